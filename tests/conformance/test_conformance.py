"""The Durable Streams conformance suite (npm) against a real `rill serve`, once per route family."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server import RillCluster, RillProcess

HERE = Path(__file__).parent
LONG_POLL_SECONDS = 2


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    rill = RillProcess(
        tmp_path_factory.mktemp("conformance") / "data", None, "--long-poll-timeout", str(LONG_POLL_SECONDS)
    )
    rill.start()
    assert httpx.put(rill.url + "/ds/conformance").status_code in (200, 201)
    yield rill
    rill.stop()


@pytest.mark.parametrize("family", ["compat", "ds", "legacy"])
def test_conformance_suite(server: RillProcess, family: str) -> None:
    base = {"compat": server.url, "ds": server.url + "/ds/conformance", "legacy": server.url + "/streams"}[family]
    _run_suite(base)


def test_conformance_suite_through_a_follower(tmp_path: Path) -> None:
    """A 3-node cluster, the suite pointed at a follower: writes are forwarded, reads redirected.

    Node's fetch cannot re-send a binary body on a 307, so the follower forwards writes.
    """
    cluster = RillCluster(tmp_path, 3, "--long-poll-timeout", str(LONG_POLL_SECONDS), "--forward-writes").start()
    try:
        leader = cluster.wait_for_leader()
        follower = next(i for i in cluster.nodes if i != leader)
        _run_suite(cluster.nodes[follower].url)
    finally:
        cluster.stop()


def _run_suite(base: str) -> None:
    env = {**os.environ, "RILL_CONFORMANCE_URL": base, "RILL_LONG_POLL_MS": str(LONG_POLL_SECONDS * 1000)}
    result = subprocess.run(
        [str(HERE / "node_modules" / ".bin" / "vitest"), "run", "--reporter=dot"],
        cwd=HERE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)
    summary = re.search(r"Tests\s+(.*)", output)
    assert result.returncode == 0, output[-6000:]
    assert summary is not None and "failed" not in summary.group(1), output[-6000:]
    passed = re.search(r"(\d+) passed", summary.group(1))
    assert passed is not None and int(passed.group(1)) >= 332, summary.group(1)
