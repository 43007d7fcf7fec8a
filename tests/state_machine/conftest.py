from __future__ import annotations

import pytest

from tests.state_machine.helpers import H


@pytest.fixture()
def h() -> H:
    """A fresh state machine on MemoryKV, with bucket B created."""
    return H()
