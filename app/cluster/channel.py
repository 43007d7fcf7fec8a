"""The framed peer channel's rules, without I/O: the handshake that authenticates a connection with
the cluster secret, and the frames that follow it.

A node sends its Raft messages to a peer over one long-lived connection it dials itself (the peer
answers over its own): an HTTP Upgrade to `PROTOCOL` on the peer's Raft path, so it takes the same
port, TLS and proxies as every other request.

- **Handshake.** The dialer's request names itself, the peer and a fresh nonce; the peer answers 101
  with its own nonce and a MAC over both ids and both nonces, which proves it holds the secret
  before anything is sent. Both derive the session key from the secret and the two nonces, so a
  recorded connection cannot be replayed into a new one.
- **Frames.** Each is a u32 payload length, a u64 sequence number, the payload (a msgpack batch of
  Raft messages) and a 16-byte keyed BLAKE2b tag over all of that. The first frame proves the
  dialer holds the secret too; a frame with a bad tag, out of sequence, or longer than the cap ends
  the connection, so frames cannot be forged, replayed, dropped or reordered unnoticed.
- **Acknowledgements.** The peer answers on the same connection with the last sequence number it
  took (8 bytes and a tag), a fraction of a second later and for all the frames since its last
  answer, so the dialer learns within seconds that a connection no longer carries anything (a peer
  paused, a path that drops packets) rather than when TCP gives up.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import struct
from collections.abc import Sequence
from dataclasses import dataclass

PROTOCOL = "rill-raft-1"
HEADER = "x-rill-channel"
TAG_BYTES = 16
_HEAD = struct.Struct(">IQ")  # payload length, sequence number
_ACK = struct.Struct(">Q")
ACK_BYTES = _ACK.size + TAG_BYTES
_HELLO = re.compile(r"v1 src=(?P<src>\d{1,19}) dst=(?P<dst>\d{1,19}) nonce=(?P<nonce>[0-9a-f]{32})")
_WELCOME = re.compile(r"v1 nonce=(?P<nonce>[0-9a-f]{32}) mac=(?P<mac>[0-9a-f]{64})")


class ChannelError(Exception):
    """The peer is not who it says, or sent what no peer of this cluster sends: close the connection."""


@dataclass(frozen=True)
class Hello:
    src: int
    dst: int
    nonce: str


def hello(src: int, dst: int) -> Hello:
    return Hello(src, dst, secrets.token_hex(16))


def hello_header(h: Hello) -> str:
    return f"v1 src={h.src} dst={h.dst} nonce={h.nonce}"


def parse_hello(value: str | None) -> Hello | None:
    match = _HELLO.fullmatch(value.strip()) if value else None
    return None if match is None else Hello(int(match["src"]), int(match["dst"]), match["nonce"])


def _mac(secret: bytes, role: str, h: Hello, theirs: str) -> bytes:
    signed = f"rill-channel-v1\n{role}\n{h.src}\n{h.dst}\n{h.nonce}\n{theirs}".encode()
    return hmac.new(secret, signed, hashlib.sha256).digest()


def welcome(secret: bytes, h: Hello) -> tuple[str, bytes]:
    """The peer's answer to `h` (its header value) and the session key."""
    nonce = secrets.token_hex(16)
    return f"v1 nonce={nonce} mac={_mac(secret, 'server', h, nonce).hex()}", _mac(secret, "key", h, nonce)


def accept_welcome(secret: bytes, h: Hello, value: str | None) -> bytes:
    """The session key, if the answer to `h` proves the peer holds the secret; ChannelError otherwise."""
    match = _WELCOME.fullmatch(value.strip()) if value else None
    if match is None:
        raise ChannelError("the peer's answer is not a channel handshake")
    if not hmac.compare_digest(bytes.fromhex(match["mac"]), _mac(secret, "server", h, match["nonce"])):
        raise ChannelError("the peer does not hold this cluster's secret")
    return _mac(secret, "key", h, match["nonce"])


def _tag(key: bytes, head: bytes, payload: Sequence[bytes | memoryview]) -> bytes:
    mac = hashlib.blake2b(head, key=key[:64], digest_size=TAG_BYTES)
    for piece in payload:
        mac.update(piece)
    return mac.digest()


class FrameWriter:
    """Numbers and tags the frames of one connection."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.seq = 0

    def frame(self, payload: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
        """The pieces to write for one frame (the payload's pieces are not copied)."""
        self.seq += 1
        head = _HEAD.pack(sum(len(p) for p in payload), self.seq)
        return [head, *payload, _tag(self.key, head, payload)]


class FrameReader:
    """Takes a connection's bytes as they come and gives back whole, checked payloads.

    The first frame, which proves the dialer holds the secret, may be at most `first_payload` long:
    before it is checked, whoever opened the connection decides what is buffered."""

    def __init__(self, key: bytes, max_payload: int, first_payload: int | None = None) -> None:
        self.key = key
        self.max_payload = max_payload
        self.first_payload = max_payload if first_payload is None else min(first_payload, max_payload)
        self.seq = 0
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        out = []
        while len(self._buffer) >= _HEAD.size:
            length, seq = _HEAD.unpack_from(self._buffer)
            cap = self.max_payload if self.seq else self.first_payload
            if length > cap:
                raise ChannelError(f"a frame of {length} bytes is past the cap of {cap}")
            end = _HEAD.size + length + TAG_BYTES
            if len(self._buffer) < end:
                break
            head, payload = bytes(self._buffer[: _HEAD.size]), bytes(self._buffer[_HEAD.size : end - TAG_BYTES])
            if not hmac.compare_digest(bytes(self._buffer[end - TAG_BYTES : end]), _tag(self.key, head, [payload])):
                raise ChannelError("a frame's tag does not match: not sent by the peer this connection proved")
            if seq != self.seq + 1:
                raise ChannelError(f"frame {seq} after frame {self.seq}: replayed, dropped or reordered")
            self.seq = seq
            del self._buffer[:end]
            out.append(payload)
        return out

    def clear(self) -> None:
        self._buffer = bytearray()


def ack(key: bytes, seq: int) -> bytes:
    """The peer's acknowledgement of every frame up to `seq`."""
    body = _ACK.pack(seq)
    return body + hashlib.blake2b(b"ack" + body, key=key[:64], digest_size=TAG_BYTES).digest()


class AckReader:
    """The dialer's side: the acknowledgements as they come, checked."""

    def __init__(self, key: bytes) -> None:
        self.key = key
        self.acked = 0
        self._buffer = bytearray()

    def feed(self, data: bytes) -> int:
        """The highest sequence number acknowledged so far; ChannelError for a forged acknowledgement."""
        self._buffer += data
        while len(self._buffer) >= ACK_BYTES:
            record = bytes(self._buffer[:ACK_BYTES])
            del self._buffer[:ACK_BYTES]
            (seq,) = _ACK.unpack_from(record)
            if not hmac.compare_digest(record, ack(self.key, seq)) or seq < self.acked:
                raise ChannelError("an acknowledgement the peer did not send")
            self.acked = seq
        return self.acked
