from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server import RillProcess


@pytest.fixture(scope="session")
def rill(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    """One server for the session (long-poll timeout 1 s to keep live tests quick)."""
    server = RillProcess(tmp_path_factory.mktemp("rill") / "data", None, "--long-poll-timeout", "1").start()
    yield server
    server.stop()


@pytest.fixture()
def client(rill: RillProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=rill.url, timeout=10) as c:
        yield c


@pytest.fixture()
def fresh_data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"
