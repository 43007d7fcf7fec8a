"""The leader's state backups: when one is due, what it uploads, how many are kept, and failures."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.state_machine import backup
from app.state_machine.machine import StateMachine
from app.tiering.backups import BackupConfig, StateBackups
from app.tiering.store import FileStore, StoreUnavailable
from tests.state_machine.helpers import T0
from tests.state_machine.tiering_helpers import TH


class Leader:
    def __init__(self, machine: StateMachine) -> None:
        self.machine = machine
        self.is_leader = True
        self.now = T0

    def now_ms(self) -> int:
        return self.now


def _backups(tmp_path: Path, **config: float) -> tuple[TH, Leader, StateBackups, FileStore]:
    h = TH()
    h.create("s", body=b"first")
    leader = Leader(h.sm)
    store = FileStore(tmp_path / "cold")
    return h, leader, StateBackups(leader, 1, store, None, BackupConfig(**config)), store  # type: ignore[arg-type]


def _keys(store: FileStore) -> list[str]:
    return [key for key in store.list(backup.KEY_PREFIX)]


def test_a_new_leader_backs_up_at_once_then_on_the_interval_or_after_enough_entries(tmp_path: Path) -> None:
    h, leader, backups, store = _backups(tmp_path, interval=60, entries=3)
    assert backups.due(leader.now)
    written = asyncio.run(backups.write_once())
    assert written is not None and _keys(store) == [written.key] and written.index == h.sm.applied_index
    assert not backups.due(leader.now + 3_600_000)  # nothing changed: no new backup, however long
    h.append("s", b"x")
    assert not backups.due(leader.now + 59_000) and backups.due(leader.now + 60_000)
    h.append("s", b"y")
    h.append("s", b"z")
    assert not backups.due(leader.now + 4_000)  # three entries, but within the minimum gap
    assert backups.due(leader.now + 5_000)
    leader.is_leader = False
    assert not backups.due(leader.now + 60_000)


def test_backups_sooner_than_the_interval_take_at_most_a_twentieth_of_the_time(tmp_path: Path) -> None:
    h, leader, backups, store = _backups(tmp_path, interval=600, entries=1)
    written = asyncio.run(backups.write_once())
    assert written is not None
    written.took_ms = 2_000  # a large state: its backup took 2 s
    h.append("s", b"x")
    assert not backups.due(leader.now + 39_000)  # enough entries, but 2 s is more than 5% of 39 s
    assert backups.due(leader.now + 40_000)
    written.took_ms = 60_000  # a backup that took longer than the interval does not delay the interval's
    assert backups.due(leader.now + 600_000)


def test_only_the_newest_backups_are_kept(tmp_path: Path) -> None:
    h, leader, backups, store = _backups(tmp_path, keep=2)
    indexes = []
    for i in range(4):
        h.append("s", b"%d" % i)
        leader.now += 1000
        written = asyncio.run(backups.write_once())
        assert written is not None
        indexes.append(written.index)
    assert [backup.parse_key(k)[0] for k in _keys(store)] == indexes[-2:]  # type: ignore[index]


def test_the_floor_is_the_newest_backup_or_the_one_under_way(tmp_path: Path) -> None:
    """What the tiering worker may delete: only objects released after the newest backup's index."""
    h, leader, backups, store = _backups(tmp_path, keep=2)
    assert backups.floor() == 0  # not listed yet: nothing released since may go
    first = asyncio.run(backups.write_once())
    assert first is not None and backups.floor() == first.index
    h.append("s", b"more")
    second = asyncio.run(backups.write_once())
    assert second is not None and backups.floor() == second.index > first.index

    seen: list[int | None] = []
    taking = backups._write

    async def watched(now: int) -> object:
        seen.append(backups.floor())
        return await taking(now)

    backups._write = watched  # type: ignore[method-assign]
    h.append("s", b"again")
    third = asyncio.run(backups.write_once())
    assert third is not None and seen == [second.index]  # under way: the older newest still holds
    assert backups.floor() == third.index
    for key in _keys(store):
        store.delete(key)
    asyncio.run(backups.write_once())
    backups._kept = []
    assert backups.floor() is None  # no backup at all: nothing held


def test_a_failing_store_is_retried_later_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    h, leader, backups, store = _backups(tmp_path)

    def down(key: str, data: bytes) -> None:
        raise StoreUnavailable("connection refused")

    monkeypatch.setattr(store, "put", down)
    assert asyncio.run(backups.write_once()) is None
    assert (backups.errors, backups.last_error, backups.last) == (1, "connection refused", None)
    assert not backups.due(leader.now + 9_000) and backups.due(leader.now + 10_000)
    monkeypatch.undo()
    assert asyncio.run(backups.write_once()) is not None and backups.last_error is None


def test_a_backup_uploaded_but_not_listed_holds_every_object(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first backup lands in an empty store, then the pruning's listing fails: the floor must not
    stay None (which lets the collector delete every released object, some of which the new backup
    names) but hold everything until the store is listed again."""
    h, leader, backups, store = _backups(tmp_path)
    asyncio.run(backups.begin_leading(leader.now))
    assert backups.floor() is None  # an empty store: nothing held

    def down(*args: object) -> None:
        raise StoreUnavailable("slow down")

    monkeypatch.setattr(store, "list", down)
    assert asyncio.run(backups.write_once()) is None
    assert len(_keys_of(tmp_path)) == 1  # the upload itself landed
    assert backups.floor() == 0
    monkeypatch.undo()
    h.append("s", b"more")
    written = asyncio.run(backups.write_once())
    assert written is not None and backups.floor() == written.index


def _keys_of(tmp_path: Path) -> list[str]:
    return list(FileStore(tmp_path / "cold").list(backup.KEY_PREFIX))


def test_the_recovery_point_age_counts_unsaved_metadata_and_unsealed_records(tmp_path: Path) -> None:
    h, leader, backups, store = _backups(tmp_path)
    backups._leading_since = leader.now
    asyncio.run(backups.write_once())
    assert backups.recovery_point_age(leader.now + 5_000, None) == 0  # nothing since the backup
    assert backups.recovery_point_age(leader.now + 5_000, leader.now - 2_000) == 7.0  # a record unsealed 7 s
    h.append("s", b"more")
    assert backups.recovery_point_age(leader.now + 5_000, None) == 5.0  # a change the backup lacks
    status = backups.status(leader.now + 5_000, None)
    assert status["unprotected_bytes"] == h.sm.untiered_bytes and status["recovery_point_age_seconds"] == 5.0
    leader.is_leader = False
    assert backups.recovery_point_age(leader.now, None) is None


def test_a_backup_of_the_state_store_is_written_through_a_file_and_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.service.restore import restore
    from app.state_machine import records as r
    from app.storage.rocks import RocksKV
    from app.storage.state_store import StateStore
    from app.tiering import backup_writer

    def not_here(*args: object) -> None:
        raise AssertionError("encoded in the server's process, under its GIL")

    monkeypatch.setattr(backup_writer, "encode", not_here)  # the child process has its own, untouched

    state_store = StateStore(tmp_path / "node", r.COLUMN_FAMILIES)
    h = TH(kv=state_store.open())  # type: ignore[arg-type]
    for i in range(200):
        h.create(f"s{i}", body=b"%d" % i * 5000)  # about 2 MiB in all, in several frames
    leader = Leader(h.sm)
    store = FileStore(tmp_path / "cold")
    backups = StateBackups(leader, 1, store, state_store, BackupConfig())  # type: ignore[arg-type]
    written = asyncio.run(backups.write_once())
    assert written is not None and _keys(store) == [written.key]
    assert not list((tmp_path / "node").rglob("*.state")), "the file is removed once uploaded"
    h.kv.close()
    restore(store, tmp_path / "restored")
    again = StateMachine(RocksKV(tmp_path / "restored" / "state", r.COLUMN_FAMILIES))
    try:
        meta = again.lookup("b", "s199")
        assert meta is not None and b"".join(again.read(meta, 0, 1 << 20).payloads) == b"199" * 5000
    finally:
        again.kv.close()


def test_a_backup_cancelled_while_its_writer_runs_kills_it_and_uploads_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stopping node cancels the backup under way: its writer must not run on (the process could
    not exit before it ended), nor its backup be uploaded after the node stopped."""
    import os
    import stat
    import sys
    import time

    from app.state_machine import records as r
    from app.storage.state_store import StateStore
    from app.tiering import backup_writer

    slow = tmp_path / "slow-python"
    wait_then_run = "import os, sys, time; time.sleep(30); os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    slow.write_text(f"#!/bin/sh\nexec {sys.executable} -c '{wait_then_run}' \"$@\"\n")  # one process, killed whole
    slow.chmod(slow.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(backup_writer.sys, "executable", str(slow))
    state_store = StateStore(tmp_path / "node", r.COLUMN_FAMILIES)
    h = TH(kv=state_store.open())  # type: ignore[arg-type]
    h.create("s", body=b"x")
    store = FileStore(tmp_path / "cold")
    backups = StateBackups(Leader(h.sm), 1, store, state_store, BackupConfig())  # type: ignore[arg-type]

    async def cancelled() -> float:
        task = asyncio.create_task(backups.write_once())
        while backups._child is None:
            await asyncio.sleep(0.01)
        started = time.monotonic()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return time.monotonic() - started

    assert asyncio.run(cancelled()) < 10
    child = backups._child
    assert child is not None and child.returncode is not None  # killed, not sleeping on
    with pytest.raises(ProcessLookupError):
        os.kill(child.pid, 0)
    assert _keys(store) == [] and backups.written == 0
    h.kv.close()


def test_a_new_leader_reports_the_recovery_point_of_the_newest_backup_in_the_store(tmp_path: Path) -> None:
    """Until its own first backup (which may keep failing), from the newest an earlier leader wrote,
    not from when it began leading; and it knows the floor at once."""
    h, leader, first_leader, store = _backups(tmp_path)
    written = asyncio.run(first_leader.write_once())
    assert written is not None
    h.append("s", b"changed since")
    leader.now += 300_000
    second = StateBackups(leader, 2, store, None, BackupConfig())  # type: ignore[arg-type]
    asyncio.run(second.begin_leading(leader.now))
    assert second.floor() == written.index
    age = second.recovery_point_age(leader.now, None)
    assert age is not None and age == 300.0  # not 0: the changes since the last backup are unprotected
