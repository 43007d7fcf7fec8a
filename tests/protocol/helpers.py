"""The in-process node the protocol tests talk to over ASGI, and the assertions they share."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from starlette.types import ASGIApp

from app.domain.errors import ProtocolError
from app.state_machine import records
from app.storage.kv import MemoryKV
from tests.http.helpers import assert_error

LIMIT = 8192  # the node's max_body_bytes: room for 1,001 one-byte append-batch frames
TEXT = {"content-type": "text/plain"}
JSON_CT = {"content-type": "application/json"}
BINARY = {"content-type": "application/octet-stream"}

Dump = dict[str, dict[str, list[tuple[bytes, bytes]]]]


@dataclass
class Node:
    """A single node's app, running its lifespan, with its Raft log and state machine in memory."""

    app: ASGIApp
    stores: dict[str, tuple[MemoryKV, list[str]]]  # by directory name ("raft", "state"): store, column families

    def dump(self) -> Dump:
        """Every pair of every column family of both stores."""
        return {name: {cf: list(kv.scan(cf, b"")) for cf in cfs} for name, (kv, cfs) in self.stores.items()}

    def state(self) -> list[tuple[str, bytes, bytes]]:
        """The state machine's pairs, but for the applied index (which every Raft entry moves)."""
        kv, cfs = self.stores["state"]
        return [
            (cf, k, v) for cf in cfs for k, v in kv.scan(cf, b"") if (cf, k) != (records.SM_META, records.APPLIED_KEY)
        ]

    @contextlib.contextmanager
    def unchanged(self) -> Iterator[None]:
        """Asserts that the block changed neither store: nothing was proposed to Raft, nothing applied."""
        before = self.dump()
        yield
        assert self.dump() == before, "a rejected request changed the stores"

    @contextlib.contextmanager
    def state_unchanged(self) -> Iterator[None]:
        """Asserts that the block changed no state: for commands that only the state machine can refuse,
        which reach it through the Raft log."""
        before = self.state()
        yield
        assert self.state() == before, "a rejected request changed the state"


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
