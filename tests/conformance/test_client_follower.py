"""The official TypeScript client writes binary through a follower, with the cluster's defaults.

Node's fetch cannot re-send a body on a 307, so this holds because followers forward writes by
default; with `--no-forward-writes` the same script must fail rather than hang.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server import RillCluster, read_to_tail

HERE = Path(__file__).resolve().parent
EXPECTED = bytes(range(256)) + bytes([0, 255, 0, 7, 7, 7])


def _client(url: str, seconds: int = 30) -> subprocess.CompletedProcess[str]:
    script = [str(HERE / "follower_client.mjs"), url, str(seconds)]
    return subprocess.run(["node", *script], cwd=HERE, capture_output=True, text=True, timeout=seconds + 30)


@pytest.fixture()
def cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[RillCluster]:
    nodes = RillCluster(tmp_path, 3, *request.param).start()
    yield nodes
    nodes.stop()


@pytest.mark.parametrize("cluster", [()], indirect=True, ids=["defaults"])
def test_binary_writes_through_a_follower(cluster: RillCluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.nodes if i != leader)
    url = cluster.nodes[follower].url + "/v1/stream/ts-binary"
    result = _client(url)
    assert result.returncode == 0, result.stderr[-3000:]
    assert bytes.fromhex(json.loads(result.stdout.strip().splitlines()[-1])["hex"]) == EXPECTED
    with httpx.Client() as client:
        assert read_to_tail(client, cluster.nodes[leader].url + "/v1/stream/ts-binary") == EXPECTED


@pytest.mark.parametrize("cluster", [("--no-forward-writes",)], indirect=True, ids=["redirects"])
def test_with_redirects_the_client_fails_instead_of_writing(cluster: RillCluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.nodes if i != leader)
    result = _client(cluster.nodes[follower].url + "/v1/stream/ts-redirected", seconds=8)
    assert result.returncode != 0
    with httpx.Client() as client:
        stream = client.get(cluster.nodes[leader].url + "/v1/stream/ts-redirected", params={"offset": "-1"})
    assert stream.status_code == 404 or not stream.content.startswith(bytes(range(256)))
