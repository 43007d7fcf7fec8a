"""The tiering worker on a real file store and an in-memory state machine, on a clock the test drives:
one stream whose keys the store rejects backs off on its own while every other stream keeps tiering."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.state_machine.commands import Code, Command, Outcome
from app.state_machine.machine import StateMachine
from app.tiering import keys
from app.tiering import segment as seg
from app.tiering.store import FileStore, KeyRejected, ObjectInfo, StoreUnavailable
from app.tiering.worker import TieringConfig, TieringWorker
from tests.state_machine.helpers import OCTET, T0, B, H

LONG = "l" * 300
CJK = "日本語のストリーム名前" * 3


class Node:
    """What the worker needs of a node: the harness's state machine, applied at once, and a clock."""

    def __init__(self, h: H) -> None:
        self.h = h
        self.machine: StateMachine = h.sm
        self.uploading: set[str] = set()
        self.clock = T0

    @property
    def is_leader(self) -> bool:
        return True

    def now_ms(self) -> int:
        return self.clock

    async def submit(self, command: Command) -> Outcome:
        return self.h.one(command, now=self.clock)

    async def read_barrier(self) -> None:
        return None

    def advance(self, seconds: float) -> None:
        self.clock += int(seconds * 1000)
        self.h.now = self.clock


class Harness:
    def __init__(self, root: Path, store: Any = None) -> None:
        self.h = H()
        self.node = Node(self.h)
        self.root = root
        self.store = store or FileStore(root)
        # No packs: these tests are about each stream's own objects (tests/tiering/test_packing.py has packs).
        config = TieringConfig(segment_max_age=0.0, local_disk_budget=1 << 30, retry_jitter=0.0, pack_below_bytes=0)
        self.worker = TieringWorker(self.node, self.store, config)

    def write(self, name: str, data: bytes) -> None:
        if self.h.meta(name) is None:
            assert self.h.create(name, OCTET).code is Code.CREATED
        assert self.h.append(name, data, ct=OCTET).code is Code.APPENDED

    def run(self) -> None:
        asyncio.run(self.worker.run_once())

    def pending(self, name: str) -> int:
        meta = self.h.meta(name)
        assert meta is not None
        return meta.tail - meta.tiered

    def failing(self) -> dict[str, dict[str, Any]]:
        status = self.worker.status()
        assert status["failing_count"] == len(status["failing"])
        return {f["stream"]: f for f in status["failing"]}

    def manifest(self, name: str) -> seg.Manifest:
        return seg.Manifest.from_json(self.store.get(seg.manifest_key(B, name)))


@pytest.fixture()
def t(tmp_path: Path) -> Iterator[Harness]:
    yield Harness(tmp_path / "cold")


def test_a_failing_stream_backs_off_while_the_others_keep_tiering(t: Harness) -> None:
    blocker = t.root / B / "bad"
    blocker.parent.mkdir(parents=True)
    blocker.write_bytes(b"a regular file where the stream's directory must go")
    for name in ("bad", "good", LONG, CJK):
        t.write(name, name.encode()[:20] + b"-1")

    t.run()
    assert [t.pending(n) for n in ("good", LONG, CJK)] == [0, 0, 0]
    assert t.pending("bad") > 0
    status = t.worker.status()
    assert status["available"] is True
    failing = t.failing()
    assert list(failing) == ["bad"]
    assert failing["bad"]["bucket"] == B and failing["bad"]["attempts"] == 1
    assert failing["bad"]["retry_in_s"] == 1.0 and "Not a directory" in failing["bad"]["error"]

    # Before its retry is due the failing stream is left alone; the others go on tiering.
    t.node.advance(0.5)
    t.write("good", b"-2")
    t.run()
    assert t.pending("good") == 0 and t.failing()["bad"]["attempts"] == 1
    t.node.advance(0.5)
    t.run()
    assert t.failing()["bad"]["attempts"] == 2 and t.failing()["bad"]["retry_in_s"] == 2.0
    t.node.advance(2)
    t.run()
    assert t.failing()["bad"]["attempts"] == 3 and t.failing()["bad"]["retry_in_s"] == 4.0

    blocker.unlink()
    t.node.advance(3.9)
    t.run()
    assert t.pending("bad") > 0, "not retried before its time"
    t.node.advance(0.1)
    t.run()
    assert t.pending("bad") == 0 and t.failing() == {}
    assert [s.first_offset for s in t.manifest("bad").segments] == ["0000000000000000_0000000000000000"]
    assert t.worker.status()["failing_count"] == 0


def test_long_names_tier_to_hashed_directories_and_are_collected(t: Harness) -> None:
    for name in (LONG, CJK):
        t.write(name, b"first")
        t.write(name, b"second")
    t.run()
    for name in (LONG, CJK):
        directory = t.root / B / keys.stream_component(name)
        assert directory.name.startswith("!h-")
        assert len(list((directory / "segments").glob("*.parquet"))) == 1
        manifest = t.manifest(name)
        assert (manifest.bucket, manifest.stream) == (B, name)
        assert manifest.segments[0].path.startswith("segments/")

    # Deleting one queues its objects; collection finds the stream behind a hashed key (none now).
    assert t.h.delete(LONG).code is Code.DELETED
    t.run()
    assert not (t.root / B / keys.stream_component(LONG)).exists()
    assert (t.root / B / keys.stream_component(CJK) / "manifest.json").exists(), "the other stream keeps its own"
    assert t.worker.status()["deletion_queue"] == 0


def test_a_stream_tiered_under_the_old_layout_stays_in_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MemoryStore()
    t = Harness(tmp_path, store)
    name = "o" * 250
    legacy = f"{B}/{name}"
    monkeypatch.setattr(keys, "MAX_COMPONENT_BYTES", 10_000)  # as before hashing
    t.write(name, b"old")
    t.run()
    monkeypatch.undo()
    t.write(name, b"new")
    t.run()
    assert sorted(k.rsplit("/segments/")[0] for k in store.objects if "/segments/" in k) == [legacy, legacy]
    assert set(store.objects) - {k for k in store.objects if "/segments/" in k} == {f"{legacy}/manifest.json"}
    assert len(seg.Manifest.from_json(store.objects[f"{legacy}/manifest.json"]).segments) == 2

    # After a delete, a new stream of that name starts in the hashed directory; the old objects go.
    assert t.h.delete(name).code is Code.DELETED
    t.write(name, b"again")
    t.run()
    hashed = f"{B}/{keys.stream_component(name)}"
    assert {k.split("/segments/")[0].removesuffix("/manifest.json") for k in store.objects} == {hashed}


def test_an_outage_still_stops_the_pass(t: Harness) -> None:
    t.store = t.worker.store = Failing(t.store, lambda key: StoreUnavailable("connection refused"))
    t.write("a", b"x")
    with pytest.raises(StoreUnavailable):
        t.run()
    assert t.failing() == {}, "an outage is the store's, not a stream's"


def test_a_bug_in_one_stream_is_isolated_too(t: Harness) -> None:
    t.store = t.worker.store = Failing(t.store, lambda key: ValueError("boom") if "/odd/" in key else None)
    t.write("odd", b"x")
    t.write("even", b"y")
    t.run()
    assert t.pending("even") == 0 and t.failing()["odd"]["error"] == "boom"


def test_a_deletion_the_store_refuses_waits_without_blocking_the_queue(t: Harness) -> None:
    for name in ("keep", "a", "b"):
        t.write(name, b"data")
    t.run()
    refused = seg.manifest_key(B, "a")
    t.store = t.worker.store = Failing(t.store, lambda key: KeyRejected("denied") if key == refused else None)
    assert t.h.delete("a").code is Code.DELETED
    assert t.h.delete("b").code is Code.DELETED
    t.run()
    status = t.worker.status()
    assert status["deletion_queue"] == 1 and status["deletions_failing_count"] == 1
    assert status["deletions_failing"][0]["object"] == refused
    assert not (t.root / B / "b").exists()
    t.store.fail = lambda key: None
    t.node.advance(1)
    t.run()
    assert t.worker.status()["deletion_queue"] == 0 and t.worker.status()["deletions_failing"] == []


class MemoryStore:
    url = "memory://"

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}

    def put(self, key: str, data: bytes) -> None:
        self.objects[key] = data

    def get(self, key: str) -> bytes:
        return self.objects[key]

    def stat(self, key: str) -> ObjectInfo | None:
        data = self.objects.get(key)
        return None if data is None else ObjectInfo(len(data), None)

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    def list(self, prefix: str) -> Iterator[str]:
        yield from sorted(k for k in self.objects if k.startswith(prefix))


class Failing:
    """A store whose writes and deletes of some keys raise what `fail` returns for them."""

    def __init__(self, inner: Any, fail: Any) -> None:
        self.inner, self.fail, self.url = inner, fail, inner.url

    def _check(self, key: str) -> None:
        exc = self.fail(key)
        if exc is not None:
            raise exc

    def put(self, key: str, data: bytes) -> None:
        self._check(key)
        self.inner.put(key, data)

    def delete(self, key: str) -> None:
        self._check(key)
        self.inner.delete(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_objects_the_newest_backup_names_stay_until_a_newer_backup_is_taken(t: Harness) -> None:
    """A stream deleted (or merged, or trimmed) after a state backup released objects that backup
    names: deleting them at once made a restore of it report success and then fail its reads."""
    floor: list[int | None] = [None]
    t.worker.backup_floor = lambda: floor[0]
    t.write("s", b"kept-by-the-backup")
    t.run()
    assert t.pending("s") == 0
    objects = [key for key in t.store.list(f"{B}/s/")]
    assert any(key.endswith(".parquet") for key in objects)

    floor[0] = t.h.sm.applied_index  # a backup taken now names the stream's objects
    assert t.h.delete("s").code is Code.DELETED
    released = t.h.sm.applied_index
    assert dict(t.h.sm.deletion_entries()) == dict.fromkeys(objects, released)
    for _ in range(3):
        t.node.advance(1)
        t.run()
    assert sorted(t.store.list(f"{B}/s/")) == sorted(objects), "deleted while the newest backup names them"

    floor[0] = released  # a backup taken after the delete: nothing kept names them
    t.node.advance(1)
    t.run()
    assert list(t.store.list(f"{B}/s/")) == [] and list(t.h.sm.deletion_queue()) == []


def test_without_backups_released_objects_go_at_once(t: Harness) -> None:
    t.write("s", b"x")
    t.run()
    assert t.h.delete("s").code is Code.DELETED
    t.node.advance(1)
    t.run()
    assert list(t.store.list(f"{B}/s/")) == []
