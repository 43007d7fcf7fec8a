"""RocksDB implementation of the KV interface (rocksdict, raw bytes).

Out of disk space, RocksDB turns a store read-only after the first failed write, and resumes on its
own only once `write_buffer_size` (64 MiB) is free. So a store that cannot write is reopened here
(`recover`), and one that cannot open read-write for want of space opens read-only: reads go on.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import rocksdict

from app.storage import large_values as large
from app.storage.disk import MIB, NO_SPACE, free_bytes, is_no_space
from app.storage.kv import DELETE, PUT, Batch, Parts, joined

log = logging.getLogger("rill.storage")

_PROBE = b"\x00rill-probe"  # deleted (never written) in `default` to test whether the store takes writes
_REOPEN_SLACK = 4 * MIB  # room a reopen needs besides flushing its logs: a manifest, options, the info log


def reopen_need(path: Path) -> int:
    """Free bytes a store at `path` needs to reopen: opening flushes its write-ahead logs to a table."""
    logs = 0
    for wal in path.glob("*.log"):
        with contextlib.suppress(FileNotFoundError):  # RocksDB deletes a log once flushed
            logs += wal.stat().st_size
    return logs + _REOPEN_SLACK


def _options() -> rocksdict.Options:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_keep_log_file_num(4)  # each open rotates the info log: old ones would pile up
    return options


class RocksKV:
    def __init__(self, path: str | Path, column_families: list[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._column_families = column_families
        try:
            self._open(read_only=False)
        except Exception as exc:
            if not is_no_space(exc):
                raise
            log.error("%s: no space to open for writing (%s): opened read-only", self.path, exc)
            self._open(read_only=True)
        self._nosync = rocksdict.WriteOptions()

    def _open(self, read_only: bool) -> None:
        cfs = self._column_families
        access = rocksdict.AccessType.read_only() if read_only else rocksdict.AccessType.read_write()
        families = {cf: _options() for cf in cfs if cf != "default"}
        # A store from before chunked values has no chunk family, and a read-only open cannot add one.
        with_chunks = not read_only or large.CHUNKS_CF in rocksdict.Rdict.list_cf(str(self.path), _options())
        if with_chunks:
            families[large.CHUNKS_CF] = large.chunk_options()
        self._db = rocksdict.Rdict(str(self.path), _options(), column_families=families, access_type=access)
        self.read_only = read_only
        self._cfs = {cf: self._db.get_column_family(cf) for cf in cfs}
        self._handles = {cf: self._db.get_column_family_handle(cf) for cf in cfs}
        self._chunks = self._db.get_column_family(large.CHUNKS_CF) if with_chunks else None
        self._chunks_handle = self._db.get_column_family_handle(large.CHUNKS_CF) if with_chunks else None
        # Column families that hold (or held) a chunked value: their deletes also drop chunks.
        self._chunked = large.families(self._chunks) if self._chunks is not None else set()

    @property
    def db(self) -> rocksdict.Rdict:
        return self._db

    def get(self, cf: str, key: bytes) -> bytes | None:
        value = self._cfs[cf].get(key)
        return self._whole(cf, key, value) if value is not None else None

    def _whole(self, cf: str, key: bytes, value: bytes) -> bytes:
        return large.read(self._chunk_family(), cf, key, value) if large.is_pointer(value) else value

    def _chunk_family(self) -> rocksdict.Rdict:
        if self._chunks is None:  # only a closed store, or one from before chunks (which has no pointers)
            raise OSError(errno.EBADF, f"{self.path} is closed or has no chunk family")
        return self._chunks

    def scan(self, cf: str, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        return self._pairs(cf, start, end, lambda key, value: self._whole(cf, key, value))

    def scan_heads(
        self, cf: str, start: bytes, end: bytes | None = None, size: int = 0
    ) -> Iterator[tuple[bytes, bytes]]:
        def head(key: bytes, value: bytes) -> bytes:
            return large.head(self._chunk_family(), cf, key, value, size) if large.is_pointer(value) else value[:size]

        return self._pairs(cf, start, end, head)

    def _pairs(
        self, cf: str, start: bytes, end: bytes | None, value_of: Callable[[bytes, bytes], bytes]
    ) -> Iterator[tuple[bytes, bytes]]:
        it = self._cfs[cf].iter()
        it.seek(start)
        while it.valid():
            key = it.key()
            if end is not None and key >= end:
                return
            yield key, value_of(key, it.value())
            it.next()

    def floor(self, cf: str, key: bytes) -> tuple[bytes, bytes] | None:
        it = self._cfs[cf].iter()
        it.seek_for_prev(key)
        if not it.valid():
            return None
        key = it.key()
        return key, self._whole(cf, key, it.value())

    def write(self, batch: Batch, sync: bool = False) -> None:
        self._writable()
        wb = rocksdict.WriteBatch(raw_mode=True)
        handles = self._handles
        deleted: list[tuple[str, bytes, bytes]] = []  # main-key ranges this batch deletes
        replaced: list[tuple[bytes, bytes]] = []  # chunk ranges of values this batch overwrites
        for kind, cf, key, value in batch.ops:
            if kind == PUT:
                if type(value) is bytes and len(value) <= large.LARGE:  # the common case, first
                    wb.put(key, value, handles[cf])
                    continue
                assert value is not None
                if large.size_of(value) > large.LARGE:
                    value = self._write_chunks(cf, key, value, deleted, replaced)
                wb.put(key, joined(value), handles[cf])
                continue
            if kind == DELETE:
                wb.delete(key, handles[cf])
                if cf in self._chunked and self._chunks_handle is not None:
                    # Only the generation its pointer names: the chunk keys of every generation of
                    # `key` are also those of longer keys that start with it (a subscription's id).
                    old = self._cfs[cf].get(key)
                    if old is not None and large.is_pointer(old):
                        wb.delete_range(*large.generation_range(cf, key, old), self._chunks_handle)
                continue
            assert isinstance(value, bytes)
            wb.delete_range(key, value, handles[cf])
            deleted.append((cf, key, value))
            if cf in self._chunked and self._chunks_handle is not None:  # its chunks go with the keys
                wb.delete_range(*large.range_of(cf, key, value), self._chunks_handle)
        self._db.write(wb, self._nosync)
        if sync:  # not WriteOptions.sync: rocksdict holds the GIL through that fsync, freezing the event loop
            self.sync_wal()
        if replaced and self._chunks_handle is not None:
            # The old generations are unreferenced now; if this is lost, they are only unreachable bytes.
            stale = rocksdict.WriteBatch(raw_mode=True)
            for start, end in replaced:
                stale.delete_range(start, end, self._chunks_handle)
            self._db.write(stale, self._nosync)

    def _write_chunks(
        self, cf: str, key: bytes, value: bytes | Parts, deleted: list[tuple[str, bytes, bytes]],
        replaced: list[tuple[bytes, bytes]],
    ) -> bytes:  # fmt: skip
        if self._chunks_handle is None:
            raise OSError(errno.EROFS, f"{self.path} has no chunk family (opened read-only)")
        # A delete earlier in the batch would land after these chunks and take them with it.
        if any(c == cf and start <= key < end for c, start, end in deleted):
            raise ValueError(f"a batch deletes {key!r} in {cf} and then writes a large value under it")
        old = self._cfs[cf].get(key)
        if old is not None and large.is_pointer(old):
            replaced.append(large.generation_range(cf, key, old))
        self._chunked.add(cf)
        return large.write_chunks(self._db, self._chunks_handle, self._nosync, cf, key, value)

    def delete_range(self, cf: str, start: bytes, end: bytes, sync: bool = False) -> None:
        batch = Batch()
        batch.delete_range(cf, start, end)
        self.write(batch, sync)

    def _writable(self) -> None:
        if self.read_only:  # opened so for want of space: the writer sees why
            raise OSError(errno.ENOSPC, f"{self.path} is open read-only: {NO_SPACE}")

    def sync_wal(self) -> None:
        # Unlike a write with sync=True, this releases the GIL while the disk syncs.
        self._db.flush_wal(True)

    def recover(self) -> bool:
        """Makes the store take writes again after a failed one; False while it cannot yet.

        A store that takes a write is left alone. Otherwise it is reopened once the disk has room to
        flush its write-ahead logs (as opening does), and read-only again if that still fails. It
        runs on the event loop's thread: nothing reads the store while it is closed.
        """
        if not self.read_only and self._probe():
            return True
        if free_bytes(self.path) < reopen_need(self.path):
            return False
        self.close()
        try:
            self._open(read_only=False)
        except Exception as exc:
            log.warning("%s: cannot reopen for writing yet (%s): read-only meanwhile", self.path, exc)
            self._open(read_only=True)
            return False
        log.info("%s: reopened, taking writes again", self.path)
        return True

    def _probe(self) -> bool:
        wb = rocksdict.WriteBatch(raw_mode=True)
        wb.delete(_PROBE)
        try:
            self._db.write(wb, self._nosync)
        except Exception:
            return False
        return True

    def close(self) -> None:
        self._cfs.clear()
        self._handles.clear()
        self._chunks = self._chunks_handle = None
        try:
            self._db.close()
        except Exception as exc:  # closing flushes; a store that cannot write still closes, its log intact
            log.warning("closing %s: %s", self.path, exc)
