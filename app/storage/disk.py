"""Free space on the data directory's filesystem: the low-disk write guard, and the ballast file.

While free space is below the watermark, min(min_free_bytes, min_free_ratio x filesystem size),
writes that add data answer 507: the stores keep room for what frees space (deletes, trims, the
tiering worker's records) and for RocksDB's own files. The ballast is a preallocated file held in
reserve: deleted once free space falls below half its size (below its size at startup: opening the
stores writes), so the stores can open and take deletes on a full disk; recreated once free space
is back above the watermark by twice its size.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from app.domain.errors import ProtocolError

log = logging.getLogger("rill.disk")

MIB = 1 << 20
NO_SPACE = "No space left on device"  # strerror(ENOSPC): RocksDB puts it in its status text
BALLAST = "ballast"
WRITE_AMPLIFICATION = 2  # an entry's bytes land in the Raft log and again in the state store


def is_no_space(exc: BaseException) -> bool:
    """A write failed for want of space: ENOSPC from the OS, or RocksDB reporting it."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return True
    return NO_SPACE in str(exc)


class OutOfSpace(Exception):
    """A store's write failed for want of disk space."""


@contextlib.contextmanager
def out_of_space() -> Iterator[None]:
    """Raises OutOfSpace for a failure for want of space; other errors pass unchanged."""
    try:
        yield
    except Exception as exc:
        if is_no_space(exc):
            raise OutOfSpace(str(exc)) from exc
        raise


def insufficient_storage(message: str) -> ProtocolError:
    return ProtocolError(507, "insufficient_storage", message)


class FsStats(Protocol):
    """The part of `os.statvfs_result` the guard reads (tests inject fakes)."""

    @property
    def f_frsize(self) -> int: ...

    @property
    def f_blocks(self) -> int: ...

    @property
    def f_bavail(self) -> int: ...


@dataclass(frozen=True)
class Usage:
    total: int
    free: int  # available to unprivileged writers (f_bavail): what RocksDB can count on


class DiskGuard:
    def __init__(
        self,
        path: Path,
        min_free_bytes: int = 1 << 30,
        min_free_ratio: float = 0.05,
        ballast_bytes: int = 0,
        *,
        statvfs: Callable[[str], FsStats] = os.statvfs,
        clock: Callable[[], float] = time.monotonic,
        refresh_seconds: float = 0.5,
        reserve: Callable[[], int] | None = None,
    ) -> None:
        """`reserve` says how much free space the stores need to recover from a failed write (reopen)."""
        self.path = path
        self.min_free_bytes = min_free_bytes
        self.min_free_ratio = min_free_ratio
        self.ballast_bytes = ballast_bytes
        self.ballast = path / BALLAST
        self._statvfs = statvfs
        self._clock = clock
        self._refresh_seconds = refresh_seconds
        self.reserve = reserve
        self._reserved = 0  # what `reserve` said at the last measure
        self._usage = Usage(0, 0)
        self._checked_at = -math.inf
        self._admitted = 0  # bytes let through since the last measure: free space falls faster than it is measured

    def _measure(self) -> Usage:
        st = self._statvfs(str(self.path))
        return Usage(st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize)

    @property
    def watermark(self) -> int:
        """Free bytes below which writes that add data are refused; 0 turns the guard off.

        Never below what the stores need to reopen after a failed write: once free space is back
        above the watermark, a store that ran out of space can take writes again.
        """
        configured = min(self.min_free_bytes, int(self.min_free_ratio * self._usage.total))
        return max(configured, self._reserved) if configured else 0

    @property
    def ballast_size(self) -> int:
        """`ballast_bytes`, capped at 1% of the filesystem (a cap never below 1 MiB, nor below what the
        stores need to reopen: released on a full disk, the ballast lets them take deletes again)."""
        return min(self.ballast_bytes, max(MIB, self._usage.total // 100, self._reserved))

    def usage(self) -> Usage:
        """Free space as last measured; measured again when older than `refresh_seconds`."""
        if self._clock() - self._checked_at >= self._refresh_seconds:
            self.refresh()
        return self._usage

    def refresh(self) -> Usage:
        """Measures now, releasing the ballast when the disk is nearly exhausted, recreating it when there is room."""
        self._checked_at = self._clock()
        self._usage = self._measure()
        self._admitted = 0
        if self.reserve is not None:
            self._reserved = self.reserve()
        size = self.ballast_size
        if size and self._usage.free < size // 2:
            self.release_ballast()
        elif size and self._usage.free >= self.watermark + 2 * size:
            self._create_ballast(size)
        return self._usage

    def start(self) -> None:
        """Before the stores open: they write as they open, so a disk with less free than the ballast gets it back."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._usage = self._measure()
        size = self.ballast_size
        if size and self._usage.free < size:
            self.release_ballast()
        self.refresh()

    def free(self) -> int:
        """Free bytes as last measured, less what the writes let through since then will take."""
        return self.usage().free - self._admitted

    def low(self) -> bool:
        return self.free() < self.watermark

    def status(self) -> dict[str, object]:
        """For /healthz: free space, the watermark, and whether writes are refused."""
        free = self.free()
        return {
            "free_bytes": max(free, 0),
            "total_bytes": self._usage.total,
            "watermark_bytes": self.watermark,
            "writes_refused": free < self.watermark,
            "ballast": self.ballast.exists(),
        }

    def check(self, nbytes: int = 0) -> None:
        """Raises the 507 a write that adds data gets while free space is below the watermark; else
        counts the write's `nbytes` against free space until the next measure."""
        free = self.free()
        watermark = self.watermark  # computed once: this is every write's path
        if free < watermark:
            raise insufficient_storage(
                f"the node's disk is nearly full ({max(free, 0)} bytes free, {watermark} kept in reserve): "
                "delete or trim streams, or add space; reads and deletes still work"
            )
        self._admitted += nbytes * WRITE_AMPLIFICATION

    def release_ballast(self) -> None:
        if self.ballast.exists():
            self.ballast.unlink()
            log.warning("disk nearly full: deleted the %s ballast file to make room", self.ballast)
            self._usage = self._measure()

    def _create_ballast(self, size: int) -> None:
        if self.ballast.exists():
            return
        tmp = self.ballast.with_name(BALLAST + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.posix_fallocate(fd, 0, size)  # blocks really allocated: a sparse file would reserve nothing
            finally:
                os.close(fd)
            tmp.rename(self.ballast)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            log.warning("could not create the ballast file %s (%s): going on without one", self.ballast, exc)
            self.ballast_bytes = 0  # not at every measure
            return
        log.info("created the ballast file %s (%d bytes)", self.ballast, size)
        self._usage = self._measure()


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize
