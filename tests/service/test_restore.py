"""`rill restore`'s core: a data directory from a state backup plus the segments sealed after it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cluster import log_store
from app.cluster.log_store import LogStore
from app.domain.offsets import format_offset
from app.service.restore import RestoreError, restore
from app.state_machine import backup
from app.state_machine import records as r
from app.state_machine.commands import Producer
from app.state_machine.machine import StateMachine
from app.storage.rocks import RocksKV
from app.tiering import segment as seg
from app.tiering.store import FileStore
from tests.state_machine.helpers import T0, B
from tests.state_machine.tiering_helpers import TH, DictCold


def _seal(h: TH, store: FileStore, name: str) -> None:
    """What the tiering worker does: the segment, its record in the state, and the stream's manifest."""
    assert h.tier(name).code.name == "OK"
    meta = h.m(name)
    entries = []
    for info in h.sm.segments(meta.sid, meta.fork_pos, meta.tiered):
        store.put(info.key, h.objects[info.key])
        directory = seg.stream_dir(meta.bucket, meta.name)
        entries.append(
            seg.SegmentEntry(
                info.key.removeprefix(directory + "/"),
                format_offset(info.lo),
                format_offset(info.hi),
                info.records,
                info.size,
                info.sha256,
                info.min_time,
                info.max_time,
            )  # fmt: skip
        )
    store.put(
        seg.manifest_key(meta.bucket, meta.name),
        seg.Manifest(meta.bucket, meta.name, meta.content_type, entries).to_json(),
    )


def _back_up(h: TH, store: FileStore, at: int) -> int:
    header, data = backup.encode(h.kv, at, 1)
    store.put(backup.backup_key(header.index, data), data)
    return header.index


@pytest.fixture()
def world(tmp_path: Path) -> tuple[TH, FileStore, int]:
    h = TH()
    store = FileStore(tmp_path / "cold")
    h.create("s", body=b"created;")
    for seq in range(3):
        h.append("s", b"before-%d;" % seq, producer=Producer("p", 0, seq))
    _seal(h, store, "s")
    h.create("quiet", body=b"never sealed")
    h.create("early", body=b"sealed before the backup, still on local disk then")
    _seal(h, store, "early")
    index = _back_up(h, store, T0 + 1000)
    for seq in range(3, 5):
        h.append("s", b"after-%d;" % seq, producer=Producer("p", 0, seq))
    _seal(h, store, "s")
    h.append("s", b"lost;")  # acknowledged, but in neither the backup nor a segment
    return h, store, index


def _content(machine: StateMachine, objects: dict[str, bytes], name: str) -> bytes:
    meta = machine.lookup(B, name)
    assert meta is not None
    pos, out = 0, b""
    while pos < meta.tail:
        chunk = machine.read(meta, pos, 1 << 20, DictCold(objects))
        assert chunk.next_pos > pos, f"nothing readable at {pos} of {name}"
        out, pos = out + b"".join(chunk.payloads), chunk.next_pos
    return out


def test_the_backup_and_the_segments_after_it_come_back(world: tuple[TH, FileStore, int], tmp_path: Path) -> None:
    h, store, index = world
    done = restore(store, tmp_path / "node")
    assert (done.index, done.segments_after, done.records_after) == (index, 1, 2)
    assert done.recovery_point >= T0 + 1000 and done.unknown_streams == []
    machine = StateMachine(RocksKV(tmp_path / "node" / "state", r.COLUMN_FAMILIES))
    try:
        objects = {key: store.get(key) for key in store.list("") if key.endswith(".parquet")}
        assert _content(machine, objects, "s") == b"created;before-0;before-1;before-2;after-3;after-4;"
        assert _content(machine, objects, "quiet") == b"never sealed"  # local in the backup
        assert _content(machine, objects, "early") == b"sealed before the backup, still on local disk then"
        meta = machine.lookup(B, "s")
        assert meta is not None and meta.tiered == meta.evicted == meta.tail
        producer = machine.kv.get(r.PRODUCERS, r.producer_key(meta.sid, "p"))
        assert producer is not None and r.decode_producer(producer).seq == 4  # a retry of seq 4 is a duplicate
        assert machine.membership is None  # a new one-node cluster: the settings say who it is
        assert machine.applied_index == index
    finally:
        machine.kv.close()
    raft = RocksKV(tmp_path / "node" / "raft", log_store.COLUMN_FAMILIES)
    try:
        log = LogStore(raft)
        assert (log.compacted_index, log.last_index, log.hard_state().commit) == (index, index, index)
    finally:
        raft.close()


def test_at_an_index_takes_the_backup_at_or_before_it(world: tuple[TH, FileStore, int], tmp_path: Path) -> None:
    h, store, first = world
    second = _back_up(h, store, T0 + 9000)
    assert restore(store, tmp_path / "newest").index == second
    assert restore(store, tmp_path / "older", at_index=second - 1).index == first
    assert restore(store, tmp_path / "by-time", at_time=T0 + 5000).index == first
    with pytest.raises(RestoreError, match="no state backup at or before"):
        restore(store, tmp_path / "none", at_index=first - 1)


def test_nothing_is_written_over_a_node_or_from_an_empty_store(
    world: tuple[TH, FileStore, int], tmp_path: Path
) -> None:
    _, store, _ = world
    restore(store, tmp_path / "node")
    with pytest.raises(RestoreError, match="empty data directory"):
        restore(store, tmp_path / "node")
    with pytest.raises(RestoreError, match="no state backup"):
        restore(FileStore(tmp_path / "empty"), tmp_path / "other")
    assert not (tmp_path / "other" / "state").exists()


def test_a_segment_that_is_not_what_the_manifest_names_stops_the_chain(
    world: tuple[TH, FileStore, int], tmp_path: Path
) -> None:
    h, store, _ = world
    meta = h.m("s")
    last = list(h.sm.segments(meta.sid, 0, meta.tiered))[-1]
    store.put(last.key, b"not the segment")
    done = restore(store, tmp_path / "node")
    assert done.segments_after == 0  # the backup's own state is all that is certain


def test_a_stream_created_after_the_backup_comes_back_from_its_manifest(
    world: tuple[TH, FileStore, int], tmp_path: Path
) -> None:
    h, store, _ = world
    h.create("gone", body=b"deleted before the backup")
    _seal(h, store, "gone")
    h.delete("gone")  # its objects are queued for deletion: the backup says so, nothing brings it back
    _back_up(h, store, T0 + 9000)
    h.create("newcomer", ct="application/json", body=b'{"a":1}')
    h.append("newcomer", b'{"b":2}', ct="application/json", producer=Producer("q", 1, 0))
    _seal(h, store, "newcomer")
    h.create("after", body=b"only in a segment")
    _seal(h, store, "after")
    done = restore(store, tmp_path / "node")
    assert done.new_streams == 2 and done.unknown_streams == []  # "newcomer" and "after"
    machine = StateMachine(RocksKV(tmp_path / "node" / "state", r.COLUMN_FAMILIES))
    try:
        objects = {key: store.get(key) for key in store.list("") if key.endswith(".parquet")}
        assert _content(machine, objects, "after") == b"only in a segment"
        meta = machine.lookup(B, "newcomer")
        assert meta is not None and meta.json and meta.content_type == "application/json"
        producer = machine.kv.get(r.PRODUCERS, r.producer_key(meta.sid, "q"))
        assert producer is not None and r.decode_producer(producer).epoch == 1
        assert machine.lookup(B, "gone") is None
        assert len({m.sid for m in machine.streams.values()}) == len(machine.streams)  # fresh ids
    finally:
        machine.kv.close()
