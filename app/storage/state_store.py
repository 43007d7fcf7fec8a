"""The state machine's RocksDB directory, the staged store that replaces it, and checkpoints.

A store received from the leader is staged beside the live one and synced; once the driver accepts
it, it is marked complete and swapped in. `open` finishes a swap that a crash interrupted: a staged
store not marked complete is dropped (the driver may have refused it, or it may be older than the
live store), one marked complete is swapped in.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import rocksdict

from app.storage.rocks import RocksKV

_COMPLETE = "COMPLETE"


class StateStore:
    """The directory of the state machine's store, its staged replacement, and checkpoints."""

    def __init__(self, data_dir: Path, column_families: list[str]) -> None:
        self.column_families = column_families
        self.path = data_dir / "state"
        self.staging = data_dir / "state.staging"
        self.checkpoints = data_dir / "checkpoints"

    def open(self) -> RocksKV:
        """Opens the store, first finishing an install a crash interrupted."""
        if (self.staging / _COMPLETE).exists():
            self.swap()
        elif not self.path.exists() and self._old.exists():
            self._old.rename(self.path)  # a swap of a store never marked complete: keep the old one
        (self.path / _COMPLETE).unlink(missing_ok=True)  # swapped in before the crash: only the marker is left
        shutil.rmtree(self.staging, ignore_errors=True)
        shutil.rmtree(self._old, ignore_errors=True)
        shutil.rmtree(self.checkpoints, ignore_errors=True)
        return RocksKV(self.path, self.column_families)

    @property
    def _old(self) -> Path:
        return self.path.with_name("state.old")

    def checkpoint(self, kv: RocksKV, name: str) -> Path:
        path = self.checkpoints / name
        shutil.rmtree(path, ignore_errors=True)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        rocksdict.Checkpoint(kv.db).create_checkpoint(str(path))
        return path

    def begin_staging(self) -> RocksKV:
        shutil.rmtree(self.staging, ignore_errors=True)
        return RocksKV(self.staging, self.column_families)

    def complete_staging(self, kv: RocksKV) -> None:
        """The staged store is whole and on disk; it is not marked complete until it is accepted."""
        kv.sync_wal()
        kv.close()

    def mark_complete(self) -> None:
        """The staged store is to replace the live one, even if a crash comes before the swap."""
        marker = self.staging / _COMPLETE
        marker.write_bytes(b"")
        _fsync(marker)
        _fsync(self.staging)

    def swap(self) -> None:
        """Makes the complete staging store the state store (the old one is removed). The marker goes
        last: a crash at any step leaves either a complete staging store or the new one in place."""
        old = self._old
        shutil.rmtree(old, ignore_errors=True)
        if self.path.exists():
            self.path.rename(old)
        self.staging.rename(self.path)  # its marker along with it
        _fsync(self.path.parent)
        (self.path / _COMPLETE).unlink()
        shutil.rmtree(old, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
