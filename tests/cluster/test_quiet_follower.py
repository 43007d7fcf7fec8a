"""A follower's reads that need the leader (HEAD, `offset=now`, long-poll, SSE) answer at once after a
quiet spell longer than the leader's keep-alive timeout, which closes the peer connections left idle."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import httpx
import pytest

from tests.server import RillCluster

KEEPALIVE = 1.0  # seconds; the leader closes idle connections after this


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillCluster]:
    env = {"RILL_KEEPALIVE_TIMEOUT": str(KEEPALIVE)}
    cluster = RillCluster(tmp_path_factory.mktemp("quiet"), 3, "--long-poll-timeout", "2", env=env).start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _follower_stream(cluster: RillCluster) -> tuple[str, str]:
    """A new stream's URL on a follower, and its tail offset."""
    leader = cluster.wait_for_leader()
    follower = next(i for i in cluster.nodes if i != leader)
    path = f"/v1/stream/quiet-{time.monotonic_ns()}"
    created = httpx.put(cluster.nodes[leader].url + path, content=b"ab")
    assert created.status_code == 201, created.text
    cluster.wait_converged()
    return cluster.nodes[follower].url + path, created.headers["stream-next-offset"]


def _head(client: httpx.Client, url: str, tail: str) -> httpx.Response:
    return client.head(url)


def _now(client: httpx.Client, url: str, tail: str) -> httpx.Response:
    return client.get(url, params={"offset": "now"})


def _long_poll(client: httpx.Client, url: str, tail: str) -> httpx.Response:
    # From the tail, so it answers 204 after the long-poll timeout (2 s) unless the barrier fails first.
    return client.get(url, params={"offset": tail, "live": "long-poll"})


def _sse(client: httpx.Client, url: str, tail: str) -> httpx.Response:
    with client.stream("GET", url, params={"offset": "-1", "live": "sse"}) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                break
        return response


@pytest.mark.parametrize("read", [_head, _now, _long_poll, _sse], ids=["head", "now", "long-poll", "sse"])
def test_a_read_after_quiet_needs_no_retry(cluster: RillCluster, read: Callable[..., httpx.Response]) -> None:
    url, tail = _follower_stream(cluster)
    time.sleep(2 * KEEPALIVE + 0.5)
    with httpx.Client(timeout=10) as client:
        started = time.monotonic()
        response = read(client, url, tail)
        elapsed = time.monotonic() - started
    assert response.status_code in (200, 204), response.status_code
    waited = 2.0 if read is _long_poll else 0.0  # a long-poll at the tail waits for its timeout
    assert elapsed - waited < 0.8, f"{read.__name__} took {elapsed - waited:.2f} s past what it waits for"


def test_reads_keep_answering_across_several_quiet_spells(cluster: RillCluster) -> None:
    url, _ = _follower_stream(cluster)
    with httpx.Client(timeout=10) as client:
        for _ in range(3):
            time.sleep(2 * KEEPALIVE + 0.5)
            started = time.monotonic()
            assert client.head(url).status_code == 200
            assert time.monotonic() - started < 0.8
