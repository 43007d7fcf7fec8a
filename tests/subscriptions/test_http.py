"""Subscriptions over HTTP against a real node: webhook deliveries signed and retried, pull-wake
claims with leases, the control routes' errors, and access control (a lease's own token acks)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.security.tokens import new_token, toml_entry
from app.subscriptions.signing import verify
from tests.http.helpers import uid
from tests.server import RillProcess

WEBHOOKS = {"RILL_WEBHOOK_ALLOWED_NETWORKS": '["127.0.0.1/32"]'}
JSON = {"content-type": "application/json"}
LOCAL, METADATA = {"url": "http://127.0.0.1:1/"}, {"url": "http://169.254.169.254/"}
PULL: dict[str, Any] = {"type": "pull-wake", "pattern": "*", "wake_stream": "w"}
HOOK: dict[str, Any] = {"type": "webhook", "pattern": "*", "webhook": LOCAL}


class Receiver:
    """A webhook endpoint on 127.0.0.1 answering with `statuses` in turn (then the last one)."""

    def __init__(self, statuses: list[int], answer: dict[str, Any] | None = None) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                receiver.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = statuses[min(len(receiver.requests) - 1, len(statuses) - 1)]
                payload = json.dumps(answer or {}).encode()
                self.send_response(status)
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"

    def wait(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.requests) < count:
            assert time.monotonic() < deadline, f"{len(self.requests)} deliveries, not {count}"
            time.sleep(0.02)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    process = RillProcess(tmp_path_factory.mktemp("subs") / "data", env=WEBHOOKS).start()
    yield process
    process.stop()


def _sub(node: RillProcess, sub_id: str) -> str:
    return f"{node.url}/v1/stream/__ds/subscriptions/{sub_id}"


def test_a_webhook_is_signed_and_retried_until_it_succeeds(node: RillProcess) -> None:
    receiver = Receiver([500, 503, 200], {"done": True})
    prefix, sub_id = f"hooks-{uid()}", f"s-{uid()}"
    try:
        created = httpx.put(
            _sub(node, sub_id), json={"type": "webhook", "pattern": f"{prefix}/*", "webhook": {"url": receiver.url}}
        )
        assert created.status_code == 201, created.text
        jwks = httpx.get(created.json()["webhook"]["signing"]["jwks_url"]).json()
        httpx.put(f"{node.url}/v1/stream/{prefix}/a", headers=JSON, content=b'{"n": 1}')
        receiver.wait(3, timeout=15)  # two failures, backed off 1 s and then 2 s
        generations = []
        for headers, body in receiver.requests:
            assert verify(headers["webhook-signature"], body, jwks, int(time.time()))
            generations.append(json.loads(body)["generation"])
        assert generations == sorted(set(generations))  # every attempt under a new generation
        deadline = time.monotonic() + 5
        while True:  # {"done": true} acknowledged the tail it was shown
            (stream,) = httpx.get(_sub(node, sub_id)).json()["streams"]
            if stream["acked_offset"] == stream["tail_offset"]:
                break
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.5)
        assert len(receiver.requests) == 3  # nothing pending: no more wakes
    finally:
        httpx.delete(_sub(node, sub_id))
        receiver.close()


def test_pull_wake_claims_expire_to_the_next_worker(node: RillProcess) -> None:
    prefix, sub_id = f"pull-{uid()}", f"p-{uid()}"
    httpx.put(f"{node.url}/v1/stream/{prefix}/wake", headers=JSON, content=b"[]")
    body = {"type": "pull-wake", "pattern": f"{prefix}/jobs/*", "wake_stream": f"{prefix}/wake", "lease_ttl_ms": 1000}
    assert httpx.put(_sub(node, sub_id), json=body).status_code == 201
    httpx.put(f"{node.url}/v1/stream/{prefix}/jobs/1", headers=JSON, content=b'{"job": 1}')
    first = httpx.post(_sub(node, sub_id) + "/claim", json={"worker": "w1"}).json()
    busy = httpx.post(_sub(node, sub_id) + "/claim", json={"worker": "w2"})
    assert busy.status_code == 409 and busy.json()["error"]["current_holder"] == "w1"
    time.sleep(1.1)  # w1's lease runs out
    second = httpx.post(_sub(node, sub_id) + "/claim", json={"worker": "w2"}).json()
    assert second["generation"] == first["generation"] + 1
    stale = {"wake_id": first["wake_id"], "generation": first["generation"], "acks": [], "done": True}
    fenced = httpx.post(_sub(node, sub_id) + "/ack", json=stale, headers={"authorization": f"Bearer {first['token']}"})
    assert fenced.status_code == 409 and fenced.json()["error"]["code"] == "FENCED"
    (job,) = second["streams"]
    ack = {"wake_id": second["wake_id"], "generation": second["generation"], "done": True}
    auth = {"authorization": f"Bearer {second['token']}"}
    ack["acks"] = [{"stream": job["path"], "offset": "0000000000000000_0000000000000003"}]  # inside {"job": 1}
    inside = httpx.post(_sub(node, sub_id) + "/ack", json=ack, headers=auth)
    assert inside.status_code == 400 and inside.json()["error"]["code"] == "OFFSET_NOT_BOUNDARY"
    ack["acks"] = [{"stream": job["path"], "offset": job["tail_offset"]}]
    done = httpx.post(_sub(node, sub_id) + "/ack", json=ack, headers={"authorization": f"Bearer {second['token']}"})
    assert done.json() == {"ok": True, "next_wake": False}
    assert httpx.get(_sub(node, sub_id)).json()["streams"][0]["acked_offset"] == job["tail_offset"]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code"),
    [
        ("PUT", "__ds/subscriptions/bad%20id", {}, 400, "invalid_subscription_id"),
        ("PUT", "__ds/subscriptions/x", {"type": "carrier-pigeon", "pattern": "*"}, 400, "INVALID_BODY"),
        ("PUT", "__ds/subscriptions/x", {"type": "webhook", "pattern": "*"}, 400, "INVALID_BODY"),
        ("PUT", "__ds/subscriptions/x", {"type": "pull-wake", "pattern": "*"}, 400, "INVALID_BODY"),
        ("PUT", "__ds/subscriptions/x", {"type": "webhook", "webhook": LOCAL}, 400, "INVALID_BODY"),  # no pattern
        ("PUT", "__ds/subscriptions/x", {**PULL, "lease_ttl_ms": 10}, 400, "INVALID_BODY"),
        ("PUT", "__ds/subscriptions/x", {**PULL, "lease_ttl_ms": 600_001}, 400, "INVALID_BODY"),
        ("PUT", "__ds/subscriptions/x", {**HOOK, "webhook": METADATA}, 400, "WEBHOOK_URL_REJECTED"),
        ("GET", "__ds/subscriptions/missing", None, 404, "SUBSCRIPTION_NOT_FOUND"),
        ("POST", "__ds/subscriptions/missing/claim", {"worker": "w"}, 404, "SUBSCRIPTION_NOT_FOUND"),
        ("POST", "__ds/subscriptions/x/ack", {}, 401, "unauthorized"),
        ("POST", "__ds/subscriptions/x/nonsense", {}, 400, "INVALID_SUBSCRIPTION_ROUTE"),
        ("PATCH", "__ds/subscriptions/x", {}, 405, "method_not_allowed"),
    ],
)  # fmt: skip
def test_bad_requests_get_clear_errors(
    node: RillProcess, method: str, path: str, body: dict[str, Any] | None, status: int, code: str
) -> None:
    response = httpx.request(method, f"{node.url}/v1/stream/{path}", json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code


def test_with_auth_on_a_subscription_needs_write_and_a_lease_acks_with_its_own_token(tmp_path: Path) -> None:
    reader, writer = new_token(), new_token()
    config = tmp_path / "rill.toml"
    config.write_text(
        '[auth]\nmode = "on"\n\n' + toml_entry(reader, ["read:*"], "r") + toml_entry(writer, ["write:*"], "w")
    )
    process = RillProcess(tmp_path / "data", None, "--config", str(config), env=WEBHOOKS).start()
    try:
        url = f"{process.url}/v1/stream/__ds/subscriptions/s"
        body = {"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wake"}
        httpx.put(f"{process.url}/v1/stream/wake", headers={**JSON, "authorization": f"Bearer {writer}"})
        assert httpx.put(url, json=body).status_code == 401
        assert httpx.put(url, json=body, headers={"authorization": f"Bearer {reader}"}).status_code == 403
        assert httpx.put(url, json=body, headers={"authorization": f"Bearer {writer}"}).status_code == 201
        assert httpx.get(process.url + "/v1/stream/__ds/jwks.json").status_code == 200  # public keys
        claim = httpx.post(url + "/claim", json={"worker": "w"}, headers={"authorization": f"Bearer {writer}"}).json()
        ack = {"wake_id": claim["wake_id"], "generation": claim["generation"], "acks": [], "done": True}
        # A user's token is no lease token, whatever it may do in the bucket.
        assert httpx.post(url + "/ack", json=ack, headers={"authorization": f"Bearer {writer}"}).status_code == 401
        done = httpx.post(url + "/ack", json=ack, headers={"authorization": f"Bearer {claim['token']}"})
        assert done.status_code == 200, done.text
    finally:
        process.stop()


def test_a_streams_consumer_groups_show_their_lag(node: RillProcess) -> None:
    prefix = f"cg-{uid()}"
    stream = f"{node.url}/v1/stream/{prefix}/orders"
    httpx.put(stream, headers=JSON)
    httpx.put(f"{node.url}/v1/stream/{prefix}/wake", headers=JSON, content=b"[]")
    body = {"type": "pull-wake", "streams": [f"{prefix}/orders"], "wake_stream": f"{prefix}/wake"}
    assert httpx.put(_sub(node, f"g-{prefix}"), json=body).status_code == 201
    httpx.post(stream, headers=JSON, content=b'[{"n": 1}, {"n": 2}]')
    tail = httpx.post(stream, headers=JSON, content=b'{"n": 3}').headers["stream-next-offset"]
    (group,) = httpx.get(stream + "/__ds/subscriptions").json()["subscriptions"]
    assert group["id"] == f"g-{prefix}" and group["path"] == f"{prefix}/orders"
    assert group["lag_messages"] == 3 and group["lag_bytes"] > 0 and group["tail_offset"] == tail
    assert group["acked_offset"] == "0000000000000000_0000000000000000"  # made empty: from its start
    claim = httpx.post(_sub(node, f"g-{prefix}") + "/claim", json={"worker": "w"}).json()
    ack = {"wake_id": claim["wake_id"], "generation": claim["generation"], "done": True}
    ack["acks"] = [{"stream": f"{prefix}/orders", "offset": tail}]
    httpx.post(_sub(node, f"g-{prefix}") + "/ack", json=ack, headers={"authorization": f"Bearer {claim['token']}"})
    (group,) = httpx.get(stream + "/__ds/subscriptions").json()["subscriptions"]
    assert (group["lag_bytes"], group["lag_messages"], group["acked_offset"]) == (0, 0, tail)
    assert httpx.get(f"{node.url}/v1/stream/{prefix}/missing/__ds/subscriptions").status_code == 404


def test_a_percent_encoded_namespace_names_the_same_routes(node: RillProcess) -> None:
    """`%5F_ds` decodes to `__ds`: the route matches, and the root's URL is found in the path as sent."""
    sub_id = f"s-{uid()}"
    assert httpx.put(f"{node.url}/v1/stream/w", headers=JSON).status_code in (200, 201)
    created = httpx.put(f"{node.url}/v1/stream/%5F_ds/subscriptions/{sub_id}", json={**PULL, "pattern": "e-*"})
    assert created.status_code == 201, created.text
    hook = httpx.put(f"{node.url}/v1/stream/%5f_ds/subscriptions/{sub_id}-hook", json=HOOK)
    assert hook.status_code == 201, hook.text
    assert httpx.get(f"{node.url}/v1/stream/%5f_ds/subscriptions/{sub_id}-hook").status_code == 200


def test_a_link_that_changes_nothing_is_answered_and_too_many_links_are_refused(node: RillProcess) -> None:
    sub_id = f"s-{uid()}"
    assert httpx.put(f"{node.url}/v1/stream/w", headers=JSON).status_code in (200, 201)
    assert httpx.put(_sub(node, sub_id), json={**PULL, "pattern": None, "streams": ["a"]}).status_code == 201
    assert httpx.post(f"{_sub(node, sub_id)}/streams", json={"streams": ["a"]}).status_code == 204
    assert httpx.delete(f"{_sub(node, sub_id)}/streams/b").status_code == 204
    for start in range(0, 9999, 1000):  # up to the cap: 10,000 named streams, "a" among them
        more = {"streams": [f"p{i}" for i in range(start, min(start + 1000, 9999))]}
        assert httpx.post(f"{_sub(node, sub_id)}/streams", json=more, timeout=30).status_code == 204
    refused = httpx.post(f"{_sub(node, sub_id)}/streams", json={"streams": ["one-more"]})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "TOO_MANY_STREAMS"
