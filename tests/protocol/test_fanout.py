"""The SSE fan-out, in process: a batch is rendered once and the same bytes go to every subscriber;
without the server's direct writes, events go through ASGI `send` and still arrive once each."""

from __future__ import annotations

import asyncio
import base64
import re
from pathlib import Path
from typing import Any

import pytest

from app.domain.errors import LeaderOnly
from app.protocol import fanout
from app.service.engine import Engine
from app.serving.cycle import EXTENSION
from app.state_machine.records import StreamMeta
from tests.inprocess import client_for, running_node

pytestmark = pytest.mark.anyio

OCTET = {"content-type": "application/octet-stream"}


class FakeWriter:
    """Stands in for app/serving/cycle.py's direct writes: records what is written to the socket."""

    def __init__(self) -> None:
        self.ready = False
        self.closed = False
        self.written: list[bytes] = []

    def offer(self, framed: bytes, limit: int) -> bool:
        if self.closed:
            return False
        self.written.append(framed)
        return True


class Subscription:
    def __init__(self, app: Any, path: str, writer: FakeWriter | None) -> None:
        self.writer = writer
        self.sent: list[dict[str, Any]] = []
        self.gone = asyncio.Event()
        self.started = asyncio.Event()
        extensions = {EXTENSION: writer} if writer is not None else {}
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"offset=now&live=sse",
            "headers": [(b"host", b"rill.test")],
            "client": ("127.0.0.1", 1),
            "server": ("rill.test", 80),
            "extensions": extensions,
        }
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))
        self._asked = False

    async def _receive(self) -> dict[str, Any]:
        if not self._asked:
            self._asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.start" and self.writer is not None:
            self.writer.ready = True
        if message["type"] == "http.response.body" and message.get("body"):
            self.started.set()

    def text(self) -> bytes:
        framed = b"".join(self.writer.written) if self.writer is not None else b""
        chunks = re.findall(rb"[0-9a-f]+\r\n(.*?)\r\n", framed, re.S)
        return b"".join(m.get("body", b"") for m in self.sent[1:]) + b"".join(chunks)


def payloads(stream: bytes) -> bytes:
    return b"".join(base64.b64decode(d) for d in re.findall(rb"event: data\ndata:(.*)\n", stream))


async def test_a_batch_is_rendered_once_for_every_subscriber(tmp_path: Path, monkeypatch) -> None:
    rendered = 0
    original = fanout.data_event

    def counting(payload: bytes, binary: bool) -> bytes:
        nonlocal rendered
        rendered += 1
        return original(payload, binary)

    monkeypatch.setattr(fanout, "data_event", counting)
    async with running_node(tmp_path) as node, client_for(node) as client:
        assert (await client.put("/v1/stream/s", headers=OCTET)).status_code == 201
        subs = [Subscription(node.app, "/v1/stream/s", FakeWriter()) for _ in range(30)]
        await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in subs)), 10)
        assert (await client.post("/v1/stream/s", content=b"hello", headers=OCTET)).status_code == 204
        for _ in range(100):
            if all(s.writer and s.writer.written for s in subs):
                break
            await asyncio.sleep(0.01)
        assert rendered == 1
        first = subs[0].writer.written[0]  # type: ignore[union-attr]
        assert all(s.writer.written == [first] and s.writer.written[0] is first for s in subs)  # type: ignore[union-attr]
        assert payloads(subs[0].text()) == b"hello"
        assert b'"upToDate":true' in first
        for s in subs:
            s.gone.set()
        await asyncio.wait_for(asyncio.gather(*(s.task for s in subs)), 10)


async def test_without_direct_writes_events_go_through_send(tmp_path: Path) -> None:
    async with running_node(tmp_path) as node, client_for(node) as client:
        assert (await client.put("/v1/stream/q", headers=OCTET)).status_code == 201
        subs = [Subscription(node.app, "/v1/stream/q", None) for _ in range(5)]
        await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in subs)), 10)
        for word in (b"one", b"two", b"three"):
            assert (await client.post("/v1/stream/q", content=word, headers=OCTET)).status_code == 204
        assert (await client.post("/v1/stream/q", headers={"stream-closed": "true"})).status_code == 204
        await asyncio.wait_for(asyncio.gather(*(s.task for s in subs)), 10)
        for s in subs:
            assert payloads(s.text()) == b"onetwothree"
            assert s.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
            assert b'"streamClosed":true' in s.text()


async def test_deleting_the_stream_ends_its_subscribers(tmp_path: Path) -> None:
    async with running_node(tmp_path) as node, client_for(node) as client:
        assert (await client.put("/v1/stream/d", headers=OCTET)).status_code == 201
        subs = [Subscription(node.app, "/v1/stream/d", FakeWriter()) for _ in range(3)]
        subs.append(Subscription(node.app, "/v1/stream/d", None))
        await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in subs)), 10)
        assert (await client.delete("/v1/stream/d")).status_code == 204
        await asyncio.wait_for(asyncio.gather(*(s.task for s in subs)), 10)
        for s in subs:
            assert s.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


async def test_json_batches_are_shared_as_arrays(tmp_path: Path) -> None:
    async with running_node(tmp_path) as node, client_for(node) as client:
        headers = {"content-type": "application/json"}
        assert (await client.put("/v1/stream/j", headers=headers)).status_code == 201
        subs = [Subscription(node.app, "/v1/stream/j", FakeWriter()) for _ in range(4)]
        await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in subs)), 10)
        assert (await client.post("/v1/stream/j", content=b'[{"a":1},{"b":2}]', headers=headers)).is_success
        for _ in range(100):
            if all(s.writer and s.writer.written for s in subs):
                break
            await asyncio.sleep(0.01)
        texts = {s.text() for s in subs}
        assert len(texts) == 1
        assert b'event: data\ndata:[{"a":1},{"b":2}]\n' in texts.pop()
        for s in subs:
            s.gone.set()
        await asyncio.wait_for(asyncio.gather(*(s.task for s in subs)), 10)


async def test_a_stream_whose_fan_out_fails_lets_its_readers_read_on_their_own(tmp_path: Path, monkeypatch) -> None:
    """An error in one stream's fan-out once left its readers (and the streams after it in the same
    pass) waiting, silent, until the SSE time limit."""
    original, failed = fanout.data_event, []

    def failing_once(payload: bytes, binary: bool) -> bytes:
        if not failed:
            failed.append(payload)
            raise RuntimeError("a bug in rendering")
        return original(payload, binary)

    monkeypatch.setattr(fanout, "data_event", failing_once)
    async with running_node(tmp_path) as node, client_for(node) as client:
        for name in ("a", "b"):
            assert (await client.put(f"/v1/stream/{name}", headers=OCTET)).status_code == 201
        subs = {name: [Subscription(node.app, f"/v1/stream/{name}", FakeWriter()) for _ in range(3)] for name in "ab"}
        everyone = subs["a"] + subs["b"]
        await asyncio.wait_for(asyncio.gather(*(s.started.wait() for s in everyone)), 10)
        for name in "ab":
            assert (
                await client.post(f"/v1/stream/{name}", content=b"hello " + name.encode(), headers=OCTET)
            ).status_code == 204
        for _ in range(300):
            if all(payloads(s.text()) == b"hello " + name.encode() for name in "ab" for s in subs[name]):
                break
            await asyncio.sleep(0.01)
        assert failed
        for name in "ab":
            assert [payloads(s.text()) for s in subs[name]] == [b"hello " + name.encode()] * 3
        for s in everyone:
            s.gone.set()
        await asyncio.wait_for(asyncio.gather(*(s.task for s in everyone)), 10)


async def test_a_stream_moving_to_the_leader_only_mid_response_ends_it_cleanly(tmp_path: Path, monkeypatch) -> None:
    # A leader stepping down mid-SSE on a TTL stream (served by the leader alone) raised LeaderOnly
    # out of a response already started: the route then tried to answer a redirect on it.
    async with running_node(tmp_path) as node, client_for(node) as client:
        assert (await client.put("/v1/stream/l", headers=OCTET)).status_code == 201
        sub = Subscription(node.app, "/v1/stream/l", None)
        await asyncio.wait_for(sub.started.wait(), 10)
        find = Engine.find

        def leader_only(engine: Engine, bucket: str, name: str) -> StreamMeta:
            if name == "l" and asyncio.current_task() is sub.task:
                raise LeaderOnly()
            return find(engine, bucket, name)

        monkeypatch.setattr(Engine, "find", leader_only)

        def failing(payload: bytes, binary: bool) -> bytes:
            raise RuntimeError("the feed lets its readers go: they read on their own, and look the stream up")

        monkeypatch.setattr(fanout, "data_event", failing)
        assert (await client.post("/v1/stream/l", headers=OCTET, content=b"x")).status_code == 204
        await asyncio.wait_for(sub.task, 10)
        assert sub.sent[0]["status"] == 200
        assert sub.sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
