"""Membership changes on a real cluster: a new node catches up from a snapshot, and nodes leave."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.cluster.test_cluster import _stream_bytes
from tests.server import RillCluster, RillProcess, free_port

# Compact early and keep little, so a node that joins late can only catch up from a snapshot.
COMPACTING = {"RILL_RAFT_COMPACT_ENTRIES": "40", "RILL_RAFT_COMPACT_KEEP": "5"}
STREAMS = ("m0", "m1", "m2")


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[RillCluster]:
    nodes = RillCluster(tmp_path, env=COMPACTING).start()
    yield nodes
    nodes.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "app.cli", "cluster", *args, "--token", RillCluster.ADMIN_TOKEN]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _create(client: httpx.Client, url: str) -> None:
    for name in STREAMS:
        assert client.put(f"{url}/v1/stream/{name}", headers={"content-type": "text/plain"}).status_code == 201


def _write(client: httpx.Client, url: str, rounds: range) -> None:
    for i in rounds:
        for name in STREAMS:
            r = client.post(f"{url}/v1/stream/{name}", headers={"content-type": "text/plain"}, content=b"%d;" % i)
            assert r.status_code == 204, r.text


def _expected(rounds: int) -> bytes:
    return b"".join(b"%d;" % i for i in range(rounds))


def test_a_new_node_catches_up_from_a_snapshot_and_serves_identical_reads(cluster: RillCluster, tmp_path: Path) -> None:
    leader = cluster.wait_for_leader()
    with httpx.Client(follow_redirects=True, timeout=10) as client:
        base = cluster.nodes[leader].url
        _create(client, base)
        _write(client, base, range(60))
        health = cluster.health(leader)
        assert health is not None and int(health["snapshot_index"]) > 0  # type: ignore[call-overload]

        port = free_port()
        joiner = RillProcess(
            tmp_path / "node-4",
            port,
            *("--node-id", "4", "--peers", cluster.peers, "--cluster-secret-file", str(cluster.secret_file), "--join"),
            env=COMPACTING,
        ).start()
        cluster.nodes[4] = joiner
        follower = next(i for i in cluster.nodes if i not in (leader, 4))
        added = _cli("add", "--url", cluster.nodes[follower].url, "--node-id", "4", "--node-url", joiner.url)
        assert added.returncode == 0, added.stdout + added.stderr

        joined = cluster.health(4)
        assert joined is not None and joined["voters"] == [1, 2, 3, 4] and joined["learners"] == []
        assert "installed a checkpoint" in joiner.log_path.read_text()

        _write(client, cluster.nodes[4].url, range(60, 80))  # through the new node: redirected to the leader
        cluster.wait_converged()
        for name in STREAMS:
            assert client.get(f"{joiner.url}/v1/stream/{name}?offset=-1").content == _expected(80)

        # Adding it again is a no-op; a node with another URL under the same id is refused.
        again = _cli("add", "--url", base, "--node-id", "4", "--node-url", joiner.url)
        assert again.returncode == 0, again.stderr
        clash = _cli("add", "--url", base, "--node-id", "4", "--node-url", "http://127.0.0.1:1")
        assert clash.returncode != 0 and "409" in clash.stderr

    cluster.stop()
    for node in cluster.nodes.values():
        for name in STREAMS:
            assert _stream_bytes(node.data_dir, name) == _expected(80)


def test_a_node_joining_with_peers_that_do_not_name_the_leader_catches_up(cluster: RillCluster, tmp_path: Path) -> None:
    """It knows no address to send the leader anything: it answers on the leader's own requests
    (a channel it refuses falls back to those) until the log names the members."""
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.nodes if i != leader)
    with httpx.Client(follow_redirects=True, timeout=10) as client:
        _create(client, cluster.nodes[leader].url)
        _write(client, cluster.nodes[leader].url, range(10))
        joiner = RillProcess(
            tmp_path / "node-4",
            free_port(),
            *("--node-id", "4", "--peers", f"{follower}={cluster.nodes[follower].url}"),
            *("--cluster-secret-file", str(cluster.secret_file), "--join"),
            env=COMPACTING,
        ).start()
        cluster.nodes[4] = joiner
        added = _cli("add", "--url", cluster.nodes[leader].url, "--node-id", "4", "--node-url", joiner.url)
        assert added.returncode == 0, added.stdout + added.stderr
        joined = cluster.health(4)
        assert joined is not None and joined["voters"] == [1, 2, 3, 4]
        cluster.wait_converged()
        for name in STREAMS:
            assert client.get(f"{joiner.url}/v1/stream/{name}?offset=-1").content == _expected(10)


def test_removing_the_leader_hands_over_and_the_rest_carry_on(cluster: RillCluster) -> None:
    leader = cluster.wait_for_leader()
    with httpx.Client(follow_redirects=True, timeout=10) as client:
        base = cluster.nodes[leader].url
        _create(client, base)
        _write(client, base, range(10))

        removed = _cli("remove", "--url", base, "--node-id", str(leader))
        assert removed.returncode == 0, removed.stdout + removed.stderr
        gone = cluster.nodes.pop(leader)
        remaining = sorted(cluster.nodes)
        new_leader = cluster.wait_for_leader()
        assert new_leader != leader
        health = cluster.health(new_leader)
        assert health is not None and health["voters"] == remaining
        gone.stop()

        _write(client, cluster.nodes[new_leader].url, range(10, 30))
        cluster.wait_converged()
        members = client.get(cluster.nodes[remaining[0]].url + "/_rill/members").json()
        assert sorted(members["voters"]) == [str(i) for i in remaining]

        # Without an admin token, no change (the cluster secret is no token); an unknown node is 404.
        target = cluster.nodes[new_leader].url + "/_rill/members"
        assert client.post(target, json={"id": 9, "url": "http://127.0.0.1:9"}).status_code == 401
        secret = {"authorization": f"Bearer {RillCluster.SECRET}"}
        assert client.post(target, json={"id": 9, "url": "http://127.0.0.1:9"}, headers=secret).status_code == 401
        reader = {"authorization": f"Bearer {RillCluster.READ_TOKEN}"}
        assert client.delete(target + "/9", headers=reader).status_code == 403
        auth = cluster.admin
        assert client.delete(target + "/9", headers=auth).status_code == 404
        assert client.post(target, json={"id": "x"}, headers=auth).status_code == 400
        # Ids no node can have: Unicode digits, past a u64, thousands of digits (a 500 each, once).
        for raw in ("%C2%B2", "1" * 5000, str(1 << 64), "0"):
            assert client.delete(f"{target}/{raw}", headers=auth).status_code == 400, raw
        assert client.post(target, json={"id": 1 << 64, "url": "http://127.0.0.1:9"}, headers=auth).status_code == 400
        # Down to one voter, which cannot go: a 409 at once, not a 503 to retry for ever.
        other = next(i for i in remaining if i != new_leader)
        assert client.delete(f"{target}/{other}", headers=auth).status_code == 200
        last = client.delete(f"{target}/{new_leader}", headers=auth)
        assert last.status_code == 409 and last.json()["error"]["code"] == "membership_conflict"
        for name in STREAMS:
            assert client.get(f"{cluster.nodes[new_leader].url}/v1/stream/{name}").content == _expected(30)
