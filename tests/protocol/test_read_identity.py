"""A live read is of the stream it opened: one deleted and made again under its name while the read
waits or catches up is another stream, whose bytes it must not hand out at the old offset."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.service.signals import Signals
from tests.inprocess import client_for, running_node

pytestmark = pytest.mark.anyio

TEXT = {"content-type": "text/plain"}


def _scope(query: bytes) -> dict[str, Any]:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": "/v1/stream/s", "raw_path": b"/v1/stream/s", "query_string": query, "root_path": "",
        "headers": [(b"host", b"rill.test")], "client": ("127.0.0.1", 5000), "server": ("rill.test", 80),
    }  # fmt: skip


async def test_an_sse_reader_catching_up_stops_when_its_stream_is_made_again(tmp_path: Path) -> None:
    async with running_node(tmp_path, read_chunk_bytes=1024) as node, client_for(node) as c:
        await c.put("/v1/stream/s", headers=TEXT)
        await c.post("/v1/stream/s", content=b"A" * 3000, headers=TEXT)
        slow, sent = asyncio.Event(), []

        async def receive() -> dict[str, Any]:
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body" and message.get("body"):
                sent.append(message["body"])
                if len(sent) == 1:
                    await slow.wait()  # a slow client: its first chunk is still being written

        reader = asyncio.create_task(node.app(_scope(b"offset=-1&live=sse"), receive, send))
        while not sent:
            await asyncio.sleep(0.01)
        assert (await c.delete("/v1/stream/s")).status_code == 204
        assert (await c.put("/v1/stream/s", headers=TEXT)).status_code == 201
        assert (await c.post("/v1/stream/s", content=b"B" * 3000, headers=TEXT)).status_code == 204
        slow.set()
        await asyncio.wait_for(reader, 5)  # the response ends
        assert b"A" in sent[0] and not any(b"B" in event for event in sent)


async def test_a_long_poll_woken_by_the_delete_does_not_read_the_stream_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    woken, resume = asyncio.Event(), asyncio.Event()
    wait = Signals.wait

    async def late(self: Signals, *args: Any) -> None:
        await wait(self, *args)
        woken.set()
        await resume.wait()  # the woken read runs only after the stream is made again

    monkeypatch.setattr(Signals, "wait", late)
    async with running_node(tmp_path) as node, client_for(node) as c:
        await c.put("/v1/stream/s", headers=TEXT)
        await c.post("/v1/stream/s", content=b"AAAA", headers=TEXT)
        tail = "0000000000000000_0000000000000004"
        poll = asyncio.create_task(c.get("/v1/stream/s", params={"offset": tail, "live": "long-poll"}))
        await asyncio.sleep(0.1)
        assert (await c.delete("/v1/stream/s")).status_code == 204
        await asyncio.wait_for(woken.wait(), 5)
        # Made again, longer: the poll's offset now lies inside another stream's data.
        assert (await c.put("/v1/stream/s", headers=TEXT, content=b"BBBBBBBB")).status_code == 201
        resume.set()
        response = await asyncio.wait_for(poll, 5)
        assert b"B" not in response.content
        assert response.status_code in (204, 404), response.status_code
