"""HTTP tests for /ds stream append-batch: length-prefixed frames, each its own append.

Every test works on its own streams (unique names) in one module bucket on the session server.
Error responses are checked with `assert_error` ({"error": {"code", "message"}}, application/json);
rejected writes are checked to leave the stream's data and tail unchanged.
"""

from __future__ import annotations

import struct

import httpx
import pytest

from tests.http.ds_helpers import SIXTY_FOUR_MIB, create, declared_only, frames, off, parse_multipart, read, tail
from tests.http.helpers import JSON_CT, TEXT, ZERO, assert_error, uid
from tests.server import RillProcess


@pytest.fixture()
def path(bucket: str) -> str:
    """A fresh, not yet created stream path in the module bucket (not conftest's per-family `path`)."""
    return f"/ds/{bucket}/s-{uid()}"


def test_append_batch_byte_stream(client: httpx.Client, path: str) -> None:
    (start,) = create(client, path)
    resp = client.post(f"{path}/append-batch", headers=TEXT, content=frames(b"alpha", b"be", b"gamma!"))
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == "application/json"
    results = resp.json()
    assert [r["status"] for r in results] == [204, 204, 204]
    assert [r["next_offset"] for r in results] == [off(5), off(7), off(13)]
    assert all("error" not in r for r in results)
    assert start == ZERO
    assert read(client, path).content == b"alphabegamma!"
    assert tail(client, path) == off(13)
    # Each frame is its own append: its own bootstrap part, and a boundary.
    assert [body for _, body in parse_multipart(client.get(f"{path}/bootstrap"))] == [b"", b"alpha", b"be", b"gamma!"]
    assert client.put(f"{path}/snapshot/{off(5)}", content=b"s").status_code == 201


def test_append_batch_json_with_an_invalid_frame(client: httpx.Client, path: str) -> None:
    create(client, path, headers=JSON_CT)
    body = frames(b'{"a": 1}', b"{oops", b"[2, 3]", b'"four"')
    resp = client.post(f"{path}/append-batch", headers=JSON_CT, content=body)
    assert resp.status_code == 200, resp.text
    results = resp.json()
    assert [r["status"] for r in results] == [204, 400, 204, 204]
    assert isinstance(results[1]["error"], str) and results[1]["error"]
    assert "next_offset" not in results[1]
    assert results[0]["next_offset"] < results[2]["next_offset"] < results[3]["next_offset"]
    assert results[3]["next_offset"] == tail(client, path)
    assert read(client, path).json() == [{"a": 1}, 2, 3, "four"]


def test_append_batch_of_1000_frames(client: httpx.Client, path: str) -> None:
    create(client, path)
    resp = client.post(f"{path}/append-batch", headers=TEXT, content=frames(*[b"%04d" % i for i in range(1000)]))
    assert resp.status_code == 200, resp.text
    results = resp.json()
    assert len(results) == 1000
    assert {r["status"] for r in results} == {204}
    assert results[-1]["next_offset"] == off(4000)
    assert read(client, path).content == b"".join(b"%04d" % i for i in range(1000))


MALFORMED_BATCHES = [
    pytest.param(b"", id="empty-body"),
    pytest.param(b"\x00\x00", id="truncated-length"),
    pytest.param(frames(b"ok") + b"\x00\x00\x00", id="truncated-length-after-frame"),
    pytest.param(struct.pack(">I", 10) + b"short", id="short-frame"),
    pytest.param(frames(b"ok") + struct.pack(">I", 3) + b"ab", id="short-last-frame"),
    pytest.param(struct.pack(">I", 0), id="zero-length-frame"),
    pytest.param(frames(b"ok") + struct.pack(">I", 0) + frames(b"ok"), id="zero-length-in-the-middle"),
    pytest.param(frames(*[b"x"] * 1001), id="1001-frames"),
]


@pytest.mark.parametrize("body", MALFORMED_BATCHES)
def test_malformed_append_batch_is_400_and_appends_nothing(client: httpx.Client, path: str, body: bytes) -> None:
    _, before = create(client, path, b"seed")
    assert_error(client.post(f"{path}/append-batch", headers=TEXT, content=body), 400)
    assert tail(client, path) == before
    assert read(client, path).content == b"seed"


def test_append_batch_to_a_closed_stream_fails_per_frame(client: httpx.Client, path: str) -> None:
    _, end = create(client, path, b"final")
    assert client.post(path, headers={"stream-closed": "true"}).status_code == 204
    resp = client.post(f"{path}/append-batch", headers=TEXT, content=frames(b"late", b"later"))
    assert resp.status_code == 200, resp.text
    results = resp.json()
    assert [r["status"] for r in results] == [409, 409]
    assert all(isinstance(r["error"], str) and r["error"] for r in results)
    assert tail(client, path) == end
    assert read(client, path).content == b"final"


def test_append_batch_with_the_wrong_content_type_is_409(client: httpx.Client, path: str) -> None:
    _, end = create(client, path, b"text")
    assert_error(client.post(f"{path}/append-batch", headers=JSON_CT, content=frames(b"1", b"2")), 409)
    assert tail(client, path) == end
    assert read(client, path).content == b"text"


def test_append_batch_over_the_body_limit_is_413(client: httpx.Client, rill: RillProcess, path: str) -> None:
    _, end = create(client, path, b"x")
    assert_error(declared_only(rill, "POST", f"{path}/append-batch", SIXTY_FOUR_MIB + 1, "text/plain"), 413)
    assert tail(client, path) == end
