"""`rill restore`'s core: a data directory from a state backup plus the segments sealed after it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from app.cluster import log_store
from app.cluster.log_store import LogStore
from app.domain.offsets import format_offset
from app.service.restore import RestoreError, restore
from app.state_machine import backup
from app.state_machine import records as r
from app.state_machine.cold_tier import pack_index_of
from app.state_machine.commands import Producer
from app.state_machine.machine import StateMachine
from app.storage.rocks import RocksKV
from app.tiering import pack as packs
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


def _log_points(data_dir: Path) -> tuple[int, int, int]:
    """Where a restored node's Raft log starts, ends and is committed to."""
    raft = RocksKV(data_dir / "raft", log_store.COLUMN_FAMILIES)
    try:
        log = LogStore(raft)
        return log.compacted_index, log.last_index, log.hard_state().commit
    finally:
        raft.close()


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
    assert _log_points(tmp_path / "node") == (index, index, index)


def test_at_an_index_takes_the_backup_at_or_before_it(world: tuple[TH, FileStore, int], tmp_path: Path) -> None:
    h, store, first = world
    second = _back_up(h, store, T0 + 9000)
    assert restore(store, tmp_path / "newest").index == second
    assert restore(store, tmp_path / "older", at_index=second - 1).index == first
    assert restore(store, tmp_path / "by-time", at_time=T0 + 5000).index == first
    with pytest.raises(RestoreError, match="no state backup at or before"):
        restore(store, tmp_path / "none", at_index=first - 1)


def test_a_restore_to_an_earlier_point_starts_its_history_after_every_backup(
    world: tuple[TH, FileStore, int], tmp_path: Path
) -> None:
    """Its own backups must be the newest in the store: the abandoned history's later ones would
    otherwise have its own pruned, hold the collector's floor, and be what the next restore takes."""
    h, store, first = world
    second = _back_up(h, store, T0 + 9000)
    older = restore(store, tmp_path / "older", at_index=first)
    assert older.index == first and older.newer_backups == 1  # the CLI warns: its segments may be gone
    assert restore(store, tmp_path / "newest").newer_backups == 0
    machine = StateMachine(RocksKV(tmp_path / "older" / "state", r.COLUMN_FAMILIES))
    try:
        assert machine.applied_index == second and machine.lookup(B, "s") is not None
    finally:
        machine.kv.close()
    assert _log_points(tmp_path / "older") == (second, second, second)


def test_nothing_is_written_over_a_node_or_from_an_empty_store(
    world: tuple[TH, FileStore, int], tmp_path: Path
) -> None:
    _, store, _ = world
    restore(store, tmp_path / "node")
    with pytest.raises(RestoreError, match="empty data directory"):
        restore(store, tmp_path / "node")
    for leftover in ("state.old", "state.staging"):  # what a node's interrupted store swap leaves
        (tmp_path / leftover / leftover).mkdir(parents=True)
        with pytest.raises(RestoreError, match=f"{leftover} exists"):
            restore(store, tmp_path / leftover)
    with pytest.raises(RestoreError, match="no state backup"):
        restore(FileStore(tmp_path / "empty"), tmp_path / "other")
    assert not (tmp_path / "other" / "state").exists()


def test_segments_merged_across_the_backups_tiered_offset_come_back(tmp_path: Path) -> None:
    """Small segments are merged after the backup, two it records with two sealed after it: no entry
    starts at the backup's tiered offset any more. The merged segment takes the place of the
    backup's two, and it and the segment sealed after it come back (they were all lost)."""
    h, store = TH(), FileStore(tmp_path / "cold")
    h.create("s", body=b"a0;")
    _seal(h, store, "s")
    h.append("s", b"a1;")
    _seal(h, store, "s")
    index = _back_up(h, store, T0 + 1000)
    replaced = [segment.key for segment in h.sm.segments(h.m("s").sid, 0, h.m("s").tiered)]
    for body in (b"b2;", b"b3;"):
        h.append("s", body)
        _seal(h, store, "s")
    assert h.one(h.merge_cmd("s", 0, h.m("s").tiered)).code.name == "OK"
    h.append("s", b"b4;")
    _seal(h, store, "s")  # its manifest lists the merged segment, then this one
    done = restore(store, tmp_path / "node")
    assert (done.index, done.segments_after, done.records_after, done.bytes_after) == (index, 2, 3, 9)
    machine = StateMachine(RocksKV(tmp_path / "node" / "state", r.COLUMN_FAMILIES))
    try:
        objects = {key: store.get(key) for key in store.list("") if key.endswith(".parquet")}
        assert _content(machine, objects, "s") == b"a0;a1;b2;b3;b4;"
        meta = machine.lookup(B, "s")
        assert meta is not None
        assert [(seg.lo, seg.hi) for seg in machine.segments(meta.sid, 0, meta.tiered)] == [(0, 12), (12, 15)]
        # What the merge replaced is the collector's, once the restored cluster has a backup of its own.
        queued = {key.decode(): r.U64.unpack(at)[0] for key, at in machine.kv.scan(r.GC_QUEUE, b"")}
        assert len(replaced) == 2 and {key: queued.get(key) for key in replaced} == dict.fromkeys(replaced, index + 1)
    finally:
        machine.kv.close()


def _restored(store: FileStore, data_dir: Path, *names: str) -> list[bytes]:
    machine = StateMachine(RocksKV(data_dir / "state", r.COLUMN_FAMILIES))
    try:
        objects = {key: store.get(key) for key in store.list("") if key.endswith(".parquet")}
        return [_content(machine, objects, name) for name in names]
    finally:
        machine.kv.close()


def test_a_stream_deleted_and_made_again_after_the_backup_is_not_joined_to_it(tmp_path: Path) -> None:
    """Deleted after the backup and made again under the name, a stream's segments start from 0 again
    in the same directory: the backup's stream took those past its own tiered offset for its own
    (b"AAAAACCC", bytes no stream held). Its records are younger than the backup, and the backup's
    own record at a stream's tiered offset must be the first of the chain."""
    h, store = TH(), FileStore(tmp_path / "cold")
    h.create("sealed", body=b"AA")
    _seal(h, store, "sealed")
    h.append("sealed", b"AAA")
    _seal(h, store, "sealed")
    h.create("local", body=b"L1;")  # not sealed at the backup: a record of its own there
    h.create("same", body=b"S1;")  # the same stream throughout, its local record sealed after the backup
    h.create("empty", ct="application/json")  # nothing sealed, nothing local: told apart by its content type
    _back_up(h, store, T0 + 1000)
    h.now = T0 + 2000
    h.delete("empty")
    h.create("empty", body=b"NEW STREAM, NOT JSON")
    _seal(h, store, "empty")
    for name, bodies in (("sealed", (b"BBBBB", b"CCC")), ("local", (b"NEW1;", b"NEW2;"))):
        h.delete(name)
        h.create(name, body=bodies[0])
        _seal(h, store, name)
        h.append(name, bodies[1])
        _seal(h, store, name)
    h.append("same", b"S2;")
    _seal(h, store, "same")
    done = restore(store, tmp_path / "node")
    restored = _restored(store, tmp_path / "node", "sealed", "local", "same", "empty")
    assert restored == [b"AAAAA", b"L1;", b"S1;S2;", b""]
    assert {problem.split(":")[0] for problem in done.skipped} == {f"{B}/sealed", f"{B}/empty"}
    cli = [sys.executable, "-m", "app.cli", "restore", "--from", (tmp_path / "cold").as_uri()]
    said = subprocess.run([*cli, "--data-dir", str(tmp_path / "by-cli")], capture_output=True, text=True, check=True)
    assert f"skipped: {B}/sealed: its segments are another stream's" in said.stdout


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


def _pack(h: TH, store: FileStore, *names: str, stale: tuple[str, ...] = ()) -> str:
    """What the worker does for small streams: one pack, recorded, and its index (listing `stale` too,
    as an index not yet rewritten after those streams were deleted)."""
    cmd = h.pack_cmd(*names)
    assert h.one(cmd).next_pos == len(names)
    store.put(cmd.key, h.objects[cmd.key])
    index = packs.PackIndex(B, cmd.key.rsplit("/", 1)[1], cmd.size, cmd.sha256)
    for name, (_, given) in zip(names, cmd.slices, strict=True):
        index.slices.append(
            packs.IndexEntry(
                name,
                h.m(name).content_type,
                format_offset(given.lo),
                format_offset(given.hi),
                given.records,
                given.group,
                given.row,
                given.digest,
                given.min_time,
                given.max_time,
            )  # fmt: skip
        )
    for name in stale:
        index.slices.append(dataclasses.replace(index.slices[0], stream=name))
    store.put(pack_index_of(cmd.key), index.to_json())
    return cmd.key


def test_packed_streams_come_back_and_a_stream_deleted_from_a_known_pack_stays_deleted(tmp_path: Path) -> None:
    h = TH()
    store = FileStore(tmp_path / "cold")
    for name in ("a", "b", "c"):
        h.create(name, body=f"{name}-before;".encode())
    first = _pack(h, store, "a", "b", "c")
    h.delete("c")
    _back_up(h, store, T0 + 1000)
    assert h.append("a", b"a-after;", producer=Producer("p", 2, 0)).code.name == "APPENDED"
    h.append("b", b"b-after;")
    second = _pack(h, store, "a", "b", stale=("c",))
    for name in ("n1", "n2"):
        h.create(name, body=f"{name} only in a pack".encode())
    third = _pack(h, store, "n1", "n2")

    done = restore(store, tmp_path / "node")
    assert (done.segments_after, done.new_streams, done.unknown_streams) == (4, 2, [])
    machine = StateMachine(RocksKV(tmp_path / "node" / "state", r.COLUMN_FAMILIES))
    try:
        objects = {key: store.get(key) for key in store.list("") if key.endswith(".parquet")}
        assert _content(machine, objects, "a") == b"a-before;a-after;"
        assert _content(machine, objects, "b") == b"b-before;b-after;"
        assert _content(machine, objects, "n1") == b"n1 only in a pack"
        assert machine.lookup(B, "c") is None
        assert {key: info.live for key, info in machine.packs()} == {first: 2, second: 2, third: 2}
        meta = machine.lookup(B, "a")
        assert meta is not None and len(list(machine.pack_slices(second))) == 2
        producer = machine.kv.get(r.PRODUCERS, r.producer_key(meta.sid, "p"))
        assert producer is not None and r.decode_producer(producer) == r.ProducerState(2, 0, meta.tail)
    finally:
        machine.kv.close()


def test_a_forged_pack_slice_stops_the_chain(tmp_path: Path) -> None:
    h = TH()
    store = FileStore(tmp_path / "cold")
    for name in ("a", "b"):
        h.create(name, body=b"before;")
    _back_up(h, store, T0 + 1000)
    key = _pack(h, store, "a", "b")
    forged, _ = packs.build(B, [packs.Slice("a", "text/plain", [seg.Record(0, T0, b"BEFORE;")]),
                               packs.Slice("b", "text/plain", [seg.Record(0, T0, b"before;")])])  # fmt: skip
    store.put(key, forged)
    done = restore(store, tmp_path / "node")
    assert done.segments_after == 0  # the pack is not the one recorded: neither slice is trusted


def test_a_damaged_later_backup_does_not_stop_a_restore_to_an_earlier_time(
    world: tuple[TH, FileStore, int], tmp_path: Path
) -> None:
    h, store, first = world
    second = _back_up(h, store, T0 + 9000)
    key = next(k for k in store.list(backup.KEY_PREFIX) if backup.parse_key(k) == (second, k[-70:-6]))
    data = store.get(key)
    store.put(key, data[:-16] + bytes(16))  # its body damaged, its header (and time) intact
    assert restore(store, tmp_path / "by-time", at_time=T0 + 5000).index == first
    with pytest.raises(backup.BackupError):
        restore(store, tmp_path / "newest")  # the newest is asked for: its damage is reported
