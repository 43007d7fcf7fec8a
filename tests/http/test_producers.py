"""Idempotent producers: header validation, duplicates, epochs and sequence gaps.

Run against every route family (/ds/<bucket>/, /streams/, /v1/stream/) through the `path` and `base` fixtures.
Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import httpx
import pytest

from tests.http.helpers import OFFSET, TEXT, assert_error, assert_unchanged, create, producer

PARTIAL_PRODUCERS = [
    pytest.param({"producer-id": "p"}, id="id-only"),
    pytest.param({"producer-epoch": "0"}, id="epoch-only"),
    pytest.param({"producer-seq": "0"}, id="seq-only"),
    pytest.param({"producer-id": "p", "producer-epoch": "0"}, id="id-epoch"),
    pytest.param({"producer-id": "p", "producer-seq": "0"}, id="id-seq"),
    pytest.param({"producer-epoch": "0", "producer-seq": "0"}, id="epoch-seq"),
    pytest.param(producer("", 0, 0), id="empty-id"),
    pytest.param(producer("p" * 257, 0, 0), id="id-too-long"),
]


@pytest.mark.parametrize("headers", PARTIAL_PRODUCERS)
def test_partial_or_empty_producer_headers_are_400(client: httpx.Client, path: str, headers: dict[str, str]) -> None:
    create(client, path, b"data")
    assert_error(client.post(path, headers={**TEXT, **headers}, content=b"x"), 400)
    assert_unchanged(client, path, b"data")
    # Also before the stream-existence check.
    assert_error(client.post(f"{path}-missing", headers={**TEXT, **headers}, content=b"x"), 400)


@pytest.mark.parametrize("bad", ["1abc", "0xyz", "1e3", "-1", "+1", "1.0", "", "9007199254740992"])
@pytest.mark.parametrize("field", ["epoch", "seq"])
def test_producer_bad_integers_are_400(client: httpx.Client, path: str, field: str, bad: str) -> None:
    create(client, path, b"data")
    headers = producer("p", 0, 0)
    headers[f"producer-{field}"] = bad
    assert_error(client.post(path, headers={**TEXT, **headers}, content=b"x"), 400)
    assert_unchanged(client, path, b"data")


def test_producer_accept_and_duplicate(client: httpx.Client, path: str) -> None:
    create(client, path)
    offsets = []
    for seq, chunk in enumerate([b"a", b"b", b"c"]):
        resp = client.post(path, headers={**TEXT, **producer("p", 0, seq)}, content=chunk)
        assert resp.status_code == 200, resp.text
        assert resp.headers["producer-epoch"] == "0"
        assert resp.headers["producer-seq"] == str(seq)
        assert OFFSET.match(resp.headers["stream-next-offset"])
        offsets.append(resp.headers["stream-next-offset"])
    assert offsets == sorted(offsets)

    dup = client.post(path, headers={**TEXT, **producer("p", 0, 1)}, content=b"b")
    assert dup.status_code == 204
    assert dup.content == b""
    assert dup.headers["producer-seq"] == "2"  # the highest accepted, not the request's
    assert dup.headers["producer-epoch"] == "0"
    dup_last = client.post(path, headers={**TEXT, **producer("p", 0, 2)}, content=b"c")
    assert dup_last.status_code == 204
    assert dup_last.headers["producer-seq"] == "2"
    assert_unchanged(client, path, b"abc")

    nxt = client.post(path, headers={**TEXT, **producer("p", 0, 3)}, content=b"d")
    assert nxt.status_code == 200
    assert_unchanged(client, path, b"abcd")


def test_producers_are_independent(client: httpx.Client, path: str) -> None:
    create(client, path)
    assert client.post(path, headers={**TEXT, **producer("A", 0, 0)}, content=b"A0").status_code == 200
    assert client.post(path, headers={**TEXT, **producer("B", 0, 0)}, content=b"B0").status_code == 200
    assert client.post(path, headers={**TEXT, **producer("A", 0, 1)}, content=b"A1").status_code == 200
    assert_unchanged(client, path, b"A0B0A1")


def test_producer_duplicate_is_checked_before_stream_seq(client: httpx.Client, path: str) -> None:
    create(client, path)
    headers = {**TEXT, **producer("p", 0, 0), "stream-seq": "app-seq-001"}
    assert client.post(path, headers=headers, content=b"once").status_code == 200
    assert client.post(path, headers=headers, content=b"once").status_code == 204
    assert_unchanged(client, path, b"once")


def test_producer_stale_epoch_is_403(client: httpx.Client, path: str) -> None:
    create(client, path)
    ok = client.post(path, headers={**TEXT, **producer("p", 1, 0)}, content=b"e1")
    assert ok.status_code == 200 and ok.headers["producer-epoch"] == "1"
    for seq in (0, 1):
        resp = client.post(path, headers={**TEXT, **producer("p", 0, seq)}, content=b"zombie")
        assert_error(resp, 403)
        assert resp.headers["producer-epoch"] == "1"
    assert_unchanged(client, path, b"e1")


def test_producer_sequence_gap_is_409(client: httpx.Client, path: str) -> None:
    create(client, path)
    assert client.post(path, headers={**TEXT, **producer("p", 0, 0)}, content=b"a").status_code == 200
    resp = client.post(path, headers={**TEXT, **producer("p", 0, 2)}, content=b"c")
    assert_error(resp, 409)
    assert resp.headers["producer-expected-seq"] == "1"
    assert resp.headers["producer-received-seq"] == "2"
    fresh = client.post(path, headers={**TEXT, **producer("q", 0, 5)}, content=b"q")
    assert_error(fresh, 409)
    assert fresh.headers["producer-expected-seq"] == "0"
    assert fresh.headers["producer-received-seq"] == "5"
    assert_unchanged(client, path, b"a")
    assert client.post(path, headers={**TEXT, **producer("p", 0, 1)}, content=b"b").status_code == 200
    assert_unchanged(client, path, b"ab")


def test_producer_epoch_bump_with_nonzero_seq_is_400(client: httpx.Client, path: str) -> None:
    create(client, path)
    assert client.post(path, headers={**TEXT, **producer("p", 0, 0)}, content=b"a").status_code == 200
    assert_error(client.post(path, headers={**TEXT, **producer("p", 1, 5)}, content=b"x"), 400)
    assert_unchanged(client, path, b"a")
    bumped = client.post(path, headers={**TEXT, **producer("p", 1, 0)}, content=b"b")
    assert bumped.status_code == 200
    assert bumped.headers["producer-epoch"] == "1" and bumped.headers["producer-seq"] == "0"
    assert_unchanged(client, path, b"ab")
