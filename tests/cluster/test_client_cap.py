"""A 3-node cluster on 127.0.0.1 with a per-client connection limit of 2: the nodes' Raft traffic and
the writes followers forward come from 127.0.0.1, the peers' address, and are never counted, while
a client (from 127.0.0.2 and up: Linux routes 127.0.0.0/8 to loopback) is held to 2 connections."""

from __future__ import annotations

import concurrent.futures
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server import RillCluster
from tests.serving.wire import answer, assert_error, ready

PER_CLIENT = 2
WRITERS = 12  # concurrent forwarded writes: far more connections from the follower than PER_CLIENT
TEXT = {"content-type": "text/plain"}


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[RillCluster]:
    nodes = RillCluster(tmp_path, 3, env={"RILL_MAX_CONNECTIONS_PER_CLIENT": str(PER_CLIENT)}).start()
    yield nodes
    nodes.stop()


def _client(source: str) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10)


def test_the_nodes_are_not_held_to_the_per_client_limit(cluster: RillCluster) -> None:
    leader = cluster.wait_for_leader()
    follower = cluster.nodes[next(i for i in cluster.nodes if i != leader)].url
    with _client("127.0.0.2") as client:
        assert client.put(follower + "/v1/stream/capped", headers=TEXT).status_code == 201

    def write(n: int) -> list[int]:
        with _client(f"127.0.0.{10 + n}") as client:  # one client per writer, each within its limit
            return [
                client.post(follower + "/v1/stream/capped", headers=TEXT, content=b"%d-%d," % (n, i)).status_code
                for i in range(15)
            ]

    with concurrent.futures.ThreadPoolExecutor(WRITERS) as pool:
        statuses = [status for result in pool.map(write, range(WRITERS)) for status in result]
    assert statuses == [204] * len(statuses)
    cluster.wait_converged()
    for node in cluster.nodes.values():
        body = httpx.get(node.url + "/v1/stream/capped", params={"offset": "-1"}, timeout=10).content
        assert body.count(b",") == WRITERS * 15

    # A client of the cluster is held to its limit, on the leader as on the others.
    held = [
        socket.create_connection(("127.0.0.1", cluster.nodes[leader].port), timeout=10, source_address=("127.0.0.3", 0))
        for _ in range(PER_CLIENT + 1)
    ]
    try:
        time.sleep(0.5)
        refused = ready(held, 0)
        assert len(refused) == 1
        assert_error(answer(refused[0]), 503, "too_many_connections_from_client")
    finally:
        for sock in held:
            sock.close()
