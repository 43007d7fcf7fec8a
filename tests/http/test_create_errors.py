"""PUT errors: configuration mismatches and invalid TTL, expiry, JSON and Stream-Closed.

Run against every route family (/ds/<bucket>/, /streams/, /v1/stream/) through the `path` and `base` fixtures.
Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import httpx
import pytest

from tests.http.helpers import BINARY, JSON_CT, TEXT, assert_error, assert_unchanged, create


def test_put_config_mismatch_is_409(client: httpx.Client, path: str) -> None:
    create(client, path, b"keep")
    assert_error(client.put(path, headers=JSON_CT), 409)
    assert_error(client.put(path, headers=BINARY), 409)
    assert_error(client.put(path, headers={**TEXT, "stream-ttl": "3600"}), 409)
    assert_error(client.put(path, headers={**TEXT, "stream-expires-at": "2099-01-01T00:00:00Z"}), 409)
    assert client.head(path).headers["content-type"] == "text/plain"
    assert "stream-ttl" not in client.head(path).headers
    assert_unchanged(client, path, b"keep")


def test_put_ttl_mismatch_is_409(client: httpx.Client, path: str) -> None:
    create(client, path, headers={**TEXT, "stream-ttl": "3600"})
    assert client.head(path).headers["stream-ttl"] == "3600"
    assert_error(client.put(path, headers={**TEXT, "stream-ttl": "7200"}), 409)
    assert_error(client.put(path, headers=TEXT), 409)
    assert client.put(path, headers={**TEXT, "stream-ttl": "3600"}).status_code == 200
    assert client.head(path).headers["stream-ttl"] == "3600"


@pytest.mark.parametrize("ttl", ["abc", "-1", "00060", "+60", "60.5", "1e3", "", "99999999999999999999"])
def test_invalid_stream_ttl_is_400(client: httpx.Client, path: str, ttl: str) -> None:
    assert_error(client.put(path, headers={**TEXT, "stream-ttl": ttl}), 400)
    assert client.head(path).status_code == 404


@pytest.mark.parametrize(
    "expires",
    ["not-a-timestamp", "2025-01-01", "2025-01-01T12:34:56", "2025-13-01T00:00:00Z", "2025-02-30T00:00:00Z", ""],
)
def test_invalid_stream_expires_at_is_400(client: httpx.Client, path: str, expires: str) -> None:
    assert_error(client.put(path, headers={**TEXT, "stream-expires-at": expires}), 400)
    assert client.head(path).status_code == 404


@pytest.mark.parametrize(
    "expires", ["2099-01-01T12:34:56.789Z", "2099-01-01T12:34:56.789+00:00", "2099-01-01T12:34:56Z"]
)
def test_valid_stream_expires_at_is_accepted(client: httpx.Client, path: str, expires: str) -> None:
    assert client.put(path, headers={**TEXT, "stream-expires-at": expires}).status_code == 201
    assert client.put(path, headers={**TEXT, "stream-expires-at": expires}).status_code == 200


def test_ttl_and_expires_at_together_is_400(client: httpx.Client, path: str) -> None:
    headers = {**TEXT, "stream-ttl": "3600", "stream-expires-at": "2099-01-01T00:00:00Z"}
    assert_error(client.put(path, headers=headers), 400)
    assert client.head(path).status_code == 404


def test_put_invalid_json_body_is_400(client: httpx.Client, path: str) -> None:
    assert_error(client.put(path, headers=JSON_CT, content=b"{ invalid json }"), 400)
    assert client.head(path).status_code == 404


def test_put_bad_stream_closed_value_is_400(client: httpx.Client, path: str) -> None:
    assert_error(client.put(path, headers={**TEXT, "stream-closed": "maybe"}), 400)
    assert client.head(path).status_code == 404
