"""Shared assertions and request helpers for the HTTP tests."""

from __future__ import annotations

import re
import uuid

import httpx
import pytest

TEXT = {"content-type": "text/plain"}
JSON_CT = {"content-type": "application/json"}
BINARY = {"content-type": "application/octet-stream"}
OFFSET = re.compile(r"^\d{16}_\d{16}$")
ZERO = "0000000000000000_0000000000000000"
FAMILIES = ["ds", "legacy", "compat"]


def assert_error(resp: httpx.Response, status: int) -> dict[str, str]:
    """An error response: the status, `application/json`, and exactly {"error": {"code": str, "message": str}}."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers.get("content-type") == "application/json", resp.headers
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert {"code", "message"} <= set(err), err
    assert isinstance(err["code"], str) and err["code"], err
    assert isinstance(err["message"], str) and err["message"], err
    return err


def uid() -> str:
    return uuid.uuid4().hex[:16]


def assert_get_error(client: httpx.Client, url: str, status: int) -> None:
    """Like assert_error for a GET that might wrongly open an SSE stream: fail at once instead of waiting on it."""
    with client.stream("GET", url, timeout=5) as resp:
        if resp.headers.get("content-type", "").startswith("text/event-stream"):
            pytest.fail(f"GET {url}: expected {status}, got {resp.status_code} with an SSE stream")
        resp.read()
    assert_error(resp, status)


def read_all(client: httpx.Client, path: str) -> bytes:
    resp = client.get(path, params={"offset": "-1"})
    assert resp.status_code == 200, resp.text
    return resp.content


def assert_unchanged(client: httpx.Client, path: str, expected: bytes) -> None:
    assert read_all(client, path) == expected


def tail_of(client: httpx.Client, path: str) -> str:
    resp = client.head(path)
    assert resp.status_code == 200
    return resp.headers["stream-next-offset"]


def producer(pid: str, epoch: int | str, seq: int | str) -> dict[str, str]:
    return {"producer-id": pid, "producer-epoch": str(epoch), "producer-seq": str(seq)}


def create(client: httpx.Client, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> httpx.Response:
    resp = client.put(path, headers=TEXT if headers is None else headers, content=body)
    assert resp.status_code == 201, resp.text
    return resp


def family_base(family: str, bucket: str) -> str:
    """The path prefix of a route family's streams: /ds/<bucket>/, /streams/ or /v1/stream/."""
    return {"ds": f"/ds/{bucket}/", "legacy": "/streams/", "compat": "/v1/stream/"}[family]
