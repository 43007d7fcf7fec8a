"""Rules applied in one batch, or one entry per batch, end in the same state: replicas batch entries
as their logs happen to arrive, and a replica that restores a checkpoint must hold the same bytes as
one that replayed. Also the subscription positions that deletes and unlinks must (not) forget, and
the apply cost of many quiet subscriptions."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from app.state_machine import records as r
from app.state_machine import subscriptions as subs
from app.state_machine.commands import (
    Ack,
    Append,
    Claim,
    Code,
    CollectExpired,
    Command,
    CreateBucket,
    CreateStream,
    DeleteBucket,
    DeleteSnapshot,
    DeleteStream,
    LinkStreams,
    PublishSnapshot,
    PutSubscription,
)
from app.state_machine.glob import Glob
from app.state_machine.machine import StateMachine
from app.state_machine.table import StreamTable
from tests.state_machine.helpers import JSON, T0, TEXT, B, H, dump
from tests.state_machine.test_subscriptions import ROOT, Machine


def _both(setup: list[Command], cmds: list[Command]) -> tuple[H, list[str], H, list[str]]:
    """The state after `cmds` applied in one batch, and one entry per batch."""
    out = []
    for together in (True, False):
        h = H()
        for cmd in setup:
            h.one(cmd)
        outcomes = h.batch(*cmds) if together else [h.one(cmd) for cmd in cmds]
        out += [h, [o.code.name for o in outcomes]]
    return out[0], out[1], out[2], out[3]


def test_a_snapshot_deleted_earlier_in_the_batch_is_gone_for_the_rest_of_it() -> None:
    setup: list[Command] = [CreateStream(B, "s", TEXT, False, body=b"hello"), Append(B, "s", TEXT, b"world")]
    setup += [Append(B, "s", TEXT, b"!!!!!")]
    for pos, key in ((0, "snap/K"), (5, "snap/K"), (10, None)):  # two offsets share one object
        digest = "d" * 64 if key else "e" * 64
        setup.append(PublishSnapshot(B, "s", pos, TEXT, digest, 3, inline=None if key else b"abc", key=key))
    cmds: list[Command] = [DeleteSnapshot(B, "s", 0), DeleteSnapshot(B, "s", 5), DeleteSnapshot(B, "s", 5)]
    one, codes_one, each, codes_each = _both(setup, cmds)
    assert codes_one == codes_each == ["DELETED", "DELETED", "SNAPSHOT_NOT_FOUND"]
    assert dump(one.kv) == dump(each.kv)
    assert [k for k, _ in dump(one.kv)[r.GC_QUEUE]] == [b"snap/K"]  # its last snapshot went: the object goes


def test_a_deleted_bucket_takes_the_subscriptions_made_in_the_same_batch() -> None:
    hook = PutSubscription("x", "", "hook", "webhook", "**", [], "https://example.com/h", None, 30000, None)
    cmds: list[Command] = [CreateBucket("x"), hook, DeleteBucket("x"), CreateBucket("x")]
    one, codes_one, each, codes_each = _both([], cmds)
    assert codes_one == codes_each
    assert dump(one.kv)[r.SUBSCRIPTIONS] == dump(each.kv)[r.SUBSCRIPTIONS] == []
    assert subs.find(one.sm.table, "x", "", "hook") is None


def test_a_subscriptions_stored_bytes_do_not_depend_on_batching() -> None:
    setup: list[Command] = [
        CreateStream(B, f"{ROOT}/wake", JSON, True),
        CreateStream(B, f"{ROOT}/events/z", JSON, True),
    ]
    setup += [CreateStream(B, f"{ROOT}/other/{i}", JSON, True) for i in range(7)]  # sid 10 lands beside sid 2
    cmds: list[Command] = [
        CreateStream(B, f"{ROOT}/events/a", JSON, True),
        PutSubscription(B, ROOT, "s1", "pull-wake", "events/*", [], None, "wake", 1000, None),
    ]
    one, _, each, _ = _both(setup, cmds)
    assert dump(one.kv) == dump(each.kv)
    assert list(r.decode_subscription(dump(one.kv)[r.SUBSCRIPTIONS][0][1]).acked) == ["events/a", "events/z"]


def _acked_subscription(m: Machine) -> None:
    m.one(PutSubscription(B, ROOT, "s1", "pull-wake", "events/*", [], None, "wake/pool", 1000, None))
    m.one(Append(B, f"{ROOT}/events/a", JSON, memoryview(b'{"x":2}')))
    generation = m.one(Claim(B, ROOT, "s1", "w", "wk", "t")).subscription.generation  # type: ignore[union-attr]
    done = Ack(B, ROOT, "s1", "wk", generation, "t", [("events/a", m.tail("events/a"))], done=True)
    assert m.one(done).code is Code.OK


def test_a_stream_made_again_under_a_deleted_ones_name_is_covered_from_its_beginning() -> None:
    m = Machine()
    m.stream("events/a", b'{"x":1}')
    _acked_subscription(m)
    assert "events/a" in m.sub().acked
    assert m.one(DeleteStream(B, f"{ROOT}/events/a")).code is Code.DELETED
    assert m.sub().acked == {}  # forgotten with its stream
    m.stream("events/a", b'{"new":1}')
    assert subs.pending(m.sm.table, m.sub()) == {"events/a": (-1, m.tail("events/a"))}


def test_unlinking_a_stream_the_pattern_still_covers_keeps_its_position() -> None:
    m = Machine()
    m.stream("events/a", b'{"x":1}')
    _acked_subscription(m)
    before = m.sub().acked
    assert m.one(LinkStreams(B, ROOT, "s1", ["events/a"], [])).code is Code.OK
    assert m.one(LinkStreams(B, ROOT, "s1", [], ["events/a"])).code is Code.OK  # still matched by events/*
    assert m.sub().acked == before
    assert subs.pending(m.sm.table, m.sub()) == {}


def test_explicit_links_are_capped_and_a_link_that_changes_nothing_is_known_as_such() -> None:
    m = Machine()
    m.one(PutSubscription(B, ROOT, "s1", "pull-wake", None, ["a"], None, "wake/pool", 1000, None))
    assert not subs.link_changes(m.sm.table, LinkStreams(B, ROOT, "s1", ["a"], ["b"]))
    assert subs.link_changes(m.sm.table, LinkStreams(B, ROOT, "s1", ["b"], []))
    too_many = LinkStreams(B, ROOT, "s1", [f"p{i}" for i in range(subs.MAX_EXPLICIT)], [])
    assert m.one(too_many).code is Code.TOO_MANY_LINKS
    assert m.sub().explicit == ["a"]


@contextlib.contextmanager
def counting_linked() -> Iterator[list[str]]:
    """The subscriptions `linked` is asked about meanwhile (a walk of all of a subscription's streams)."""
    calls: list[str] = []
    linked = subs.linked

    def counting(table: StreamTable, sub: r.Subscription) -> dict[str, str]:
        calls.append(sub.id)
        return linked(table, sub)

    subs.linked = counting  # type: ignore[assignment]
    try:
        yield calls
    finally:
        subs.linked = linked  # type: ignore[assignment]


def test_a_link_request_costs_what_it_names_not_what_the_subscription_holds() -> None:
    m = Machine()
    m.one(PutSubscription(B, ROOT, "s1", "pull-wake", "events/*", [], None, "wake/pool", 1000, None))
    with counting_linked() as calls:
        m.one(LinkStreams(B, ROOT, "s1", [f"p{i}" for i in range(500)], []))
    assert len(calls) <= 3  # once before and once after the change, not once per path


def test_globs_are_equal_by_pattern() -> None:
    assert Glob("events/*") == Glob("events/*") and hash(Glob("a/**")) == hash(Glob("a/**"))
    assert Glob("events/*") != Glob("events/**")


def test_appends_do_not_read_subscriptions_that_were_woken_already() -> None:
    m = Machine()
    m.stream("data/a")
    m.apply(
        *[
            PutSubscription(B, ROOT, f"s{i}", "pull-wake", "data/**", [], None, "wake/pool", 1000, None)
            for i in range(300)
        ]
    )
    m.one(Append(B, f"{ROOT}/data/a", JSON, memoryview(b'{"x":1}')))  # wakes each of them once
    wakes = m.tail("wake/pool")
    reads = 0
    get = m.sm.table.get

    def counting(cf: str, key: bytes) -> bytes | None:
        nonlocal reads
        reads += cf == r.SUBSCRIPTIONS
        return get(cf, key)

    m.sm.table.get = counting  # type: ignore[method-assign]
    for _ in range(20):
        m.one(Append(B, f"{ROOT}/data/a", JSON, memoryview(b'{"x":2}')))
    assert reads == 0, "an append decoded subscriptions told of their generation already"
    assert m.tail("wake/pool") == wakes


def test_an_ack_checks_the_streams_it_names_not_all_the_subscription_has() -> None:
    m = Machine()
    m.stream("events/a", b'{"x":1}')
    for i in range(50):
        m.stream(f"events/{i}", b'{"x":1}')
    _acked_subscription(m)
    assert all(subs.links(m.sm.table, m.sub(), f"events/{i}") for i in range(50))
    assert not subs.links(m.sm.table, m.sub(), "other/1") and not subs.links(m.sm.table, m.sub(), "events/99")
    generation = m.one(Claim(B, ROOT, "s1", "w", "wk2", "t")).subscription.generation  # type: ignore[union-attr]
    with counting_linked() as calls:
        ack = Ack(B, ROOT, "s1", "wk2", generation, "t", [("events/3", m.tail("events/3"))], done=False)
        assert m.one(ack).code is Code.OK
        missing = Ack(B, ROOT, "s1", "wk2", generation, "t", [("events/99", 0)], done=False)
        assert m.one(missing).code is Code.NOT_FOUND
    assert calls == []


def test_an_entry_removing_many_streams_rewrites_each_subscription_once() -> None:
    m = Machine()
    for i in range(20):
        name = f"{ROOT}/events/{i}"
        assert m.one(CreateStream(B, name, JSON, True, ttl=1)).code is Code.CREATED
        m.one(Append(B, name, JSON, memoryview(b'{"x":1}')))
    m.one(PutSubscription(B, ROOT, "s1", "pull-wake", "events/*", [], None, "wake/pool", 600_000, None))
    assert len(m.sub().acked) == 20
    writes = 0
    stage = m.sm.table.stage

    def counting(cf: str, key: bytes, value: object) -> None:
        nonlocal writes
        writes += cf == r.SUBSCRIPTIONS
        stage(cf, key, value)  # type: ignore[arg-type]

    m.sm.table.stage = counting  # type: ignore[method-assign]
    sids = [m.sm.names[(B, f"{ROOT}/events/{i}")] for i in range(20)]
    m.one(CollectExpired(sids), now=T0 + 60_000)
    assert m.sub().acked == {} and writes == 1


def test_a_bucket_holds_a_bounded_number_of_pattern_subscriptions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each stream created in a bucket is matched against every pattern subscription of the bucket."""
    monkeypatch.setattr(subs, "MAX_PATTERNS", 3)
    m = Machine()
    for i in range(3):
        assert (
            m.one(PutSubscription(B, ROOT, f"p{i}", "pull-wake", f"x{i}/*", [], None, "wake/pool", 1000, None)).code
            is Code.CREATED
        )
    one_more = PutSubscription(B, ROOT, "p3", "pull-wake", "y/*", [], None, "wake/pool", 1000, None)
    assert m.one(one_more).code is Code.TOO_MANY_SUBSCRIPTIONS
    named = PutSubscription(B, ROOT, "n", "pull-wake", None, ["a"], None, "wake/pool", 1000, None)
    assert m.one(named).code is Code.CREATED  # no pattern: nothing to match


def test_a_reloaded_state_machine_wakes_the_same_subscriptions() -> None:
    """A replica that loads the state (a restart, a checkpoint) wakes what one that applied it all would."""
    m = Machine()
    m.stream("data/a")
    m.one(PutSubscription(B, ROOT, "s1", "pull-wake", "data/**", [], None, "wake/pool", 1000, None))
    m.sm = StateMachine(m.kv)  # loaded from its store
    m.one(Append(B, f"{ROOT}/data/a", JSON, memoryview(b'{"x":1}')))
    assert m.tail("wake/pool") > 0, "the loaded replica wrote no wake event"
