"""`rill tail` as a subprocess: live output, reconnects (the server ends SSE responses and
long-polls after a second here), the end of a closed stream, and Ctrl-C, also when it lands inside httpx."""

from __future__ import annotations

import base64
import contextlib
import queue
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import Background
from tests.server import RillProcess

# `python -c HOLD_POOL_LOCK FLAG ARGV...` runs `rill ARGV` with httpcore's connection-pool lock held for
# 5 s the first time it is taken (FLAG, a file, is created then): the window between the lock's acquire
# and its `with` block, a few bytecodes wide, in which a busy machine once let a Ctrl-C land.
HOLD_POOL_LOCK = """
import sys, time
from pathlib import Path
from httpcore import _synchronization
from app.cli.program import main

flag = Path(sys.argv.pop(1))
enter = _synchronization.ThreadLock.__enter__

def held_enter(self):
    enter(self)
    if not flag.exists():
        flag.touch()
        time.sleep(5)
    return self

_synchronization.ThreadLock.__enter__ = held_enter
main()
"""


@pytest.fixture(scope="module")
def bucket(server: RillProcess) -> str:
    assert httpx.put(server.url + "/ds/tails").status_code == 201
    return server.url + "/ds/tails"


def _stream(url: str, content_type: str) -> str:
    assert httpx.put(url, headers={"content-type": content_type}).status_code == 201
    return httpx.head(url).headers["stream-next-offset"]


def _append(url: str, body: bytes, content_type: str) -> None:
    assert httpx.post(url, content=body, headers={"content-type": content_type}).status_code == 204


def _close(url: str) -> None:
    assert httpx.post(url, headers={"stream-closed": "true"}).status_code == 204


def test_sse_tail_of_a_json_stream_ends_when_it_is_closed(bucket: str) -> None:
    url = bucket + "/sse-json"
    start = _stream(url, "application/json")
    _append(url, b'[{"before": true}]', "application/json")
    tail = Background("tail", url, "--sse", "--from", start)  # from the start: nothing is missed
    try:
        assert tail.line() == b'{"before":true}\n'
        _append(url, b'[{"n": 1}, {"n": 2}]', "application/json")
        assert [tail.line(), tail.line()] == [b'{"n":1}\n', b'{"n":2}\n']
        time.sleep(1.3)  # the SSE response ends after a second here: the tail reconnects
        _append(url, b'{"after": "a reconnect"}', "application/json")  # the SSE response ended meanwhile
        assert tail.line() == b'{"after":"a reconnect"}\n'
        _close(url)
        code, err = tail.wait()
        assert code == 0 and err == ""
    finally:
        tail.stop()


def test_sse_tail_of_a_binary_stream_decodes_base64(bucket: str) -> None:
    url = bucket + "/sse-binary"
    start = _stream(url, "application/octet-stream")
    tail = Background("tail", url, "--from", start)  # SSE is the default
    try:
        payload = bytes(range(256)) + b"\n"
        _append(url, payload, "application/octet-stream")
        _close(url)
        code, err = tail.wait()
        assert code == 0 and err == ""
        received = tail.rest()
        assert received == payload, base64.b64encode(received)
    finally:
        tail.stop()


def test_long_poll_tail_of_a_text_stream(bucket: str) -> None:
    url = bucket + "/long-poll-text"
    _stream(url, "text/plain")
    _append(url, b"old\n", "text/plain")
    after_old = httpx.head(url).headers["stream-next-offset"]
    tail = Background("tail", url, "--long-poll", "--from", after_old)  # the old line is not shown
    try:
        time.sleep(2.5)  # the first long-polls time out (after 1 s here) and are asked again
        _append(url, b"new 1\n", "text/plain")
        assert tail.line() == b"new 1\n"
        _append(url, b"new 2\n", "text/plain")
        assert tail.line() == b"new 2\n"
        _close(url)
        code, err = tail.wait()
        assert code == 0 and err == ""
    finally:
        tail.stop()


def test_tail_from_now_skips_what_is_there(bucket: str) -> None:
    url = bucket + "/from-now"
    _stream(url, "text/plain")
    _append(url, b"old\n", "text/plain")
    tail = Background("tail", url)  # --from now, over SSE
    try:
        first = None
        for _ in range(60):  # append until the tail, once connected, shows one
            _append(url, b"new\n", "text/plain")
            with contextlib.suppress(queue.Empty):
                first = tail.line(timeout=0.5)
                break
        assert first == b"new\n"
        _close(url)
        assert tail.wait()[0] == 0
        assert set(tail.rest().splitlines()) <= {b"new"}  # never the old line
    finally:
        tail.stop()


def test_ctrl_c_ends_a_tail_quietly(bucket: str) -> None:
    url = bucket + "/interrupted"
    start = _stream(url, "text/plain")
    tail = Background("tail", url, "--from", start)
    try:
        _append(url, b"seen\n", "text/plain")
        assert tail.line() == b"seen\n"
        tail.proc.send_signal(signal.SIGINT)
        code, err = tail.wait()
        assert code == 0 and err == ""
    finally:
        tail.stop()


def test_ctrl_c_while_httpx_holds_its_pool_lock_ends_a_tail_quietly(bucket: str, tmp_path: Path) -> None:
    """A KeyboardInterrupt raised with the pool lock taken made httpcore's cleanup (and the client's
    close) wait for that lock forever: the tail hung. Ctrl-C must not land inside httpx at all."""
    url = bucket + "/interrupted-in-a-lock"
    start = _stream(url, "text/plain")
    flag = tmp_path / "lock-held"
    tail = Background("tail", url, "--from", start, launcher=("-c", HOLD_POOL_LOCK, str(flag)))
    try:
        deadline = time.monotonic() + 30  # starting (imports) takes seconds on a busy machine
        while not flag.exists():
            assert tail.proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        tail.proc.send_signal(signal.SIGINT)
        code, err = tail.wait()
        assert code == 0 and err == ""
    finally:
        tail.stop()
