"""A real 3-node cluster on 127.0.0.1: replication, redirects, failover, and replicas byte-identical."""

from __future__ import annotations

import concurrent.futures
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.cluster.transport import AUTH_HEADER, PATH, sign
from app.state_machine import records
from app.state_machine.machine import COMPAT_BUCKET, StateMachine
from app.storage.rocks import RocksKV
from tests.server import RillCluster

# Compacting often makes restarted and frozen nodes catch up from snapshots, not just the log.
COMPACTING = {"RILL_RAFT_COMPACT_ENTRIES": "100", "RILL_RAFT_COMPACT_KEEP": "10"}


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[RillCluster]:
    nodes = RillCluster(tmp_path, 3, "--no-forward-writes", env=COMPACTING).start()
    yield nodes
    nodes.stop()


def _stream_bytes(data_dir: Path, name: str) -> bytes:
    """The stream's content read straight from a stopped node's state store."""
    kv = RocksKV(data_dir / "state", records.COLUMN_FAMILIES)
    try:
        machine = StateMachine(kv)
        meta = machine.lookup(COMPAT_BUCKET, name)
        assert meta is not None
        return b"".join(bytes(p) for p in machine.read(meta, 0, 1 << 30).payloads)
    finally:
        kv.close()


def test_followers_redirect_and_every_node_applies(cluster: RillCluster) -> None:
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.nodes if i != leader)
    url = cluster.nodes[follower].url
    r = httpx.put(url + "/v1/stream/r1", headers={"content-type": "text/plain"}, content=b"x")
    assert r.status_code == 307
    assert r.headers["location"] == cluster.nodes[leader].url + "/v1/stream/r1"
    with httpx.Client(follow_redirects=True) as client:
        assert client.put(url + "/v1/stream/r1", headers={"content-type": "text/plain"}).status_code == 201
        for i in range(20):
            node = cluster.nodes[random.choice(list(cluster.nodes))]
            r = client.post(node.url + "/v1/stream/r1", headers={"content-type": "text/plain"}, content=b"%d," % i)
            assert r.status_code == 204
        assert client.get(url + "/v1/stream/r1").content == b"".join(b"%d," % i for i in range(20))
    cluster.wait_converged()


def test_leader_failover_loses_no_acknowledged_write(cluster: RillCluster) -> None:
    acked: list[bytes] = []
    killed: int | None = None
    failover_seconds = 0.0
    with httpx.Client(follow_redirects=True, timeout=2) as client:
        base = cluster.nodes[1].url
        assert client.put(base + "/v1/stream/f1", headers={"content-type": "text/plain"}).status_code == 201
        for seq in range(60):
            if seq == 20:
                killed = cluster.wait_for_leader()
                cluster.nodes[killed].kill()
                started = time.monotonic()
            body = b"append-%d;" % seq
            headers = {
                "content-type": "text/plain",
                "producer-id": "p",
                "producer-epoch": "0",
                "producer-seq": str(seq),
            }
            deadline = time.monotonic() + 20
            while True:  # retry the same seq until acknowledged: the producer makes retries safe
                node = random.choice([n for i, n in cluster.nodes.items() if i != killed])
                try:
                    r = client.post(node.url + "/v1/stream/f1", headers=headers, content=body)
                    if r.status_code in (200, 204):
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "writes did not resume after the leader died"
                time.sleep(0.05)
            if seq == 20:
                failover_seconds = time.monotonic() - started
            acked.append(body)
    assert killed is not None
    assert failover_seconds < 10
    cluster.nodes[killed].start()  # the old leader rejoins and catches up
    cluster.wait_for_leader()
    cluster.wait_converged()
    cluster.stop()
    expected = b"".join(acked)
    for node in cluster.nodes.values():
        assert _stream_bytes(node.data_dir, "f1") == expected  # exactly once, same order, every replica


def test_internal_route_refuses_unsigned_messages(cluster: RillCluster) -> None:
    url = cluster.nodes[1].url + PATH
    assert httpx.post(url, content=b"\x90").status_code == 403
    forged = {AUTH_HEADER: sign(b"wrong", 2, 1, PATH, b"\x90")}
    assert httpx.post(url, content=b"\x90", headers=forged).status_code == 403
    signed = {AUTH_HEADER: sign(RillCluster.SECRET.encode(), 2, 1, PATH, b"\x90")}
    assert httpx.post(url, content=b"\x90", headers=signed).status_code == 204  # an empty, valid batch


def test_cluster_status_finds_every_node_from_one(cluster: RillCluster) -> None:
    cmd = [sys.executable, "-m", "app.cli", "cluster", "status", "--url", cluster.nodes[2].url]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("follower") == 2 and out.stdout.count("leader") >= 1
    for node in cluster.nodes.values():
        assert node.url in out.stdout


def test_sigterm_on_the_leader_hands_leadership_over(cluster: RillCluster) -> None:
    leader = cluster.wait_for_leader()
    health = cluster.health(leader)
    assert health is not None
    term = health["term"]
    process = cluster.nodes[leader].proc
    assert process is not None
    process.terminate()  # graceful: the leader hands over before exiting
    process.wait(15)
    # The old leader steps down (and exits) once the transferee asks for votes, perhaps before the
    # transferee has counted them: wait a little, far less than an election timeout (1-2 s).
    new_leader = cluster.wait_for_leader(timeout=0.5)
    new_health = cluster.health(new_leader)
    # Handed over, not elected after a timeout: the new leader is in the very next term.
    assert new_leader != leader and new_health is not None and new_health["term"] == term + 1, new_health


def test_chaos_kills_and_pauses_lose_no_acknowledged_write(cluster: RillCluster) -> None:
    """Kill -9 the leader and restart it, freeze followers with SIGSTOP, all while appending."""
    stop = threading.Event()
    acked: list[bytes] = []
    errors: list[str] = []

    def writer() -> None:
        with httpx.Client(follow_redirects=True, timeout=1) as client:
            assert client.put(cluster.nodes[1].url + "/v1/stream/chaos", headers={"content-type": "text/plain"})
            seq = 0
            while not stop.is_set():
                body = b"w-%d;" % seq
                producer = {"producer-id": "w", "producer-epoch": "0", "producer-seq": str(seq)}
                deadline = time.monotonic() + 20
                while True:  # same seq until acknowledged: retries are safe
                    node = random.choice([n for n in cluster.nodes.values() if n.alive()])
                    try:
                        r = client.post(
                            node.url + "/v1/stream/chaos",
                            content=body,
                            headers={"content-type": "text/plain", **producer},
                        )
                        if r.status_code in (200, 204):
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        errors.append(f"seq {seq} was never acknowledged")
                        return
                    time.sleep(0.02)
                acked.append(body)
                seq += 1

    thread = threading.Thread(target=writer)
    thread.start()
    rng = random.Random(7)
    for round_ in range(6):
        time.sleep(0.8)
        if round_ % 2 == 0:
            leader = cluster.wait_for_leader()
            cluster.nodes[leader].kill()
            time.sleep(0.8)
            cluster.nodes[leader].start()
        else:
            leader = cluster.wait_for_leader()
            frozen = cluster.nodes[rng.choice([i for i in cluster.nodes if i != leader])]
            frozen.pause()
            time.sleep(1.0)
            frozen.resume()
    time.sleep(0.5)
    stop.set()
    thread.join(30)
    assert not errors, errors
    assert len(acked) > 20
    cluster.wait_for_leader()
    cluster.wait_converged()
    cluster.stop()
    expected = b"".join(acked)
    for node in cluster.nodes.values():
        # Every acknowledged append once, in order; the writer stops only between acknowledgements.
        assert _stream_bytes(node.data_dir, "chaos") == expected


def test_followers_serve_reads_that_see_every_acknowledged_write(cluster: RillCluster) -> None:
    leader = cluster.wait_for_leader()
    followers = [cluster.nodes[i].url for i in cluster.nodes if i != leader]
    base = cluster.nodes[leader].url
    with httpx.Client(timeout=10) as client:
        assert client.put(base + "/v1/stream/rr", headers={"content-type": "text/plain"}).status_code == 201
        for i in range(30):
            r = client.post(base + "/v1/stream/rr", headers={"content-type": "text/plain"}, content=b"%d," % i)
            assert r.status_code == 204
            tail = r.headers["stream-next-offset"]
            follower = followers[i % 2]
            # Served by the follower itself (no redirect), yet never behind an acknowledged write.
            head = client.head(follower + "/v1/stream/rr")
            assert head.status_code == 200 and head.headers["stream-next-offset"] == tail
            read = client.get(follower + "/v1/stream/rr?offset=-1")
            assert read.status_code == 200 and read.headers["stream-up-to-date"] == "true"
            assert read.content == b"".join(b"%d," % j for j in range(i + 1))
        # A long-poll on a follower wakes when the leader commits an append.
        with httpx.Client(timeout=10) as poller, concurrent.futures.ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(poller.get, f"{followers[0]}/v1/stream/rr?offset={tail}&live=long-poll")
            time.sleep(0.3)
            client.post(base + "/v1/stream/rr", headers={"content-type": "text/plain"}, content=b"late")
            assert waiting.result().content == b"late"


TEXT = {"content-type": "text/plain"}


def _two_then_a_third(tmp_path: Path) -> RillCluster:
    """Nodes 1 and 2 started and led, and stream `late` holding b"x"; node 3 is left to the test."""
    cluster = RillCluster(tmp_path, 3)
    for node in (cluster.nodes[1], cluster.nodes[2]):
        node.start()
    leader = cluster.nodes[cluster.wait_for_leader()].url
    assert httpx.put(leader + "/v1/stream/late", headers=TEXT).status_code == 201
    assert httpx.post(leader + "/v1/stream/late", content=b"x", headers=TEXT).status_code == 204
    return cluster


def test_a_node_just_started_serves_a_read_once_it_hears_from_the_leader(tmp_path: Path) -> None:
    # A node that had not heard from the leader yet answered a read 503 at once (a CI run caught it on
    # a node 0.3 s old); the read now waits for the leader within its deadline. This fails without the
    # fix only when the machine is busy; tests/simulation/test_driver.py and tests/service/test_engine.py
    # pin the waits on virtual time.
    cluster = _two_then_a_third(tmp_path)
    try:
        cluster.nodes[3].start()  # returns once it answers /healthz, before it has heard from anyone
        read = httpx.get(cluster.nodes[3].url + "/v1/stream/late", params={"offset": "-1"}, timeout=10)
        assert (read.status_code, read.content) == (200, b"x"), read.text
    finally:
        cluster.stop()
