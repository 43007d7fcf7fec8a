"""The coverage index (app/state_machine/coverage.py): after any history of streams and
subscriptions coming and going, in batches, it names what a plain match of every pattern over
every stream names; a replica that starts from the store builds the same index; wake streams
belong to no subscription."""

from __future__ import annotations

import random

import pytest

from app.raft.messages import Entry
from app.state_machine import records as r
from app.state_machine import subscriptions as rules
from app.state_machine.commands import (
    Code,
    Command,
    CreateBucket,
    CreateStream,
    DeleteBucket,
    DeleteStream,
    DeleteSubscription,
    LinkStreams,
    PutSubscription,
    encode_envelope,
)
from app.state_machine.glob import matches
from app.state_machine.machine import StateMachine
from app.state_machine.table import StreamTable
from app.storage.kv import MemoryKV

NAMES = ("a", "b", "a/b", "a/b/c", "ab", "w", "a/w", "x" * 300, "a" * 200)
PATTERNS = ("*", "**", "a/*", "a/**", "*b*", "**/b/**", "**a**a**a**a**a**a**a**b", "*" + "*a" * 60, "a*")
BUCKETS = ("b1", "b2")


def _expected(table: StreamTable, sub: r.Subscription) -> dict[str, str]:
    """A subscription's streams by brute force: every stream, every pattern."""
    prefix = f"{sub.root}/" if sub.root else ""
    out = {}
    for (bucket, name), sid in table.names.items():
        path = name[len(prefix) :]
        wake = table.coverage.is_wake_stream(bucket, name)
        mine = bucket == sub.bucket and name.startswith(prefix) and not table.streams[sid].deleted and not wake
        if mine and sub.pattern is not None and matches(sub.pattern, path):
            out[path] = "glob"
    for path in sub.explicit:
        if not table.coverage.is_wake_stream(sub.bucket, prefix + path):
            out[path] = "explicit"
    return out


def _subscriptions(table: StreamTable) -> list[r.Subscription]:
    return [r.decode_subscription(raw) for _, raw in table.kv.scan(r.SUBSCRIPTIONS, b"")]


def _random_command(rng: random.Random) -> Command:
    bucket, name, root = rng.choice(BUCKETS), rng.choice(NAMES), rng.choice(("", "a"))
    sub_id = f"s{rng.randrange(5)}"
    roll = rng.random()
    if roll < 0.35:
        return CreateStream(bucket, name, "text/plain", False)
    if roll < 0.5:
        return DeleteStream(bucket, name)
    if roll < 0.75:
        pattern = rng.choice((*PATTERNS, None))
        explicit = rng.sample(NAMES, rng.randrange(3)) if pattern is None or rng.random() < 0.3 else []
        wake = rng.choice((None, "w", "a/w", "b"))
        kind = "pull-wake" if wake else "webhook"
        url = None if wake else "http://h/"
        return PutSubscription(bucket, root, sub_id, kind, pattern, explicit or ["b"], url, wake, 1000, None)
    if roll < 0.85:
        return DeleteSubscription(bucket, root, sub_id)
    if roll < 0.95:
        return LinkStreams(bucket, root, sub_id, rng.sample(NAMES, 1), rng.sample(NAMES, 1))
    return DeleteBucket(bucket) if rng.random() < 0.3 else CreateBucket(bucket)


@pytest.mark.parametrize("seed", range(20))
def test_random_histories_match_brute_force_and_a_restart(seed: int) -> None:
    rng = random.Random(seed)
    kv = MemoryKV(r.COLUMN_FAMILIES)
    machine = StateMachine(kv)
    index = 0
    for bucket in BUCKETS:
        index += 1
        machine.apply([Entry(1, index, encode_envelope(0, CreateBucket(bucket)))])
    for _ in range(40):
        batch = []
        for _ in range(rng.randint(1, 6)):  # several commands in one apply: staged state matters
            index += 1
            batch.append(Entry(1, index, encode_envelope(index, _random_command(rng))))
        machine.apply(batch)
        for sub in _subscriptions(machine.table):
            assert rules.linked(machine.table, sub) == _expected(machine.table, sub), (seed, sub.id, sub.pattern)
    restarted = StreamTable(kv)
    assert restarted.coverage.scopes == machine.table.coverage.scopes
    for sub in _subscriptions(machine.table):
        assert rules.linked(restarted, sub) == rules.linked(machine.table, sub)


def test_an_append_wakes_only_the_subscriptions_that_cover_it() -> None:
    machine = StateMachine(MemoryKV(r.COLUMN_FAMILIES))
    commands: list[Command] = [CreateBucket("b1")]
    commands += [CreateStream("b1", name, "text/plain", False) for name in ("w", "a/x", "b/x")]
    commands += [
        PutSubscription("b1", "", "A", "pull-wake", "a/*", [], None, "w", 1000, None),
        PutSubscription("b1", "", "B", "webhook", "b/*", [], "http://h/", None, 1000, None),
    ]
    outcomes = machine.apply([Entry(1, i + 1, encode_envelope(0, c)) for i, c in enumerate(commands)])
    assert [o.code for o in outcomes[-2:]] == [Code.CREATED, Code.CREATED]  # type: ignore[union-attr]
    machine.table.coverage.take_woken()
    from app.state_machine.commands import Append

    woken = []
    machine.on_woken = lambda: woken.append(machine.table.coverage.take_woken())
    for i, name in enumerate(("a/x", "w", "b/x")):
        machine.apply([Entry(1, 10 + i, encode_envelope(0, Append("b1", name, "text/plain", memoryview(b"1"))))])
    assert woken == [{r.subscription_key("b1", "", "A")}, {r.subscription_key("b1", "", "B")}]  # "w" wakes none
