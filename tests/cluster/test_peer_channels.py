"""A real 3-node cluster sending its Raft messages over framed peer channels (the default): no HTTP
request per batch, reads that stay fast past every idle timeout, a node with channels off sent HTTP
batches instead, a failover, a dialer that is not what it says refused, and requests that are no clean Upgrade."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.cluster import channel as ch
from app.cluster.peer_channel import Outbound, Refused
from app.cluster.transport import CHANNEL_PATH
from tests.server import RillCluster

TEXT = {"content-type": "text/plain"}
SECRET = RillCluster.SECRET.encode()


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[RillCluster]:
    nodes = RillCluster(tmp_path, 3).start()  # channels are the default
    yield nodes
    nodes.stop()


def _raft_requests(url: str) -> dict[str, float]:
    """This node's Raft requests by method, from /metrics."""
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=5).text.splitlines():
        if line.startswith('rill_http_requests_total{family="raft"'):
            method = line.split('method="', 1)[1].split('"', 1)[0]
            status = line.split('status="', 1)[1].split('"', 1)[0]
            key = method if method == "POST" else f"{method} {status}"
            out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_batches_go_over_channels_and_reads_stay_fast_past_every_idle_timeout(cluster: RillCluster) -> None:
    leader = cluster.nodes[cluster.wait_for_leader()]
    follower = next(n for n in cluster.nodes.values() if n is not leader)
    with httpx.Client(timeout=10) as client:
        assert client.put(leader.url + "/v1/stream/c", headers=TEXT).status_code == 201
        for i in range(100):
            assert client.post(leader.url + "/v1/stream/c", headers=TEXT, content=b"%d;" % i).status_code == 204
        expected = b"".join(b"%d;" % i for i in range(100))
        assert client.get(follower.url + "/v1/stream/c", params={"offset": "-1"}).content == expected
        time.sleep(6.5)  # past the edge's keep-alive (5 s) and the forwarding pool's idle time (4 s)
        started = time.monotonic()
        assert client.post(follower.url + "/v1/stream/c", headers=TEXT, content=b"late;").status_code == 204
        got = client.get(follower.url + "/v1/stream/c", params={"offset": "-1"})
        assert got.content == expected + b"late;" and time.monotonic() - started < 1.0
    for node in cluster.nodes.values():
        requests = _raft_requests(node.url)
        assert "POST" not in requests, f"{node.url} got Raft batches by HTTP: {requests}"
        assert requests.get("GET 101", 0) >= 1  # the channels' upgrades (counted as 101)


def test_a_node_with_channels_off_is_sent_http_batches_and_the_cluster_works(tmp_path: Path) -> None:
    """Channels are the default; a node that refuses them (an older one, or `peer_channels = false`)
    still takes part: the others fall back to signed HTTP requests for it, and it sends them some."""
    cluster = RillCluster(tmp_path, 3)
    cluster.nodes[3].env["RILL_PEER_CHANNELS"] = "false"
    cluster.start()
    try:
        leader = cluster.nodes[cluster.wait_for_leader()]
        with httpx.Client(timeout=10, follow_redirects=True) as client:
            assert client.put(leader.url + "/v1/stream/m", headers=TEXT).status_code == 201
            for i in range(30):
                assert client.post(leader.url + "/v1/stream/m", headers=TEXT, content=b"%d;" % i).status_code == 204
            expected = b"".join(b"%d;" % i for i in range(30))
            for node in cluster.nodes.values():
                assert client.get(node.url + "/v1/stream/m", params={"offset": "-1"}).content == expected
        off = _raft_requests(cluster.nodes[3].url)
        assert off.get("POST", 0) >= 1 and "GET 101" not in off  # HTTP batches only, no channel accepted
        on = [_raft_requests(cluster.nodes[n].url) for n in (1, 2)]
        assert all(r.get("GET 101", 0) >= 1 for r in on)  # 1 and 2 talk over channels
    finally:
        cluster.stop()


def test_a_failover_redials_and_the_restarted_node_catches_up(cluster: RillCluster) -> None:
    first = cluster.wait_for_leader()
    with httpx.Client(timeout=10, follow_redirects=True) as client:
        url = cluster.nodes[first].url
        assert client.put(url + "/v1/stream/f", headers=TEXT).status_code == 201
        assert client.post(url + "/v1/stream/f", headers=TEXT, content=b"before;").status_code == 204
        cluster.nodes[first].kill()
        second = cluster.wait_for_leader()  # among the live nodes
        url = cluster.nodes[second].url
        assert client.post(url + "/v1/stream/f", headers=TEXT, content=b"after;").status_code == 204
        cluster.nodes[first].start()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            got = client.get(cluster.nodes[first].url + "/v1/stream/f", params={"offset": "-1"})
            if got.status_code == 200 and got.content == b"before;after;":
                break
            time.sleep(0.2)
        assert got.content == b"before;after;"


def test_a_dialer_that_is_not_what_it_says_gets_no_channel(cluster: RillCluster) -> None:
    node = cluster.nodes[1]

    async def attempts() -> None:
        async def dial(secret: bytes, src: int, dst: int) -> Outbound:
            return await Outbound.open(node.url, CHANNEL_PATH, None, secret, src, dst, 5)

        with pytest.raises(ch.ChannelError, match="secret"):  # the node's proof fails under another secret
            await dial(b"not the cluster's secret", 2, 1)
        for src, dst in ((9, 1), (2, 3), (1, 1)):  # not a member, not this node, or the node itself
            with pytest.raises(Refused):
                await dial(SECRET, src, dst)
        good = await dial(SECRET, 2, 1)
        good.send([b"\x01\x02 not msgpack"])  # tagged right, but no Raft batch: the node closes it
        await good.drain(5)
        for _ in range(50):
            if not good.is_open:
                break
            await asyncio.sleep(0.1)
        assert not good.is_open
        forged = await dial(SECRET, 3, 1)
        forged._frames = ch.FrameWriter(b"k" * 32)  # frames tagged with a key that is not the session's
        forged.send([b"\x90"])
        await forged.drain(5)
        for _ in range(50):
            if not forged.is_open:
                break
            await asyncio.sleep(0.1)
        assert not forged.is_open

    asyncio.run(attempts())
    with httpx.Client(timeout=10, follow_redirects=True) as client:  # the cluster is unharmed
        leader = cluster.nodes[cluster.wait_for_leader()]
        assert client.put(leader.url + "/v1/stream/after-attacks", headers=TEXT).status_code == 201


def _ask_raw(port: int, head: str, body: bytes = b"") -> bytes:
    """Sends one hand-made request for a channel; what the node answered before it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        sock.shutdown(socket.SHUT_WR)
        out = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                out += chunk
        return out


def test_requests_for_a_channel_that_are_not_clean_upgrades_hold_no_place(cluster: RillCluster) -> None:
    """Requests in a peer's name that cannot become a channel: no Upgrade header, a body, or a body
    the edge refuses after the head (a bad chunk, which once left a channel that never connected
    holding a place for good: 8 of them kept every peer off the node's channels)."""
    node = cluster.nodes[1]
    for i in range(12):
        hello = f"x-rill-channel: v1 src={2 + i % 2} dst=1 nonce={secrets.token_hex(16)}\r\n"
        start = f"GET {CHANNEL_PATH} HTTP/1.1\r\nhost: x\r\n{hello}"
        upgrade = f"connection: Upgrade\r\nupgrade: {ch.PROTOCOL}\r\n"
        for head, body in (
            (start + "transfer-encoding: chunked\r\n", b"ZZZ\r\n"),
            (start + upgrade + "content-length: 3\r\n", b"abc"),
            (start, b""),
        ):
            answer = _ask_raw(node.port, head, body)
            assert not answer.startswith(b"HTTP/1.1 101"), (head, answer[:80])

    async def dial() -> None:
        good = await Outbound.open(node.url, CHANNEL_PATH, None, SECRET, 2, 1, 5)
        good.close()

    asyncio.run(dial())  # a peer still gets its channel
    assert "Exception in ASGI application" not in node.log_path.read_text()
