"""SSE fan-out on a real server: many subscribers at the tail get every byte once, in order; a
subscriber that stops reading is disconnected without holding the others back; a reader that
falls out of the shared tail continues from disk with no gap and no duplicate."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server import RillProcess

STREAM = "/v1/stream/fan"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RillProcess]:
    env = {
        "RILL_SSE_BUFFER_BYTES": str(64 << 10),
        "RILL_TAIL_STREAM_BYTES": str(32 << 10),  # small rings, so readers fall out of them
        "RILL_SSE_PING_SECONDS": "0.5",
    }
    proc = RillProcess(tmp_path_factory.mktemp("fanout") / "data", None, env=env).start()
    yield proc
    proc.stop()


class Reader(threading.Thread):
    """An SSE client that follows a stream, reconnecting from its last offset as clients do."""

    def __init__(self, url: str, offset: str = "now", reconnect: bool = True) -> None:
        super().__init__(daemon=True)
        self.url, self.offset, self.reconnect = url, offset, reconnect
        self.data = bytearray()
        self.ready = threading.Event()
        self.stop = threading.Event()
        self.connections = 0
        self.pings = 0

    def run(self) -> None:
        while not self.stop.is_set():
            self.connections += 1
            try:
                with httpx.stream("GET", f"{self.url}?offset={self.offset}&live=sse", timeout=10) as resp:
                    event, lines = None, []
                    for line in resp.iter_lines():
                        if line.startswith(":"):
                            self.pings += 1
                        elif line.startswith("event:"):
                            event = line[6:].strip()
                        elif line.startswith("data:"):
                            lines.append(line[5:])
                        elif line == "" and event is not None:
                            self._event(event, "\n".join(lines))
                            event, lines = None, []
                        if self.stop.is_set():
                            return
            except httpx.HTTPError:
                time.sleep(0.05)
            if not self.reconnect:
                return

    def _event(self, event: str, data: str) -> None:
        if event == "data":
            self.data += base64.b64decode(data)
        elif event == "control":
            self.offset = json.loads(data)["streamNextOffset"]
            self.ready.set()


def _create(url: str) -> None:
    httpx.delete(url)
    assert httpx.put(url, headers={"content-type": "application/octet-stream"}).status_code == 201


def test_every_subscriber_gets_every_byte_once_in_order(server: RillProcess) -> None:
    url = server.url + STREAM + "-many"
    _create(url)
    readers = [Reader(url) for _ in range(40)]
    for r in readers:
        r.start()
    for r in readers:
        assert r.ready.wait(10)
    sent = bytearray()
    with httpx.Client() as client:
        for i in range(200):
            chunk = f"{i:05d}|".encode() * (1 + i % 7)
            assert client.post(url, content=chunk, headers={"content-type": "application/octet-stream"}).is_success
            sent += chunk
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(len(r.data) < len(sent) for r in readers):
        time.sleep(0.05)
    for r in readers:
        r.stop.set()
    assert all(bytes(r.data) == bytes(sent) for r in readers)


def test_a_subscriber_that_stops_reading_is_dropped_and_the_others_go_on(server: RillProcess) -> None:
    url = server.url + STREAM + "-slow"
    _create(url)
    path = url.removeprefix(server.url)
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # a small window, and it never reads
    stuck.connect(("127.0.0.1", server.port))
    stuck.sendall(f"GET {path}?offset=now&live=sse HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    reader = Reader(url)
    reader.start()
    assert reader.ready.wait(10)
    time.sleep(0.2)
    sent = 0
    payload = b"z" * 16384
    with httpx.Client() as client:
        for _ in range(400):  # 8.7 MB of base64: past the kernel's socket buffers and the 64 KiB limit
            assert client.post(url, content=payload, headers={"content-type": "application/octet-stream"}).is_success
            sent += len(payload)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and len(reader.data) < sent:
        time.sleep(0.05)
    reader.stop.set()
    assert len(reader.data) == sent and set(reader.data) == {ord("z")}
    stuck.settimeout(5)
    received = 0
    try:
        while chunk := stuck.recv(1 << 16):  # what was in flight, then the end: the server let it go
            received += len(chunk)
    except ConnectionResetError:
        pass  # reset: the server dropped what it had buffered for us
    stuck.close()
    assert received < sent * 4 // 3, "the server stopped writing to a reader that stopped reading (base64 data)"


def test_a_reader_behind_the_shared_tail_continues_from_disk(server: RillProcess, tmp_path: Path) -> None:
    url = server.url + STREAM + "-behind"
    _create(url)
    sent = bytearray()
    with httpx.Client() as client:
        for i in range(100):  # 100 KiB, past the 32 KiB ring
            chunk = bytes([i]) * 1024
            assert client.post(url, content=chunk, headers={"content-type": "application/octet-stream"}).is_success
            sent += chunk
        reader = Reader(url, offset="-1")
        reader.start()
        assert reader.ready.wait(10)
        for i in range(100, 120):
            chunk = bytes([i]) * 1024
            assert client.post(url, content=chunk, headers={"content-type": "application/octet-stream"}).is_success
            sent += chunk
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len(reader.data) < len(sent):
        time.sleep(0.05)
    reader.stop.set()
    assert bytes(reader.data) == bytes(sent)


def test_idle_subscribers_get_pings(server: RillProcess) -> None:
    url = server.url + STREAM + "-idle"
    _create(url)
    reader = Reader(url)
    reader.start()
    assert reader.ready.wait(10)
    time.sleep(1.6)
    reader.stop.set()
    assert reader.pings >= 1
