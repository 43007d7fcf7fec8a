"""A batch of Raft messages as msgpack, in pieces that point at large entries' data instead of copying it.

A leader sends each follower its own AppendEntries, but the entries in them are the same objects,
and a large one (a 64 MiB append) would be copied into every follower's encoded batch, and again
behind the request's headers. Here each large entry's data is swapped for a random marker before
encoding, and the marker's bytes in the small encoded batch are then replaced by the data itself,
as a msgpack bin32 header followed by a view of it: the same bytes a plain encode gives (msgpack
uses bin32 for anything this large), so the receiver decodes them as usual.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence

import msgspec

from app.raft.messages import AppendEntries, Message

LARGE = 64 * 1024  # entries at least this large travel as views
_MARK = 16  # random bytes per marker: encoded as bin8 `c4 10` + the marker

_encoder = msgspec.msgpack.Encoder()

Piece = bytes | memoryview


def encode_pieces(batch: list[Message]) -> list[Piece]:
    """The msgpack of `batch` (exactly `msgspec.msgpack.encode(batch)`), as pieces to send in order."""
    large: list[tuple[bytes, bytes]] = []
    swapped = [_swap(msg, large) for msg in batch]
    if not large:
        return [_encoder.encode(batch)]
    encoded = _encoder.encode(swapped)
    view = memoryview(encoded)
    pieces: list[Piece] = []
    pos = 0
    for mark, data in large:  # in the order the encoder met them
        at = encoded.index(b"\xc4\x10" + mark, pos)
        pieces += [view[pos:at], b"\xc6" + len(data).to_bytes(4, "big"), memoryview(data)]
        pos = at + 2 + _MARK
    pieces.append(view[pos:])
    return pieces


def _swap(msg: Message, large: list[tuple[bytes, bytes]]) -> Message:
    if not isinstance(msg, AppendEntries) or all(len(e.data) < LARGE for e in msg.entries):
        return msg
    entries = []
    for entry in msg.entries:
        if len(entry.data) >= LARGE:
            mark = secrets.token_bytes(_MARK)
            large.append((mark, entry.data))
            entry = msgspec.structs.replace(entry, data=mark)
        entries.append(entry)
    return msgspec.structs.replace(msg, entries=entries)


def size(pieces: Sequence[Piece]) -> int:
    return sum(len(piece) for piece in pieces)


def sha256_hex(pieces: Sequence[Piece]) -> str:
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return digest.hexdigest()
