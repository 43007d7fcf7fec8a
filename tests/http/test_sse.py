"""SSE reads: text, JSON and binary streams, closed streams, live appends.

Run against every route family (/ds/<bucket>/, /streams/, /v1/stream/) through the `path` and `base` fixtures.
Every error response must be `application/json` with {"error": {"code": str, "message": str}}
(`assert_error`); after a rejected write the stream's data must be unchanged (`assert_unchanged`).
"""

from __future__ import annotations

import base64
import json
import re
import threading
import time
from collections.abc import Callable

import httpx

from tests.http.helpers import BINARY, JSON_CT, TEXT, create, tail_of


def _parse_block(block: str) -> tuple[str, str] | None:
    event, data = None, []
    for line in block.split("\n"):
        if line.startswith(":"):
            continue
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(" ") else value)
    if event is None or not data:
        return None
    return event, "\n".join(data)


def read_sse(
    client: httpx.Client, url: str, until: Callable[[str, str], bool] | None = None, timeout: float = 5.0
) -> tuple[httpx.Response, list[tuple[str, str]], str, bool]:
    """GETs an SSE URL; returns (response, [(event, data)], raw text, whether the server ended the body).

    Stops early once `until(event, data)` is true for a received event.
    """
    events: list[tuple[str, str]] = []
    raw = ""
    with client.stream("GET", url, timeout=timeout) as resp:
        if resp.status_code != 200:
            resp.read()
            return resp, events, resp.text, True
        buffer = ""
        for text in resp.iter_text():
            raw += text
            buffer += text
            while "\n\n" in buffer:
                block, buffer = buffer.split("\n\n", 1)
                parsed = _parse_block(block)
                if parsed is None:
                    continue
                events.append(parsed)
                if until is not None and until(*parsed):
                    return resp, events, raw, False
    return resp, events, raw, True


def _up_to_date(event: str, data: str) -> bool:
    return event == "control" and "upToDate" in data


def assert_data_control_pairs(events: list[tuple[str, str]]) -> None:
    for i, (event, _) in enumerate(events):
        assert event in ("data", "control"), events
        if event == "data":
            assert i + 1 < len(events) and events[i + 1][0] == "control", events


def test_sse_text_stream(client: httpx.Client, path: str) -> None:
    create(client, path, b"line1\nline2")
    assert client.post(path, headers=TEXT, content=b"\nline3").status_code == 204
    tail = tail_of(client, path)
    resp, events, raw, _ = read_sse(client, f"{path}?offset=-1&live=sse", _up_to_date)
    assert resp.status_code == 200
    assert resp.headers["content-type"] == "text/event-stream"
    assert "no-cache" in resp.headers["cache-control"]
    assert "content-length" not in resp.headers
    assert "stream-sse-data-encoding" not in resp.headers
    assert resp.headers["x-content-type-options"] == "nosniff"
    assert "\r" not in raw
    assert raw.startswith("event: data\n")
    assert "data:line1\n" in raw and "data:line3\n" in raw
    assert_data_control_pairs(events)
    assert "".join(d for e, d in events if e == "data") == "line1\nline2\nline3"
    controls = [json.loads(d) for e, d in events if e == "control"]
    last = controls[-1]
    assert last["streamNextOffset"] == tail
    assert last["upToDate"] is True
    assert re.fullmatch(r"\d+", last["streamCursor"])
    assert "streamClosed" not in last
    assert all("upToDate" not in c for c in controls[:-1])
    assert re.search(r"event: control\n(data:\{[^}]+\})\n\n", raw)


def test_sse_empty_stream_and_offset_now(client: httpx.Client, path: str) -> None:
    tail = create(client, path).headers["stream-next-offset"]
    for offset in ("-1", "now"):
        _, events, _, _ = read_sse(client, f"{path}?offset={offset}&live=sse", _up_to_date)
        assert [e for e, _ in events] == ["control"]
        control = json.loads(events[0][1])
        assert control["upToDate"] is True
        assert control["streamNextOffset"] == tail


def test_sse_json_stream(client: httpx.Client, path: str) -> None:
    create(client, path, b'[{"n":1}]', JSON_CT)
    assert client.post(path, headers=JSON_CT, content=b'{"n":2}').status_code == 204
    resp, events, _, _ = read_sse(client, f"{path}?offset=-1&live=sse", _up_to_date)
    assert "stream-sse-data-encoding" not in resp.headers
    assert_data_control_pairs(events)
    values = [v for e, d in events if e == "data" for v in json.loads(d)]
    assert values == [{"n": 1}, {"n": 2}]


def test_sse_binary_stream_is_base64(client: httpx.Client, path: str) -> None:
    payload = b"\x00\x01\n\r\xffHello"
    create(client, path, payload, BINARY)
    tail = tail_of(client, path)
    resp, events, _, _ = read_sse(client, f"{path}?offset=-1&live=sse", _up_to_date)
    assert resp.status_code == 200
    assert resp.headers["stream-sse-data-encoding"] == "base64"
    assert resp.headers["content-type"] == "text/event-stream"
    assert_data_control_pairs(events)
    decoded = b""
    for event, data in events:
        if event == "data":
            assert len(data) % 4 == 0
            decoded += base64.b64decode(data, validate=True)
    assert decoded == payload
    control = json.loads(events[-1][1])
    assert control["streamNextOffset"] == tail and control["upToDate"] is True


def test_sse_closed_stream_ends_the_response(client: httpx.Client, path: str) -> None:
    create(client, path, b"bye", {**TEXT, "stream-closed": "true"})
    tail = tail_of(client, path)
    resp, events, raw, ended = read_sse(client, f"{path}?offset=-1&live=sse")
    assert resp.status_code == 200
    assert ended, "the server must end the SSE body after the closing control event"
    assert events[0] == ("data", "bye")
    assert events[-1][0] == "control"
    last = json.loads(events[-1][1])
    assert last["streamClosed"] is True
    assert last["streamNextOffset"] == tail
    assert "streamCursor" not in last
    assert raw.endswith("\n\n")
    # At the tail of a closed stream: just the closing control, then the end.
    _, events, _, ended = read_sse(client, f"{path}?offset={tail}&live=sse")
    assert ended
    assert [e for e, _ in events] == ["control"]
    assert json.loads(events[0][1])["streamClosed"] is True


def test_sse_live_append_then_close(client: httpx.Client, path: str) -> None:
    tail = create(client, path, b"initial").headers["stream-next-offset"]

    def close_later() -> None:
        time.sleep(0.2)
        client.post(path, headers={**TEXT, "stream-closed": "true"}, content=b"final")

    writer = threading.Thread(target=close_later)
    writer.start()
    try:
        _, events, _, ended = read_sse(client, f"{path}?offset={tail}&live=sse")
    finally:
        writer.join()
    assert ended
    assert "".join(d for e, d in events if e == "data") == "final"
    assert json.loads(events[-1][1])["streamClosed"] is True
