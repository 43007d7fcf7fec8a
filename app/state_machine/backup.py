"""A state backup: the applied state at one Raft index, as one immutable object in the object store.

It holds every pair of the state store (buckets, streams and their configuration, closure, TTLs,
forks, attributes, published snapshots, producer state, subscriptions and their acknowledged
offsets, the segments already tiered) except the records that sealed segments already hold:
a restore reads those from the segments. Nodes write one now and then (app/tiering/backups.py);
`rill restore` builds a data directory from one (app/tiering/restore.py).

The object: `MAGIC`, a big-endian u32 length and a JSON header (format, index, term, when, which
node, counts), then a zlib stream of frames, each a u32 length and a msgpack list of
(column family position, key, value). Its key names the index and the SHA-256 of the whole
object, so a backup is never overwritten and a reader can check what it got.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from typing import BinaryIO

import msgspec

from app.state_machine import records as r
from app.state_machine.export import Pair
from app.storage.kv import KV

FORMAT = 1  # bump when the layout changes; restore reads every format that ever shipped
MAGIC = b"RILLSTATE\n"
# Not a bucket's directory: bucket ids have no dot, and the built-in buckets do not start with one.
KEY_PREFIX = ".rill/state/"
_KEY = re.compile(r"\.rill/state/([0-9]{20})-([0-9a-f]{64})\.state")  # ASCII digits: \d takes any script's
MAX_INDEX = (1 << 63) - 1  # a Raft index is a u64 in the log, and no log reaches this: a larger key is not ours
_U32 = struct.Struct(">I")
_FRAME_BYTES = 1 << 20
MAX_FRAME_BYTES = 1 << 30  # a frame closes past 1 MiB, so it is that plus its last pair (a record)
_SKIPPED = {(r.SM_META, r.SYNCED_KEY)}  # node-local bookkeeping
_POSITION = {cf: position for position, cf in enumerate(r.COLUMN_FAMILIES)}


class BackupError(ValueError):
    """The object is not a state backup this version can read, or not the one its key names."""


@dataclass(frozen=True)
class Header:
    format: int
    index: int
    term: int
    created_at: int  # ms
    node: int
    streams: int
    pairs: int
    skipped_bytes: int  # records left to the segments
    column_families: list[str]


def backup_key(index: int, data: bytes) -> str:
    return key_for(index, hashlib.sha256(data).hexdigest())


def key_for(index: int, sha256: str) -> str:
    return f"{KEY_PREFIX}{index:020d}-{sha256}.state"


def parse_key(key: str) -> tuple[int, str] | None:
    """(index, sha256) of a backup's key; None for any other key."""
    match = _KEY.fullmatch(key)
    if match is None or int(match[1]) > MAX_INDEX:
        return None
    return int(match[1]), match[2]


def pairs_to_keep(kv: KV, skipped: list[int] | None = None) -> Iterator[Pair]:
    """The store's pairs, less each stream's own records below its tiered offset (in segments).

    Streams come before data in COLUMN_FAMILIES, so each stream's tiered offset is known before its
    records are reached. `skipped`, if given, gets the bytes left out added to its one element."""
    tiered: dict[int, int] = {}
    for position, cf in enumerate(r.COLUMN_FAMILIES):
        for key, value in kv.scan(cf, b""):
            if (cf, key) in _SKIPPED:
                continue
            if cf == r.STREAMS:
                meta = r.decode_meta(value)
                tiered[meta.sid] = meta.tiered
            elif cf == r.DATA:
                sid, pos = r.data_sid_pos(key)
                if pos < tiered.get(sid, 0):
                    if skipped is not None:
                        skipped[0] += len(value)
                    continue
            yield position, key, value


def encode(kv: KV, created_at: int, node: int) -> tuple[Header, bytes]:
    """The backup of `kv` (a store no one writes meanwhile: a RocksDB checkpoint), in memory."""
    out = io.BytesIO()
    header, _ = write(kv, created_at, node, out)
    return header, out.getvalue()


def write(kv: KV, created_at: int, node: int, out: BinaryIO) -> tuple[Header, str]:
    """Writes the backup of `kv` (which no one writes meanwhile) to `out` a frame at a time, so a
    large state never sits in memory whole; returns its header and SHA-256. The header comes first
    and holds counts, so the store is read twice: once to count, once to write."""
    index, term = r.decode_applied(kv.get(r.SM_META, r.APPLIED_KEY))
    count, streams, skipped = 0, 0, [0]
    for position, _, _ in pairs_to_keep(kv, skipped):
        count += 1
        streams += position == _POSITION[r.STREAMS]
    header = Header(FORMAT, index, term, created_at, node, streams, count, skipped[0], list(r.COLUMN_FAMILIES))
    head = json.dumps(asdict(header), separators=(",", ":")).encode()
    digest = hashlib.sha256()

    def emit(data: bytes) -> None:
        digest.update(data)
        out.write(data)

    emit(MAGIC + _U32.pack(len(head)) + head)
    compressor = zlib.compressobj(6)
    frame: list[Pair] = []
    size = 0
    for pair in pairs_to_keep(kv):
        frame.append(pair)
        size += len(pair[1]) + len(pair[2]) + 16
        if size >= _FRAME_BYTES:
            emit(compressor.compress(_frame(frame)))
            frame, size = [], 0
    if frame:
        emit(compressor.compress(_frame(frame)))
    emit(compressor.flush())
    return header, digest.hexdigest()


def _frame(pairs: list[Pair]) -> bytes:
    data = msgspec.msgpack.encode(pairs)
    return _U32.pack(len(data)) + data


_HEADER_FIELDS = {f.name for f in fields(Header)}


def read_header(data: bytes) -> Header:
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        raise BackupError("not a Rill state backup")
    (length,) = _U32.unpack_from(data, len(MAGIC))
    head = data[len(MAGIC) + 4 : len(MAGIC) + 4 + length]
    try:
        header = msgspec.json.decode(head, type=Header)
        unknown = set(msgspec.json.decode(head, type=dict[str, msgspec.Raw])) - _HEADER_FIELDS
    except (msgspec.MsgspecError, RecursionError) as exc:
        raise BackupError(f"the backup's header is unreadable: {exc}") from None
    if unknown:  # a writer of the same format knows no other field: this is not a backup we read
        raise BackupError(f"the backup's header has fields this version does not know: {sorted(unknown)[:5]}")
    if header.format > FORMAT:
        raise BackupError(f"backup format {header.format} is newer than this Rill reads ({FORMAT})")
    numbers = (header.index, header.term, header.created_at, header.node, header.streams, header.pairs)
    if not all(0 <= n < 2**64 for n in (*numbers, header.skipped_bytes)):
        raise BackupError("the backup's header has a number out of range")
    return header


def decode(data: bytes, expected_sha256: str | None = None) -> tuple[Header, Iterator[list[Pair]]]:
    """The header and the pairs, in frames, of a backup; checked against its key's digest if given."""
    if expected_sha256 is not None and hashlib.sha256(data).hexdigest() != expected_sha256:
        raise BackupError("the backup does not match the digest its key names")
    header = read_header(data)
    (length,) = _U32.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + 4 + length
    return header, _frames(data[start:], header)


def _frames(body: bytes, header: Header) -> Iterator[list[Pair]]:
    """The frames, inflated a bounded piece at a time: a restore never holds the whole state twice,
    and a frame longer than any writer makes is refused before it is inflated."""
    positions = _renumbering(header.column_families)
    inflate = zlib.decompressobj()
    pending = bytearray()
    rest: bytes | memoryview = memoryview(body)
    while True:
        try:
            pending += inflate.decompress(rest, _FRAME_BYTES)
        except zlib.error as exc:
            raise BackupError(f"the backup's body is corrupt: {exc}") from None
        rest = inflate.unconsumed_tail
        while len(pending) >= 4:
            (length,) = _U32.unpack_from(pending)
            if not 0 < length <= MAX_FRAME_BYTES:
                raise BackupError(f"the backup has a frame of {length} bytes (empty, or more than any writer makes)")
            if len(pending) < 4 + length:
                break
            yield _pairs(bytes(pending[4 : 4 + length]), positions)
            del pending[: 4 + length]  # from the front of a bytearray: no copy of the rest
        if not rest:
            break
    if pending or not inflate.eof:
        raise BackupError("the backup's body is cut short")


def _pairs(frame: bytes, positions: list[int]) -> list[Pair]:
    try:
        pairs = msgspec.msgpack.decode(frame, type=list[tuple[int, bytes, bytes]])
    except msgspec.MsgspecError as exc:
        raise BackupError(f"a frame of the backup is unreadable: {exc}") from None
    if not pairs:
        raise BackupError("the backup has an empty frame (no writer makes one)")
    if any(not 0 <= position < len(positions) for position, _, _ in pairs):
        raise BackupError("a frame of the backup names a column family its header does not list")
    return [(positions[position], key, value) for position, key, value in pairs]


def _renumbering(families: Iterable[str]) -> list[int]:
    """Positions in the backup's family list -> positions in this version's (families only grow)."""
    if not isinstance(families, list) or not all(isinstance(cf, str) for cf in families):
        raise BackupError("the backup's header does not list its column families")
    try:
        return [_POSITION[cf] for cf in families]
    except KeyError as exc:
        raise BackupError(f"the backup has a column family this version does not know: {exc}") from None
