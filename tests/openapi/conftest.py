from __future__ import annotations

import pytest

from tests.openapi.helpers import seed
from tests.server import RillProcess


@pytest.fixture(scope="session")
def seeded(rill: RillProcess) -> str:
    """The bucket and streams the schema's examples name, so generated requests can hit them.

    Seeded once, as when these tests were one module: a second fresh seed could meet streams the
    schemathesis run closed or trimmed."""
    seed(rill.url, fresh=True)
    return rill.url
