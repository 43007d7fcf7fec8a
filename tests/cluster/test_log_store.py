"""The Raft log in RocksDB: synced saves, suffix replacement, compaction, reopening."""

from __future__ import annotations

from pathlib import Path

from app.cluster import log_store
from app.cluster.log_store import LogStore
from app.raft.messages import Entry, HardState
from app.storage.rocks import RocksKV


def _open(path: Path) -> tuple[RocksKV, LogStore]:
    kv = RocksKV(path, log_store.COLUMN_FAMILIES)
    return kv, LogStore(kv)


def test_entries_and_hard_state_survive_reopen(tmp_path: Path) -> None:
    kv, store = _open(tmp_path)
    store.save(HardState(term=3, vote=1, commit=2), [Entry(3, i, f"e{i}".encode()) for i in range(1, 5)])
    kv.close()
    kv, store = _open(tmp_path)
    assert store.hard_state() == HardState(term=3, vote=1, commit=2)
    assert [e.data for e in store.entries()] == [b"e1", b"e2", b"e3", b"e4"]
    assert store.last_index == 4
    kv.close()


def test_overwriting_from_the_middle_drops_the_old_tail(tmp_path: Path) -> None:
    kv, store = _open(tmp_path)
    store.save(None, [Entry(1, i, b"old") for i in range(1, 6)])
    store.save(None, [Entry(2, 3, b"new")])
    assert [(e.index, e.data) for e in store.entries()] == [(1, b"old"), (2, b"old"), (3, b"new")]
    assert store.last_index == 3
    kv.close()


def test_compaction_forgets_the_prefix_but_remembers_its_term(tmp_path: Path) -> None:
    kv, store = _open(tmp_path)
    store.save(None, [Entry(1, i, b"x") for i in range(1, 11)])
    store.compact(6, 1)
    kv.close()
    kv, store = _open(tmp_path)
    assert (store.compacted_index, store.compacted_term) == (6, 1)
    assert [e.index for e in store.entries()] == [7, 8, 9, 10]
    kv.close()
