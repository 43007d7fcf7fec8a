"""app/protocol/headers.py: every header and query rule, called directly and through requests."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.protocol.headers import (
    MAX_SAFE_INTEGER,
    format_expires_at,
    parse_expires_at,
    parse_flag,
    parse_producer,
    parse_stream_seq,
    parse_sub_offset,
    parse_ttl,
    parse_uint,
    single_query,
)
from app.state_machine.commands import Producer
from tests.inprocess import Node
from tests.protocol.helpers import TEXT, create, error_code, off, raises, read_all

pytestmark = pytest.mark.anyio

LATEST_MS = 253402300799000  # 9999-12-31T23:59:59Z
# Digits outside ASCII pass str.isdigit(); the rules must refuse them all the same.
NON_ASCII_DIGITS = ["\u00b2", "\u0661", "\uff11"]


@pytest.fixture()
def path(bucket: str) -> str:
    return f"/ds/{bucket}/s"


@pytest.mark.parametrize(("value", "expected"), [("0", 0), ("7", 7), ("0042", 42), ("9" * 16, 9999999999999999)])
def test_parse_uint_accepts_up_to_16_ascii_digits(value: str, expected: int) -> None:
    assert parse_uint(value) == expected


@pytest.mark.parametrize("value", [None, "", "-1", "+1", " 1", "1 ", "1.0", "1e3", "0x10", "9" * 17, *NON_ASCII_DIGITS])
def test_parse_uint_returns_none_for_anything_else(value: str | None) -> None:
    assert parse_uint(value) is None


@pytest.mark.parametrize(("value", "expected"), [(None, None), ("0", 0), ("60", 60), ("9007199254740", 9007199254740)])
def test_parse_ttl_accepts_canonical_seconds(value: str | None, expected: int | None) -> None:
    assert parse_ttl(value) == expected


@pytest.mark.parametrize(
    "value", ["", "00060", "+60", "-1", "60.5", "1e3", " 60", "9007199254741", "9" * 17, *NON_ASCII_DIGITS]
)
def test_parse_ttl_rejects_non_canonical_or_too_large(value: str) -> None:
    with raises(400, "invalid_ttl"):
        parse_ttl(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("1970-01-01T00:00:00Z", 0),
        ("2099-01-01T00:00:00Z", 4070908800000),
        ("2099-01-01t00:00:00z", 4070908800000),
        ("2099-01-01T02:00:00+02:00", 4070908800000),
        ("2098-12-31T23:00:00-01:00", 4070908800000),
        ("2099-01-01T00:00:00.5Z", 4070908800500),
        ("2099-01-01T00:00:00.001Z", 4070908800001),
        ("9999-12-31T23:59:59Z", LATEST_MS),
        ("9999-12-31T23:59:59.999Z", LATEST_MS + 999),  # the last millisecond of 9999
    ],
)
def test_parse_expires_at_gives_utc_milliseconds(value: str | None, expected: int | None) -> None:
    assert parse_expires_at(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "RFC 3339"),
        ("tomorrow", "RFC 3339"),
        ("2099-01-01", "RFC 3339"),
        ("2099-01-01 00:00:00Z", "RFC 3339"),
        ("2099-01-01T00:00:00", "RFC 3339"),
        ("2099-1-01T00:00:00Z", "RFC 3339"),
        ("2099-01-01T00:00:00+0200", "RFC 3339"),
        ("2099-02-30T00:00:00Z", "not a valid date"),
        ("2099-13-01T00:00:00Z", "not a valid date"),
        ("2099-01-01T24:00:00Z", "not a valid date"),
        ("2099-01-01T00:00:60Z", "not a valid date"),
        ("2099-01-01T00:00:00+24:00", "RFC 3339"),
        ("2099-01-01T00:00:00+00:60", "RFC 3339"),  # was taken, as an hour
        ("2099-01-01T00:00:00-07:99", "RFC 3339"),
        ("1969-12-31T23:59:59Z", "between 1970 and 9999"),
        ("1970-01-01T00:00:00+00:01", "between 1970 and 9999"),
        ("9999-12-31T23:59:59-23:59", "between 1970 and 9999"),
    ],
)
def test_parse_expires_at_rejects(value: str, message: str) -> None:
    with raises(400, "invalid_expires_at") as exc:
        parse_expires_at(value)
    assert message in exc.value.message


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (4070908800500, "2099-01-01T00:00:00.500Z"),
        (LATEST_MS, "9999-12-31T23:59:59.000Z"),
    ],
)
def test_format_expires_at_is_utc_with_milliseconds(ms: int, text: str) -> None:
    assert format_expires_at(ms) == text


# Instants where float arithmetic (timestamp() * 1000, ms / 1000) once landed 1 ms early.
@pytest.mark.parametrize(
    ("text", "ms"), [("1970-01-01T02:19:17.103Z", 8357103), ("2038-09-19T02:19:57.956Z", 2168475597956)]
)
def test_parse_expires_at_keeps_every_millisecond(text: str, ms: int) -> None:
    assert format_expires_at(ms) == text
    assert parse_expires_at(text) == ms


def test_format_expires_at_keeps_every_millisecond() -> None:
    assert format_expires_at(253401925441770) == "9999-12-27T15:44:01.770Z"


@given(st.integers(min_value=0, max_value=LATEST_MS))
def test_expires_at_round_trips_exactly(ms: int) -> None:
    assert parse_expires_at(format_expires_at(ms)) == ms


@pytest.mark.parametrize(
    ("headers", "expected"),
    [({}, False), ({"f": "true"}, True), ({"f": "TRUE"}, True), ({"f": " True "}, True), ({"f": "false"}, False)],
)
def test_parse_flag_is_case_insensitive_true_or_false(headers: dict[str, str], expected: bool) -> None:
    assert parse_flag(headers, "f") is expected


@pytest.mark.parametrize("value", ["", "yes", "1", "0", "truee", "t"])
def test_parse_flag_rejects_other_values_naming_the_header(value: str) -> None:
    with raises(400, "invalid_header") as exc:
        parse_flag({"stream-closed": value}, "stream-closed")
    assert exc.value.message == "stream-closed must be true or false"


def producer(pid: str = "p", epoch: str = "0", seq: str = "0") -> dict[str, str]:
    return {"producer-id": pid, "producer-epoch": epoch, "producer-seq": seq}


def test_parse_producer_is_none_without_headers() -> None:
    assert parse_producer({"content-type": "text/plain"}) is None


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        (producer("p", "1", "2"), Producer("p", 1, 2)),
        (producer("x" * 256, "0", "0"), Producer("x" * 256, 0, 0)),
        (producer("p", "007", "0010"), Producer("p", 7, 10)),
        (
            producer("p", str(MAX_SAFE_INTEGER), str(MAX_SAFE_INTEGER)),
            Producer("p", MAX_SAFE_INTEGER, MAX_SAFE_INTEGER),
        ),
    ],
)
def test_parse_producer_accepts(headers: dict[str, str], expected: Producer) -> None:
    assert parse_producer(headers) == expected


@pytest.mark.parametrize(
    "names",
    [["producer-id"], ["producer-epoch"], ["producer-seq"], ["producer-id", "producer-epoch"],
     ["producer-id", "producer-seq"], ["producer-epoch", "producer-seq"]],
)  # fmt: skip
def test_parse_producer_needs_all_three_headers(names: list[str]) -> None:
    with raises(400, "invalid_producer") as exc:
        parse_producer({name: producer()[name] for name in names})
    assert "go together" in exc.value.message


@pytest.mark.parametrize("pid", ["", "x" * 257])
def test_parse_producer_rejects_empty_or_long_ids(pid: str) -> None:
    with raises(400, "invalid_producer") as exc:
        parse_producer(producer(pid))
    assert exc.value.message.startswith("Producer-Id")


@pytest.mark.parametrize("bad", ["", "-1", "+1", "1.0", "1e3", "0x1", str(MAX_SAFE_INTEGER + 1), "9" * 17, "\u00b2"])
@pytest.mark.parametrize(("field", "name"), [("epoch", "Producer-Epoch"), ("seq", "Producer-Seq")])
def test_parse_producer_rejects_bad_integers_naming_the_header(field: str, name: str, bad: str) -> None:
    with raises(400, "invalid_producer") as exc:
        parse_producer(producer(**{field: bad}))
    assert exc.value.message == f"{name} must be an integer from 0 to 2^53-1"


@pytest.mark.parametrize(
    ("value", "expected"), [(None, 0), ("0", 0), ("5", 5), (str(MAX_SAFE_INTEGER), MAX_SAFE_INTEGER)]
)
def test_parse_sub_offset_accepts(value: str | None, expected: int) -> None:
    assert parse_sub_offset(value) == expected


@pytest.mark.parametrize("value", ["", "05", "-1", "+1", "1.5", "abc", str(MAX_SAFE_INTEGER + 1), "9" * 17])
def test_parse_sub_offset_rejects(value: str) -> None:
    with raises(400, "invalid_fork_sub_offset"):
        parse_sub_offset(value)


@pytest.mark.parametrize("value", [None, "a", "x" * 256])
def test_parse_stream_seq_accepts_1_to_256_characters(value: str | None) -> None:
    assert parse_stream_seq(value) == value


@pytest.mark.parametrize("value", ["", "x" * 257])
def test_parse_stream_seq_rejects_empty_or_long(value: str) -> None:
    with raises(400, "invalid_stream_seq"):
        parse_stream_seq(value)


@pytest.mark.parametrize(
    ("params", "expected"),
    [({}, None), ({"offset": ["a"]}, "a"), ({"offset": [""]}, ""), ({"other": ["a", "b"]}, None)],
)
def test_single_query_gives_the_one_value(params: dict[str, list[str]], expected: str | None) -> None:
    assert single_query(params, "offset") == expected


@pytest.mark.parametrize("name", ["offset", "cursor"])
def test_single_query_rejects_a_repeat_with_a_code_per_parameter(name: str) -> None:
    with raises(400, f"invalid_{name}") as exc:
        single_query({name: ["a", "a"]}, name)
    assert exc.value.message == f"{name} may appear only once"


# Through requests: the rule's answer, and nothing stored when it rejects a write.


async def test_stream_ttl_is_stored_and_reported(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path, headers={**TEXT, "stream-ttl": "3600"})
    head = await client.head(path)
    assert head.headers["stream-ttl"] == "3600"
    assert "stream-expires-at" not in head.headers


async def test_stream_expires_at_with_milliseconds_is_reported_as_sent(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path, headers={**TEXT, "stream-expires-at": "2038-09-19T02:19:57.956Z"})
    assert (await client.head(path)).headers["stream-expires-at"] == "2038-09-19T02:19:57.956Z"


async def test_stream_expires_at_is_reported_in_utc_milliseconds(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path, headers={**TEXT, "stream-expires-at": "2099-01-01T02:00:00.25+02:00"})
    head = await client.head(path)
    assert head.headers["stream-expires-at"] == "2099-01-01T00:00:00.250Z"
    assert "stream-ttl" not in head.headers


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({"stream-ttl": "00060"}, "invalid_ttl"),
        ({"stream-ttl": "-1"}, "invalid_ttl"),
        ({"stream-expires-at": "2099-02-30T00:00:00Z"}, "invalid_expires_at"),
        ({"stream-expires-at": "9999-12-31T23:59:59-23:59"}, "invalid_expires_at"),
        ({"stream-ttl": "60", "stream-expires-at": "2099-01-01T00:00:00Z"}, "conflicting_expiry"),
        ({"stream-closed": "maybe"}, "invalid_header"),
        ({"stream-fork-offset": "-1"}, "invalid_fork"),
        ({"stream-fork-sub-offset": "1"}, "invalid_fork"),
    ],
)
async def test_rejected_create_headers_create_nothing(
    client: httpx.AsyncClient, node: Node, path: str, headers: dict[str, str], code: str
) -> None:
    with node.unchanged():
        error_code(await client.put(path, headers={**TEXT, **headers}, content=b"body"), 400, code)
    assert (await client.head(path)).status_code == 404


async def test_stream_closed_on_create_is_case_insensitive(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path, b"x", {**TEXT, "stream-closed": "TRUE"})
    assert (await client.head(path)).headers["stream-closed"] == "true"
    await create(client, path + "2", b"x", {**TEXT, "stream-closed": "false"})
    assert "stream-closed" not in (await client.head(path + "2")).headers


async def test_stream_closed_on_append_closes(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path, b"x")
    resp = await client.post(path, headers={"stream-closed": " True "})
    assert resp.status_code == 204
    assert resp.headers["stream-closed"] == "true"


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({"stream-closed": "1"}, "invalid_header"),
        ({"producer-id": "p"}, "invalid_producer"),
        ({"producer-id": "p", "producer-epoch": "0"}, "invalid_producer"),
        (producer(""), "invalid_producer"),
        (producer(epoch="-1"), "invalid_producer"),
        (producer(seq=str(MAX_SAFE_INTEGER + 1)), "invalid_producer"),
        ({"stream-seq": ""}, "invalid_stream_seq"),
        ({"stream-seq": "x" * 257}, "invalid_stream_seq"),
    ],
)
async def test_rejected_append_headers_append_nothing(
    client: httpx.AsyncClient, node: Node, path: str, headers: dict[str, str], code: str
) -> None:
    await create(client, path, b"data")
    with node.unchanged():
        error_code(await client.post(path, headers={**TEXT, **headers}, content=b"more"), 400, code)
    assert await read_all(client, path) == b"data"
    assert "stream-closed" not in (await client.head(path)).headers


async def test_producer_headers_are_echoed_as_integers(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path)
    resp = await client.post(path, headers={**TEXT, **producer("p", "003", "0")}, content=b"a")
    assert resp.status_code == 200
    assert (resp.headers["producer-epoch"], resp.headers["producer-seq"]) == ("3", "0")


async def test_stream_seq_of_256_characters_is_accepted(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path)
    assert (await client.post(path, headers={**TEXT, "stream-seq": "x" * 256}, content=b"a")).status_code == 204
    assert await read_all(client, path) == b"a"


async def test_bad_fork_sub_offset_creates_no_fork(client: httpx.AsyncClient, node: Node, bucket: str) -> None:
    await create(client, f"/ds/{bucket}/src", b"source")
    fork = f"/ds/{bucket}/fork"
    headers = {"stream-forked-from": f"/ds/{bucket}/src", "stream-fork-sub-offset": "05"}
    with node.unchanged():
        error_code(await client.put(fork, headers=headers), 400, "invalid_fork_sub_offset")
    assert (await client.head(fork)).status_code == 404


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("offset=-1&offset=-1", "invalid_offset"),
        ("offset=-1&live=long-poll&live=long-poll", "invalid_live"),
        ("offset=-1&cursor=1&cursor=2", "invalid_cursor"),
    ],
)
async def test_repeated_read_parameters_are_400(client: httpx.AsyncClient, path: str, query: str, code: str) -> None:
    await create(client, path, b"x")
    error_code(await client.get(f"{path}?{query}"), 400, code)


async def test_blank_offset_is_not_the_start(client: httpx.AsyncClient, path: str) -> None:
    # keep_blank_values: `offset=` is an offset, and a malformed one.
    await create(client, path, b"x")
    error_code(await client.get(f"{path}?offset="), 400, "invalid_offset")


async def _cursor(client: httpx.AsyncClient, path: str, cursor: str | None = None) -> int:
    # A long-poll with data to return answers at once, with a Stream-Cursor.
    params = {"offset": "-1", "live": "long-poll", **({"cursor": cursor} if cursor is not None else {})}
    resp = await client.get(path, params=params)
    assert resp.status_code == 200, resp.text
    return int(resp.headers["stream-cursor"])


@pytest.mark.parametrize("cursor", ["\u00b2", "9" * 17, "9" * 4301, "-5", "abc", ""])
async def test_unusable_cursor_is_ignored(client: httpx.AsyncClient, path: str, cursor: str) -> None:
    await create(client, path, b"x")
    plain = await _cursor(client, path)
    assert await _cursor(client, path, cursor) - plain in (0, 1)  # 1: an interval boundary passed between


async def test_cursor_ahead_of_the_clock_is_moved_further_ahead(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path, b"x")
    assert await _cursor(client, path, "9" * 16) > 9999999999999999


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("prefix=a&prefix=b", "invalid_prefix"),
        ("after=a&after=b", "invalid_after"),
        ("limit=1&limit=1", "invalid_limit"),
        ("limit=0", "invalid_limit"),
        ("limit=1001", "invalid_limit"),
        ("limit=-1", "invalid_limit"),
        ("limit=\u00b2", "invalid_limit"),
        ("limit=" + "9" * 17, "invalid_limit"),
    ],
)
async def test_bad_bucket_listing_parameters_are_400(
    client: httpx.AsyncClient, bucket: str, query: str, code: str
) -> None:
    error_code(await client.get(f"/ds/{bucket}?{query}"), 400, code)


async def test_bucket_listing_limit_takes_leading_zeros_and_blank_is_default(
    client: httpx.AsyncClient, bucket: str
) -> None:
    for name in ("a", "b"):
        await create(client, f"/ds/{bucket}/{name}")
    one = (await client.get(f"/ds/{bucket}?limit=0001")).json()
    assert ([s["name"] for s in one["streams"]], one["has_more"], one["next"]) == (["a"], True, "a")
    blank = (await client.get(f"/ds/{bucket}?limit=")).json()
    assert ([s["name"] for s in blank["streams"]], blank["has_more"]) == (["a", "b"], False)


async def test_created_at_in_bucket_listing_uses_the_expiry_format(client: httpx.AsyncClient, bucket: str) -> None:
    await create(client, f"/ds/{bucket}/a")
    listing = (await client.get(f"/ds/{bucket}")).json()
    for created in (listing["created_at"], listing["streams"][0]["created_at"]):
        assert parse_expires_at(created) is not None
        assert created.endswith("Z") and len(created) == len("2099-01-01T00:00:00.000Z")


async def test_offset_helper_matches_the_server(client: httpx.AsyncClient, path: str) -> None:
    assert (await create(client, path, b"abc")).headers["stream-next-offset"] == off(3)
