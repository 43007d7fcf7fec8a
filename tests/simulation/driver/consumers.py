"""Subscriptions in the simulation: pull-wake workers claim a subscription over every stream and
acknowledge what they saw, through whichever node they reach, across crashes, partitions and
leader changes. After healing they consume until nothing is pending: every message reaches a
consumer at least once. More subscriptions with random patterns, adversarial ones among them, come
and go meanwhile. Checked as replicas apply (tests/simulation/driver/checks.py): an acknowledged position never
moves backwards, one generation never has two holders, and every replica's coverage index names
the streams a plain match of each pattern names."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app.cluster.driver_errors import NotLeader, ProposalDropped
from app.state_machine import subscriptions as rules
from app.state_machine.commands import (
    Ack,
    Claim,
    Code,
    Command,
    CreateStream,
    DeleteSubscription,
    Outcome,
    PutSubscription,
    encode_envelope,
)
from app.state_machine.machine import COMPAT_BUCKET
from tests.simulation.driver.process import Unavailable, call

if TYPE_CHECKING:
    from tests.simulation.driver.world import Simulation

SUBSCRIPTION = (COMPAT_BUCKET, "", "group")
WAKE_STREAM = "wake/group"  # the pattern "*" (one segment) does not cover it
# Patterns for the subscriptions that come and go: plain ones, and ones a backtracking matcher
# would take exponential time on (a stream name of 1,000 characters is among the streams).
PATTERNS = (
    "s*", "*1", "**", "s0", "**/**", "w*/**", "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b", "**a**a**a**a**a**a**a**b",
    "**s**s**s**s**s**s**s**1", "*" + "*a" * 60, "wake/*",
)  # fmt: skip
LONG_STREAM = "a" * 1000
WORKERS = ("w1", "w2")
LEASE_MS = 1000


async def propose(sim: Simulation, command: Command) -> tuple[Outcome, int] | None:
    """The outcome of `command` proposed through a random live node, and that node; None if it failed."""
    up = sim.up()
    if not up:
        return None
    member = sim.rng.choice(up)
    envelope = encode_envelope(int(sim.now() * 1000), command)
    try:
        outcome = await call(member, lambda raft: raft.propose(envelope), sim.rng.uniform(0.3, 4.0))
    except (NotLeader, ProposalDropped, Unavailable):
        return None
    if not isinstance(outcome, Outcome):
        sim.fail(f"{command} got {outcome!r}")
        return None
    return outcome, member.id


def consumed(sim: Simulation) -> bool:
    """Nothing is pending for the subscription on the leader, and every writer is done."""
    leader = sim.leader()
    if leader is None or leader.current is None or not all(c.done for c in sim.clients):
        return False
    from tests.simulation.driver.webhooks import HOOKS

    table = leader.current.raft.machine.table
    subs = [rules.find(table, *SUBSCRIPTION), rules.find(table, *HOOKS)]
    return all(sub is not None and not rules.pending(table, sub) for sub in subs)


async def subscribe(sim: Simulation, command: PutSubscription) -> Outcome:
    while (created := await propose(sim, command)) is None or created[0].code not in (Code.CREATED, Code.EXISTS):
        await sim.sleep(0.05, 0.4)
    return created[0]


async def create_stream(sim: Simulation, name: str) -> None:
    command = CreateStream(COMPAT_BUCKET, name, "application/json", False)
    while (created := await propose(sim, command)) is None or created[0].code not in (Code.CREATED, Code.EXISTS):
        await sim.sleep(0.05, 0.4)


async def patterns(sim: Simulation) -> None:
    """Subscriptions with random patterns are made and deleted while the faults last."""
    await create_stream(sim, LONG_STREAM)
    turn = 0
    while not sim.healing:
        await sim.sleep(0.2, 2.0)
        turn += 1
        sub_id = f"p{sim.rng.randrange(4)}"
        if sim.rng.random() < 0.3:
            await propose(sim, DeleteSubscription(COMPAT_BUCKET, "", sub_id))
            continue
        pattern = sim.rng.choice(PATTERNS)
        from tests.simulation.driver.webhooks import URL

        wake = WAKE_STREAM if sim.rng.random() < 0.5 else None
        kind, url = ("pull-wake", None) if wake else ("webhook", URL)
        command = PutSubscription(COMPAT_BUCKET, "", sub_id, kind, pattern, [], url, wake, LEASE_MS, None, "http://sim")
        answered = await propose(sim, command)
        refused = (Code.CONFIG_MISMATCH, Code.INVALID_PATTERN, Code.WAKE_STREAM_COVERED, Code.WAKE_STREAM_NOT_FOUND)
        if answered is not None and answered[0].code not in (Code.CREATED, Code.EXISTS, *refused):
            sim.fail(f"subscription {sub_id} ({pattern!r}): unexpected outcome {answered[0]}")


async def webhook_subscription(sim: Simulation) -> None:
    from tests.simulation.driver.webhooks import HOOKS, URL

    made = await subscribe(sim, PutSubscription(*HOOKS, "webhook", "*", [], URL, None, LEASE_MS, None, "http://sim"))
    # What was written before it was made is not for it (its offsets then, or later ones once it exists).
    sim.hooked_at = dict(made.subscription.acked) if made.subscription is not None else {}


async def consumer(sim: Simulation, worker: str) -> None:
    bucket, root, sub_id = SUBSCRIPTION
    await create_stream(sim, WAKE_STREAM)
    pull = PutSubscription(bucket, root, sub_id, "pull-wake", "*", [], None, WAKE_STREAM, LEASE_MS, None)
    await subscribe(sim, pull)
    turn = 0
    while not (sim.healing and consumed(sim)):
        await sim.sleep(0.05, 0.8)
        turn += 1
        token = f"{worker}-{turn}"
        claimed = await propose(sim, Claim(bucket, root, sub_id, worker, f"wake-{worker}-{turn}", token))
        if claimed is None or claimed[0].code is not Code.OK:
            continue
        outcome, node = claimed
        sub = outcome.subscription
        member = sim.members[node]
        if sub is None or member.current is None:
            continue
        # What this worker read: the pending tails as the node that granted the claim had them.
        pending = rules.pending(member.current.raft.machine.table, sub)
        # Mostly the tails it read; sometimes a position behind what is acknowledged already (a
        # slow worker's stale ack), which must not move anything back.
        acks = [
            (path, tail if sim.rng.random() < 0.7 else sim.rng.randint(0, tail))
            for path, (_, tail) in sorted(pending.items())
        ]
        await sim.sleep(0, 0.3)
        done = sim.healing or sim.rng.random() < 0.7
        answered = await propose(sim, Ack(bucket, root, sub_id, sub.wake_id or "", sub.generation, token, acks, done))
        if answered is not None and answered[0].code not in (Code.OK, Code.FENCED):
            sim.fail(f"worker {worker}: unexpected ack outcome {answered[0]}")
        elif answered is not None and answered[0].code is Code.OK:
            sim.stats["acks"] += 1
    sim.consumers_done += 1
