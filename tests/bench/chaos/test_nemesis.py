"""The nemesis's schedule: fixed by the seed, every kind in turn, each fault over before the settle."""

from __future__ import annotations

from collections import Counter

from app.bench.chaos.nemesis import QUIET_SECONDS, plan
from app.bench.chaos.options import KINDS


def test_a_seed_fixes_the_schedule() -> None:
    assert plan(5, list(KINDS), 300) == plan(5, list(KINDS), 300)
    assert plan(5, list(KINDS), 300) != plan(6, list(KINDS), 300)


def test_every_kind_comes_round_before_any_repeats() -> None:
    steps = plan(9, list(KINDS), 600)
    first = [s.kind for s in steps[: len(KINDS)]]
    assert sorted(first) == sorted(KINDS)
    assert min(Counter(s.kind for s in steps).values()) >= 3


def test_faults_do_not_overlap_and_end_before_the_settle() -> None:
    steps = plan(3, list(KINDS), 200, warmup=4, settle=6)
    for a, b in zip(steps, steps[1:], strict=False):
        assert a.at + a.seconds + 2.0 <= b.at + 1e-6
    assert steps[0].at >= 4
    assert steps[-1].at + steps[-1].seconds <= 200 - 6


def test_quiet_outlasts_the_keep_alive_timeout() -> None:
    quiet = [s for s in plan(1, ["quiet"], 120)]
    assert quiet and all(s.seconds == QUIET_SECONDS > 5.0 for s in quiet)


def test_only_the_kinds_asked_for() -> None:
    assert {s.kind for s in plan(2, ["kill", "pause"], 120)} == {"kill", "pause"}
