"""app/protocol/append_batch.py: framing, and `POST /ds/{bucket}/{stream}/append-batch` end to end."""

from __future__ import annotations

import json
import struct

import httpx
import pytest

from app.protocol.append_batch import MAX_FRAMES, split_frames
from tests.inprocess import Node
from tests.protocol.helpers import BINARY, JSON_CT, LIMIT, TEXT, create, error_code, off, raises, read_all

pytestmark = pytest.mark.anyio


def frames(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


@pytest.mark.parametrize(
    "payloads", [[b"a"], [b"bb", b"ccc"], [b"\x00\x00\x00\x00"], [b"x" * 70000], [b"x"] * MAX_FRAMES]
)
def test_split_frames_gives_back_each_payload(payloads: list[bytes]) -> None:
    assert split_frames(frames(*payloads)) == payloads


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "the batch holds no frames"),
        (b"\x00", "a frame's 4-byte length is cut short"),
        (frames(b"x") + b"\x00\x00\x00", "a frame's 4-byte length is cut short"),
        (b"\x00\x00\x00\x00", "frames may not be empty"),
        (frames(b"x") + b"\x00\x00\x00\x00", "frames may not be empty"),
        (b"\x00\x00\x00\x05abc", "a frame is shorter than its length says"),
        (frames(b"x")[:-1], "a frame is shorter than its length says"),
        (b"\xff\xff\xff\xffabc", "a frame is shorter than its length says"),
    ],
)
def test_split_frames_rejects_bad_framing(data: bytes, message: str) -> None:
    with raises(400, "invalid_framing") as exc:
        split_frames(data)
    assert exc.value.message == message


@pytest.mark.parametrize("tail", [b"", b"\x00"], ids=["exact", "then-garbage"])
def test_split_frames_refuses_frame_1001_as_it_reads_it(tail: bytes) -> None:
    with raises(400, "too_many_frames") as exc:
        split_frames(frames(*[b"x"] * (MAX_FRAMES + 1)) + tail)
    assert exc.value.message == "at most 1000 frames per batch"


@pytest.fixture()
async def stream(client: httpx.AsyncClient, bucket: str) -> str:
    """A text stream holding "a"."""
    path = f"/ds/{bucket}/s"
    await create(client, path, b"a")
    return path


async def batch(
    client: httpx.AsyncClient, path: str, data: bytes, headers: dict[str, str] | None = None
) -> httpx.Response:
    return await client.post(f"{path}/append-batch", content=data, headers=headers or {})


async def test_each_frame_is_its_own_append(client: httpx.AsyncClient, stream: str) -> None:
    resp = await batch(client, stream, frames(b"bb", b"ccc"), TEXT)
    assert resp.status_code == 200
    assert (resp.headers["content-type"], resp.headers["cache-control"]) == ("application/json", "no-store")
    assert resp.json() == [{"status": 204, "next_offset": off(3)}, {"status": 204, "next_offset": off(6)}]
    assert await read_all(client, stream) == b"abbccc"
    assert (await client.head(stream)).headers["stream-next-offset"] == off(6)


@pytest.mark.parametrize("headers", [{}, {"content-type": "TEXT/PLAIN; charset=utf-8"}], ids=["absent", "same-type"])
async def test_content_type_may_be_absent_or_match_with_parameters(
    client: httpx.AsyncClient, stream: str, headers: dict[str, str]
) -> None:
    assert (await batch(client, stream, frames(b"b"), headers)).json() == [{"status": 204, "next_offset": off(2)}]
    assert await read_all(client, stream) == b"ab"


async def test_maximum_number_of_frames_is_accepted(client: httpx.AsyncClient, stream: str) -> None:
    results = (await batch(client, stream, frames(*[b"x"] * MAX_FRAMES))).json()
    assert len(results) == MAX_FRAMES
    assert results[-1] == {"status": 204, "next_offset": off(1 + MAX_FRAMES)}


@pytest.mark.parametrize(
    ("data", "headers", "status", "code"),
    [
        (b"", {}, 400, "invalid_framing"),
        (frames(b"x") + b"\x00\x00", {}, 400, "invalid_framing"),
        (frames(b"x", b""), {}, 400, "invalid_framing"),
        (frames(*[b"x"] * (MAX_FRAMES + 1)), {}, 400, "too_many_frames"),
        (frames(b"x"), BINARY, 409, "content_type_mismatch"),
        (frames(b"x"), JSON_CT, 409, "content_type_mismatch"),
        (frames(b"x" * LIMIT), {}, 413, "payload_too_large"),
        (frames(b"x"), {"producer-id": "p", "producer-epoch": "0", "producer-seq": "0"}, 400, "unsupported_header"),
        (frames(b"x"), {"stream-seq": "5"}, 400, "unsupported_header"),
        (frames(b"x"), {"stream-closed": "true"}, 400, "unsupported_header"),
    ],
)
async def test_rejected_batch_appends_nothing(
    client: httpx.AsyncClient,
    node: Node,
    stream: str,
    data: bytes,
    headers: dict[str, str],
    status: int,
    code: str,
) -> None:
    with node.unchanged():
        error_code(await batch(client, stream, data, headers), status, code)
    assert await read_all(client, stream) == b"a"


async def test_framing_is_checked_before_the_stream(client: httpx.AsyncClient, bucket: str) -> None:
    error_code(await batch(client, f"/ds/{bucket}/missing", b"\x00"), 400, "invalid_framing")
    error_code(await batch(client, f"/ds/{bucket}/missing", frames(b"x")), 404, "stream_not_found")
    error_code(await batch(client, "/ds/no-such-bucket/s", frames(b"x")), 404, "bucket_not_found")


async def test_json_frames_fail_one_by_one(client: httpx.AsyncClient, bucket: str) -> None:
    path = f"/ds/{bucket}/j"
    await create(client, path, b"[]", JSON_CT)
    data = frames(b'{"a": 1}', b"{oops", b"[2, 3]", b"[]", b" 4 ")
    results = (await batch(client, path, data, JSON_CT)).json()
    assert results == [
        {"status": 204, "next_offset": off(8)},
        {"status": 400, "error": "invalid_json"},
        {"status": 204, "next_offset": off(12)},  # offsets count stored bytes: the array is stored as "2, 3"
        {"status": 400, "error": "empty_json_array"},
        {"status": 204, "next_offset": off(13)},
    ]
    assert json.loads(await read_all(client, path)) == [{"a": 1}, 2, 3, 4]


async def test_json_batch_of_only_bad_frames_appends_nothing(
    client: httpx.AsyncClient, node: Node, bucket: str
) -> None:
    path = f"/ds/{bucket}/j"
    await create(client, path, b"[1]", JSON_CT)
    with node.unchanged():
        resp = await batch(client, path, frames(b"{oops", b"[]"))
    assert resp.json() == [{"status": 400, "error": "invalid_json"}, {"status": 400, "error": "empty_json_array"}]
    assert json.loads(await read_all(client, path)) == [1]


async def test_text_frames_are_not_parsed_as_json(client: httpx.AsyncClient, stream: str) -> None:
    assert [r["status"] for r in (await batch(client, stream, frames(b"{oops", b"[]"))).json()] == [204, 204]
    assert await read_all(client, stream) == b"a{oops[]"


async def test_closed_stream_fails_every_frame(client: httpx.AsyncClient, node: Node, stream: str) -> None:
    assert (await client.post(stream, headers={"stream-closed": "true"})).status_code == 204
    with node.state_unchanged():
        resp = await batch(client, stream, frames(b"late", b"later"), TEXT)
    assert resp.status_code == 200
    assert resp.json() == [{"status": 409, "error": "stream_closed", "next_offset": off(1)}] * 2
    assert await read_all(client, stream) == b"a"


async def test_soft_deleted_stream_is_410(client: httpx.AsyncClient, node: Node, bucket: str, stream: str) -> None:
    await create(client, f"/ds/{bucket}/fork", headers={"stream-forked-from": stream})
    assert (await client.delete(stream)).status_code == 204
    with node.unchanged():
        error_code(await batch(client, stream, frames(b"x")), 410, "stream_gone")


async def test_only_post_and_options(client: httpx.AsyncClient, stream: str) -> None:
    options = await client.options(f"{stream}/append-batch")
    assert (options.status_code, options.headers["allow"]) == (204, "POST, OPTIONS")
    for method in ("GET", "PUT", "DELETE"):
        resp = await client.request(method, f"{stream}/append-batch")
        error_code(resp, 405, "method_not_allowed")
        assert resp.headers["allow"] == "POST, OPTIONS"
