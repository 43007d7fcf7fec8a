"""RocksDB implementation of the KV interface (rocksdict, raw bytes)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import rocksdict

from app.storage.kv import DELETE, PUT, Batch


def _options() -> rocksdict.Options:
    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    return options


class RocksKV:
    def __init__(self, path: str | Path, column_families: list[str]) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self._db = rocksdict.Rdict(
            str(path),
            _options(),
            column_families={cf: _options() for cf in column_families if cf != "default"},
        )
        self._cfs = {cf: self._db.get_column_family(cf) for cf in column_families}
        self._handles = {cf: self._db.get_column_family_handle(cf) for cf in column_families}
        self._sync = rocksdict.WriteOptions()
        self._sync.sync = True
        self._nosync = rocksdict.WriteOptions()

    @property
    def db(self) -> rocksdict.Rdict:
        return self._db

    def get(self, cf: str, key: bytes) -> bytes | None:
        return self._cfs[cf].get(key)

    def scan(self, cf: str, start: bytes, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        it = self._cfs[cf].iter()
        it.seek(start)
        while it.valid():
            key = it.key()
            if end is not None and key >= end:
                return
            yield key, it.value()
            it.next()

    def floor(self, cf: str, key: bytes) -> tuple[bytes, bytes] | None:
        it = self._cfs[cf].iter()
        it.seek_for_prev(key)
        if not it.valid():
            return None
        return it.key(), it.value()

    def write(self, batch: Batch, sync: bool = False) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        handles = self._handles
        for kind, cf, key, value in batch.ops:
            if kind == PUT:
                wb.put(key, value, handles[cf])
            elif kind == DELETE:
                wb.delete(key, handles[cf])
            else:
                assert value is not None
                wb.delete_range(key, value, handles[cf])
        self._db.write(wb, self._sync if sync else self._nosync)

    def delete_range(self, cf: str, start: bytes, end: bytes, sync: bool = False) -> None:
        wb = rocksdict.WriteBatch(raw_mode=True)
        wb.delete_range(start, end, self._handles[cf])
        self._db.write(wb, self._sync if sync else self._nosync)

    def sync_wal(self) -> None:
        # Unlike a write with sync=True, this releases the GIL while the disk syncs.
        self._db.flush_wal(True)

    def close(self) -> None:
        self._cfs.clear()
        self._handles.clear()
        self._db.close()
