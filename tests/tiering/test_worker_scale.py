"""A tiering pass visits the streams and packs with work, never all of them: the leader runs one every half
second, and a scan of a million streams took about half a second of its loop."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import pytest

from app.domain.errors import ProtocolError
from app.state_machine.commands import Code, Retain
from app.tiering import keys
from app.tiering import pack as packs
from app.tiering import worker as worker_module
from app.tiering.retention import retention_target
from tests.state_machine.helpers import OCTET, B
from tests.tiering.test_packing import Packing
from tests.tiering.test_worker_isolation import Harness


class NoScan(dict[int, Any]):
    """The table's streams, refusing to be iterated: lookups by sid only."""

    def _refuse(self, *args: object) -> NoReturn:
        raise AssertionError("a tiering pass iterated over every stream, or every pack")

    __iter__ = keys = values = items = _refuse  # type: ignore[assignment]


def test_after_the_first_pass_of_a_term_a_pass_looks_only_at_streams_that_changed(tmp_path: Path) -> None:
    t = Harness(tmp_path / "cold")
    for i in range(200):
        t.write(f"s{i}", b"first")
    t.h.create("kept", OCTET, retention_bytes=6)
    t.write("kept", b"0123")
    t.run()  # the term's first pass checks every manifest
    assert [t.pending(f"s{i}") for i in range(200)] == [0] * 200
    table = t.h.sm.table
    table.streams = NoScan(table.streams)

    t.write("s7", b"second")
    t.write("kept", b"4567")
    t.node.advance(1)
    t.run()
    assert t.pending("s7") == 0 and t.pending("kept") == 0
    assert [s.next_offset for s in t.manifest("s7").segments][-1] == f"{0:016d}_{11:016d}"
    assert t.h.meta("kept").earliest == 4, "retention ran: 6 bytes kept, whole records"
    assert t.h.one(Retain(B, "s3", 5)).code is Code.OK
    t.run()  # its only segment released: its manifest goes with it
    t.run()
    assert t.worker._published[(B, "s3")][0] == (t.h.meta("s3").sid, 5, 5), "republished after retention"


def test_pack_indexes_follow_their_changes_without_a_scan_of_packs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = Packing(tmp_path, segment_max_bytes=4096)
    for i in range(300):
        p.write(f"s{i}", bytes([65 + i % 26]) * 50)
    p.run()  # the term's first pass looks at every pack
    indexes = sorted(k for k in p.objects() if k.endswith(".json"))
    assert len(indexes) >= 4
    table = p.h.sm.table
    table.streams = NoScan(table.streams)
    monkeypatch.setattr(type(p.h.sm), "packs", lambda sm: NoScan()._refuse())

    p.h.delete("s0")
    p.run()
    listed = {k: [s.stream for s in packs.PackIndex.from_json(p.store.get(k)).slices] for k in indexes}
    assert sum(len(names) for names in listed.values()) == 299
    assert not any("s0" in names for names in listed.values())
    assert p.read("s1") == b"B" * 50


def test_retention_looks_at_a_stream_when_it_is_written_or_its_max_age_check_is_due(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = Harness(tmp_path / "cold")
    t.h.create("sized", OCTET, retention_bytes=6)
    t.h.create("aged", OCTET, retention_age=10)
    for i in range(100):
        t.h.create(f"idle{i}", OCTET, retention_bytes=1 << 20)
    t.write("sized", b"0123")
    t.write("aged", b"old")
    t.run()  # the term's first pass looks at every stream with retention
    looked: list[str] = []

    def counted(machine: Any, meta: Any, now: int) -> int | None:
        looked.append(meta.name)
        return retention_target(machine, meta, now)

    monkeypatch.setattr(worker_module, "retention_target", counted)
    table = t.h.sm.table
    table.streams = NoScan(table.streams)

    t.node.advance(0.5)
    t.run()
    assert looked == [], "nothing written, and no max-age check due yet"
    t.node.advance(0.6)  # its oldest record is far younger than the 10 s max-age: no look until it is not
    t.run()
    assert looked == []
    t.write("sized", b"4567")
    t.run()
    assert looked == ["sized"] and t.h.meta("sized").earliest == 4
    looked.clear()
    t.node.advance(9.5)  # "old" is past its 10 s now: looked at, though nothing was written
    t.run()
    assert "aged" in looked and t.h.meta("aged").earliest == 3
    t.run()  # the retention applied counts as a write: one more look
    looked.clear()
    t.node.advance(100)  # it holds no record now: nothing to look at until it is written
    t.run()
    assert looked == []
    t.write("aged", b"new")
    t.run()
    assert looked == ["aged"] and t.h.meta("aged").earliest == 3


def test_a_stream_whose_retention_cannot_be_worked_out_is_set_aside_not_the_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    t = Harness(tmp_path / "cold")
    for name in ("a", "b", "c"):
        t.h.create(name, OCTET, retention_bytes=6)
        t.write(name, b"0123")
        t.write(name, b"4567")
    failed: list[str] = []

    def failing_once(machine: Any, meta: Any, now: int) -> int | None:
        if not failed:
            failed.append(meta.name)
            raise OSError("a damaged record")
        return retention_target(machine, meta, now)

    monkeypatch.setattr(worker_module, "retention_target", failing_once)
    t.run()  # the term's first pass: "a" fails alone, and the pass goes on (manifests, eviction...)
    assert failed == ["a"] and [t.h.meta(n).earliest for n in ("a", "b", "c")] == [0, 4, 4]
    assert t.pending("b") == 0
    t.node.advance(worker_module.RETENTION_RETRY_MS / 1000 + 0.1)
    t.run()  # nothing written since: "a" is looked at again all the same
    assert t.h.meta("a").earliest == 4


def test_a_retention_pass_stopped_while_proposing_looks_at_the_rest_next_time(tmp_path: Path) -> None:
    t = Harness(tmp_path / "cold")
    for name in ("a", "b", "c"):
        t.h.create(name, OCTET, retention_bytes=6)
        t.write(name, b"0123")
        t.write(name, b"4567")
    submit, refused = t.node.submit, []

    async def not_leader_once(command: Any) -> Any:
        if isinstance(command, Retain) and not refused:
            refused.append(command.stream)
            raise ProtocolError(503, "not_leader", "leadership changed")
        return await submit(command)

    t.node.submit = not_leader_once  # type: ignore[method-assign]
    with pytest.raises(ProtocolError):
        t.run()
    t.node.advance(0.1)
    t.run()  # nothing written since: the streams it did not reach are looked at all the same
    assert refused == ["a"] and [t.h.meta(n).earliest for n in ("a", "b", "c")] == [4, 4, 4]


def test_the_owners_of_hashed_directories_are_kept_up_to_date_not_rebuilt_each_pass(tmp_path: Path) -> None:
    t = Harness(tmp_path / "cold")
    long = ["a" * 300, "b" * 300, "c" * 300]
    for name in long:
        t.write(name, b"first")
    t.run()
    assert t.h.delete(long[0]).code is Code.DELETED
    t.run()  # a hashed key is queued: the map of hashed names is built, once
    assert not (t.root / B / keys.stream_component(long[0])).exists()
    table = t.h.sm.table
    table.names = NoScan(table.names)

    t.write("d" * 300, b"new")  # created after the map was built
    assert t.h.delete(long[1]).code is Code.DELETED
    t.run()
    assert not (t.root / B / keys.stream_component(long[1])).exists()
    assert t.h.delete(long[2]).code is Code.DELETED
    t.write(long[2], b"again")  # the same name, a new stream: its objects stay, the old ones go
    t.run()
    t.run()
    for name in (long[2], "d" * 300):
        directory = t.root / B / keys.stream_component(name)
        assert (directory / "manifest.json").exists(), name
        assert len(list((directory / "segments").glob("*.parquet"))) == 1, name
    assert t.manifest(long[2]).segments[0].first_offset == f"{0:016d}_{0:016d}"
    assert t.worker.status()["deletion_queue"] == 0


def test_a_reloaded_state_machine_makes_the_worker_look_at_everything_again(tmp_path: Path) -> None:
    t = Harness(tmp_path / "cold")
    name = "x" * 300
    for each in (name, "h" * 300, "plain"):
        t.write(each, b"first")
    t.run()
    assert t.h.delete("h" * 300).code is Code.DELETED
    t.run()  # the map of hashed names is built
    assert t.h.delete(name).code is Code.DELETED  # its manifest is queued for deletion...
    t.write(name, b"again")  # ...and a new stream of that name will publish one at the same key
    t.h.sm.reload(t.h.kv)  # what a checkpoint install does: the sets kept as it applied start over
    t.write("plain", b"second")
    t.run()  # collects the old stream's objects, in the pass that publishes the new one's manifest
    assert (t.root / B / keys.stream_component(name) / "manifest.json").exists(), "the new stream's manifest"
    assert t.manifest(name).segments[0].records == 1 and t.worker.status()["deletion_queue"] == 0
    assert t.pending("plain") == 0 and len(t.manifest("plain").segments) == 2
