"""Subscriptions tried as an attacker would, against a real node with auth on: a pattern that
would backtrack, made-up lease tokens, probes for private buckets, repeated acks, and wake
streams that could loop. None of them may stall the node, write to the Raft log or tell a
stranger what exists."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from app.security.tokens import new_token, toml_entry
from tests.server import RillProcess

ADMIN, WRITER, STRANGER = new_token(), new_token(), new_token()
BUCKET, OTHER = "acme", "other-team"
JSON = {"content-type": "application/json"}
EVIL = "**a**a**a**a**a**a**a**a**b"  # the reported pattern: nine `**`
HARD = "**a**a**a**a**a**a**a**b"  # the most `**` allowed, against a long name of `a`s


def _as(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    tmp = tmp_path_factory.mktemp("hostile")
    config = tmp / "rill.toml"
    config.write_text(
        '[auth]\nmode = "on"\n\n'
        + toml_entry(ADMIN, ["admin:*"], "admin")
        + toml_entry(WRITER, [f"write:{BUCKET}"], "writer")
        + toml_entry(STRANGER, [f"write:{OTHER}"], "stranger")
    )
    process = RillProcess(tmp / "data", None, "--config", str(config)).start()
    for bucket in (BUCKET, OTHER):
        assert httpx.put(f"{process.url}/ds/{bucket}", headers=_as(ADMIN)).status_code == 201
    for stream in ("wake", "a" * 200, "jobs/1", "jobs/wake"):
        httpx.put(f"{process.url}/ds/{BUCKET}/{stream}", headers={**JSON, **_as(WRITER)}).raise_for_status()
    yield process
    process.stop()


def _sub(node: RillProcess, sub_id: str, bucket: str = BUCKET) -> str:
    return f"{node.url}/ds/{bucket}/__ds/subscriptions/{sub_id}"


def _commit(node: RillProcess) -> int:
    return int(httpx.get(f"{node.url}/healthz", headers=_as(ADMIN)).json()["commit"])


def test_a_backtracking_pattern_is_refused_and_the_hardest_allowed_one_is_cheap(node: RillProcess) -> None:
    """Before: EVIL became a backtracking regular expression run in every replica's apply; the PUT
    never returned, /healthz stopped answering, and a restart hung replaying it."""
    body = {"type": "pull-wake", "pattern": EVIL, "wake_stream": "wake"}
    refused = httpx.put(_sub(node, "evil"), json=body, headers=_as(WRITER), timeout=10)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "INVALID_PATTERN"
    assert "more than 8" in refused.json()["error"]["message"]
    body["pattern"] = HARD
    assert httpx.put(_sub(node, "hard"), json=body, headers=_as(WRITER), timeout=10).status_code == 201
    for bad in ("a*" * 200, ""):  # too long, empty: the pattern's own error code, as documented
        refused = httpx.put(_sub(node, "long"), json={**body, "pattern": bad}, headers=_as(WRITER), timeout=10)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "INVALID_PATTERN", bad
    assert httpx.get(f"{node.url}/healthz", timeout=5).status_code == 200
    node.stop()
    node.start()  # replays the log with the subscription in it
    assert httpx.get(_sub(node, "hard"), headers=_as(WRITER), timeout=5).status_code == 200


def test_made_up_lease_tokens_write_nothing_and_tell_nothing(node: RillProcess) -> None:
    """Before: each junk ack was proposed (about 4,400 log entries a second), and answered 409 when
    the subscription existed and 404 when it did not."""
    body = {"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wake"}
    assert httpx.put(_sub(node, "real"), json=body, headers=_as(WRITER)).status_code in (200, 201)
    ack = {"wake_id": "w_0", "generation": 1, "acks": [], "done": True}
    before = _commit(node)
    answers = set()
    with httpx.Client(timeout=10) as client:
        for i in range(300):
            target = (_sub(node, "real"), _sub(node, "missing"), _sub(node, "x", "no-such-bucket"))[i % 3]
            for route in ("ack", "release", "callback"):
                response = client.post(f"{target}/{route}", json=ack, headers=_as(f"junk{i}.abc"))
                answers.add((response.status_code, response.content))
    assert _commit(node) == before
    assert len(answers) == 1 and next(iter(answers))[0] == 401


def test_a_stranger_cannot_tell_a_private_bucket_from_a_missing_one(node: RillProcess) -> None:
    for route, method in (("", "GET"), ("", "PUT"), ("/claim", "POST"), ("", "DELETE")):
        body = {"type": "pull-wake", "pattern": "*", "wake_stream": "wake"} if method == "PUT" else {"worker": "w"}
        private = httpx.request(method, _sub(node, "real") + route, json=body, headers=_as(STRANGER))
        missing = httpx.request(method, _sub(node, "real", "no-such-bucket") + route, json=body, headers=_as(STRANGER))
        assert private.status_code == missing.status_code == 404
        assert private.content.replace(BUCKET.encode(), b"?") == missing.content.replace(b"no-such-bucket", b"?")


def test_an_ack_that_changes_nothing_is_not_proposed(node: RillProcess) -> None:
    body = {"type": "pull-wake", "pattern": "jobs/*", "wake_stream": "wake"}
    assert httpx.put(_sub(node, "acks"), json=body, headers=_as(WRITER)).status_code in (200, 201)
    tail = httpx.post(f"{node.url}/ds/{BUCKET}/jobs/1", json={"n": 1}, headers=_as(WRITER)).headers[
        "stream-next-offset"
    ]
    claim = httpx.post(_sub(node, "acks") + "/claim", json={"worker": "w"}, headers=_as(WRITER)).json()
    ack = {
        "wake_id": claim["wake_id"],
        "generation": claim["generation"],
        "acks": [{"stream": "jobs/1", "offset": tail}],
    }
    lease = _as(claim["token"])
    assert httpx.post(_sub(node, "acks") + "/ack", json=ack, headers=lease).status_code == 200
    before = _commit(node)
    for _ in range(20):
        again = httpx.post(_sub(node, "acks") + "/ack", json=ack, headers=lease)
        assert again.json() == {"ok": True, "next_wake": False}
    assert _commit(node) == before
    stale = {**ack, "generation": claim["generation"] - 1}
    fenced = httpx.post(_sub(node, "acks") + "/ack", json=stale, headers=lease)
    assert fenced.status_code == 409 and fenced.json()["error"]["code"] == "FENCED"
    assert _commit(node) == before


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"pattern": "jobs/*", "wake_stream": "nowhere"}, "WAKE_STREAM_NOT_FOUND"),
        ({"pattern": "jobs/*", "wake_stream": "jobs/wake"}, "WAKE_STREAM_COVERED"),
        ({"pattern": "**", "wake_stream": "wake"}, "WAKE_STREAM_COVERED"),
        ({"streams": ["wake"], "wake_stream": "wake"}, "WAKE_STREAM_COVERED"),
    ],
)
def test_wake_streams_that_are_missing_or_covered_are_refused(
    node: RillProcess, body: dict[str, object], code: str
) -> None:
    """Before: a missing wake stream was proposed to every 100 ms forever; a covered one woke itself."""
    before = _commit(node)
    refused = httpx.put(_sub(node, "wakes"), json={"type": "pull-wake", **body}, headers=_as(WRITER))
    assert refused.status_code == 400 and refused.json()["error"]["code"] == code
    assert _commit(node) == before


def test_a_wake_stream_deleted_later_is_retried_with_backoff(node: RillProcess, tmp_path: Path) -> None:
    httpx.put(f"{node.url}/ds/{BUCKET}/later/wake", headers={**JSON, **_as(WRITER)}).raise_for_status()
    httpx.put(f"{node.url}/ds/{BUCKET}/later/x", headers={**JSON, **_as(WRITER)}).raise_for_status()
    body = {"type": "pull-wake", "pattern": "later/x", "wake_stream": "later/wake"}
    assert httpx.put(_sub(node, "later"), json=body, headers=_as(WRITER)).status_code == 201
    assert httpx.delete(f"{node.url}/ds/{BUCKET}/later/wake", headers=_as(WRITER)).status_code == 204
    httpx.post(f"{node.url}/ds/{BUCKET}/later/x", json={"n": 1}, headers=_as(WRITER)).raise_for_status()
    time.sleep(0.5)
    before = _commit(node)
    time.sleep(3)
    assert _commit(node) - before <= 2  # retries 1 s, then 2 s, ... apart; it was 30 in 3 s
    view = httpx.get(_sub(node, "later"), headers=_as(WRITER)).json()
    assert view["delivery"]["attempts"] >= 2 and "not_found" in view["delivery"]["error"]
