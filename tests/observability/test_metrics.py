"""`/metrics` against a real node: the values move with appends, reads, live reads and tiering."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.observability.metrics import METRIC_NAMES
from tests.http.helpers import uid
from tests.observability.helpers import scrape, value
from tests.server import RillProcess, read_to_tail

TEXT = {"content-type": "text/plain"}
# Live reads end quickly, and every record is tiered and evicted at once, so one node shows it all.
FAST = {
    "RILL_SSE_MAX_SECONDS": "1",
    "RILL_LONG_POLL_TIMEOUT": "1",
    "RILL_SEGMENT_MAX_AGE": "0.2",
    "RILL_TIERING_INTERVAL": "0.1",
    "RILL_LOCAL_DISK_BUDGET": "0",
    "RILL_TAIL_CACHE_BYTES": "0",  # reads of evicted records go to the object store, not to memory
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    process = RillProcess(tmp_path_factory.mktemp("metrics") / "data", env=FAST).start()
    yield process
    process.stop()


def test_every_named_metric_is_exported(node: RillProcess) -> None:
    text = httpx.get(node.url + "/metrics").text
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    assert set(METRIC_NAMES) == declared


def test_appends_count_requests_bytes_and_fsyncs(node: RillProcess) -> None:
    url = f"{node.url}/v1/stream/m-{uid()}"
    before = scrape(node.url)
    assert httpx.put(url, headers=TEXT).status_code == 201
    for body in (b"abc", b"defgh"):
        assert httpx.post(url, headers=TEXT, content=body).status_code == 204
    after = scrape(node.url)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("rill_appends_total") == 2
    assert moved("rill_appended_bytes_total") == 8
    assert moved("rill_http_requests_total", family="compat", method="POST", status="204") == 2
    assert moved("rill_http_requests_total", family="compat", method="PUT", status="201") == 1
    assert moved("rill_http_request_duration_seconds_count", family="compat", method="POST") == 2
    assert moved("rill_http_request_duration_seconds_bucket", family="compat", method="POST", le="+Inf") == 2
    assert moved("rill_raft_fsync_duration_seconds_count") >= 3  # one sync may carry several entries
    assert moved("rill_raft_commit_index") >= 3
    assert value(after, "rill_raft_applied_index") == value(after, "rill_raft_commit_index")
    assert value(after, "rill_raft_role", role="leader") == 1 and value(after, "rill_raft_leader_id") == 1


def test_errors_are_counted_by_status(node: RillProcess) -> None:
    before = scrape(node.url)
    assert httpx.get(f"{node.url}/ds/no-such-bucket/s").status_code == 404
    assert httpx.get(f"{node.url}/ds/x").status_code == 400
    after = scrape(node.url)
    for status in ("404", "400"):
        key = {"family": "ds", "method": "GET", "status": status}
        assert value(after, "rill_http_requests_total", **key) - value(before, "rill_http_requests_total", **key) == 1


def test_reads_count_bytes(node: RillProcess) -> None:
    url = f"{node.url}/v1/stream/r-{uid()}"
    httpx.put(url, headers=TEXT, content=b"0123456789")
    before = scrape(node.url)
    with httpx.Client() as client:
        assert read_to_tail(client, url) == b"0123456789"
    after = scrape(node.url)
    assert value(after, "rill_read_bytes_total") - value(before, "rill_read_bytes_total") >= 10
    key = {"family": "compat", "method": "GET", "status": "200"}
    assert value(after, "rill_http_requests_total", **key) > value(before, "rill_http_requests_total", **key)


@pytest.mark.parametrize(("live", "mode"), [("sse", "sse"), ("long-poll", "long_poll")])
def test_live_readers_are_counted_while_they_last(node: RillProcess, live: str, mode: str) -> None:
    url = f"{node.url}/v1/stream/l-{uid()}"
    httpx.put(url, headers=TEXT)
    done = threading.Event()

    def read() -> None:
        httpx.get(url, params={"offset": "now", "live": live}, timeout=10)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 5
    while value(scrape(node.url), "rill_live_subscribers", mode=mode) < 1:
        assert time.monotonic() < deadline, "the live read was never counted"
        time.sleep(0.05)
    assert done.wait(10)  # the server ends it after a second
    deadline = time.monotonic() + 5
    while value(scrape(node.url), "rill_live_subscribers", mode=mode) != 0:
        assert time.monotonic() < deadline, "the ended live read is still counted"
        time.sleep(0.05)
    live_requests = sum(
        v for (name, labels), v in scrape(node.url).items()
        if name == "rill_http_request_duration_seconds_count" and ("method", "GET") in labels
    )  # fmt: skip
    assert live_requests >= 0  # live reads are kept out of the histogram: nothing to compare exactly


def test_tiering_uploads_and_cold_reads(node: RillProcess) -> None:
    url = f"{node.url}/v1/stream/t-{uid()}"
    before = scrape(node.url)
    httpx.put(url, headers=TEXT, content=b"cold bytes")
    deadline = time.monotonic() + 15
    while True:
        now = scrape(node.url)
        uploaded = value(now, "rill_tiering_segments_uploaded_total") - value(
            before, "rill_tiering_segments_uploaded_total"
        )
        if uploaded >= 1 and value(now, "rill_tiering_local_bytes") == 0:
            break
        assert time.monotonic() < deadline, "nothing was tiered and evicted"
        time.sleep(0.1)
    assert value(now, "rill_tiering_upload_duration_seconds_count") >= 1
    while True:  # every upload timed is counted, segments and packs alike, once recorded
        now = scrape(node.url)
        timed = value(now, "rill_tiering_upload_duration_seconds_count")
        if value(now, "rill_tiering_segments_uploaded_total") == timed - value(now, "rill_tiering_upload_errors_total"):
            break
        assert time.monotonic() < deadline, "uploads timed but not counted"
        time.sleep(0.1)
    assert value(now, "rill_tiering_untiered_bytes") == 0
    assert value(now, "rill_tiering_store_available") == 1
    with httpx.Client() as client:
        assert read_to_tail(client, url) == b"cold bytes"  # from the object store now
    after = scrape(node.url)
    assert value(after, "rill_cold_cache_misses_total") > value(before, "rill_cold_cache_misses_total")
    assert value(after, "rill_cold_cache_hits_total") > value(before, "rill_cold_cache_hits_total")
    assert value(after, "rill_deletion_queue_length") >= 0


def test_metrics_need_an_admin_token_with_auth_on(tmp_path: Path) -> None:
    from app.security.tokens import new_token, toml_entry

    admin, reader = new_token(), new_token()
    config = tmp_path / "rill.toml"
    config.write_text(
        '[auth]\nmode = "on"\n\n' + toml_entry(admin, ["admin:*"], "admin") + toml_entry(reader, ["read:*"], "r")
    )
    process = RillProcess(tmp_path / "data", None, "--config", str(config)).start()
    try:
        assert httpx.get(process.url + "/metrics").status_code == 401
        assert httpx.get(process.url + "/metrics", headers={"authorization": f"Bearer {reader}"}).status_code == 403
        samples = scrape(process.url, {"authorization": f"Bearer {admin}"})
        assert value(samples, "rill_raft_term") >= 1
    finally:
        process.stop()
