"""1,000 seeds of the deterministic cluster simulation (tests/simulation/core.py) on every run."""

from __future__ import annotations

from concurrent.futures import Executor

import pytest

from tests.simulation.seeds import check_core_seed, failures

BATCH = 100


@pytest.mark.parametrize("first", range(0, 1000, BATCH), ids=lambda first: f"seeds-{first}-{first + BATCH - 1}")
def test_simulated_cluster_is_safe(seed_pool: Executor, first: int) -> None:
    failed = failures(seed_pool, check_core_seed, range(first, first + BATCH))
    assert not failed, "\n".join(failed)
