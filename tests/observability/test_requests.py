"""app/observability/requests.py: what each request is counted as."""

from __future__ import annotations

import asyncio

import pytest

from app.counters.counts import RequestCounters
from app.observability.requests import count_requests


async def _noop_receive() -> dict[str, object]:
    return {"type": "http.disconnect"}


def _scope(method: str = "GET", query: bytes = b"") -> dict[str, object]:
    return {"type": "http", "method": method, "path": "/v1/stream/x", "query_string": query, "headers": []}


def test_an_app_that_fails_before_answering_is_counted_as_the_500_the_server_sends() -> None:
    counters = RequestCounters()

    async def failing(scope: object, receive: object, send: object) -> None:
        raise RuntimeError("a bug")

    async def send(message: object) -> None:
        pass

    with pytest.raises(RuntimeError):
        asyncio.run(count_requests(failing, counters)(_scope(), _noop_receive, send))
    assert counters.requests == {("compat", "GET", 500): 1}


def test_only_a_get_is_a_live_read() -> None:
    counters = RequestCounters()
    seen: list[dict[str, int]] = []

    async def app(scope: object, receive: object, send: object) -> None:
        seen.append(dict(counters.live))
        await send({"type": "http.response.start", "status": 204, "headers": []})

    async def send(message: object) -> None:
        pass

    asyncio.run(count_requests(app, counters)(_scope("POST", b"live=sse"), _noop_receive, send))
    asyncio.run(count_requests(app, counters)(_scope("GET", b"live=sse"), _noop_receive, send))
    assert seen == [{"sse": 0, "long_poll": 0}, {"sse": 1, "long_poll": 0}]
    assert counters.latency[("compat", "POST")].count == 1  # in the latency histogram: not a live read
