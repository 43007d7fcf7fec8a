"""Upkeep: the streams each periodic chore may have work for, kept as they change, equal after any
sequence of commands to what a scan of every stream would find, and rebuilt the same on reload;
likewise each bucket's usage, which quotas read."""

from __future__ import annotations

import sys

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.state_machine import records as r
from app.state_machine.commands import Code, Retain, Touch
from app.state_machine.machine import StateMachine
from app.state_machine.upkeep import Upkeep
from tests.state_machine.helpers import OCTET, B
from tests.state_machine.tiering_helpers import TH

NAMES = ["a", "b"]


def scanned(sm: StateMachine) -> dict[str, set[int]]:
    """What a scan of every stream finds: the old way, kept here as the reference."""
    metas = list(sm.streams.values())
    return {
        "untiered": {m.sid for m in metas if m.tail > m.tiered},
        "evictable": {m.sid for m in metas if m.evicted < m.tiered},
        "retained": {
            m.sid for m in metas if not m.deleted and (m.retention_age is not None or m.retention_bytes is not None)
        },
        "expiring": {m.sid for m in metas if not m.deleted and m.expiry() is not None},
    }


def scanned_usage(sm: StateMachine) -> dict[str, tuple[int, int]]:
    """Each bucket's (streams, bytes kept) as a scan of its streams counts them: what quotas read."""
    usage: dict[str, tuple[int, int]] = {}
    for m in sm.streams.values():
        streams, kept_bytes = usage.get(m.bucket, (0, 0))
        usage[m.bucket] = (streams + 1, kept_bytes + max(0, m.tail - max(m.fork_pos, m.earliest)))
    return usage


def kept(upkeep: Upkeep, sm: StateMachine) -> dict[str, set[int]]:
    return {
        "untiered": set(upkeep.untiered),
        "evictable": set(upkeep.evictable),
        "retained": set(upkeep.retained),
        "expiring": {sid for sid in sm.streams if upkeep.is_expiring(sid)},
    }


# Weighted towards what moves data between the tiers, so most plans tier and evict something.
KINDS = ["create", "create_ttl", "create_retained", "fork", "retain", "delete", "touch"]
KINDS += ["append"] * 4 + ["tier"] * 3 + ["evict"] * 2
ops = st.lists(
    st.tuples(
        st.sampled_from(KINDS), st.sampled_from(NAMES), st.sampled_from(NAMES), st.binary(min_size=1, max_size=5)
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=ops)
def test_the_kept_sets_equal_a_scan_of_every_stream_after_any_commands(plan) -> None:
    h = TH()
    for op, name, other, body in plan:
        meta = h.meta(name)
        if op == "create":
            h.create(name, OCTET)
        elif op == "create_ttl":
            h.create(name, OCTET, ttl=5)
        elif op == "create_retained":
            h.create(name, OCTET, retention_bytes=4)
        elif op == "fork" and h.meta(other) is not None and not h.m(other).deleted:
            h.fork(name, other)
        elif op == "append":
            if meta is None:
                h.create(name, OCTET)
            h.append(name, body, ct=OCTET)
        elif op == "tier" and meta is not None and meta.tail > meta.tiered and not meta.deleted:
            assert h.tier(name).code is Code.OK
        elif op == "evict" and meta is not None and meta.evicted < meta.tiered:
            assert h.evict(name).code is Code.OK
        elif op == "retain" and meta is not None:
            h.one(Retain(B, name, meta.tail if len(body) % 2 else (meta.earliest + meta.tail) // 2))
        elif op == "delete":
            h.delete(name)
        elif op == "touch":
            h.one(Touch(B, name))
        h.now += 1_000
        assert kept(h.sm.upkeep, h.sm) == scanned(h.sm), (op, name)
        assert {b: h.sm.bucket_usage(b) for b in scanned_usage(h.sm)} == scanned_usage(h.sm), (op, name)
        assert h.sm.bucket_usage("none") == (0, 0)
    reopened = StateMachine(h.kv)
    assert kept(reopened.upkeep, reopened) == scanned(reopened) == scanned(h.sm)
    assert reopened.table.usage == h.sm.table.usage


def test_a_stream_whose_cold_data_changes_is_offered_for_its_manifest_once() -> None:
    h = TH()
    h.create("s", OCTET)
    h.create("quiet", OCTET)
    h.append("s", b"one", ct=OCTET)
    h.append("quiet", b"one", ct=OCTET)
    assert h.sm.upkeep.take_manifests() == set()  # nothing is tiered yet
    assert h.tier("s").code is Code.OK
    assert h.tier("quiet").code is Code.OK
    assert h.sm.upkeep.take_manifests() == {h.m("s").sid, h.m("quiet").sid}
    assert h.sm.upkeep.take_manifests() == set()
    h.one(Retain(B, "s", h.m("s").tail))
    assert h.sm.upkeep.take_manifests() == {h.m("s").sid}
    h.delete("quiet")
    assert h.sm.upkeep.take_manifests() == set()


def test_expiry_surfaces_in_time_order_once_and_a_later_expiry_schedules_nothing() -> None:
    upkeep = Upkeep()
    for sid, at in [(1, 300), (2, 100), (3, 200)]:
        upkeep.schedule(sid, at)
    upkeep.schedule(2, 900)  # a sliding TTL moved later: its entry still surfaces at 100
    upkeep.schedule(3, 150)  # earlier: it surfaces at 150, and its entry for 200 is stale
    assert list(upkeep.may_have_expired(99)) == []
    assert list(upkeep.may_have_expired(250)) == [2, 3]
    assert list(upkeep.may_have_expired(250)) == []
    assert upkeep.expiring == 1 and upkeep.is_expiring(1) and not upkeep.is_expiring(2)
    upkeep.schedule(2, 900)  # the sweeper found it alive: back on the schedule
    assert list(upkeep.may_have_expired(10**6)) == [1, 2]


def test_a_follower_that_never_sweeps_keeps_its_schedule_bounded_under_churn() -> None:
    h = TH()
    for i in range(3_000):
        name = f"t{i}"
        assert h.create(name, OCTET, ttl=60).code is Code.CREATED
        assert h.delete(name).code is Code.DELETED
    upkeep = h.sm.upkeep
    assert upkeep.expiring == 0
    assert len(upkeep._expiry) <= 64 + 1, "entries of removed streams must not pile up"


def test_a_million_appends_to_one_stream_leave_one_entry_of_each_kind() -> None:
    upkeep = Upkeep()
    meta = r.StreamMeta(7, B, "s", OCTET, False, 0, 0, ttl=10, retention_bytes=100)
    for i in range(1, 1_000_001):
        meta.tail = i
        meta.touched_at = i
        upkeep.note(meta)
    assert list(upkeep.untiered) == [7] and upkeep.retained == {7} and upkeep.expiring == 1
    assert len(upkeep._expiry) == 1, "a sliding TTL moving later schedules nothing new"


def test_a_soft_deleted_stream_leaves_retention_and_expiry_but_keeps_its_data_chores() -> None:
    h = TH()
    h.create("src", OCTET, ttl=60, retention_bytes=4)
    h.append("src", b"abcdef", ct=OCTET)
    assert h.tier("src").code is Code.OK
    h.append("src", b"gh", ct=OCTET)
    h.fork("child", "src")
    sid = h.m("src").sid
    assert sid in h.sm.upkeep.retained and h.sm.upkeep.is_expiring(sid)
    h.delete("src")
    meta = h.sm.streams[sid]
    assert meta.deleted, "forks hold it: soft-deleted"
    upkeep = h.sm.upkeep
    assert sid not in upkeep.retained and not upkeep.is_expiring(sid)
    assert sid in upkeep.untiered and sid in upkeep.evictable  # its records still tier and evict
    assert kept(upkeep, h.sm) == scanned(h.sm)


def test_the_sets_a_pass_iterates_are_copied_small_once_most_of_them_is_gone() -> None:
    upkeep = Upkeep()
    metas = [r.StreamMeta(sid, B, f"s{sid}", OCTET, False, 0, 0, tail=10) for sid in range(1, 20_001)]
    for meta in metas:
        upkeep.note(meta)
    peak = sys.getsizeof(upkeep.untiered)
    for meta in metas:
        meta.tiered = 10
        upkeep.note(meta)  # tiered: no longer untiered, now evictable
    big = sys.getsizeof(upkeep.evictable)
    for meta in metas[:-10]:
        meta.evicted = 10
        upkeep.note(meta)
    assert list(upkeep.untiered) == [] and len(upkeep.evictable) == 10
    assert sys.getsizeof(upkeep.untiered) < peak // 20 and sys.getsizeof(upkeep.evictable) < big // 20


def test_names_that_came_and_went_are_taken_once() -> None:
    h = TH()
    h.sm.upkeep.take_names()
    h.create("a", OCTET)
    h.create("b", OCTET)
    sid = h.m("a").sid
    h.delete("a")
    assert h.sm.upkeep.take_names() == ({sid, h.m("b").sid}, [(sid, B, "a")])
    assert h.sm.upkeep.take_names() == (set(), [])
