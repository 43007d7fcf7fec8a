"""Long-poll reads: timeouts, immediate data, wake-ups, closed streams.

Run against every route family (/ds/<bucket>/, /streams/, /v1/stream/) through the `path` and `base` fixtures.
Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import re
import threading
import time

import httpx

from tests.http.helpers import TEXT, create


def test_long_poll_times_out_with_204(client: httpx.Client, path: str) -> None:
    tail = create(client, path, b"data").headers["stream-next-offset"]
    started = time.monotonic()
    resp = client.get(path, params={"offset": tail, "live": "long-poll"})
    elapsed = time.monotonic() - started
    assert resp.status_code == 204
    assert resp.content == b""
    assert 0.5 < elapsed < 5
    assert re.fullmatch(r"\d+", resp.headers["stream-cursor"])
    assert resp.headers["stream-up-to-date"] == "true"
    assert resp.headers["stream-next-offset"] == tail
    assert resp.headers["x-content-type-options"] == "nosniff"
    # The 204 offset is a resume point.
    assert client.post(path, headers=TEXT, content=b"+new").status_code == 204
    assert client.get(path, params={"offset": resp.headers["stream-next-offset"]}).content == b"+new"


def test_long_poll_with_data_is_immediate_and_cursor_advances(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    first = client.get(path, params={"offset": "-1", "live": "long-poll"})
    assert first.status_code == 200 and first.content == b"data"
    cursor = first.headers["stream-cursor"]
    assert re.fullmatch(r"\d+", cursor)
    assert first.headers["stream-up-to-date"] == "true"
    second = client.get(path, params={"offset": "-1", "live": "long-poll", "cursor": cursor})
    assert second.status_code == 200
    assert int(second.headers["stream-cursor"]) > int(cursor)


def test_long_poll_wakes_on_append(client: httpx.Client, path: str) -> None:
    tail = create(client, path, b"old").headers["stream-next-offset"]

    def append_later() -> None:
        time.sleep(0.2)
        client.post(path, headers=TEXT, content=b"new")

    writer = threading.Thread(target=append_later)
    writer.start()
    try:
        resp = client.get(path, params={"offset": tail, "live": "long-poll"})
    finally:
        writer.join()
    assert resp.status_code == 200
    assert resp.content == b"new"
    assert resp.headers["stream-up-to-date"] == "true"
    assert re.fullmatch(r"\d+", resp.headers["stream-cursor"])


def test_long_poll_on_closed_stream_returns_at_once(client: httpx.Client, path: str) -> None:
    create(client, path, b"data")
    final = client.post(path, headers={"stream-closed": "true"}).headers["stream-next-offset"]
    started = time.monotonic()
    resp = client.get(path, params={"offset": final, "live": "long-poll"})
    assert time.monotonic() - started < 0.8
    assert resp.status_code == 204
    assert resp.headers["stream-closed"] == "true"
    assert resp.headers["stream-up-to-date"] == "true"
    assert resp.headers["stream-next-offset"] == final
