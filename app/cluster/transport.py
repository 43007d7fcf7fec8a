"""Raft messages between nodes: msgpack batches over HTTP, signed with the cluster secret.

Each peer has one sender task that drains its queue into a single request (on the raw
keep-alive client of app/cluster/http1.py; httpx costs too much CPU per message),
so messages produced together travel together over one keep-alive
connection. Raft tolerates loss, so a full queue drops its oldest messages
(they are resent on later heartbeats) instead of holding memory, and a peer
that is down just costs failed requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
from collections import deque
from collections.abc import AsyncIterator

import msgspec

from app.cluster.http1 import Connection, connect, encode_request
from app.raft.messages import Message

log = logging.getLogger("rill.transport")

PATH = "/_rill/raft"
AUTH_HEADER = "x-rill-signature"
FROM_HEADER = "x-rill-from"
MAX_QUEUED_BYTES = 64 * 1024 * 1024

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[Message])


def sign(secret: bytes, body: bytes) -> str:
    return hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify(secret: bytes, body: bytes, signature: str | None) -> bool:
    return signature is not None and hmac.compare_digest(sign(secret, body), signature)


def decode(body: bytes) -> list[Message]:
    return _decoder.decode(body)


class Transport:
    def __init__(self, node_id: int, peers: dict[int, str], secret: bytes) -> None:
        self.node_id = node_id
        self.secret = secret
        self.peers: dict[int, str] = {}
        self._queues: dict[int, deque[Message]] = {}
        self._bytes: dict[int, int] = {}
        self._ready: dict[int, asyncio.Event] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self.set_peers(peers)

    def set_peers(self, peers: dict[int, str]) -> None:
        """Follows a membership change: senders for new nodes, none for removed ones."""
        wanted = {pid: url.rstrip("/") for pid, url in peers.items() if pid != self.node_id and url}
        for pid in [p for p in self.peers if wanted.get(p) != self.peers[p]]:
            self._tasks.pop(pid).cancel()
            del self.peers[pid], self._queues[pid], self._bytes[pid], self._ready[pid]
        for pid, url in wanted.items():
            if pid not in self.peers:
                self.peers[pid] = url
                self._queues[pid], self._bytes[pid], self._ready[pid] = deque(), 0, asyncio.Event()
                self._tasks[pid] = asyncio.create_task(self._sender(pid))

    async def send(self, messages: list[Message]) -> None:
        for msg in messages:
            queue = self._queues.get(msg.dst)
            if queue is None:
                continue
            queue.append(msg)
            self._bytes[msg.dst] += _size(msg)
            while self._bytes[msg.dst] > MAX_QUEUED_BYTES and len(queue) > 1:
                self._bytes[msg.dst] -= _size(queue.popleft())
            self._ready[msg.dst].set()

    async def _sender(self, peer: int) -> None:
        url = self.peers[peer] + PATH
        queue = self._queues[peer]
        conn: Connection | None = None
        while True:
            await self._ready[peer].wait()
            self._ready[peer].clear()
            batch = list(queue)
            queue.clear()
            self._bytes[peer] = 0
            if not batch:
                continue
            body = _encoder.encode(batch)
            headers = {AUTH_HEADER: sign(self.secret, body), FROM_HEADER: str(self.node_id)}
            try:
                if conn is None:
                    conn = await asyncio.wait_for(connect(url), 2.0)
                await asyncio.wait_for(conn.request(encode_request("POST", url, headers, body)), 2.0)
            except Exception as exc:  # noqa: BLE001 - whatever went wrong, this sender must live on
                log.debug("raft messages to node %s lost: %r", peer, exc)
                if conn is not None:
                    conn.close()
                conn = None

    async def stream(self, peer: int, path: str, bodies: AsyncIterator[bytes], timeout: float = 60.0) -> bool:
        """POSTs each body in turn on one connection, the next only after a 204; False on any failure."""
        base = self.peers.get(peer)
        if base is None:
            return False
        url = base + path
        conn: Connection | None = None
        try:
            conn = await asyncio.wait_for(connect(url), 2.0)
            async for body in bodies:
                headers = {AUTH_HEADER: sign(self.secret, body), FROM_HEADER: str(self.node_id)}
                status, _ = await asyncio.wait_for(conn.request(encode_request("POST", url, headers, body)), timeout)
                if status != 204:
                    return False
            return True
        except Exception as exc:  # noqa: BLE001 - a failed stream is retried by the caller
            log.info("stream to node %s failed: %r", peer, exc)
            return False
        finally:
            if conn is not None:
                conn.close()

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


def _size(msg: Message) -> int:
    entries = getattr(msg, "entries", None)
    return 64 + (sum(len(e.data) + 24 for e in entries) if entries else 0)
