"""The framed peer channel on real connections (its rules are app/cluster/channel.py): `Outbound`,
the connection a node dials to a peer and writes its Raft batches into, and `Inbound`, the protocol
a node's HTTP edge hands an accepted Upgrade to, which checks each frame and delivers its messages.

A channel carries messages one way, dialer to peer; the peer's answers go over its own channel.
Nothing waits for an answer, so batches follow each other as fast as the socket takes them.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections import deque
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import msgspec

from app.cluster import channel as ch
from app.raft.messages import Message

log = logging.getLogger("rill.transport")

HEAD_CAP = 16 * 1024  # the peer's 101 and its headers
FIRST_FRAME_SECONDS = 10.0  # an accepted channel that has not proved itself by then is closed
# A frame not acknowledged within this, plus its bytes at the slowest rate a peer is allowed, ends the
# connection (the peer or the path is gone).
ACK_SECONDS = 3.0
SLOW_PEER_BYTES_PER_SECOND = 16 * 1024 * 1024
# Before its first frame proves the secret, a channel may buffer at most this much: what anyone who can
# reach the node makes it hold per channel. A batch is at most about 4 MiB (transport.BATCH_BYTES), and
# a dialer opens with an empty frame (`Outbound.open`), so a longer message never comes first.
FIRST_FRAME_CAP = 8 * 1024 * 1024
# Frames are acknowledged together, at most this long after the first one not yet acknowledged: one
# write a round would cost both ends a system call and a wake-up, and only liveness needs them.
ACK_DELAY = 0.25
_decoder = msgspec.msgpack.Decoder(list[Message])
_EMPTY_BATCH = msgspec.msgpack.encode([])


class Refused(Exception):
    """The peer answered the Upgrade with something else (an older node, or channels turned off)."""


class Outbound:
    """A channel to one peer: dialed, upgraded, authenticated; then frames only."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, key: bytes) -> None:
        self._writer = writer
        self._frames = ch.FrameWriter(key)
        self._acks = ch.AckReader(key)
        self._closed = False
        self._waiting_since: float | None = None  # when the oldest frame not yet acknowledged went out
        self._unacked: deque[tuple[int, int]] = deque()  # (sequence number, bytes) of frames not acknowledged
        self._unacked_bytes = 0
        self._watch = asyncio.ensure_future(self._read_acks(reader))

    @classmethod
    async def open(
        cls, url: str, path: str, tls: ssl.SSLContext | None, secret: bytes, src: int, dst: int, timeout: float
    ) -> Outbound:
        """Dials `url` and upgrades to the channel; Refused, ChannelError or OSError if that fails."""
        parts = urlsplit(url)
        https = parts.scheme == "https"
        port = parts.port or (443 if https else 80)
        host = parts.hostname or "127.0.0.1"
        hello = ch.hello(src, dst)
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port, ssl=tls if https else None, limit=HEAD_CAP)
        try:
            writer.write(
                f"GET {path} HTTP/1.1\r\nhost: {parts.netloc}\r\nconnection: Upgrade\r\nupgrade: {ch.PROTOCOL}\r\n"
                f"{ch.HEADER}: {ch.hello_header(hello)}\r\ncontent-length: 0\r\n\r\n".encode()
            )
            async with asyncio.timeout(timeout):
                head = await reader.readuntil(b"\r\n\r\n")
            status, headers = _parse_head(head)
            if status != 101 or headers.get("upgrade", "").lower() != ch.PROTOCOL:
                raise Refused(f"the peer answered {status} to the channel's Upgrade")
            key = ch.accept_welcome(secret, hello, headers.get(ch.HEADER))
        except BaseException:
            writer.close()
            raise
        out = cls(reader, writer, key)
        out.send([_EMPTY_BATCH])  # the proof, small enough for the peer's cap on a first frame
        return out

    @property
    def acknowledged(self) -> bool:
        """Whether the peer acknowledged any frame on this connection (so it took the channel)."""
        return self._acks.acked > 0

    @property
    def is_open(self) -> bool:
        allowed = ACK_SECONDS + self._unacked_bytes / SLOW_PEER_BYTES_PER_SECOND
        stalled = self._waiting_since is not None and time.monotonic() - self._waiting_since > allowed
        return not self._closed and not stalled and not self._writer.is_closing()

    @property
    def idle(self) -> bool:
        """Nothing written is still waiting for the socket to take it."""
        return self._writer.transport.get_write_buffer_size() == 0

    def send(self, payload: Sequence[bytes | memoryview]) -> None:
        """Writes one frame (it goes out as the socket takes it; `drain` waits for that)."""
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()
        pieces = self._frames.frame(payload)
        size = sum(len(piece) for piece in pieces)
        self._unacked.append((self._frames.seq, size))
        self._unacked_bytes += size
        self._writer.writelines(pieces)

    async def drain(self, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            await self._writer.drain()

    def close(self) -> None:
        """Drops the connection with whatever it has not sent yet: frames the dialer gave up on must
        not arrive after those of its next channel (Raft sends again what was not acknowledged)."""
        self._closed = True
        self._watch.cancel()
        self._writer.transport.abort()

    async def _read_acks(self, reader: asyncio.StreamReader) -> None:
        """Takes the peer's acknowledgements until the connection ends (or one is forged)."""
        try:
            while data := await reader.read(4096):
                acked = self._acks.feed(data)
                while self._unacked and self._unacked[0][0] <= acked:
                    self._unacked_bytes -= self._unacked.popleft()[1]
                self._waiting_since = None if acked >= self._frames.seq else time.monotonic()
        except (OSError, ch.ChannelError):
            pass
        finally:
            self._closed = True


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    fields = lines[0].split(" ", 2)
    if len(fields) < 2 or not fields[0].startswith("HTTP/1.") or not fields[1].isdigit():
        raise Refused("the peer's answer is not HTTP")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(fields[1]), headers


def welcome_head(value: str) -> bytes:
    """The 101 that accepts a channel, with the handshake's answer."""
    return (
        f"HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: {ch.PROTOCOL}\r\n"
        f"{ch.HEADER}: {value}\r\n\r\n"
    ).encode()


class Inbound(asyncio.Protocol):
    """The receiving end of one peer's channel: frames checked, their messages delivered in order."""

    def __init__(
        self,
        key: bytes,
        peer: int,
        node_id: int,
        max_payload: int,
        deliver: Callable[[list[Message]], None],
        on_close: Callable[[Inbound], None],
        on_proven: Callable[[Inbound], None],
        client: str = "",
        accepted: int = 0,
        on_connected: Callable[[Inbound], None] | None = None,
    ) -> None:
        self.peer = peer
        self.node_id = node_id
        self._frames = ch.FrameReader(key, max_payload, FIRST_FRAME_CAP)
        self._deliver = deliver
        self._on_close = on_close
        self._on_proven = on_proven
        self.transport: asyncio.BaseTransport | None = None
        self.frames = 0
        self.closed = False
        self._ack_due = False
        self._deadline: asyncio.TimerHandle | None = None
        self.client = client  # the address it came from
        self.accepted = accepted  # its place in the order the node accepted channels in
        self._on_connected = on_connected

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        # Anyone may ask for a channel; only a frame tagged with the session key proves the secret.
        self._deadline = asyncio.get_running_loop().call_later(FIRST_FRAME_SECONDS, self._unproven)
        if self._on_connected is not None:
            self._on_connected(self)

    def _unproven(self) -> None:
        self._deadline = None
        if self.frames == 0 and not self.closed:
            self._refuse(f"no frame in {FIRST_FRAME_SECONDS:.0f} s")

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            payloads = self._frames.feed(data)
            batches = [_decoder.decode(payload) for payload in payloads]
        except (ch.ChannelError, msgspec.DecodeError) as exc:
            self._refuse(str(exc))
            return
        for messages in batches:
            if any(msg.src != self.peer or msg.dst != self.node_id for msg in messages):
                self._refuse("a message's sender or recipient is not the channel's")
                return
            self.frames += 1
            if self.frames == 1:
                if self._deadline is not None:
                    self._deadline.cancel()
                    self._deadline = None
                self._on_proven(self)
                if self.closed:  # proven after a newer channel from the peer: this one is stale
                    return
            if messages:
                self._deliver(messages)
        if batches and not self._ack_due:
            self._ack_due = True
            asyncio.get_running_loop().call_later(ACK_DELAY, self._ack)

    def _ack(self) -> None:
        self._ack_due = False
        if not self.closed and self.transport is not None:
            self.transport.write(ch.ack(self._frames.key, self._frames.seq))  # type: ignore[attr-defined]

    def _refuse(self, why: str) -> None:
        log.warning("closed the Raft channel from node %s: %s", self.peer, why)
        self.close()

    def close(self) -> None:
        self._release()
        if self.transport is not None:
            self.transport.close()
        else:  # never connected: no connection_lost will tell the transport
            self._on_close(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._release()
        self._on_close(self)

    def _release(self) -> None:
        """Closed: nothing it buffered, and no timer, keeps it in memory."""
        self.closed = True
        self._frames.clear()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
