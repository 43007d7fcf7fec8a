"""Signed Raft input that no correct node could send is refused, logged with the sender's id and
counted in /metrics, on real processes; the node keeps running and the cluster keeps its data."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import msgspec
import pytest

from app.cluster.checkpoints import PATH as CHECKPOINT_PATH
from app.cluster.checkpoints import CheckpointChunk
from app.cluster.transport import AUTH_HEADER, PATH, sign
from app.raft.messages import AppendEntries, AppendResponse, Entry, Message
from tests.server import RillCluster, read_to_tail

SECRET = RillCluster.SECRET.encode()
TEXT = {"content-type": "text/plain"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillCluster]:
    cluster = RillCluster(tmp_path_factory.mktemp("peer-input"), 3).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _post(cluster: RillCluster, dst: int, path: str, src: int, body: bytes) -> httpx.Response:
    headers = {AUTH_HEADER: sign(SECRET, src, dst, path, body)}
    return httpx.post(cluster.nodes[dst].url + path, content=body, headers=headers, timeout=5)


def _send(cluster: RillCluster, dst: int, *messages: Message) -> httpx.Response:
    return _post(cluster, dst, PATH, messages[0].src, msgspec.msgpack.encode(list(messages)))


def _refused(cluster: RillCluster, node: int, peer: int, reason: str) -> float:
    metrics = httpx.get(cluster.nodes[node].url + "/metrics", headers=cluster.admin).text
    found = re.search(rf'rill_raft_refused_messages_total{{peer="{peer}",reason="{reason}"}} (\S+)', metrics)
    return float(found.group(1)) if found else 0.0


def _roles(cluster: RillCluster) -> tuple[int, int, dict[str, object]]:
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.nodes if i != leader)
    health = cluster.health(follower)
    assert health is not None
    return leader, follower, health


@pytest.fixture(scope="module")
def stream(cluster: RillCluster) -> str:
    leader = cluster.wait_for_leader()
    url = cluster.nodes[leader].url + "/v1/stream/kept"
    assert httpx.put(url, content=b"one,", headers=TEXT).status_code == 201
    assert httpx.post(url, content=b"two,", headers=TEXT).status_code == 204
    cluster.wait_converged()
    return "/v1/stream/kept"


def _intact(cluster: RillCluster, stream: str, expected: bytes) -> None:
    """Every node is alive, the cluster takes a write, and every node serves the same bytes."""
    assert all(node.alive() for node in cluster.nodes.values())
    leader = cluster.wait_for_leader()
    assert httpx.post(cluster.nodes[leader].url + stream, content=b"more,", headers=TEXT).status_code == 204
    cluster.wait_converged()
    for node in cluster.nodes.values():
        with httpx.Client(timeout=5) as client:
            assert read_to_tail(client, node.url + stream) == expected + b"more,"


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("overwrite", "overwrites_committed"),
        ("past-term", "stale_term"),
        ("out-of-range", "entries_out_of_order"),
        ("match-beyond-log", "match_beyond_log"),
        ("stale-checkpoint", "stale_checkpoint"),
    ],
)
def test_signed_impossible_input_is_refused_logged_and_counted(
    cluster: RillCluster, stream: str, case: str, reason: str
) -> None:
    leader, follower, health = _roles(cluster)
    term, commit, last = int(health["term"]), int(health["commit"]), int(health["last_index"])  # type: ignore[call-overload]
    target, sender = follower, leader
    before = read_to_tail(httpx.Client(timeout=5), cluster.nodes[leader].url + stream)
    if case == "overwrite":  # from a term ahead, so the term alone would have been taken
        response = _send(
            cluster, follower, AppendEntries(term + 1, leader, follower, 0, 0, [Entry(term + 1, 1, b"x")], commit)
        )
    elif case == "past-term":
        response = _send(cluster, follower, AppendEntries(0, leader, follower, 0, 0, [], 0))
    elif case == "out-of-range":
        response = _send(
            cluster, follower, AppendEntries(term, leader, follower, last, 0, [Entry(term, last + 5, b"")], 0)
        )
    elif case == "match-beyond-log":
        target, sender = leader, follower
        response = _send(cluster, leader, AppendResponse(term, follower, leader, True, last + 1_000_000))
    else:
        chunk = CheckpointChunk(term, leader, follower, 1, 1, 0, False, [])
        response = _post(cluster, follower, CHECKPOINT_PATH, leader, msgspec.msgpack.encode(chunk))
        assert response.status_code == 409
    assert response.status_code in (200, 204, 409), response.text
    deadline = time.monotonic() + 5
    while _refused(cluster, target, sender, reason) < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _refused(cluster, target, sender, reason) >= 1
    if reason != "stale_term":  # a past term is ordinary after a partition: counted, not logged
        log = cluster.nodes[target].log_path.read_text()
        assert f"refused a Raft message from node {sender}: {reason}" in log
    _intact(cluster, stream, before)


def _declared(url: str, path: str, length: int) -> bytes:
    """The status line a node answers to a POST declaring `length` bytes of body, none of them sent."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        head = f"POST {path} HTTP/1.1\r\nhost: {parts.netloc}\r\ncontent-type: application/json\r\n"
        sock.sendall(f"{head}content-length: {length}\r\n\r\n".encode())
        return sock.recv(65536).split(b"\r\n", 1)[0]


def test_a_follower_refuses_what_it_would_forward_past_the_leaders_limits(cluster: RillCluster) -> None:
    """A write a follower forwards is read against the limit the leader applies to it: a subscription's
    control body is at most 64 KiB (an ack's token is checked only by the leader), and a body too
    large gets a 413, not a 500."""
    _, follower, _ = _roles(cluster)
    url = cluster.nodes[follower].url
    ack = "/v1/stream/__ds/subscriptions/s/ack"
    assert b" 413 " in _declared(url, ack, 100 * 1024)
    assert b" 413 " in _declared(url, "/v1/stream/kept", 1 << 40)


def test_refusals_from_ids_that_are_not_members_share_one_series(cluster: RillCluster, stream: str) -> None:
    """A message may name any sender id: counting each one apart would grow /metrics without bound."""
    leader = cluster.wait_for_leader()
    before = _refused(cluster, leader, 0, "stale_term")
    for src in range(1000, 1050):
        response = _send(cluster, leader, AppendResponse(0, src, leader, False, 0))
        assert response.status_code in (200, 204), response.text
    deadline = time.monotonic() + 5
    while _refused(cluster, leader, 0, "stale_term") < before + 50 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _refused(cluster, leader, 0, "stale_term") == before + 50
    metrics = httpx.get(cluster.nodes[leader].url + "/metrics", headers=cluster.admin).text
    assert not re.search(r'rill_raft_refused_messages_total\{peer="1\d\d\d"', metrics)
