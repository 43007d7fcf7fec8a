"""Raft messages between nodes: msgpack batches over HTTP, each request signed with the cluster secret.

Each peer has one sender task that drains its queue into requests of about `BATCH_BYTES` (on the raw
keep-alive client of app/cluster/peer_client.py; httpx costs too much CPU per message),
so messages produced together travel together over one keep-alive
connection. Raft tolerates loss, so a full queue drops its oldest messages
(they are resent on later heartbeats) instead of holding memory, and a peer
that is down just costs failed requests.

A request's `x-rill-signature` header carries the time it was signed, the sending and the receiving
node, a nonce, the SHA-256 of the body, and an HMAC-SHA256 (cluster secret) over all of them and the
path. The receiver (`Verifier`) checks the header before it reads any body: a request addressed to
another node, signed more than `WINDOW_SECONDS` away from its clock, not signed with the secret, or
seen before (every MAC accepted within the window is remembered) is refused. Only then is the body
read, up to a cap, and compared with the signed digest. A captured message therefore cannot be
replayed, sent to another node, or reused on another route or with another body.

Replies ride back on the response. A sender asks for them (`x-rill-replies: 1`); the receiver,
once it has stepped a batch that calls for an answer (entries to append, a vote to give), waits a
moment (`REPLY_WAIT`) for the messages its node then addresses to the sender (the acknowledgement,
which follows the sync) and returns them as the response's body, signed as above for `REPLY_PATH`,
so a reply can never pass as a request. What is not ready in time, or would take a reply past
`BATCH_BYTES`, goes by the node's own sender; a sender therefore takes at most `REPLY_CAP` in a reply.
Under load each peer then costs one request per round instead of two, and a round's wait for the
follower's sync lets the next batch grow meanwhile.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import re
import secrets
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import msgspec

from app.cluster import wire
from app.cluster.accepted_channels import AcceptedChannels
from app.cluster.channel import ChannelError, Hello, welcome
from app.cluster.peer_channel import SLOW_PEER_BYTES_PER_SECOND, Inbound, Outbound, Refused, welcome_head
from app.cluster.peer_client import Connection, ConnectionClosed, connect, encode_head, encode_request
from app.domain.errors import ProtocolError
from app.domain.paths import RAFT_PATH
from app.raft.messages import AppendEntries, Message, RequestVote

log = logging.getLogger("rill.transport")

PATH = RAFT_PATH
CHANNEL_PATH = RAFT_PATH  # a GET with `Upgrade: rill-raft-1` on the same path opens a channel
HTTP_FALLBACK_SECONDS = 30.0
# Channels in a row the peer accepted but that ended before it acknowledged anything (displaced by
# others asking in its name, say): HTTP for a while. A peer that cannot be reached at all is not counted.
MAX_FAILED_DIALS = 3
REPLY_PATH = PATH + "#reply"  # what a reply's signature names
AUTH_HEADER = "x-rill-signature"
REPLIES_HEADER = "x-rill-replies"
REPLY_WAIT = 0.25  # seconds a receiver holds a response for its node's replies
REQUEST_SECONDS = 2.0  # a request's answer is given up on after this, plus its size at the rate below
MAX_QUEUED_BYTES = 64 * 1024 * 1024
BATCH_BYTES = 4 * 1024 * 1024  # a request packs messages up to about this much; a bigger message goes alone
SEND_NOW_BYTES = 64 * 1024  # a message written straight to an idle channel is at most this large
WINDOW_SECONDS = 5.0  # a signature is accepted this long before and after the receiver's clock
MAX_REMEMBERED = 500_000  # MACs held for replay detection (8 bytes each plus a set slot: tens of MB at most)
BODY_SLACK = 8 * 1024 * 1024  # what a request may carry beyond its largest entry or record
REPLY_CAP = BATCH_BYTES + BODY_SLACK  # replies are held to BATCH_BYTES by estimate (`_size`), this on the wire
CONNECT_SECONDS = 2.0

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(list[Message])
_SIGNATURE = re.compile(
    r"v1 ts=(?P<ts>\d{1,16}) src=(?P<src>\d{1,19}) dst=(?P<dst>\d{1,19}) nonce=(?P<nonce>[0-9a-f]{16})"
    r" sha256=(?P<digest>[0-9a-f]{64}) mac=(?P<mac>[0-9a-f]{64})"
)


class Signature(NamedTuple):
    ts: int  # ms since the epoch, the sender's clock
    src: int
    dst: int
    nonce: str
    digest: str  # hex SHA-256 of the body
    mac: str


def _mac(secret: bytes, ts: int, src: int, dst: int, nonce: str, path: str, digest: str) -> str:
    signed = f"rill-signature-v1\n{ts}\n{src}\n{dst}\n{nonce}\n{path}\n{digest}".encode()
    return hmac.new(secret, signed, hashlib.sha256).hexdigest()


def sign(secret: bytes, src: int, dst: int, path: str, body: bytes, now_ms: int | None = None) -> str:
    """The signature header for `body` posted to `path` on node `dst`."""
    return sign_digest(secret, src, dst, path, hashlib.sha256(body).hexdigest(), now_ms)


def sign_digest(secret: bytes, src: int, dst: int, path: str, digest: str, now_ms: int | None = None) -> str:
    """The same, given the body's hex SHA-256 (of a body sent in pieces)."""
    ts = int(time.time() * 1000) if now_ms is None else now_ms
    nonce = secrets.token_hex(8)
    mac = _mac(secret, ts, src, dst, nonce, path, digest)
    return f"v1 ts={ts} src={src} dst={dst} nonce={nonce} sha256={digest} mac={mac}"


def parse(header: str | None) -> Signature | None:
    match = _SIGNATURE.fullmatch(header.strip()) if header else None
    if match is None:
        return None
    g = match.groupdict()
    return Signature(int(g["ts"]), int(g["src"]), int(g["dst"]), g["nonce"], g["digest"], g["mac"])


def message_cap(largest_entry: int) -> int:
    """The largest body a signed request may carry: a batch, or one message holding the largest entry."""
    return max(BATCH_BYTES, largest_entry) + BODY_SLACK


def _forbidden(message: str) -> ProtocolError:
    return ProtocolError(403, "forbidden", message)


class Verifier:
    """Checks signature headers on the receiving node; remembers accepted MACs to refuse replays."""

    def __init__(
        self,
        secret: bytes,
        node_id: int,
        window: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.time,
        capacity: int = MAX_REMEMBERED,
    ) -> None:
        self.secret = secret
        self.node_id = node_id
        self.window_ms = max(1, int(window * 1000))
        self.clock = clock
        self.capacity = capacity
        # MACs (their first 8 bytes) by the window-sized slice of time their timestamp falls in:
        # a whole slice is forgotten once every timestamp in it is outside the window.
        self._seen: dict[int, set[int]] = {}
        self._count = 0
        self._warned = 0

    def check(self, header: str | None, path: str) -> Signature:
        """The request's signature, if it may be read; raises a 403 (or 409 for a replay) otherwise."""
        sig = parse(header)
        if sig is None:
            raise _forbidden(f"not a signed message from this cluster (no valid {AUTH_HEADER} header)")
        if not self.secret:
            raise _forbidden("this node has no cluster secret")
        if sig.dst != self.node_id:
            raise _forbidden(f"the message is addressed to node {sig.dst}, not to this node ({self.node_id})")
        now = int(self.clock() * 1000)
        expected = _mac(self.secret, sig.ts, sig.src, sig.dst, sig.nonce, path, sig.digest)
        if not hmac.compare_digest(expected, sig.mac):
            raise _forbidden("not a signed message from this cluster")
        if abs(now - sig.ts) > self.window_ms:
            if now - self._warned > 10_000:  # a peer's clock is off (or a replay): say so, but not per message
                self._warned = now
                log.warning("refused a message node %s signed %+d ms from this node's clock", sig.src, sig.ts - now)
            raise _forbidden(f"the signature is {abs(now - sig.ts)} ms away from this node's clock")
        self._remember(sig, now)
        return sig

    def _remember(self, sig: Signature, now: int) -> None:
        for old in [s for s in self._seen if (s + 1) * self.window_ms + self.window_ms < now]:
            self._count -= len(self._seen.pop(old))
        key = int(sig.mac[:16], 16)
        seen = self._seen.setdefault(sig.ts // self.window_ms, set())
        if key in seen:
            raise ProtocolError(409, "replayed", "this signed message was already received")
        if self._count >= self.capacity:
            raise ProtocolError(503, "retry", "too many messages within the signature window", {"retry-after": "1"})
        seen.add(key)
        self._count += 1

    @staticmethod
    def body_matches(sig: Signature, digest: str) -> bool:
        return hmac.compare_digest(sig.digest, digest)


def decode(body: bytes) -> list[Message]:
    return _decoder.decode(body)


class Transport:
    """One sender task per peer, started by `start`. With a `verifier` and `deliver`, peers are asked
    for replies on their responses, checked with `verifier` and handed to `deliver`."""

    def __init__(
        self,
        node_id: int,
        peers: dict[int, str],
        secret: bytes,
        tls: ssl.SSLContext | None = None,
        routes: dict[int, str] | None = None,
        verifier: Verifier | None = None,
        deliver: Callable[[Message], None] | None = None,
        channels: bool = False,
    ) -> None:
        self.node_id = node_id
        self.channels = channels  # send over framed channels (app/cluster/peer_channel.py), HTTP where refused
        self._outbound: dict[int, Outbound] = {}
        self._http_until: dict[int, float] = {}  # peers that refused a channel: HTTP until then (monotonic)
        self._accepted = AcceptedChannels(node_id)
        self._failed_dials: dict[int, int] = {}
        self.routes = dict(routes or {})  # peers dialed elsewhere than their member URL (a proxy in between)
        self.secret = secret
        self.tls = tls  # for https:// peers
        self.peers: dict[int, str] = {}
        self._queues: dict[int, deque[Message]] = {}
        self._bytes: dict[int, int] = {}
        self._ready: dict[int, asyncio.Event] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._held: dict[int, _Held] = {}  # peers whose request is held open for replies
        self._verifier = verifier
        self._deliver = deliver
        self._started = False
        self.set_peers(peers)

    def start(self) -> None:
        """Starts a sender for each peer (on the running loop); later peers get theirs as they join."""
        self._started = True
        for pid in self.peers:
            if pid not in self._tasks:
                self._tasks[pid] = asyncio.create_task(self._sender(pid))

    def set_peers(self, peers: dict[int, str]) -> None:
        """Follows a membership change: senders for new nodes, none for removed ones."""
        wanted = {
            pid: self.routes.get(pid, url).rstrip("/") for pid, url in peers.items() if pid != self.node_id and url
        }
        for pid in [p for p in self.peers if wanted.get(p) != self.peers[p]]:
            task = self._tasks.pop(pid, None)
            if task is not None:
                task.cancel()
            out = self._outbound.pop(pid, None)
            if out is not None:
                out.close()
            self._accepted.drop(pid)
            del self.peers[pid], self._queues[pid], self._bytes[pid], self._ready[pid]
            self._http_until.pop(pid, None)  # what the old address refused says nothing of a new one
            self._failed_dials.pop(pid, None)
        for pid, url in wanted.items():
            if pid not in self.peers:
                self.peers[pid] = url
                self._queues[pid], self._bytes[pid], self._ready[pid] = deque(), 0, asyncio.Event()
                if self._started:
                    self._tasks[pid] = asyncio.create_task(self._sender(pid))

    async def send(self, messages: list[Message]) -> None:
        now: dict[int, tuple[list[Message], int]] = {}  # peers whose channel takes them at once, and their size
        for msg in messages:
            size = _size(msg)
            held = self._held.get(msg.dst)
            if held is not None and held.size + size <= BATCH_BYTES:
                held.add(msg)
                continue
            queue = self._queues.get(msg.dst)
            if queue is None:
                continue
            if not queue and (msg.dst in now or self._idle_channel(msg.dst)):
                batch, taken = now.get(msg.dst, ([], 0))
                if taken + size <= SEND_NOW_BYTES:
                    batch.append(msg)
                    now[msg.dst] = (batch, taken + size)
                    continue
            queue.append(msg)
            self._bytes[msg.dst] += size
            while self._bytes[msg.dst] > MAX_QUEUED_BYTES and len(queue) > 1:
                self._bytes[msg.dst] -= _size(queue.popleft())
            self._ready[msg.dst].set()
        for peer, (batch, _) in now.items():
            self._outbound[peer].send(wire.encode_pieces(batch))

    def _idle_channel(self, peer: int) -> bool:
        """Whether `peer`'s channel is open with nothing of this node's waiting to go out on it: a message
        written now goes ahead of whatever else this loop iteration runs (the sender task would wait for
        it: on a follower, for the apply of what the leader's message committed)."""
        out = self._outbound.get(peer)
        return out is not None and out.idle and out.is_open

    async def _sender(self, peer: int) -> None:
        url = self.peers[peer] + PATH
        queue = self._queues[peer]
        conn: Connection | None = None
        while True:
            await self._ready[peer].wait()
            self._ready[peer].clear()
            batch: list[Message] = []
            size = 0
            while queue and (not batch or size + _size(queue[0]) <= BATCH_BYTES):
                msg = queue.popleft()
                batch.append(msg)
                size += _size(msg)
            self._bytes[peer] -= size
            if queue:
                self._ready[peer].set()  # the rest goes in the next request
            if not batch:
                continue
            pieces = wire.encode_pieces(batch)  # a large entry's data is sent from where it is, not copied
            length = wire.size(pieces)
            if self.channels and time.monotonic() >= self._http_until.get(peer, 0.0):
                try:
                    if await self._send_on_channel(peer, pieces, length):
                        continue
                except Exception:  # a bug here must not end this peer's sender (it did, once: see the chaos note)
                    log.exception("raft channel to node %s failed", peer)
                    continue
            headers = {AUTH_HEADER: sign_digest(self.secret, self.node_id, peer, PATH, wire.sha256_hex(pieces))}
            if self._deliver is not None:
                headers[REPLIES_HEADER] = "1"
            head = encode_head("POST", url, headers, length)
            timeout = REQUEST_SECONDS + length / SLOW_PEER_BYTES_PER_SECOND
            # The peer closes a connection left idle past its keep-alive timeout. A closed one is
            # replaced before use, and a request that fails on a reused one (closed meanwhile) is sent
            # once more on a fresh one: Raft takes a message twice as well as once, but a lost ReadIndex
            # would leave a read waiting.
            for _ in range(2):
                reused = conn is not None and conn.is_open
                try:
                    if not reused:
                        if conn is not None:
                            conn.close()
                        conn = await connect(url, self.tls, CONNECT_SECONDS, REPLY_CAP)
                    assert conn is not None
                    response = await conn.send_pieces(head, pieces, timeout)
                    if response.status == 200 and response.body:
                        self._take_reply(peer, response.header(AUTH_HEADER), response.body)
                    break
                except Exception as exc:  # noqa: BLE001 - whatever went wrong, this sender must live on
                    if conn is not None:
                        conn.close()
                    conn = None
                    if not reused or not isinstance(exc, ConnectionClosed | OSError):
                        log.debug("raft messages to node %s lost: %r", peer, exc)
                        break

    async def _send_on_channel(self, peer: int, pieces: list[bytes | memoryview], length: int) -> bool:
        """Sends a batch as one frame of the peer's channel, dialed first if needed; False if the peer
        refuses channels (the batch then goes by HTTP). A batch lost with a broken connection is left
        to Raft, which sends again what was not acknowledged."""
        out = self._outbound.get(peer)
        if out is None or not out.is_open:
            if out is not None:
                out.close()
                del self._outbound[peer]  # counted once, here
                if out.acknowledged:
                    self._failed_dials[peer] = 0
                elif self._dial_failed(peer, "it ended before the peer acknowledged it"):
                    return False
            try:
                out = await Outbound.open(
                    self.peers[peer], CHANNEL_PATH, self.tls, self.secret, self.node_id, peer, CONNECT_SECONDS
                )
            except Refused as exc:
                self._fall_back(peer, str(exc))
                return False
            except ChannelError as exc:  # the peer's proof failed (another secret?): not every batch redials
                log.warning("refused a Raft channel to node %s: %s", peer, exc)
                return not self._dial_failed(peer, str(exc))
            except Exception as exc:  # noqa: BLE001 - reset or cut short mid-handshake (EOF): try again later
                log.debug("raft channel to node %s failed: %r", peer, exc)
                return True
            self._outbound[peer] = out
        out.send(pieces)
        try:
            await out.drain(REQUEST_SECONDS + length / SLOW_PEER_BYTES_PER_SECOND)
        except Exception as exc:  # noqa: BLE001 - whatever broke the connection, this sender lives on
            log.debug("raft channel to node %s broke: %r", peer, exc)
            out.close()
        return True

    def _dial_failed(self, peer: int, why: str) -> bool:
        """Counts a channel `peer` accepted that never carried anything; True once it falls back to HTTP."""
        failed = self._failed_dials[peer] = self._failed_dials.get(peer, 0) + 1
        if failed < MAX_FAILED_DIALS:
            return False
        self._fall_back(peer, f"{failed} channels in a row failed, the last: {why}")
        return True

    def _fall_back(self, peer: int, why: str) -> None:
        log.info("node %s takes no Raft channel (%s): HTTP for %.0f s", peer, why, HTTP_FALLBACK_SECONDS)
        self._http_until[peer] = time.monotonic() + HTTP_FALLBACK_SECONDS
        self._failed_dials[peer] = 0

    def accept_channel(
        self, hello: Hello, deliver: Callable[[list[Message]], None], max_payload: int, client: str
    ) -> tuple[bytes, Inbound] | None:
        """The 101 and the protocol for a peer's channel from the address `client`, or None if this
        node takes none from it (app/cluster/accepted_channels.py: who may wait for a place)."""
        if not self.channels or not self.secret or hello.dst != self.node_id or hello.src not in self.peers:
            return None
        answer, key = welcome(self.secret, hello)
        return welcome_head(answer), self._accepted.accept(hello, key, deliver, max_payload, client)

    def _take_reply(self, peer: int, signature: str | None, body: bytes) -> None:
        """Hands the node the messages `peer` replied with, if they are signed by it for this node."""
        if self._verifier is None or self._deliver is None:
            return
        try:
            sig = self._verifier.check(signature, REPLY_PATH)
        except ProtocolError as exc:
            log.warning("refused a reply from node %s: %s", peer, exc.message)
            return
        if sig.src != peer or not Verifier.body_matches(sig, hashlib.sha256(body).hexdigest()):
            log.warning("refused a reply from node %s: not signed by it, or not the body signed", peer)
            return
        for msg in decode(body):
            if msg.src == peer and msg.dst == self.node_id:
                self._deliver(msg)

    async def replies_for(self, peer: int, messages: list[Message], timeout: float = REPLY_WAIT) -> list[Message]:
        """The messages this node addresses to `peer` within `timeout`, if `messages` (just received
        from it) call for an answer; they are taken from the peer's queue's way, not sent twice.

        The peer need not be one this node knows the address of: a node joining with `--peers` that
        do not name the current leader learns it only from the log the leader sends, and answers
        it here until then (the caller checked the cluster's signature)."""
        if peer in self._held:
            return []
        if not any(isinstance(msg, AppendEntries | RequestVote) for msg in messages):
            return []
        loop = asyncio.get_running_loop()
        held = self._held[peer] = _Held(loop.create_future())
        timer = loop.call_later(timeout, held.wake)
        try:
            await held.waiter
        finally:
            timer.cancel()
            del self._held[peer]
        return held.replies

    def signed_reply(self, peer: int, replies: list[Message]) -> tuple[bytes, str]:
        """The body and signature header of a response carrying `replies` to `peer`."""
        body = _encoder.encode(replies)
        return body, sign(self.secret, self.node_id, peer, REPLY_PATH, body)

    async def stream(self, peer: int, path: str, bodies: AsyncIterator[bytes], timeout: float = 60.0) -> bool:
        """POSTs each body in turn on one connection, the next only after a 204; False on any failure."""
        base = self.peers.get(peer)
        if base is None:
            return False
        url = base + path
        conn: Connection | None = None
        try:
            conn = await connect(url, self.tls, CONNECT_SECONDS)
            async for body in bodies:
                headers = {AUTH_HEADER: sign(self.secret, self.node_id, peer, path, body)}
                response = await conn.request(encode_request("POST", url, headers, body), timeout)
                if response.status != 204:
                    return False
            return True
        except Exception as exc:  # noqa: BLE001 - a failed stream is retried by the caller
            log.info("stream to node %s failed: %r", peer, exc)
            return False
        finally:
            if conn is not None:
                conn.close()

    async def close(self) -> None:
        for out in self._outbound.values():
            out.close()
        self._accepted.close()
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # their cancellations, not one aimed at the caller


@dataclass
class _Held:
    """A request held open for replies: those so far, their size, and what wakes its handler."""

    waiter: asyncio.Future[None]
    replies: list[Message] = field(default_factory=list)
    size: int = 0

    def add(self, msg: Message) -> None:
        self.replies.append(msg)
        self.size += _size(msg)
        self.wake()

    def wake(self) -> None:
        if not self.waiter.done():
            self.waiter.set_result(None)


def _size(msg: Message) -> int:
    entries = getattr(msg, "entries", None)
    return 64 + (sum(len(e.data) + 24 for e in entries) if entries else 0)
