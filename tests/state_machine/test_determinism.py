"""Determinism and durability: the same entries give the same state on any store, in any batching,
and survive a restart.
"""

from __future__ import annotations

from pathlib import Path

from app.state_machine import records as r
from app.state_machine.commands import (
    Append,
    Code,
    CollectExpired,
    Command,
    CreateBucket,
    CreateStream,
    DeleteStream,
    Outcome,
    Touch,
)
from app.state_machine.machine import StateMachine
from app.storage.rocks import RocksKV
from tests.state_machine.helpers import JSON, OCTET, T0, TEXT, B, H, P, dump, jrec


def scenario(h: H) -> list[Outcome]:
    """A mixed workload, in several batches with advancing time."""
    out: list[Outcome] = []
    t = T0
    steps: list[tuple[int, list[Command]]] = [
        (0, [CreateBucket("x"), CreateStream(B, "a", TEXT, False, body=b"hello")]),
        (10, [Append(B, "a", TEXT, b" world", producer=P(0, 0)), Append(B, "a", TEXT, b"!", stream_seq="1")]),
        (20, [CreateStream(B, "j", JSON, True, body=jrec({"k": 1}, [2], "3"))]),
        (
            30,
            [CreateStream(B, "fa", OCTET, False, fork_stream="a", fork_offset=5, fork_sub=3, content_type_given=False)],
        ),
        (40, [Append(B, "fa", TEXT, b"fork"), CreateStream(B, "fj", JSON, True, fork_stream="j", fork_sub=0)]),
        (50, [CreateStream(B, "ttl", TEXT, False, ttl=1, body=b"short")]),
        (60, [Append(B, "j", JSON, jrec(4, 5), producer=P(1, 0, "q")), DeleteStream(B, "a")]),
        (70, [CreateStream("x", "s", TEXT, False, closed=True), Append(B, "fa", None, b"", close=True)]),
        (2000, [Append(B, "ttl", TEXT, b"late"), Touch(B, "j"), CollectExpired([1, 2, 3, 4, 5, 6])]),
        (2010, [DeleteStream(B, "fa"), CreateStream(B, "ttl", JSON, True, body=jrec(1))]),
        (2020, [Append(B, "j", JSON, jrec(6), producer=P(1, 1, "q")), DeleteStream(B, "fj")]),
    ]
    for dt, cmds in steps:
        out += h.batch(*cmds, now=t + dt)
    return out


def test_same_entries_same_state_on_two_memory_kvs() -> None:
    a, b = H(), H()
    out_a, out_b = scenario(a), scenario(b)
    assert out_a == out_b
    assert dump(a.kv) == dump(b.kv)
    assert a.sm.applied_index == b.sm.applied_index
    assert a.sm.streams == b.sm.streams and a.sm.names == b.sm.names and a.sm.buckets == b.sm.buckets


def test_same_entries_same_state_on_rocks_and_memory(tmp_path: Path) -> None:
    rocks = RocksKV(tmp_path / "db", r.COLUMN_FAMILIES)
    try:
        a, b = H(rocks), H()
        assert scenario(a) == scenario(b)
        assert dump(a.kv) == dump(b.kv)
        assert a.sm.streams == b.sm.streams
        for name in ("j", "ttl"):
            assert a.parts(name, max_bytes=3) == b.parts(name, max_bytes=3)
    finally:
        rocks.close()


def test_scenario_outcomes_and_content(h: H) -> None:
    out = scenario(h)
    assert Code.GONE not in [o.code for o in out]
    assert h.json("j") == [{"k": 1}, [2], "3", 4, 5, 6]
    assert h.meta("a") is None and h.meta("fa") is None
    assert h.json("ttl") == [1]
    assert h.sm.lookup("x", "s").closed


def test_batch_grouping_does_not_change_outcomes_or_state() -> None:
    """Replicas may group committed entries into apply batches differently; they must converge.

    Fails because of the two batch bugs (producer state and range deletes; see test_producers and test_delete).
    """
    ref = H()
    outcomes = scenario(ref)
    entries = [e for batch in ref.batches[1:] for e in batch]  # all but the bucket creation

    whole = H()
    whole_out = whole.sm.apply(entries)
    single = H()
    single_out = [single.sm.apply([e])[0] for e in entries]
    assert whole_out == single_out == outcomes
    assert dump(single.kv) == dump(ref.kv)
    assert dump(whole.kv) == dump(ref.kv)


def test_restart_on_rocks(tmp_path: Path) -> None:
    path = tmp_path / "db"
    kv = RocksKV(path, r.COLUMN_FAMILIES)
    h = H(kv)
    scenario(h)
    h.create("keep", body=b"data")
    h.append("keep", b"1", producer=P(0, 0))
    h.create("src", body=b"shared")
    h.fork("child", "src")
    applied, next_sid = h.sm.applied_index, h.sm.next_sid
    streams, names, buckets = dict(h.sm.streams), dict(h.sm.names), dict(h.sm.buckets)
    texts = {n: h.text(n) for n in ("keep", "child", "src")}
    h.sm.make_durable()
    before = dump(kv)
    kv.close()

    kv2 = RocksKV(path, r.COLUMN_FAMILIES)
    try:
        h2 = H(kv2, bucket=None)
        assert h2.sm.applied_index == applied and h2.index == applied
        assert h2.sm.next_sid == next_sid
        assert h2.sm.streams == streams and h2.sm.names == names and h2.sm.buckets == buckets
        assert dump(kv2) == before
        assert {n: h2.text(n) for n in texts} == texts
        # Producer state, fork references and sid allocation survive too.
        assert h2.append("keep", b"1", producer=P(0, 0)).code is Code.DUPLICATE
        assert h2.append("keep", b"2", producer=P(0, 1)).code is Code.APPENDED
        assert h2.text("keep") == b"data12"
        assert h2.delete("src").code is Code.DELETED and h2.meta("src").deleted
        assert h2.create("new").sid == next_sid
        assert h2.delete("child").code is Code.DELETED
        assert h2.meta("src") is None
    finally:
        kv2.close()


def test_restart_on_memory_kv_rebuilds_the_same_view(h: H) -> None:
    scenario(h)
    again = StateMachine(h.kv)
    assert again.applied_index == h.sm.applied_index
    assert again.streams == h.sm.streams and again.names == h.sm.names and again.buckets == h.sm.buckets
