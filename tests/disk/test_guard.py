"""The free-space guard and the ballast file, on a faked filesystem size (statvfs injected)."""

from __future__ import annotations

import errno
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.domain.errors import ProtocolError
from app.service.engine import _grows_storage
from app.state_machine.commands import (
    Append,
    AppendBatch,
    CollectExpired,
    Command,
    CreateBucket,
    CreateStream,
    DeleteSnapshot,
    DeleteStream,
    Evict,
    ForgetObjects,
    PublishSnapshot,
    Retain,
    SetAttrs,
    TierSegment,
    Touch,
)
from app.state_machine.records import SegmentInfo
from app.storage.disk import MIB, DiskGuard, OutOfSpace, is_no_space, out_of_space

GIB = 1 << 30
BLOCK = 4096


@dataclass
class FakeFs:
    """A filesystem of `total` bytes with `free` available; counts statvfs calls."""

    total: int
    free: int
    calls: int = 0

    def __call__(self, path: str) -> FakeFs:
        self.calls += 1
        return self

    @property
    def f_frsize(self) -> int:
        return BLOCK

    @property
    def f_blocks(self) -> int:
        return self.total // BLOCK

    @property
    def f_bavail(self) -> int:
        return self.free // BLOCK


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _guard(tmp_path: Path, fs: FakeFs, clock: Clock | None = None, **kwargs: int | float) -> DiskGuard:
    return DiskGuard(tmp_path, statvfs=fs, clock=clock or Clock(), **kwargs)  # type: ignore[arg-type]


def test_the_watermark_is_the_smaller_of_the_byte_cap_and_the_share(tmp_path: Path) -> None:
    big = _guard(tmp_path, FakeFs(total=1000 * GIB, free=500 * GIB))
    big.refresh()
    assert big.watermark == GIB  # 5% would be 50 GiB: the 1 GiB cap applies
    small = _guard(tmp_path, FakeFs(total=20 * MIB, free=10 * MIB))
    small.refresh()
    assert small.watermark == MIB  # 5% of 20 MiB
    off = _guard(tmp_path, FakeFs(total=20 * MIB, free=0), min_free_bytes=0)
    off.check(1 << 20)  # 0 turns the guard off, even on a full disk


def test_the_watermark_leaves_the_stores_room_to_reopen(tmp_path: Path) -> None:
    """After a failed write a store reopens, which needs its write-ahead logs' size free: writes that
    resume above the watermark must find it there, and a released ballast must give at least that."""
    need = [3 * MIB]
    fs = FakeFs(total=100 * MIB, free=50 * MIB)
    guard = DiskGuard(
        tmp_path,
        2 * MIB,
        1.0,
        64 * MIB,
        statvfs=fs,
        clock=Clock(),
        reserve=lambda: need[0],  # type: ignore[arg-type]
    )
    guard.refresh()
    assert guard.watermark == 3 * MIB and guard.ballast_size == 3 * MIB  # 1% of the disk would be 1 MiB
    need[0] = MIB
    guard.refresh()
    assert guard.watermark == 2 * MIB  # the configured one, when larger
    off = DiskGuard(tmp_path, 0, 1.0, statvfs=fs, clock=Clock(), reserve=lambda: need[0])  # type: ignore[arg-type]
    off.refresh()
    assert off.watermark == 0  # a guard turned off stays off


def test_check_answers_507_below_the_watermark(tmp_path: Path) -> None:
    fs = FakeFs(total=100 * MIB, free=10 * MIB)
    guard = _guard(tmp_path, fs, min_free_bytes=8 * MIB, min_free_ratio=1.0)
    guard.check()
    fs.free = 7 * MIB
    guard.refresh()
    with pytest.raises(ProtocolError) as caught:
        guard.check()
    assert (caught.value.status, caught.value.code) == (507, "insufficient_storage")
    assert guard.low()


def test_free_space_is_measured_at_most_every_refresh_interval(tmp_path: Path) -> None:
    fs, clock = FakeFs(total=100 * MIB, free=50 * MIB), Clock()
    guard = _guard(tmp_path, fs, clock, min_free_bytes=MIB, min_free_ratio=1.0)
    for _ in range(1000):
        guard.check()
    assert fs.calls == 1
    clock.now += 0.6
    guard.check()
    assert fs.calls == 2


def test_writes_let_through_count_against_free_space_until_measured_again(tmp_path: Path) -> None:
    fs, clock = FakeFs(total=100 * MIB, free=20 * MIB), Clock()
    guard = _guard(tmp_path, fs, clock, min_free_bytes=10 * MIB, min_free_ratio=1.0)
    for _ in range(6):
        guard.check(MIB)  # each counts twice, the Raft log's copy and the state store's: 8 MiB left
    with pytest.raises(ProtocolError):
        guard.check(MIB)
    clock.now += 1
    guard.check(MIB)  # measured again: the fake disk did not fill after all


def test_the_ballast_is_made_when_there_is_room_and_freed_when_the_disk_fills(tmp_path: Path) -> None:
    fs = FakeFs(total=1000 * MIB, free=500 * MIB)
    guard = _guard(tmp_path, fs, min_free_bytes=50 * MIB, min_free_ratio=1.0, ballast_bytes=64 * MIB)
    guard.start()
    assert guard.ballast_size == 10 * MIB  # at most 1% of the filesystem
    assert guard.ballast.stat().st_size == 10 * MIB
    fs.free = 6 * MIB  # a disk this full would still leave the ballast alone (more than half of it free)
    guard.refresh()
    assert guard.ballast.exists()
    fs.free = 4 * MIB
    guard.refresh()
    assert not guard.ballast.exists()
    fs.free = 65 * MIB  # not room for it above the watermark twice over yet
    guard.refresh()
    assert not guard.ballast.exists()
    fs.free = 70 * MIB
    guard.refresh()
    assert guard.ballast.exists()


def test_start_frees_the_ballast_when_less_than_it_is_free(tmp_path: Path) -> None:
    fs = FakeFs(total=1000 * MIB, free=500 * MIB)
    guard = _guard(tmp_path, fs, min_free_bytes=0, ballast_bytes=2 * MIB)
    guard.start()
    assert guard.ballast.stat().st_size == 2 * MIB
    fs.free = MIB + MIB // 2  # more than half the ballast: a running node keeps it, a starting one frees it
    guard.refresh()
    assert guard.ballast.exists()
    guard.start()
    assert not guard.ballast.exists()


def test_no_space_is_recognised_from_the_os_and_from_rocksdb() -> None:
    assert is_no_space(OSError(errno.ENOSPC, "No space left on device"))
    assert is_no_space(Exception("IO error: No space left on device: While appending to file: x/000004.log"))
    assert not is_no_space(OSError(errno.EIO, "Input/output error"))
    with pytest.raises(OutOfSpace), out_of_space():
        raise Exception("IO error: No space left on device")
    with pytest.raises(ValueError), out_of_space():
        raise ValueError("something else")


def test_a_nearly_full_disk_refuses_what_adds_data_and_passes_what_frees_space() -> None:
    segment = SegmentInfo(0, 1, "k", 1, "", 0, 0, b"")
    grows: list[Command] = [
        CreateBucket("b"),
        CreateStream("b", "s", "text/plain", False),
        Append("b", "s", None, memoryview(b"x")),
        AppendBatch("b", "s", None, [b"x"]),
        SetAttrs("b", "s", b"{}"),
        PublishSnapshot("b", "s", 0, "text/plain", "", 1, inline=b"x"),
    ]
    frees: list[Command] = [
        Append("b", "s", None, memoryview(b""), close=True),
        DeleteStream("b", "s"),
        Retain("b", "s", 1),
        DeleteSnapshot("b", "s", 0),
        CollectExpired([1]),
        Touch("b", "s"),
        TierSegment(1, segment),
        Evict(1, 1),
        ForgetObjects(["k"]),
    ]
    assert all(_grows_storage(c) for c in grows)
    assert not any(_grows_storage(c) for c in frees)


def test_status_reports_free_space_the_watermark_and_whether_writes_are_refused(tmp_path: Path) -> None:
    fs = FakeFs(total=10 * GIB, free=2 * GIB)
    guard = _guard(tmp_path, fs, min_free_bytes=GIB, min_free_ratio=0.05)
    status = guard.status()
    assert status == {
        "free_bytes": 2 * GIB,
        "total_bytes": 10 * GIB,
        "watermark_bytes": GIB // 2,
        "writes_refused": False,
        "ballast": False,
    }
    fs.free = GIB // 4
    guard.refresh()
    assert guard.status()["writes_refused"] is True
