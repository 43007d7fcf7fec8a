"""`/readyz` and `/_rill/cluster` on real nodes: ready once a leader is known and the log applied."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.observability.helpers import scrape, value
from tests.server import RillCluster, RillProcess


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillCluster]:
    nodes = RillCluster(tmp_path_factory.mktemp("probes")).start()
    nodes.wait_for_leader()
    yield nodes
    nodes.stop()


def test_a_single_node_is_ready(tmp_path: Path) -> None:
    node = RillProcess(tmp_path / "data").start()
    try:
        ready = httpx.get(node.url + "/readyz")
        assert ready.status_code == 200 and ready.json() == {"status": "ready"}
        assert ready.headers["cache-control"] == "no-store"
    finally:
        node.stop()


def test_the_cluster_view_shows_every_member(cluster: RillCluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.nodes if i != leader)
    view = httpx.get(cluster.nodes[follower].url + "/_rill/cluster", timeout=10)
    assert view.status_code == 200, view.text
    nodes = {n["id"]: n for n in view.json()["nodes"]}
    assert sorted(nodes) == [1, 2, 3]
    assert [i for i, n in nodes.items() if n["role"] == "leader"] == [leader]
    for i, n in nodes.items():
        assert n["reachable"] is True and n["url"] == cluster.nodes[i].url
        assert n["term"] >= 1 and n["leader"] == leader and isinstance(n["lag"], int) and n["lag"] >= 0
    for i in cluster.nodes:
        assert httpx.get(cluster.nodes[i].url + "/readyz").status_code == 200
        # Members answer each other over the signed channel only: a client cannot ask directly.
        unsigned = httpx.get(cluster.nodes[i].url + "/_rill/status", headers={"x-rill-signature": "v1 nope"})
        assert unsigned.status_code == 403 and unsigned.json()["error"]["code"] == "forbidden"


def test_the_leader_reports_replication_lag_per_peer(cluster: RillCluster) -> None:
    leader = cluster.wait_for_leader()
    samples = scrape(cluster.nodes[leader].url)
    peers = {dict(labels)["peer"] for name, labels in samples if name == "rill_raft_replication_lag_entries"}
    assert peers == {str(i) for i in cluster.nodes if i != leader}
    follower = next(i for i in cluster.nodes if i != leader)
    on_follower = scrape(cluster.nodes[follower].url)
    assert value(on_follower, "rill_raft_role", role="follower") == 1
    assert value(on_follower, "rill_raft_leader_id") == leader
    assert value(on_follower, "rill_raft_leader_changes_total") >= 1


def test_a_follower_without_a_leader_is_not_ready(cluster: RillCluster) -> None:
    """Last in the module: it stops two of the three nodes."""
    leader = cluster.wait_for_leader()
    survivor, other = (i for i in cluster.nodes if i != leader)
    cluster.nodes[leader].kill()
    cluster.nodes[other].kill()
    url = cluster.nodes[survivor].url
    deadline = time.monotonic() + 15
    while (ready := httpx.get(url + "/readyz", timeout=5)).status_code == 200:
        assert time.monotonic() < deadline, "the survivor stayed ready without a leader"
        time.sleep(0.1)
    assert ready.status_code == 503
    # First the leader goes quiet; once the survivor's election timer fires, it knows no leader at all.
    quiet = {"status": "not_ready", "reason": "no word from the leader within an election timeout"}
    assert ready.json() in (quiet, {"status": "not_ready", "reason": "no leader is known"})
    assert httpx.get(url + "/healthz").status_code == 200  # alive, though not ready
    view = httpx.get(url + "/_rill/cluster", timeout=10).json()
    assert {n["id"]: n["reachable"] for n in view["nodes"]} == {leader: False, other: False, survivor: True}
