"""A raw socket client for the edge tests: half-sent requests, dripped bytes, answers read to the close."""

from __future__ import annotations

import json
import select
import socket
import ssl
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def send(sock: socket.socket, data: bytes) -> bool:
    """Sends what the server still takes; False once it has closed its end."""
    try:
        sock.sendall(data)
        return True
    except OSError:  # BrokenPipeError, ConnectionResetError: the server answered and closed
        return False


def ready(sockets: list[socket.socket], timeout: float) -> list[socket.socket]:
    """The sockets with something to read (or closed), waiting up to `timeout` s; poll, not select: fds past 1023."""
    poller = select.poll()
    by_fd = {sock.fileno(): sock for sock in sockets}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    return [by_fd[fd] for fd, _ in poller.poll(timeout * 1000)]


def drip(sock: socket.socket, data: bytes, interval: float) -> float:
    """Sends `data` a byte every `interval` seconds until the server answers; returns when it did."""
    start = time.monotonic()
    for i in range(len(data)):
        if not send(sock, data[i : i + 1]):
            break
        if ready([sock], interval):
            break
    return time.monotonic() - start


def read_to_close(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes (a reset, or TLS without close_notify, ends it too)."""
    sock.settimeout(timeout)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (ConnectionResetError, ssl.SSLEOFError):
        pass
    return data


def read_response(sock: socket.socket, timeout: float = 10.0) -> Answer:
    """One response with a Content-Length, leaving the connection open."""
    sock.settimeout(timeout)
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        assert chunk, "the server closed mid-response"
        raw += chunk
    reply = parse(raw)
    while len(reply.body) < int(reply.headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the server closed mid-response"
        reply.body += chunk
    return reply


def parse(raw: bytes) -> Answer:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(status, headers, body)


def answer(sock: socket.socket, timeout: float = 10.0) -> Answer:
    raw = read_to_close(sock, timeout)
    assert raw, "the server closed without an answer"
    return parse(raw)


def assert_error(reply: Answer, status: int, code: str) -> None:
    """The edge's errors look like the app's: JSON error body, security headers, and a close."""
    assert reply.status == status, reply
    assert reply.headers["content-type"] == "application/json"
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert reply.headers["connection"] == "close"
    assert reply.json()["error"]["code"] == code
    assert reply.json()["error"]["message"]
