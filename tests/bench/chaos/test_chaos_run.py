"""`rill bench chaos` for real, short: a 3-node cluster through seven kinds of fault loses nothing and
reads nothing stale, and a build whose followers skip the read barrier is caught reading stale."""

from __future__ import annotations

from collections import Counter

from app.bench.chaos.nemesis import plan
from app.bench.chaos.options import KINDS
from app.bench.chaos.run import ChaosOptions, run

# Seed 20's first 55 s: pause, membership, disk, partition, quiet, kill and delay, one each.
SEED, SECONDS = 20, 55.0


def test_the_seed_still_plans_seven_kinds() -> None:
    assert [s.kind for s in plan(SEED, list(KINDS), SECONDS)] == [
        "pause", "membership", "disk", "partition", "quiet", "kill", "delay"
    ]  # fmt: skip


def test_a_short_run_through_seven_kinds_of_fault_loses_nothing() -> None:
    history, verdict, errors = run(ChaosOptions(nodes=3, seconds=SECONDS, seed=SEED), list(KINDS))
    assert verdict.ok, [v.message for v in verdict.violations[:5]]
    assert errors == [] and history.nemesis_errors == []
    kinds = Counter(f.kind for f in history.faults)
    expected = {"pause", "membership", "partition", "quiet", "kill", "delay"} | (
        {"disk"} - {s[:4] for s in history.skipped}
    )
    assert expected <= set(kinds), kinds
    assert all(f.healed >= f.start for f in history.faults)
    assert verdict.acknowledged > 300 and verdict.lost == verdict.duplicated == 0
    assert {r.kind for r in history.reads} == {"catch-up", "long-poll", "sse"}
    assert {r.node for r in history.reads} == {1, 2, 3}
    assert any(c.status == 200 for c in history.claims) and any(a.status == 200 for a in history.acks)
    # The peers really talked through the proxies (--peer-routes), so the faults were real.
    assert history.links["bytes"] > 100_000 and history.links["accepted"] >= 6
    assert len(history.final) == 3 and all(all(c for c in streams.values()) for streams in history.final.values())


def test_a_follower_reading_without_the_read_barrier_is_caught() -> None:
    history, verdict, _ = run(ChaosOptions(nodes=3, seconds=10.0, seed=2, broken="read-without-barrier"), ["oneway"])
    assert verdict.stale_reads > 0
    stale = next(v for v in verdict.violations if v.kind == "stale-read")
    assert [op["op"] for op in stale.excerpt] == ["append", "read"]
