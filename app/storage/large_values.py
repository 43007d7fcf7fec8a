"""Large values in RocksDB, stored as 1 MiB chunks so no write copies a whole value at once.

RocksDB copies a value into the write batch and again into the memtable, which keeps it until a
flush; a 64 MiB append would cost several times its size. A value past `LARGE` is written as
chunks in their own column family (small write buffers, flushed early), each chunk in its own
write, followed by a pointer in the caller's batch. The pointer lands last, so until it does the
chunks are invisible; a crash in between leaves chunks a later write of the same key replaces.

Chunk keys are `cf NUL key generation chunk#`. A write's chunks get a fresh random generation, so
overwriting a key never mixes its old chunks with new ones: the old pointer keeps naming the old
generation until the new pointer replaces it, and the old generation is deleted after. A range
delete takes the same range in the chunk column family, which holds exactly the chunks of the keys
in it when keys have one length (log indexes, record positions: the only users of range deletes).
A single key's delete takes only the generation its pointer names: keys of other lengths (a
subscription's) may start with it, and so may their chunk keys.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from typing import cast

import rocksdict

from app.storage.kv import Buffer, Parts

CHUNKS_CF = "_chunks"
LARGE = 1 << 20
CHUNK = 1 << 20
# A pointer starts with a byte no value of a chunked column family starts with (msgpack arrays,
# record versions), then the total length and the number of chunks.
_MAGIC = b"\xff\x00rill-chunked\x00"
_POINTER = struct.Struct(">QI8s")  # total length, chunks, generation
_CHUNK_NO = struct.Struct(">I")
_GENERATION = 8


def chunk_options() -> rocksdict.Options:
    options = rocksdict.Options(raw_mode=True)
    options.set_write_buffer_size(4 << 20)
    options.set_max_write_buffer_number(2)
    return options


def is_pointer(value: bytes) -> bool:
    return value[:1] == b"\xff" and value.startswith(_MAGIC)


def size_of(value: bytes | Parts) -> int:
    return len(value) if isinstance(value, bytes) else sum(len(p) for p in value)


def _prefix(cf: str, key: bytes) -> bytes:
    return cf.encode() + b"\x00" + key


def _slices(parts: Iterable[Buffer]) -> Iterable[bytes]:
    """The value as CHUNK-sized bytes, copying one chunk at a time."""
    pending: list[memoryview] = []
    size = 0
    for part in parts:
        view = memoryview(part).cast("B")
        while view:
            take = view[: CHUNK - size]
            pending.append(take)
            size += len(take)
            view = view[len(take) :]
            if size == CHUNK:
                yield b"".join(pending)
                pending, size = [], 0
    if pending:
        yield b"".join(pending)


def write_chunks(
    db: rocksdict.Rdict, handle: rocksdict.ColumnFamily, options: rocksdict.WriteOptions, cf: str, key: bytes,
    value: bytes | Parts,
) -> bytes:  # fmt: skip
    """Writes a large value's chunks; returns the pointer to put under `key` in the caller's batch."""
    generation = os.urandom(_GENERATION)
    prefix = _prefix(cf, key) + generation
    count = 0
    for count, chunk in enumerate(_slices((value,) if isinstance(value, bytes) else value), 1):
        wb = rocksdict.WriteBatch(raw_mode=True)
        wb.put(prefix + _CHUNK_NO.pack(count - 1), chunk, handle)
        db.write(wb, options)
    return _MAGIC + _POINTER.pack(size_of(value), count, generation)


def read(chunks: rocksdict.Rdict, cf: str, key: bytes, pointer: bytes) -> bytes:
    total, count, generation = _POINTER.unpack_from(pointer, len(_MAGIC))
    prefix = _prefix(cf, key) + generation
    # One buffer of the final size, filled chunk by chunk: a join would hold the value twice.
    value = bytearray(total)
    at = 0
    for i in range(count):
        chunk = _chunk(chunks, prefix + _CHUNK_NO.pack(i))
        value[at : at + len(chunk)] = chunk
        at += len(chunk)
    if at != total:
        raise RuntimeError(f"chunked value under {key!r} in {cf} is {at} bytes, expected {total}")
    return cast(bytes, value)  # read-only by every caller, as a value from the store is


def head(chunks: rocksdict.Rdict, cf: str, key: bytes, pointer: bytes, size: int) -> bytes:
    """The first `size` (at most CHUNK) bytes of a chunked value."""
    generation = _POINTER.unpack_from(pointer, len(_MAGIC))[2]
    return _chunk(chunks, _prefix(cf, key) + generation + _CHUNK_NO.pack(0))[:size] if size else b""


def _chunk(chunks: rocksdict.Rdict, key: bytes) -> bytes:
    value = chunks.get(key)
    if value is None:
        raise RuntimeError(f"chunk {key!r} of a large value is missing")
    return value


def range_of(cf: str, start: bytes, end: bytes) -> tuple[bytes, bytes]:
    """The chunk keys of main keys in [start, end)."""
    return _prefix(cf, start), _prefix(cf, end)


def generation_range(cf: str, key: bytes, pointer: bytes) -> tuple[bytes, bytes]:
    """The chunk keys the pointer names (and no newer generation's)."""
    prefix = _prefix(cf, key) + _POINTER.unpack_from(pointer, len(_MAGIC))[2]
    return prefix, prefix + b"\xff" * (_CHUNK_NO.size + 1)


def families(chunks: rocksdict.Rdict) -> set[str]:
    """The column families that have chunks, skipping from one family's chunks to the next."""
    found: set[str] = set()
    it = chunks.iter()
    it.seek_to_first()
    while it.valid():
        cf = it.key().split(b"\x00", 1)[0]
        found.add(cf.decode())
        it.seek(cf + b"\x01")
    return found
