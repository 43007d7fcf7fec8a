"""app/protocol/target.py: stream id rules, the /ds sub-routes ids may not end in, fork references."""

from __future__ import annotations

import httpx
import pytest

from app.protocol.target import SUBROUTES, WITH_OFFSET, StreamTarget, split_subroute, validate_stream_id
from tests.http.helpers import uid
from tests.inprocess import Node
from tests.protocol.helpers import TEXT, create, error_code, raises, read_all

pytestmark = pytest.mark.anyio

FAMILIES = ["ds", "legacy", "compat"]
WITHOUT_OFFSET = [kind for kind in SUBROUTES if kind not in WITH_OFFSET]


@pytest.mark.parametrize(
    "name",
    [
        *["a", "a/b/c", "...", ".a", "a.", "a b", "a%20b", "\u65e5\u672c", "x" * 1024, "\u00e9" * 512, "a/attrs/x"],
        *["~!$&'()*+,;=:@", "\u00a0", "\u00ff", "\U0001f600", "\ufffd"],  # around the control ranges
    ],
)
@pytest.mark.parametrize("ds", [False, True])
def test_valid_stream_ids(name: str, ds: bool) -> None:
    validate_stream_id(name, ds=ds)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "stream id is empty"),
        ("x" * 1025, "stream id is longer than 1 KiB"),
        ("\u00e9" * 513, "stream id is longer than 1 KiB"),  # 513 characters, 1,026 bytes of UTF-8
        ("a\x00b", "stream id contains control character U+0000"),
        ("a\rb", "stream id contains control character U+000D"),
        ("a\nb", "stream id contains control character U+000A"),
        ("\x1f", "stream id contains control character U+001F"),
        ("a\x7f", "stream id contains control character U+007F"),
        ("\x80a", "stream id contains control character U+0080"),
        ("a\x9fb", "stream id contains control character U+009F"),
        *[
            (name, "stream id has an empty, '.' or '..' segment")
            for name in ["/a", "a/", "a//b", ".", "..", "a/./b", "a/../b", "./a", "a/.."]
        ],
    ],
)
@pytest.mark.parametrize("ds", [False, True])
def test_invalid_stream_ids(name: str, message: str, ds: bool) -> None:
    with raises(400, "invalid_stream_id") as exc:
        validate_stream_id(name, ds=ds)
    assert exc.value.message == message


@pytest.mark.parametrize("name", ["__ds", "a/__ds", "__ds/a", "a/__ds/b", "a/__ds/records"])
@pytest.mark.parametrize("ds", [False, True])
def test_ids_may_not_have_a_protocol_namespace_segment(name: str, ds: bool) -> None:
    """In no family: `r/__ds/x/__ds/subscriptions` would be a stream hiding r/__ds/x's groups."""
    with raises(400, "invalid_stream_id") as exc:
        validate_stream_id(name, ds=ds)
    assert "__ds segment" in exc.value.message


@pytest.mark.parametrize(
    "name",
    [
        *[f"a/{kind}" for kind in SUBROUTES if "/" not in kind],
        *[kind for kind in SUBROUTES if "/" not in kind],
        *[f"a/{kind}/x" for kind in WITH_OFFSET],
        *[f"{kind}/x" for kind in WITH_OFFSET],
    ],
)
def test_ds_ids_may_not_end_in_a_sub_route(name: str) -> None:
    validate_stream_id(name)  # other families have no sub-routes
    with raises(400, "invalid_stream_id") as exc:
        validate_stream_id(name, ds=True)
    assert exc.value.message == "stream id may not end in a reserved sub-route"


@pytest.mark.parametrize("kind", [k for k in WITHOUT_OFFSET if "/" not in k])
def test_sub_routes_without_an_offset_reserve_only_the_last_segment(kind: str) -> None:
    validate_stream_id(f"a/{kind}/x", ds=True)
    validate_stream_id(f"{kind}/x", ds=True)


def test_an_id_valid_elsewhere_is_still_checked_for_ds() -> None:
    # Good ids are cached: the cache must not let a non-/ds answer stand for /ds.
    validate_stream_id("cached/attrs")
    with raises(400, "invalid_stream_id"):
        validate_stream_id("cached/attrs", ds=True)


def test_bad_ids_are_refused_every_time() -> None:
    for _ in range(2):
        with raises(400, "invalid_stream_id"):
            validate_stream_id("a//b")


def test_sub_route_kinds() -> None:
    # Pinned: a new kind reserves a suffix, and existing /ds streams whose ids end in it become unreachable.
    # New ones go under the protocol's own `__ds` segment, which no id may contain.
    assert set(SUBROUTES) == {"attrs", "append-batch", "bootstrap", "snapshot", "retention", "__ds/records"}
    assert set(WITH_OFFSET) == {"snapshot", "retention"}


@pytest.mark.parametrize(
    ("segments", "expected"),
    [
        (["a", "attrs"], ("a", "attrs", None)),
        (["a", "b", "append-batch"], ("a/b", "append-batch", None)),
        (["a", "bootstrap"], ("a", "bootstrap", None)),
        (["a", "snapshot"], ("a", "snapshot", None)),
        (["a", "retention"], ("a", "retention", None)),
        (["a", "snapshot", "X"], ("a", "snapshot", "X")),
        (["a", "b", "retention", "X"], ("a/b", "retention", "X")),
        (["a", "snapshot", "attrs"], ("a/snapshot", "attrs", None)),
        (["a", "b", "__ds", "records"], ("a/b", "__ds/records", None)),
    ],
)
def test_split_subroute_names_the_stream_kind_and_offset(
    segments: list[str], expected: tuple[str, str, str | None]
) -> None:
    assert split_subroute(segments) == expected


@pytest.mark.parametrize(
    "segments",
    [
        ["a"],
        ["a", "b"],
        ["attrs"],
        ["snapshot", "X"],
        ["a", "attrs", "X"],
        ["a", "bootstrap", "X"],
        ["__ds", "records"],
        ["a", "__ds", "nope"],
    ],  # fmt: skip
)
def test_split_subroute_is_none_for_plain_stream_paths(segments: list[str]) -> None:
    assert split_subroute(segments) is None


DS_TARGET = StreamTarget("b", "fork", "/ds/b/")


@pytest.mark.parametrize(
    ("reference", "name"),
    [
        ("/ds/b/src", "src"),
        ("/ds/b/x/y", "x/y"),
        ("src", "src"),
        ("/src", "src"),
        ("http://elsewhere:1/ds/b/src", "src"),
        ("https://h/ds/b/src?x=1#frag", "src"),
        # Outside the family's prefix a path is read as an id in the same bucket (the conformance
        # suite, run against every family, names fork sources by their compat paths).
        ("/ds/other/src", "ds/other/src"),
        ("/streams/src", "streams/src"),
    ],
)
def test_resolve_reads_paths_urls_and_bare_ids(reference: str, name: str) -> None:
    assert DS_TARGET.resolve(reference) == name


@pytest.mark.parametrize(("reference", "name"), [("/streams/a/b", "a/b"), ("http://h/streams/a", "a"), ("a", "a")])
def test_resolve_in_a_builtin_family(reference: str, name: str) -> None:
    assert StreamTarget("__legacy__", "fork", "/streams/").resolve(reference) == name


def test_resolve_refuses_an_unparsable_url() -> None:
    with raises(400, "invalid_fork") as exc:
        DS_TARGET.resolve("http://[x/y")
    assert exc.value.message == "Stream-Forked-From is not a valid path or URL"


@pytest.mark.parametrize("reference", ["", "/ds/b/", "/ds/b/a/../b", "http://h/ds/b/a//b", "/ds/b/a\x00"])
def test_resolve_refuses_references_to_invalid_ids(reference: str) -> None:
    with raises(400, "invalid_stream_id"):
        DS_TARGET.resolve(reference)


# The Location the server returns for a stream whose id needs encoding must name that stream.
@pytest.mark.parametrize(
    ("reference", "name"),
    [
        ("/ds/b/a%20b", "a b"),
        ("http://h/ds/b/a%20b", "a b"),
        ("/ds/b/a%2520b", "a%20b"),
        ("/ds/b/x%2Fy", "x/y"),
        ("/ds/b/%E6%97%A5", "\u65e5"),
        ("/ds/b/\u00e6\u0097\u00a5", "\u65e5"),  # raw UTF-8 bytes, as a header value arrives (latin-1)
        ("%2Fds%2Fb%2Fsrc", "src"),
    ],
)
def test_resolve_decodes_percent_encoded_references(reference: str, name: str) -> None:
    assert DS_TARGET.resolve(reference) == name


@pytest.mark.parametrize(
    "reference", ["/ds/b/a%ffb", "/ds/b/a\u00ffb", "/ds/b/%C3", "/ds/b/a%0Ab", "/ds/b/a%00", "/ds/b/a%zz", "/ds/b/a%"]
)
def test_resolve_refuses_references_that_decode_to_invalid_ids(reference: str) -> None:
    with raises(400, "invalid_stream_id"):
        DS_TARGET.resolve(reference)


# Through requests, in every route family. The built-in families share one namespace per node, so
# names there start with a fresh id.


@pytest.fixture(params=FAMILIES)
def base(request: pytest.FixtureRequest, bucket: str) -> str:
    return {"ds": f"/ds/{bucket}/", "legacy": "/streams/", "compat": "/v1/stream/"}[request.param]


@pytest.fixture()
def u() -> str:
    return uid()


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        ("", "stream id is empty"),
        ("a%00b", "stream id contains control character U+0000"),
        ("a%0D%0Ab", "stream id contains control character U+000D"),
        ("a%C2%85b", "stream id contains control character U+0085"),
        ("a%ffb", "the request path is not valid UTF-8 once percent-decoded"),
        ("a%C3", "the request path is not valid UTF-8 once percent-decoded"),
        *[
            (bad, "the request path has a % that is not followed by two hex digits")
            for bad in ("a%zz", "a%", "a%2", "100%")
        ],
        ("a/__ds/x", "stream id may not have a __ds segment (the protocol's namespace)"),
        ("a/%2E%2E/b", "stream id has an empty, '.' or '..' segment"),
        ("a//b", "stream id has an empty, '.' or '..' segment"),
        ("x" * 1025, "stream id is longer than 1 KiB"),
        ("%C3%A9" * 513, "stream id is longer than 1 KiB"),
    ],
)
async def test_invalid_ids_are_400_for_every_method(
    client: httpx.AsyncClient, node: Node, base: str, suffix: str, message: str
) -> None:
    with node.unchanged():
        for method in ("PUT", "POST", "GET", "DELETE"):
            resp = await client.request(method, base + suffix, headers=TEXT, content=b"x" if method == "POST" else b"")
            assert error_code(resp, 400, "invalid_stream_id") == message, method


@pytest.mark.parametrize(
    "suffix", ["x" * 1008, "%C3%A9" * 504, "/a/.../b"], ids=["1024-bytes", "1024-utf8-bytes", "dots"]
)
async def test_ids_at_the_limits_are_streams(client: httpx.AsyncClient, base: str, u: str, suffix: str) -> None:
    await create(client, base + u + suffix, b"data")  # the id is 16 bytes of `u` and the suffix
    assert await read_all(client, base + u + suffix) == b"data"


@pytest.mark.parametrize(
    "path", ["a/attrs/attrs", "a/bootstrap/append-batch", "a/snapshot/x/attrs", "a/retention/x/bootstrap"]
)
async def test_ds_sub_resource_of_a_reserved_id_is_400(
    client: httpx.AsyncClient, node: Node, bucket: str, path: str
) -> None:
    with node.unchanged():
        error_code(await client.get(f"/ds/{bucket}/{path}"), 400, "invalid_stream_id")


@pytest.mark.parametrize("base", ["/streams/", "/v1/stream/"])
@pytest.mark.parametrize("name", ["attrs", "snapshot/x", "retention/x", "bootstrap"])
async def test_builtin_families_have_no_reserved_ids(client: httpx.AsyncClient, base: str, u: str, name: str) -> None:
    await create(client, f"{base}{u}/{name}", b"plain")
    assert await read_all(client, f"{base}{u}/{name}") == b"plain"


async def test_ds_sub_route_without_offset_form_is_only_reserved_last(client: httpx.AsyncClient, bucket: str) -> None:
    await create(client, f"/ds/{bucket}/a/attrs/x", b"plain")
    assert await read_all(client, f"/ds/{bucket}/a/attrs/x") == b"plain"


async def test_encoded_slash_is_a_separator(client: httpx.AsyncClient, base: str, u: str) -> None:
    await create(client, f"{base}{u}%2Fy", b"data")
    assert await read_all(client, f"{base}{u}/y") == b"data"


async def test_fork_from_a_path_a_url_or_a_bare_id(client: httpx.AsyncClient, base: str, u: str) -> None:
    src = f"{u}-src"
    await create(client, base + src, b"source")
    for reference in (base + src, src, f"http://elsewhere.example{base}{src}"):
        fork = f"{base}{uid()}"
        await create(client, fork, headers={"stream-forked-from": reference})
        assert await read_all(client, fork) == b"source", reference


async def test_fork_from_another_family_is_a_missing_stream(
    client: httpx.AsyncClient, node: Node, bucket: str, u: str
) -> None:
    await create(client, f"/streams/{u}", b"legacy")
    with node.state_unchanged():
        resp = await client.put(f"/ds/{bucket}/fork", headers={"stream-forked-from": f"/streams/{u}"})
        error_code(resp, 404, "stream_not_found")
    assert (await client.head(f"/ds/{bucket}/fork")).status_code == 404


@pytest.mark.parametrize(
    ("reference", "code"), [("http://[x/y", "invalid_fork"), ("a/../b", "invalid_stream_id"), ("", "invalid_stream_id")]
)
async def test_bad_fork_references_create_nothing(
    client: httpx.AsyncClient, node: Node, base: str, u: str, reference: str, code: str
) -> None:
    with node.unchanged():
        error_code(await client.put(base + u, headers={"stream-forked-from": reference}), 400, code)
    assert (await client.head(base + u)).status_code == 404


async def test_fork_from_the_location_of_a_stream_whose_id_is_encoded(
    client: httpx.AsyncClient, base: str, u: str
) -> None:
    location = (await create(client, f"{base}{u}%20b", b"source")).headers["location"]
    assert location.endswith(f"/{u}%20b")
    await create(client, f"{base}{u}-fork", headers={"stream-forked-from": location})
    assert await read_all(client, f"{base}{u}-fork") == b"source"
