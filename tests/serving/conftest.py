from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.server import RillProcess

# Short limits so the edge tests run in seconds; the long-poll outlasts every one of them.
EDGE_CONFIG = """
header_timeout = 1.5
keepalive_timeout = 2.0
body_timeout = 1.0
body_min_rate = 1024
long_poll_timeout = 4.0
"""


@pytest.fixture(scope="package")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    root = tmp_path_factory.mktemp("edge")
    config = root / "edge.toml"
    config.write_text(EDGE_CONFIG)
    server = RillProcess(root / "data", None, "--config", str(config)).start()
    yield server
    server.stop()
