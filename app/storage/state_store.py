"""The state machine's RocksDB directory, the staged store that replaces it, and checkpoints.

A store received from the leader is staged beside the live one, synced and marked complete, then
swapped in; `open` finishes (or undoes) a swap that a crash interrupted.
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
        shutil.rmtree(self.staging, ignore_errors=True)
        shutil.rmtree(self.checkpoints, ignore_errors=True)
        return RocksKV(self.path, self.column_families)

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
        kv.sync_wal()
        kv.close()
        marker = self.staging / _COMPLETE
        marker.write_bytes(b"")
        _fsync(marker)
        _fsync(self.staging)

    def swap(self) -> None:
        """Makes the complete staging store the state store (the old one is removed)."""
        old = self.path.with_name("state.old")
        shutil.rmtree(old, ignore_errors=True)
        if self.path.exists():
            self.path.rename(old)
        (self.staging / _COMPLETE).unlink()
        self.staging.rename(self.path)
        _fsync(self.path.parent)
        shutil.rmtree(old, ignore_errors=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
