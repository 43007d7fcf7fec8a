"""HTTP tests for stream ids in every route family: slashes, invalid segments, control characters, length, /ds
reserved suffixes (bytes and UTF-8 in depth: test_stream_id_bytes.py)."""

from __future__ import annotations

import httpx
import pytest

from tests.http.helpers import TEXT, assert_error, uid
from tests.server import RillProcess

# ------------------------------------------------------------------------------------------------
# Valid ids


def test_ids_with_slashes_work(client: httpx.Client, base: str) -> None:
    root = f"{base}{uid()}"
    deep = f"{root}/a/b/c"
    mid = f"{root}/a"
    assert client.put(deep, headers=TEXT, content=b"deep").status_code == 201
    assert client.put(mid, headers=TEXT, content=b"mid").status_code == 201
    resp = client.put(deep, headers=TEXT)
    assert resp.status_code == 200
    assert client.post(deep, headers=TEXT, content=b"+more").status_code == 204
    assert client.get(deep).content == b"deep+more"
    assert client.get(mid).content == b"mid"
    head = client.head(deep)
    assert head.status_code == 200 and head.headers["content-type"] == "text/plain"
    created = client.put(f"{root}/x/y", headers=TEXT)
    assert created.status_code == 201
    assert created.headers["location"].endswith(f"{root}/x/y")
    # The parent path is not a stream by itself.
    assert_error(client.get(f"{root}/a/b"), 404)
    assert client.delete(deep).status_code == 204
    assert client.get(mid).content == b"mid"


def test_id_of_exactly_1_kib_is_accepted(client: httpx.Client, base: str) -> None:
    name = uid() + "x" * (1024 - len(uid()))
    assert len(name.encode()) == 1024
    assert client.put(base + name, headers=TEXT, content=b"ok").status_code == 201
    assert client.get(base + name).content == b"ok"


UNUSUAL_SEGMENTS = [
    pytest.param("caf\u00e9", id="latin1"),
    pytest.param("\u6d41", id="cjk"),
    pytest.param("\U0001f30a", id="emoji"),
    pytest.param("a b", id="space"),
]


@pytest.mark.parametrize("segment", UNUSUAL_SEGMENTS)
def test_unusual_id_characters(rill: RillProcess, base: str, segment: str) -> None:
    """Non-ASCII and space: a stream with a valid Location; never a 500."""
    path = f"{base}{uid()}/{segment}"
    # Its own client: a server error here must not poison the shared connection pool.
    with httpx.Client(base_url=rill.url, timeout=10) as client:
        resp = client.put(path, headers=TEXT, content=b"u")
        assert resp.status_code == 201, (resp.status_code, resp.text)
        # Location is an absolute URL of ASCII characters (the path percent-encoded), ending with the request path.
        location = resp.headers.get("location", "")
        assert location.isascii() and location.isprintable() and " " not in location, location
        assert location.endswith(resp.request.url.raw_path.decode()), location
        assert client.get(path).content == b"u"
        assert client.post(path, headers=TEXT, content=b"2").status_code == 204
        assert client.get(path).content == b"u2"


# ------------------------------------------------------------------------------------------------
# Invalid ids (sent raw on the wire; dot segments percent-encoded since httpx removes literal ones)

INVALID_IDS = [
    pytest.param("{u}/a//b", id="empty-segment"),
    pytest.param("{u}/", id="trailing-slash"),
    pytest.param("/{u}", id="leading-slash"),
    pytest.param("", id="empty-id"),
    pytest.param("{u}/a/%2E%2E/b", id="dotdot-segment"),
    pytest.param("{u}/%2e%2e", id="dotdot-last-lowercase"),
    pytest.param("%2E%2E/{u}", id="dotdot-first"),
    pytest.param("{u}/a/%2E/b", id="dot-segment"),
    pytest.param("{u}/%2E", id="dot-last"),
    pytest.param("{u}/a%00b", id="nul"),
    pytest.param("%00{u}", id="nul-first"),
    pytest.param("{u}/a%09b", id="tab"),
    pytest.param("{u}/a%0Ab", id="lf"),
    pytest.param("{u}/a%0D%0AX-Injected:%201", id="crlf-injection"),
    pytest.param("{u}/a%C2%85b", id="c1-nel"),
    pytest.param("{u}/a%FFb", id="invalid-utf8"),
    pytest.param("{u}" + "x" * 1013, id="1025-bytes"),
    pytest.param("{u}" + "%C3%A9" * 507, id="1026-bytes-utf8"),
]


@pytest.mark.parametrize("raw", INVALID_IDS)
def test_invalid_id_put_is_400(client: httpx.Client, base: str, raw: str) -> None:
    u = uid()
    assert_error(client.put(base + raw.format(u=u), headers=TEXT, content=b"x"), 400)
    # Nothing was created under a neighbouring valid name either.
    if raw.startswith("{u}") or raw.startswith("/{u}"):
        assert_error(client.get(f"{base}{u}"), 404)


@pytest.mark.parametrize("raw", INVALID_IDS)
@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_invalid_id_other_methods_are_400(client: httpx.Client, base: str, raw: str, method: str) -> None:
    content = b"x" if method == "POST" else b""
    resp = client.request(method, base + raw.format(u=uid()), headers=TEXT, content=content)
    assert_error(resp, 400)


@pytest.mark.parametrize("raw", ["{u}/a//b", "{u}/a/%2E%2E/b", "{u}/a%00b"])
def test_invalid_id_head_is_400(client: httpx.Client, base: str, raw: str) -> None:
    resp = client.head(base + raw.format(u=uid()))
    assert resp.status_code == 400
    assert resp.content == b""


def test_invalid_ids_do_not_alias_valid_streams(client: httpx.Client, base: str) -> None:
    u = uid()
    assert client.put(f"{base}{u}/b", headers=TEXT, content=b"target").status_code == 201
    # Would resolve to {u}/b after dot-segment removal: must be rejected, not aliased.
    assert_error(client.post(f"{base}{u}/a/%2E%2E/b", headers=TEXT, content=b"evil"), 400)
    assert_error(client.post(f"{base}{u}/%2E/b", headers=TEXT, content=b"evil"), 400)
    assert_error(client.post(f"{base}{u}//b", headers=TEXT, content=b"evil"), 400)
    assert client.get(f"{base}{u}/b").content == b"target"


def test_invalid_fork_source_id_is_400(client: httpx.Client, base: str) -> None:
    u = uid()
    assert client.put(f"{base}{u}/src", headers=TEXT, content=b"s").status_code == 201
    # Literal dot and empty segments (the reference is percent-decoded as a request path is).
    for bad in [f"{base}{u}//src", f"{base}{u}/x/../src", f"{base}{u}/./src", f"{base}{u}/src/"]:
        assert_error(client.put(f"{base}{u}/fork", headers={**TEXT, "stream-forked-from": bad}), 400)
    assert_error(client.get(f"{base}{u}/fork"), 404)


# ------------------------------------------------------------------------------------------------
# /ds reserved sub-route suffixes

RESERVED = [
    "bootstrap",
    "x/bootstrap",
    "attrs",
    "x/y/attrs",
    "append-batch",
    "x/append-batch",
    "snapshot",
    "x/snapshot",
    "snapshot/v1",
    "x/snapshot/v1",
    "retention/p",
    "x/retention/p",
]


@pytest.mark.parametrize("suffix", RESERVED)
def test_ds_reserved_suffixes_never_create_a_stream(client: httpx.Client, ds_bucket: str, suffix: str) -> None:
    """They name a stream's sub-resource (attrs, snapshot/{offset}, ...): a PUT there never creates a
    stream with that id; it fails as the sub-resource would (bad offset, no such stream, wrong method)."""
    u = uid()
    path = f"/ds/{ds_bucket}/{u}/{suffix}"
    r = client.put(path, headers=TEXT, content=b"x")
    assert r.status_code in (400, 404, 405), (r.status_code, r.text)
    assert "error" in r.json()
    # And without a leading segment: a bare reserved word is a bad id (400).
    r = client.put(f"/ds/{ds_bucket}/{suffix}", headers=TEXT)
    assert r.status_code == (400 if "/" not in suffix else r.status_code) and r.status_code in (400, 404, 405)
    listing = client.get(f"/ds/{ds_bucket}", params={"prefix": u}).json()
    assert listing["streams"] == []


@pytest.mark.parametrize("suffix", ["bootstrap/x", "snapshot/x/y", "my-snapshot", "attrs.json", "x/retentions"])
def test_ds_near_reserved_ids_are_fine(client: httpx.Client, ds_bucket: str, suffix: str) -> None:
    path = f"/ds/{ds_bucket}/{uid()}/{suffix}"
    assert client.put(path, headers=TEXT, content=b"ok").status_code == 201
    assert client.get(path).content == b"ok"


@pytest.mark.parametrize("prefix", ["/streams/", "/v1/stream/"])
@pytest.mark.parametrize("suffix", ["bootstrap", "snapshot/v1", "retention/p"])
def test_reserved_suffixes_are_plain_ids_outside_ds(client: httpx.Client, prefix: str, suffix: str) -> None:
    path = f"{prefix}{uid()}/{suffix}"
    assert client.put(path, headers=TEXT, content=b"ok").status_code == 201
    assert client.get(path).content == b"ok"


def test_families_are_separate_namespaces(client: httpx.Client, ds_bucket: str) -> None:
    name = uid()
    assert client.put(f"/streams/{name}", headers=TEXT, content=b"legacy").status_code == 201
    assert_error(client.get(f"/v1/stream/{name}"), 404)
    assert_error(client.get(f"/ds/{ds_bucket}/{name}"), 404)
    assert client.put(f"/v1/stream/{name}", headers=TEXT, content=b"compat").status_code == 201
    assert client.get(f"/streams/{name}").content == b"legacy"
    assert client.get(f"/v1/stream/{name}").content == b"compat"
