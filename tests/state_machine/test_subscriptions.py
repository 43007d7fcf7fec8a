"""State machine rules for subscriptions (`app/state_machine/subscriptions.py`): configuration,
streams by pattern and by name, leases decided with the entry's time, fencing by generation, and
acknowledged positions that never move backwards."""

from __future__ import annotations

import random

import pytest

from app.raft.messages import Entry
from app.state_machine import records as r
from app.state_machine import subscriptions as subs
from app.state_machine.commands import (
    Ack,
    Append,
    Claim,
    Code,
    Command,
    CreateBucket,
    CreateStream,
    DeleteBucket,
    DeleteSubscription,
    LinkStreams,
    Outcome,
    PutSubscription,
    encode_envelope,
)
from app.state_machine.machine import StateMachine
from app.storage.kv import MemoryKV
from tests.state_machine.helpers import T0, B

JSON = "application/json"
ROOT = "v1/stream"


class Machine:
    """A state machine on MemoryKV; each apply is one batch, at the time given."""

    def __init__(self) -> None:
        self.kv = MemoryKV(r.COLUMN_FAMILIES)
        self.sm = StateMachine(self.kv)
        self.index = self.sm.applied_index
        assert self.one(CreateBucket(B)).code is Code.CREATED
        self.stream("wake/pool")

    def apply(self, *cmds: Command, now: int = T0) -> list[Outcome]:
        entries = []
        for cmd in cmds:
            self.index += 1
            entries.append(Entry(1, self.index, encode_envelope(now, cmd)))
        return self.sm.apply(entries)  # type: ignore[return-value]

    def one(self, cmd: Command, now: int = T0) -> Outcome:
        return self.apply(cmd, now=now)[0]

    def stream(self, path: str, body: bytes = b"") -> None:
        name = f"{ROOT}/{path}"
        assert self.one(CreateStream(B, name, JSON, True)).code is Code.CREATED
        if body:
            assert self.one(Append(B, name, JSON, memoryview(body))).code is Code.APPENDED

    def tail(self, path: str) -> int:
        return self.sm.streams[self.sm.names[(B, f"{ROOT}/{path}")]].tail

    def sub(self, sub_id: str = "s1") -> r.Subscription:
        found = subs.find(self.sm.table, B, ROOT, sub_id)
        assert found is not None
        return found


def put(sub_id: str = "s1", pattern: str | None = "events/*", streams: list[str] | None = None) -> PutSubscription:
    return PutSubscription(B, ROOT, sub_id, "pull-wake", pattern, streams or [], None, "wake/pool", 1000, None)


@pytest.fixture()
def m() -> Machine:
    return Machine()


def test_create_confirm_and_conflict(m: Machine) -> None:
    created = m.one(put())
    assert created.code is Code.CREATED and created.subscription is not None
    assert created.subscription.created_at == T0
    assert m.one(put(), now=T0 + 5).code is Code.EXISTS  # the same configuration again
    assert m.one(put(pattern="other/*")).code is Code.CONFIG_MISMATCH
    assert m.one(PutSubscription("nope", ROOT, "s", "webhook", "*", [], None, None, 1000, None)).code is (
        Code.BUCKET_NOT_FOUND
    )


def test_streams_by_pattern_and_by_name(m: Machine) -> None:
    m.stream("events/a")
    m.stream("events/a/deeper")
    m.stream("other/x")
    m.one(put(streams=["manual/a"]))
    m.stream("events/b")  # made after the subscription: linked too
    assert subs.linked(m.sm.table, m.sub()) == {"events/a": "glob", "events/b": "glob", "manual/a": "explicit"}
    assert m.one(LinkStreams(B, ROOT, "s1", ["manual/b"], ["manual/a"])).code is Code.OK
    assert m.sub().explicit == ["manual/b"]
    assert m.one(LinkStreams(B, ROOT, "nope", [], [])).code is Code.SUBSCRIPTION_NOT_FOUND


def test_a_claim_holds_until_its_lease_runs_out(m: Machine) -> None:
    m.one(put())
    first = m.one(Claim(B, ROOT, "s1", "worker-1", "w1", "t1"))
    assert first.code is Code.OK and first.subscription is not None and first.subscription.generation == 1
    busy = m.one(Claim(B, ROOT, "s1", "worker-2", "w2", "t2"), now=T0 + 999)
    assert busy.code is Code.ALREADY_CLAIMED and busy.subscription is not None
    assert busy.subscription.holder == "worker-1"
    taken = m.one(Claim(B, ROOT, "s1", "worker-2", "w2", "t2"), now=T0 + 1000)  # the lease ran out
    assert taken.code is Code.OK and m.sub().holder == "worker-2" and m.sub().generation == 2


def test_acks_are_fenced_by_generation_wake_and_token(m: Machine) -> None:
    m.stream("events/a", b'{"n":1}')
    m.one(put())
    m.one(Claim(B, ROOT, "s1", "worker-1", "w1", "t1"))
    tail = m.tail("events/a")
    for stale in (
        Ack(B, ROOT, "s1", "w1", 2, "t1", [("events/a", tail)]),  # another generation
        Ack(B, ROOT, "s1", "w0", 1, "t1", [("events/a", tail)]),  # another wake
        Ack(B, ROOT, "s1", "w1", 1, "forged", [("events/a", tail)]),  # another token
    ):
        assert m.one(stale).code is Code.FENCED
    assert m.one(Ack(B, ROOT, "s1", "w1", 1, "t1", [("events/a", tail)], done=True)).code is Code.OK
    assert m.sub().acked == {"events/a": tail} and m.sub().holder is None
    assert m.one(Ack(B, ROOT, "s1", "w1", 1, "t1", [("events/a", tail)])).code is Code.FENCED  # done: released


def test_a_lapsed_lease_fences_its_holder(m: Machine) -> None:
    m.stream("events/a", b'{"n":1}')
    m.one(put())
    m.one(Claim(B, ROOT, "s1", "worker-1", "w1", "t1"))
    late = Ack(B, ROOT, "s1", "w1", 1, "t1", [("events/a", 1)])
    assert m.one(late, now=T0 + 1000).code is Code.FENCED


def test_acks_renew_the_lease_and_refuse_unknown_streams_and_future_positions(m: Machine) -> None:
    m.stream("events/a", b'{"n":1}')
    m.one(put())
    m.one(Claim(B, ROOT, "s1", "worker-1", "w1", "t1"))
    assert m.one(Ack(B, ROOT, "s1", "w1", 1, "t1", [("events/a", 0)]), now=T0 + 900).code is Code.OK
    assert m.sub().lease_until == T0 + 900 + 1000
    assert m.one(Ack(B, ROOT, "s1", "w1", 1, "t1", [("other/x", 0)])).code is Code.NOT_FOUND
    beyond = m.tail("events/a") + 1
    assert m.one(Ack(B, ROOT, "s1", "w1", 1, "t1", [("events/a", beyond)])).code is Code.BEYOND_TAIL
    # The next worker resumes from an acknowledged offset: one inside a message is refused before it is
    # proposed. The apply does not refuse it: acks that earlier versions applied replay alike.
    inside = Ack(B, ROOT, "s1", "w1", 1, "t1", [("events/a", 3)])
    refused = subs.ack_boundary_refusal(m.sm.table, inside)
    assert refused is not None and refused.code is Code.NOT_BOUNDARY
    for pos in (0, beyond - 1, beyond):  # the start, the tail, past it (BEYOND_TAIL's to answer)
        assert subs.ack_boundary_refusal(m.sm.table, Ack(B, ROOT, "s1", "w1", 1, "t1", [("events/a", pos)])) is None
    assert m.one(inside).code is Code.OK


def test_pending_streams_and_delete(m: Machine) -> None:
    m.stream("events/a", b'{"n":1}')
    m.stream("events/b")
    m.one(put())
    before = m.tail("events/a")
    assert subs.pending(m.sm.table, m.sub()) == {}  # a subscription takes what comes after it
    m.one(Append(B, f"{ROOT}/events/a", JSON, memoryview(b'{"n":2}')))
    m.stream("events/c", b'{"n":3}')  # made later: from its beginning
    assert subs.pending(m.sm.table, m.sub()) == {
        "events/a": (before, m.tail("events/a")),
        "events/c": (-1, m.tail("events/c")),
    }
    deleted, again = m.apply(DeleteSubscription(B, ROOT, "s1"), DeleteSubscription(B, ROOT, "s1"))
    assert (deleted.code, again.code) == (Code.DELETED, Code.SUBSCRIPTION_NOT_FOUND)
    assert subs.find(m.sm.table, B, ROOT, "s1") is None
    assert m.one(put()).code is Code.CREATED  # and made anew


def test_subscriptions_survive_a_restart(m: Machine) -> None:
    m.stream("events/a", b'{"n":1}')
    m.one(put())
    m.one(Claim(B, ROOT, "s1", "worker-1", "w1", "t1"))
    m.one(Ack(B, ROOT, "s1", "w1", 1, "t1", [("events/a", 1)]))
    reopened = StateMachine(m.kv)
    assert subs.find(reopened.table, B, ROOT, "s1") == m.sub()


def test_random_histories_keep_the_invariants(m: Machine) -> None:
    """Whatever workers do and whenever: an acknowledged position never moves backwards, and a
    generation is held by one holder only."""
    rng = random.Random(7)
    m.stream("events/a")
    m.one(put())
    now, holders, seen_acked = T0, {}, {}
    for step in range(400):
        now += rng.choice([0, 10, 300, 1200])
        if rng.random() < 0.3:
            m.one(Append(B, f"{ROOT}/events/a", JSON, memoryview(b'{"n":%d}' % step)), now=now)
        worker = rng.choice(["w1", "w2", "w3"])
        sub = m.sub()
        if rng.random() < 0.4:
            m.one(Claim(B, ROOT, "s1", worker, f"wake-{step}", f"token-{worker}"), now=now)
        else:
            generation = sub.generation if rng.random() < 0.8 else sub.generation - 1
            pos = rng.randint(0, m.tail("events/a"))
            token = f"token-{worker}"
            m.one(
                Ack(B, ROOT, "s1", sub.wake_id or "", generation, token, [("events/a", pos)], rng.random() < 0.3),
                now=now,
            )
        after = m.sub()
        if after.holder is not None:
            assert holders.setdefault(after.generation, after.holder) == after.holder
        acked = after.acked.get("events/a", -1)
        assert acked >= seen_acked.get("events/a", -1)
        seen_acked["events/a"] = acked
    assert len(holders) > 10 and seen_acked["events/a"] > 0


def test_a_deleted_bucket_takes_its_subscriptions_along(m: Machine) -> None:
    other = B + "-other"
    m.one(CreateBucket(other))
    m.one(PutSubscription(other, "", "s", "pull-wake", "*", [], None, "w", 1000, None))
    m.one(put())
    assert m.one(DeleteBucket(other)).code is Code.DELETED
    assert subs.find(m.sm.table, other, "", "s") is None
    assert subs.find(m.sm.table, B, ROOT, "s1") is not None  # another bucket's stay


def test_patterns_and_wake_streams_are_checked_when_applied(m: Machine) -> None:
    """The same checks the routes make, so a forwarded or replayed entry cannot get past them."""
    m.stream("a" * 1000)
    assert m.one(put("evil", pattern="**a" * 9 + "**b")).code is Code.INVALID_PATTERN
    assert m.one(put("hard", pattern="**a" * 7 + "**b")).code is Code.CREATED  # 8 `**`: matched at once
    missing = PutSubscription(B, ROOT, "m", "pull-wake", "events/*", [], None, "nowhere", 1000, None)
    assert m.one(missing).code is Code.WAKE_STREAM_NOT_FOUND
    assert m.one(put("self", pattern="wake/*")).code is Code.WAKE_STREAM_COVERED
    assert m.one(put("named", pattern=None, streams=["wake/pool"])).code is Code.WAKE_STREAM_COVERED
    assert m.one(LinkStreams(B, ROOT, "hard", ["wake/pool"], [])).code is Code.WAKE_STREAM_COVERED
