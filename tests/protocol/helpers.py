"""Assertions and requests the protocol tests share (the node itself is in tests/inprocess.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest

from app.domain.errors import ProtocolError
from tests.http.helpers import assert_error

LIMIT = 8192  # the node's max_body_bytes: room for 1,001 one-byte append-batch frames
TEXT = {"content-type": "text/plain"}
JSON_CT = {"content-type": "application/json"}
BINARY = {"content-type": "application/octet-stream"}


def off(pos: int) -> str:
    return f"0000000000000000_{pos:016d}"


def error_code(resp: httpx.Response, status: int, code: str) -> str:
    """Asserts the protocol's JSON error with this status and code; returns its message."""
    err = assert_error(resp, status)
    assert err["code"] == code, err
    return err["message"]


@contextlib.contextmanager
def raises(status: int, code: str) -> Iterator[pytest.ExceptionInfo[ProtocolError]]:
    """Asserts that the block raises a ProtocolError with this status and code."""
    with pytest.raises(ProtocolError) as info:
        yield info
    assert (info.value.status, info.value.code) == (status, code), info.value.message


async def create(
    client: httpx.AsyncClient, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> httpx.Response:
    resp = await client.put(path, content=body, headers=TEXT if headers is None else headers)
    assert resp.status_code == 201, resp.text
    return resp


async def read_all(client: httpx.AsyncClient, path: str) -> bytes:
    resp = await client.get(path, params={"offset": "-1"})
    assert resp.status_code == 200, resp.text
    return resp.content
