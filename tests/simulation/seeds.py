"""Simulation seeds on every core: each seed is independent and deterministic, so they run in worker
processes and report back what failed, with the command that replays it."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, ProcessPoolExecutor


def pool() -> ProcessPoolExecutor:
    # spawn, not fork: the test process has threads (moto's server, Spark's gateway) a fork would copy mid-lock.
    return ProcessPoolExecutor(max_workers=os.cpu_count() or 1, mp_context=multiprocessing.get_context("spawn"))


def failures(executor: Executor, check: Callable[[int], str | None], seeds: Iterable[int]) -> list[str]:
    return [failure for failure in executor.map(check, seeds) if failure is not None]


def check_core_seed(seed: int) -> str | None:
    """tests/simulation/core.py: the pure Raft core, log store and state machine."""
    from tests.simulation.core import run_seed

    try:
        run_seed(seed)
    except AssertionError as exc:
        return f"seed {seed}: {exc} (replay: python -m tests.simulation.core --seed {seed} -v)"
    return None


def check_driver_seed(seed: int) -> str | None:
    """tests/simulation/driver: the real asyncio RaftNode on virtual time."""
    from tests.simulation.driver import run_seed

    try:
        result = run_seed(seed)
    except AssertionError as exc:
        return f"seed {seed}: {exc} (replay: python -m tests.simulation.driver --seed {seed} -v)"
    if not (result.stats["acked"] > 0 and result.stats["reads"] > 0):
        return f"seed {seed}: the workload did nothing: {result.stats}"
    return None
