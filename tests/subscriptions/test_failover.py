"""A pull-wake consumer group on a 3-node cluster survives the leader's death: a worker acknowledges
half a stream, the leader is SIGKILLed, and a second worker, through another node, resumes exactly
after the last acknowledged message."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from tests.server import RillCluster
from tests.subscriptions.helpers import claim as claim_subscription

JSON = {"content-type": "application/json"}
MESSAGES = 40


def test_acknowledged_offsets_survive_the_leader(tmp_path: Path) -> None:
    cluster = RillCluster(tmp_path, 3).start()
    try:
        leader = cluster.wait_for_leader()
        first, second = (i for i in cluster.nodes if i != leader)
        base = cluster.nodes[first].url + "/v1/stream"
        sub = base + "/__ds/subscriptions/group"
        httpx.put(base + "/wake", headers=JSON, content=b"[]")
        body = {"type": "pull-wake", "streams": ["orders"], "wake_stream": "wake", "lease_ttl_ms": 2000}
        assert httpx.put(sub, json=body).status_code == 201
        httpx.put(base + "/orders", headers=JSON)
        offsets = []  # the tail after each message
        for n in range(MESSAGES):
            appended = httpx.post(base + "/orders", headers=JSON, content=json.dumps({"n": n}).encode())
            offsets.append(appended.headers["stream-next-offset"])

        claim = claim_subscription(sub, "worker-1", time.monotonic() + 10)
        half = offsets[MESSAGES // 2 - 1]
        ack = {
            "wake_id": claim["wake_id"],
            "generation": claim["generation"],
            "acks": [{"stream": "orders", "offset": half}],
        }
        acked = httpx.post(sub + "/ack", json=ack, headers={"authorization": f"Bearer {claim['token']}"})
        assert acked.status_code == 200, acked.text

        cluster.nodes[leader].kill()  # SIGKILL: no handover
        survivor = cluster.nodes[second].url + "/v1/stream/__ds/subscriptions/group"
        resumed = claim_subscription(survivor, "worker-2", time.monotonic() + 30)  # worker-1's lease lapses first
        (stream,) = resumed["streams"]  # type: ignore[misc]
        assert stream["acked_offset"] == half
        with httpx.Client(timeout=10) as client:
            rest = client.get(cluster.nodes[second].url + "/v1/stream/orders", params={"offset": half}).json()
        assert [m["n"] for m in rest] == list(range(MESSAGES // 2, MESSAGES))
    finally:
        cluster.stop()
