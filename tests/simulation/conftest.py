"""The process pool the simulations' seeds run in."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor

import pytest

from tests.simulation import seeds


@pytest.fixture(scope="session")
def seed_pool() -> Iterator[ProcessPoolExecutor]:
    """Worker processes for the simulations' seeds, shared by the session."""
    with seeds.pool() as executor:
        yield executor
