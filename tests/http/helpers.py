"""Shared assertions for the HTTP tests."""

from __future__ import annotations

import uuid

import httpx

TEXT = {"content-type": "text/plain"}


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
