"""app/protocol/bodies.py: the body limit (declared and streamed), JSON bodies, empty bodies."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncIterator, Callable

import httpx
import msgspec
import pytest
from starlette.types import Message

from app.protocol.bodies import json_record, read_body
from app.protocol.http import Call
from app.state_machine.reader import split_json_record
from tests.inprocess import Node
from tests.protocol.helpers import JSON_CT, LIMIT, TEXT, create, error_code, off, raises, read_all

pytestmark = pytest.mark.anyio

DEEP_ARRAY = b"[" * 1000 + b"]" * 1000
DEEP_OBJECT = b'{"a":' * 1000 + b"1" + b"}" * 1000


class Receiver:
    """An ASGI `receive` that hands out the given messages and counts how many were taken."""

    def __init__(self, *messages: Message) -> None:
        self.messages = list(messages)
        self.taken = 0

    async def __call__(self) -> Message:
        self.taken += 1
        return self.messages[self.taken - 1]


def body(data: bytes, more: bool = False) -> Message:
    return {"type": "http.request", "body": data, "more_body": more}


def call(receive: Receiver, content_length: str | None = None) -> Call:
    headers = {} if content_length is None else {"content-length": content_length}
    return Call({"type": "http"}, receive, "POST", "/streams/s", headers)


async def test_read_body_refuses_a_declared_length_over_the_limit_without_reading() -> None:
    receive = Receiver(body(b"x"))
    with raises(413, "payload_too_large") as exc:
        await read_body(call(receive, "11"), 10)
    assert exc.value.message == "request body exceeds 10 bytes"
    assert receive.taken == 0


@pytest.mark.parametrize("declared", [None, "10", "0", "abc", "-1", "9" * 17])
async def test_read_body_reads_up_to_the_limit_whatever_the_declared_length(declared: str | None) -> None:
    # Only a well-formed Content-Length over the limit refuses early; the bytes received decide.
    assert await read_body(call(Receiver(body(b"x" * 10)), declared), 10) == b"x" * 10


async def test_read_body_joins_chunks() -> None:
    receive = Receiver(body(b"ab", more=True), body(b"", more=True), body(b"cd"))
    assert await read_body(call(receive), 10) == b"abcd"
    assert receive.taken == 3


async def test_read_body_stops_at_the_chunk_that_passes_the_limit() -> None:
    receive = Receiver(body(b"x" * 6, more=True), body(b"x" * 5, more=True), body(b"never read"))
    with raises(413, "payload_too_large"):
        await read_body(call(receive), 10)
    assert receive.taken == 2


async def test_read_body_counts_bytes_not_the_declared_length() -> None:
    with raises(413, "payload_too_large"):
        await read_body(call(Receiver(body(b"x" * 11)), "1"), 10)


async def test_read_body_of_a_message_without_body_is_empty() -> None:
    assert await read_body(call(Receiver({"type": "http.request"})), 10) == b""


@pytest.mark.parametrize("first", [[], [body(b"partial", more=True)]])
async def test_read_body_disconnect_is_400(first: list[Message]) -> None:
    with raises(400, "client_disconnected"):
        await read_body(call(Receiver(*first, {"type": "http.disconnect"})), 10)


@pytest.mark.parametrize(
    ("data", "record"),
    [
        (b' {"a": 1} ', b'{"a": 1}'),
        (b"42", b"42"),
        (b'"text"', b'"text"'),
        (b'[ {"a": 1} , 2,"x" ]', b'{"a": 1} , 2,"x"'),
        (b'[\n  {"a": 1},\n  {"b": [1, 2]}\n]\n', b'{"a": 1},\n  {"b": [1, 2]}'),
        (b"\n[1]\n", b"1"),
        (b"[[1,2],[3]]", b"[1,2],[3]"),
        (b"[null]", b"null"),
    ],
)
def test_json_record_keeps_message_bytes_and_flattens_one_array_level(data: bytes, record: bytes) -> None:
    # Whitespace between messages stays: a read's `[` + records joined by `,` + `]` is valid JSON still.
    assert json_record(data, allow_empty=False) == record


@pytest.mark.parametrize(
    "messages",
    [
        [{"a": 1}, {"a": 2}],
        [[1, [2, []]], "x, y", {"s": "]"}, None, 1.5e300, "\u00e9\n"],
        [0] * 100,
        ["one big string " * 100],
    ],
)
@pytest.mark.parametrize(
    "dumps", [json.dumps, lambda v: json.dumps(v, indent=2), lambda v: json.dumps(v, separators=(",", ":"))]
)
def test_json_record_messages_are_the_bodys_elements_byte_for_byte(
    messages: list[object], dumps: Callable[[object], str]
) -> None:
    data = dumps(messages).encode()
    record = json_record(data, allow_empty=False)
    assert json.loads(b"[" + bytes(record) + b"]") == messages
    assert json.loads(b"[" + b",".join([bytes(record)] * 2) + b"]") == messages * 2  # as a read renders two
    assert split_json_record(bytes(record)) == [bytes(m) for m in msgspec.json.decode(data, type=list[msgspec.Raw])]


def test_json_record_is_a_view_of_the_body_not_a_copy() -> None:
    data = bytearray(b" [ 1 , 2 ] ")
    record = json_record(data, allow_empty=False)
    assert isinstance(record, memoryview) and record.obj is data
    assert record == b"1 , 2"


def test_json_record_strips_long_whitespace_runs() -> None:
    pad = b" \t\r\n" * 5000  # longer than one strip slice
    assert json_record(pad + b"[" + pad + b"1" + pad + b"," + pad + b"2" + pad + b"]" + pad, allow_empty=False) == (
        b"1" + pad + b"," + pad + b"2"
    )
    assert json_record(pad + b'"s"' + pad, allow_empty=False) == b'"s"'
    assert json_record(b"[" + pad + b"]", allow_empty=True) == b""


def test_json_record_of_tiny_messages_allocates_no_object_per_message() -> None:
    # Issue 26: a list of msgspec.Raw made an object per message, 37x the body for [0,0,...] at 64 MiB.
    data = b"[" + b",".join([b"0"] * (2 << 20)) + b"]"  # 4 MiB, 2 Mi messages
    tracemalloc.start()
    try:
        record = json_record(data, allow_empty=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * len(data), f"peak {peak} bytes for a {len(data)}-byte body"
    assert record == data[1:-1]


@pytest.mark.parametrize("data", [b"[]", b" [ ] ", b"[\n]", b"\t[\r\n\t ]\n"])
def test_json_record_empty_array_is_an_empty_record_only_where_allowed(data: bytes) -> None:
    assert json_record(data, allow_empty=True) == b""
    with raises(400, "empty_json_array"):
        json_record(data, allow_empty=False)


@pytest.mark.parametrize(
    "data",
    [
        *(b"", b"  ", b"{", b"[1,", b"{oops", b"[1] [2]", b"1 2", b"[1,]", b"01", b"NaN", b"'a'", b'"a\x01b"'),
        *(b"[1 2]", b"[1,,2]", b"[,1]", b"[01]", b'["\\q"]', b"[1,2", b"[1]]", b"[ ]]", b"[", b"]", b"[[1]", b"[tru]"),
        *(b'[{"a" 1}]', b'[{"a":1,}]', b"[1e]", b"[-]", b'["\\u12"]'),
    ],
)
def test_json_record_rejects_invalid_json(data: bytes) -> None:
    with raises(400, "invalid_json") as exc:
        json_record(data, allow_empty=True)
    assert exc.value.message.startswith("invalid JSON: ")


@pytest.mark.parametrize("data", [DEEP_ARRAY, DEEP_OBJECT, b"[" + DEEP_ARRAY + b"]"])
def test_json_record_rejects_deep_nesting_as_invalid_json(data: bytes) -> None:
    with raises(400, "invalid_json") as exc:
        json_record(data, allow_empty=True)
    assert exc.value.message == "invalid JSON: nested too deeply"


@pytest.mark.parametrize("data", [b'"\xff"', b'["ok", "\xc3"]', b'{"\xed\xa0\x80": 1}'])
def test_json_record_rejects_invalid_utf8(data: bytes) -> None:
    with raises(400, "invalid_json"):
        json_record(data, allow_empty=True)


# Through requests: the node's limit is LIMIT bytes.


@pytest.fixture()
def path(bucket: str) -> str:
    return f"/ds/{bucket}/s"


async def chunks(total: int, size: int = 1000) -> AsyncIterator[bytes]:
    for start in range(0, total, size):
        yield b"x" * min(size, total - start)


async def test_append_of_exactly_the_limit_is_accepted(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path)
    assert (await client.post(path, headers=TEXT, content=b"y" * LIMIT)).status_code == 204
    resp = await client.post(path, headers=TEXT, content=chunks(LIMIT))
    assert resp.request.headers["transfer-encoding"] == "chunked"
    assert resp.status_code == 204
    assert await read_all(client, path) == b"y" * LIMIT + b"x" * LIMIT


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(lambda: b"x" * (LIMIT + 1), id="content-length"),
        pytest.param(lambda: chunks(4 * LIMIT), id="chunked"),
    ],
)
async def test_append_over_the_limit_is_413_and_appends_nothing(
    client: httpx.AsyncClient, node: Node, path: str, content: Callable[[], bytes | AsyncIterator[bytes]]
) -> None:
    await create(client, path, b"base")
    with node.unchanged():
        resp = await client.post(path, headers=TEXT, content=content())
        error_code(resp, 413, "payload_too_large")
    assert await read_all(client, path) == b"base"


@pytest.mark.parametrize(
    ("declared", "data"),
    [(str(LIMIT + 1), b"x"), ("1", b"x" * (LIMIT + 1))],
    ids=["declared-over-sent-under", "declared-under-sent-over"],
)
async def test_either_length_over_the_limit_is_413(
    client: httpx.AsyncClient, node: Node, path: str, declared: str, data: bytes
) -> None:
    await create(client, path, b"base")
    with node.unchanged():
        resp = await client.post(path, headers={**TEXT, "content-length": declared}, content=data)
        assert resp.request.headers["content-length"] == declared
        error_code(resp, 413, "payload_too_large")
    assert await read_all(client, path) == b"base"


async def test_create_over_the_limit_is_413_and_creates_nothing(
    client: httpx.AsyncClient, node: Node, path: str
) -> None:
    with node.unchanged():
        error_code(await client.put(path, headers=TEXT, content=b"x" * (LIMIT + 1)), 413, "payload_too_large")
        error_code(await client.put(path, headers=TEXT, content=chunks(2 * LIMIT)), 413, "payload_too_large")
    assert (await client.head(path)).status_code == 404


async def test_attrs_body_has_the_same_limit_and_snapshots_their_own(client: httpx.AsyncClient, path: str) -> None:
    tail = (await create(client, path, b"data")).headers["stream-next-offset"]
    error_code(await client.put(f"{path}/attrs", headers=JSON_CT, content=b" " * (LIMIT + 1)), 413, "payload_too_large")
    big = await client.put(f"{path}/snapshot/{tail}", headers=TEXT, content=b"s" * (LIMIT + 1))
    assert big.status_code == 201, big.text


async def test_json_create_and_appends_flatten_arrays(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path, b'[{"a": 1}, [2]]', JSON_CT)
    with_charset = {"content-type": "application/json; charset=utf-8"}
    assert (await client.post(path, headers=with_charset, content=b' "three" ')).status_code == 204
    # The record keeps the array's inside as sent, space included.
    assert await read_all(client, path) == b'[{"a": 1}, [2],"three"]'


async def test_whitespace_between_messages_is_kept_and_every_reader_sees_the_same_messages(
    client: httpx.AsyncClient, path: str
) -> None:
    await create(client, path, b'[{"a": 1},\n {"b": [2, 3]} , "four"]', JSON_CT)
    assert (await client.post(path, headers=JSON_CT, content=b"[ 5 ,6 ]")).status_code == 204
    body = await read_all(client, path)
    assert body == b'[{"a": 1},\n {"b": [2, 3]} , "four",5 ,6]'
    assert json.loads(body) == [{"a": 1}, {"b": [2, 3]}, "four", 5, 6]
    boot = await client.get(f"{path}/bootstrap")
    parts = [p.split(b"\r\n\r\n", 1)[1].removesuffix(b"\r\n") for p in boot.content.split(b"--rill-")[2:-1]]
    assert parts == [b'{"a": 1}', b'{"b": [2, 3]}', b'"four"', b"5", b"6"]  # each message's exact bytes
    fork = path + "-fork"
    sub = {"stream-forked-from": path, "stream-fork-offset": off(0), "stream-fork-sub-offset": "2"}
    await create(client, fork, headers=sub)
    assert await read_all(client, fork) == b'[{"a": 1},{"b": [2, 3]}]'


async def test_json_create_of_an_empty_array_is_an_empty_stream(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path, b"[]", JSON_CT)
    assert await read_all(client, path) == b"[]"
    assert (await client.head(path)).headers["stream-next-offset"] == off(0)


@pytest.mark.parametrize(
    ("data", "code"),
    [(b"[]", "empty_json_array"), (b"{oops", "invalid_json"), (DEEP_ARRAY, "invalid_json"), (b" ", "invalid_json")],
)
async def test_rejected_json_append_appends_nothing(
    client: httpx.AsyncClient, node: Node, path: str, data: bytes, code: str
) -> None:
    await create(client, path, b"[1]", JSON_CT)
    with node.unchanged():
        error_code(await client.post(path, headers=JSON_CT, content=data), 400, code)
    assert json.loads(await read_all(client, path)) == [1]


@pytest.mark.parametrize("data", [b"{oops", DEEP_OBJECT])
async def test_invalid_json_create_creates_nothing(
    client: httpx.AsyncClient, node: Node, path: str, data: bytes
) -> None:
    with node.unchanged():
        error_code(await client.put(path, headers=JSON_CT, content=data), 400, "invalid_json")
    assert (await client.head(path)).status_code == 404


async def test_json_append_of_invalid_utf8_is_400(client: httpx.AsyncClient, node: Node, path: str) -> None:
    await create(client, path, b"[1]", JSON_CT)
    with node.unchanged():
        error_code(await client.post(path, headers=JSON_CT, content=b'"\xff"'), 400, "invalid_json")
    assert json.loads(await read_all(client, path)) == [1]


async def test_text_bodies_are_not_parsed(client: httpx.AsyncClient, path: str) -> None:
    await create(client, path, b"{oops")
    assert (await client.post(path, headers=TEXT, content=b"[]")).status_code == 204
    assert await read_all(client, path) == b"{oops[]"


async def test_empty_create_is_an_empty_stream(client: httpx.AsyncClient, path: str) -> None:
    resp = await client.put(path, headers=TEXT)
    assert resp.status_code == 201
    assert await read_all(client, path) == b""


async def test_empty_append_is_400_and_appends_nothing(client: httpx.AsyncClient, node: Node, path: str) -> None:
    await create(client, path, b"data")
    with node.unchanged():
        error_code(await client.post(path, headers=TEXT), 400, "empty_body")
        error_code(await client.post(path, headers=JSON_CT), 400, "empty_body")
    assert await read_all(client, path) == b"data"


@pytest.mark.parametrize("headers", [{}, TEXT, JSON_CT])
async def test_empty_append_with_stream_closed_closes(
    client: httpx.AsyncClient, path: str, headers: dict[str, str]
) -> None:
    await create(client, path, b"data")
    resp = await client.post(path, headers={**headers, "stream-closed": "true"})
    assert resp.status_code == 204
    assert resp.headers["stream-closed"] == "true"
    assert await read_all(client, path) == b"data"


async def test_append_with_a_body_needs_a_content_type(client: httpx.AsyncClient, node: Node, path: str) -> None:
    await create(client, path, b"data")
    with node.unchanged():
        # httpx adds no Content-Type for raw bytes.
        error_code(await client.post(path, content=b"more"), 400, "missing_content_type")
    assert await read_all(client, path) == b"data"


async def test_the_stores_checks_see_an_accepted_write(client: httpx.AsyncClient, node: Node, path: str) -> None:
    await create(client, path, b"data")
    with pytest.raises(AssertionError, match="changed the stores"), node.unchanged():
        assert (await client.post(path, headers=TEXT, content=b"more")).status_code == 204
    with pytest.raises(AssertionError, match="changed the state"), node.state_unchanged():
        assert (await client.post(path, headers=TEXT, content=b"more")).status_code == 204
