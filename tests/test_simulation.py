"""1,000 seeds of the deterministic cluster simulation (tests/simulation.py) on every run."""

from __future__ import annotations

import pytest

from tests.simulation import run_seed

BATCH = 100


@pytest.mark.parametrize("first", range(0, 1000, BATCH), ids=lambda first: f"seeds-{first}-{first + BATCH - 1}")
def test_simulated_cluster_is_safe(first: int) -> None:
    failed = []
    for seed in range(first, first + BATCH):
        try:
            run_seed(seed)
        except AssertionError as exc:
            failed.append(f"seed {seed}: {exc} (replay: python -m tests.simulation --seed {seed} -v)")
    assert not failed, "\n".join(failed)
