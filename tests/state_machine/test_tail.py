"""The shared tail: reads it serves equal the store's, it stays within its budget, and it never
holds what the store does not."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.state_machine import records as r
from app.state_machine.commands import Append, CreateStream
from app.state_machine.machine import StateMachine
from app.state_machine.tail import TailCache
from app.storage.kv import MemoryKV
from tests.state_machine.helpers import JSON, OCTET, B, H, jrec
from tests.state_machine.tiering_helpers import TH

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class CountingKV(MemoryKV):
    """A store that counts the reads of records, to see which reads the cache served."""

    def __init__(self) -> None:
        super().__init__(r.COLUMN_FAMILIES)
        self.record_reads = 0

    def scan(self, cf, start, end=None):  # type: ignore[no-untyped-def]
        if cf == r.DATA:
            self.record_reads += 1
        return super().scan(cf, start, end)

    def floor(self, cf, key):  # type: ignore[no-untyped-def]
        if cf == r.DATA:
            self.record_reads += 1
        return super().floor(cf, key)


def chunk_of(sm: StateMachine, name: str, pos: int, max_bytes: int, whole: bool = False) -> tuple[list[bytes], int]:
    meta = sm.lookup(B, name)
    assert meta is not None
    chunk = sm.read(meta, pos, max_bytes, None, whole)
    return [bytes(p) for p in chunk.payloads], chunk.next_pos


@FAST
@given(
    records=st.lists(st.binary(min_size=1, max_size=12), min_size=1, max_size=20),
    budget=st.integers(0, 80),
    per_stream=st.integers(1, 40),
    reads=st.lists(st.tuples(st.integers(0, 250), st.integers(1, 40), st.booleans()), max_size=12),
)
def test_byte_reads_through_the_cache_equal_the_stores(records, budget, per_stream, reads) -> None:
    h = H(tail_cache_bytes=budget)
    h.sm.table.tail = TailCache(budget, per_stream)
    h.create("s", OCTET)
    h.create("t", OCTET)
    for i, payload in enumerate(records):
        h.append("s" if i % 3 else "t", payload, ct=OCTET)
    store_only = StateMachine(h.kv, tail_cache_bytes=0)
    assert h.sm.table.tail.size <= budget
    for name in ("s", "t"):
        tail = h.meta(name).tail
        for start, max_bytes, whole in reads:
            pos = start % (tail + 1)
            assert chunk_of(h.sm, name, pos, max_bytes, whole) == chunk_of(store_only, name, pos, max_bytes, whole)


@FAST
@given(
    batches=st.lists(st.lists(st.integers(0, 99), min_size=1, max_size=4), min_size=1, max_size=12),
    per_stream=st.integers(1, 60),
    max_bytes=st.integers(1, 50),
)
def test_json_reads_through_the_cache_equal_the_stores(batches, per_stream, max_bytes) -> None:
    h = H()
    h.sm.table.tail = TailCache(1 << 20, per_stream)
    h.create("j", JSON)
    starts = [0]
    for values in batches:
        h.append("j", jrec(*values), ct=JSON)
        starts.append(h.meta("j").tail)
    store_only = StateMachine(h.kv, tail_cache_bytes=0)
    for pos in starts:
        assert chunk_of(h.sm, "j", pos, max_bytes) == chunk_of(store_only, "j", pos, max_bytes)


def test_a_read_at_the_tail_comes_from_memory() -> None:
    kv = CountingKV()
    h = H(kv)
    h.create("s", OCTET)
    for payload in (b"one", b"two", b"three"):
        h.append("s", payload, ct=OCTET)
    kv.record_reads = 0
    assert chunk_of(h.sm, "s", 3, 1 << 20) == ([b"two", b"three"], 11)
    assert chunk_of(h.sm, "s", 4, 1 << 20) == ([b"wo", b"three"], 11)
    assert chunk_of(h.sm, "s", 11, 1 << 20) == ([], 11)
    assert kv.record_reads == 0
    # Reloaded (a restart, a checkpoint installed): the cache starts empty and the store answers.
    again = StateMachine(kv)
    assert chunk_of(again, "s", 3, 1 << 20) == ([b"two", b"three"], 11)
    assert kv.record_reads > 0


def test_a_record_too_large_to_keep_sends_reads_back_to_the_store() -> None:
    kv = CountingKV()
    h = H(kv)
    h.sm.table.tail = TailCache(100, 10)
    h.create("s", OCTET)
    h.append("s", b"small", ct=OCTET)
    h.append("s", b"x" * 11, ct=OCTET)  # over the per-stream limit: not kept
    h.append("s", b"after", ct=OCTET)
    kv.record_reads = 0
    assert chunk_of(h.sm, "s", 16, 100) == ([b"after"], 21)
    assert kv.record_reads == 0, "the ring starts again after the large record"
    assert chunk_of(h.sm, "s", 0, 100) == ([b"small", b"x" * 11, b"after"], 21)
    assert kv.record_reads > 0


def test_the_least_recently_appended_streams_give_way_first() -> None:
    h = H()
    cache = h.sm.table.tail = TailCache(10, 10)
    for name in ("a", "b"):
        h.create(name, OCTET)
    h.append("a", b"aaaa", ct=OCTET)
    h.append("b", b"bbbb", ct=OCTET)
    h.append("b", b"cccc", ct=OCTET)  # 12 bytes held: a's record goes
    a, b = h.meta("a"), h.meta("b")
    assert cache.size == 8
    assert cache.covering(a.sid, 0, 4) is None
    assert cache.covering(b.sid, 0, 8) is not None


def test_a_failed_commit_leaves_nothing_in_the_cache() -> None:
    h = H()
    h.create("s", OCTET)
    h.append("s", b"kept", ct=OCTET)
    meta = h.meta("s")
    original = h.kv.write

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise OSError("no space left on device")

    h.kv.write = failing  # type: ignore[method-assign]
    with pytest.raises(OSError):
        h.one(Append(B, "s", OCTET, b"lost"))
    h.kv.write = original  # type: ignore[method-assign]
    assert h.sm.table.tail.covering(meta.sid, 0, 8) is None, "the failed apply's record is not cached"


def test_deleted_streams_leave_the_cache() -> None:
    h = H()
    h.create("s", OCTET, body=b"data")
    sid = h.meta("s").sid
    assert h.sm.table.tail.covering(sid, 0, 4) is not None
    h.delete("s")
    assert h.sm.table.tail.covering(sid, 0, 4) is None and h.sm.table.tail.size == 0


def test_cached_records_read_the_same_once_evicted_to_the_object_store() -> None:
    h = TH(tail_cache_bytes=1 << 20)
    h.create("s", OCTET)
    for payload in (b"aaa", b"bb", b"cccc"):
        h.append("s", payload, ct=OCTET)
    h.tier("s")
    h.evict("s")
    assert chunk_of(h.sm, "s", 1, 100) == ([b"aa", b"bb", b"cccc"], 9)  # no cold source needed


def test_forks_read_their_sources_range_and_their_own_tail() -> None:
    h = H()
    h.create("src", OCTET)
    h.append("src", b"abc", ct=OCTET)
    h.append("src", b"def", ct=OCTET)
    h.one(CreateStream(B, "f", OCTET, False, fork_stream="src", fork_offset=3))
    h.append("f", b"XYZ", ct=OCTET)
    store_only = StateMachine(h.kv, tail_cache_bytes=0)
    for pos in range(7):
        assert chunk_of(h.sm, "f", pos, 100) == chunk_of(store_only, "f", pos, 100)
    assert chunk_of(h.sm, "f", 0, 100) == ([b"abc", b"XYZ"], 6)
