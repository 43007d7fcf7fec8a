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
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import msgspec

from app.cluster import channel as ch
from app.raft.messages import Message

log = logging.getLogger("rill.transport")

HEAD_CAP = 16 * 1024  # the peer's 101 and its headers
FIRST_FRAME_SECONDS = 10.0  # an accepted channel that has not proved itself by then is closed
ACK_SECONDS = 3.0  # a frame not acknowledged within this ends the connection (the peer or the path is gone)
# Frames are acknowledged together, at most this long after the first one not yet acknowledged: one
# write a round would cost both ends a system call and a wake-up, and only liveness needs them.
ACK_DELAY = 0.25
_decoder = msgspec.msgpack.Decoder(list[Message])


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
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=tls if https else None, limit=HEAD_CAP), timeout
        )
        try:
            writer.write(
                f"GET {path} HTTP/1.1\r\nhost: {parts.netloc}\r\nconnection: Upgrade\r\nupgrade: {ch.PROTOCOL}\r\n"
                f"{ch.HEADER}: {ch.hello_header(hello)}\r\ncontent-length: 0\r\n\r\n".encode()
            )
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
            status, headers = _parse_head(head)
            if status != 101 or headers.get("upgrade", "").lower() != ch.PROTOCOL:
                raise Refused(f"the peer answered {status} to the channel's Upgrade")
            key = ch.accept_welcome(secret, hello, headers.get(ch.HEADER))
        except BaseException:
            writer.close()
            raise
        return cls(reader, writer, key)

    @property
    def is_open(self) -> bool:
        stalled = self._waiting_since is not None and time.monotonic() - self._waiting_since > ACK_SECONDS
        return not self._closed and not stalled and not self._writer.is_closing()

    def send(self, payload: Sequence[bytes | memoryview]) -> None:
        """Writes one frame (it goes out as the socket takes it; `drain` waits for that)."""
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()
        self._writer.writelines(self._frames.frame(payload))

    async def drain(self, timeout: float) -> None:
        await asyncio.wait_for(self._writer.drain(), timeout)

    def close(self) -> None:
        self._closed = True
        self._watch.cancel()
        self._writer.close()

    async def _read_acks(self, reader: asyncio.StreamReader) -> None:
        """Takes the peer's acknowledgements until the connection ends (or one is forged)."""
        try:
            while data := await reader.read(4096):
                acked = self._acks.feed(data)
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
    ) -> None:
        self.peer = peer
        self.node_id = node_id
        self._frames = ch.FrameReader(key, max_payload)
        self._deliver = deliver
        self._on_close = on_close
        self._on_proven = on_proven
        self.transport: asyncio.BaseTransport | None = None
        self.frames = 0
        self.closed = False
        self._ack_due = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        # Anyone may ask for a channel; only a frame tagged with the session key proves the secret.
        asyncio.get_running_loop().call_later(FIRST_FRAME_SECONDS, self._unproven)

    def _unproven(self) -> None:
        if self.frames == 0:
            self._refuse(f"no frame in {FIRST_FRAME_SECONDS:.0f} s")

    def data_received(self, data: bytes) -> None:
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
                self._on_proven(self)
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
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._on_close(self)
