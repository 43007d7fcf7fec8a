"""Every node lost, the data kept: a 3-node cluster on moto's S3 under producer load is SIGKILLed, its
data directories deleted, and a new cluster restored with `rill restore` and `rill cluster add`.

Checked: every append acknowledged before the recovery point is there byte for byte, in order;
a producer's retry of a restored append is deduplicated; a consumer group resumes from its
acknowledged offset; the new nodes serve what the first one does. The test prints how many
acknowledged appends came after the recovery point and how many of those were lost.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.moto import MotoS3
from tests.server import RillCluster, RillProcess, free_port, read_to_tail
from tests.subscriptions.helpers import claim as claim_subscription

AWS_ENV = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
ENV = {
    **AWS_ENV,
    "RILL_STATE_CHECKPOINT_INTERVAL": "1",
    "RILL_SEGMENT_MAX_AGE": "1",
    "RILL_TIERING_INTERVAL": "0.2",
}
JSON = {"content-type": "application/json"}
TEXT = {"content-type": "text/plain"}
SMALL_STREAMS = 30
LOAD_SECONDS = 3


@pytest.fixture()
def moto() -> Iterator[MotoS3]:
    server = MotoS3("rill-restore").start().create_bucket()
    yield server
    server.stop()


class Producer(threading.Thread):
    """Appends with an idempotent producer until stopped; remembers what was acknowledged, and when."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.acked: list[tuple[bytes, float]] = []  # (body, wall-clock time of the acknowledgement)
        self.stopping = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=5) as client:
            seq = 0
            while not self.stopping.is_set():
                body = b"e%05d;" % seq
                headers = {**TEXT, "producer-id": "p", "producer-epoch": "0", "producer-seq": str(seq)}
                try:
                    response = client.post(self.url, headers=headers, content=body)
                except httpx.HTTPError:
                    continue  # the same seq again: a retry the server deduplicates
                if response.status_code in (200, 204):
                    self.acked.append((body, time.time()))
                    seq += 1


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **AWS_ENV}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_a_cluster_restored_from_the_object_store_keeps_every_append_before_the_recovery_point(
    tmp_path: Path, moto: MotoS3
) -> None:
    cold = ("--cold-store", f"s3://{moto.bucket}/prod", "--s3-endpoint-url", moto.endpoint_url)
    old = RillCluster(tmp_path / "old", 3, *cold, env=ENV).start()
    try:
        base = old.nodes[old.wait_for_leader()].url + "/v1/stream"
        sub = base + "/__ds/subscriptions/group"
        assert httpx.put(base + "/wake", headers=JSON, content=b"[]").status_code == 201
        body = {"type": "pull-wake", "streams": ["orders"], "wake_stream": "wake", "lease_ttl_ms": 1000}
        assert httpx.put(sub, json=body).status_code == 201
        assert httpx.put(base + "/orders", headers=JSON).status_code == 201
        offsets = [
            httpx.post(base + "/orders", headers=JSON, content=json.dumps({"n": n}).encode()).headers[
                "stream-next-offset"
            ]
            for n in range(20)
        ]
        claim = claim_subscription(sub, "worker-1", time.monotonic() + 10)
        ack = {
            "wake_id": claim["wake_id"],
            "generation": claim["generation"],
            "acks": [{"stream": "orders", "offset": offsets[9]}],
        }
        token = {"authorization": f"Bearer {claim['token']}"}
        assert httpx.post(sub + "/ack", json=ack, headers=token).status_code == 200
        for i in range(SMALL_STREAMS):  # each too small for an object of its own: they share packs
            assert httpx.put(f"{base}/small-{i}", headers=TEXT, content=b"small %d;" % i).status_code == 201
        assert httpx.put(base + "/events", headers=TEXT).status_code == 201
        producer = Producer(base + "/events")
        producer.start()
        time.sleep(LOAD_SECONDS)
    finally:
        for node in old.nodes.values():
            node.kill()  # SIGKILL, all at once, under load
    producer.stopping.set()
    producer.join(10)
    for node in old.nodes.values():
        shutil.rmtree(node.data_dir)
    assert any("/!packs/" in key for key in moto.keys("prod/")), "the small streams were packed"

    restored_dir = tmp_path / "new" / "node-1"
    done = _cli(
        "restore", "--from", f"s3://{moto.bucket}/prod", "--s3-endpoint-url", moto.endpoint_url,
        "--data-dir", str(restored_dir),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    point_text = next(line for line in done.stdout.splitlines() if "recovery point:" in line).split()[2]
    recovery_point = datetime.datetime.fromisoformat(point_text).timestamp()

    ports = [free_port() for _ in range(3)]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    common = ("--cluster-secret-file", str(old.secret_file), "--config", str(old.config), *cold)
    first = RillProcess(restored_dir, ports[0], "--node-id", "1", "--peers", f"1={urls[0]}", *common, env=ENV).start()
    new = [first]
    try:
        for n in (2, 3):
            peers = ",".join(f"{i + 1}={urls[i]}" for i in range(n - 1))  # the cluster it joins
            joiner = RillProcess(
                tmp_path / "new" / f"node-{n}", ports[n - 1], "--node-id", str(n), "--peers", peers, "--join",
                *common, env=ENV,
            ).start()  # fmt: skip
            new.append(joiner)
            added = _cli(
                "cluster", "add", "--url", urls[0], "--node-id", str(n), "--node-url", urls[n - 1],
                "--token", RillCluster.ADMIN_TOKEN,
            )  # fmt: skip
            assert added.returncode == 0, added.stdout + added.stderr

        with httpx.Client(timeout=10, follow_redirects=True) as client:
            events = read_to_tail(client, urls[0] + "/v1/stream/events")
            acked = producer.acked
            kept = len(events) // len(b"e00000;")
            # Seq i's body is e{i}: the restored stream is seqs 0 .. kept-1, each once, in order (one in
            # flight when the nodes died may be there without its acknowledgement).
            assert events == b"".join(b"e%05d;" % i for i in range(kept)), "not the producer's appends in order"
            before = sum(1 for _, at in acked if at < recovery_point)
            assert kept >= before, f"{before - kept} appends acknowledged before the recovery point are missing"
            after = len(acked) - before
            print(
                f"\nrestore: {len(acked)} appends acknowledged, {before} before the recovery point, {after} after it: "
                f"{kept - before} of those restored from segments sealed after the backup, {len(acked) - kept} lost"
            )

            # The producer's retry of the last restored append is a duplicate; its next one is accepted.
            if kept:
                retry = {**TEXT, "producer-id": "p", "producer-epoch": "0", "producer-seq": str(kept - 1)}
                again = client.post(urls[0] + "/v1/stream/events", headers=retry, content=b"e%05d;" % (kept - 1))
                assert again.status_code in (200, 204), again.text
                assert read_to_tail(client, urls[0] + "/v1/stream/events") == events  # nothing appended twice
            nxt = {**TEXT, "producer-id": "p", "producer-epoch": "0", "producer-seq": str(kept)}
            assert client.post(urls[0] + "/v1/stream/events", headers=nxt, content=b"next;").status_code in (200, 204)

            for i in range(SMALL_STREAMS):
                assert client.get(f"{urls[0]}/v1/stream/small-{i}", params={"offset": "-1"}).content == b"small %d;" % i
            orders = client.get(urls[0] + "/v1/stream/orders", params={"offset": "-1"}).json()
            assert [m["n"] for m in orders] == list(range(20))
            group = urls[1] + "/v1/stream/__ds/subscriptions/group"
            resumed = claim_subscription(group, "worker-2", time.monotonic() + 30)
            (stream,) = resumed["streams"]  # type: ignore[misc]
            assert stream["acked_offset"] == offsets[9]

            time.sleep(1)
            for url in urls[1:]:
                assert read_to_tail(client, url + "/v1/stream/events") == events + b"next;"
    finally:
        for node in new:
            node.stop()
