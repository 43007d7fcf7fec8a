"""Helpers for the /ds stream sub-resource tests (test_ds_*.py): snapshot, bootstrap, retention, attrs, append-batch.

Streams there are /ds streams with offsets `0000000000000000_<position>`; `create` (unlike helpers.create) appends
each body separately, so every offset it returns is a record boundary.
"""

from __future__ import annotations

import hashlib
import http.client
import re
import socket
import struct
from pathlib import Path

import httpx

from tests.http.helpers import TEXT
from tests.server import RillProcess

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
SIXTY_FOUR_MIB = 64 * 1024 * 1024


def off(pos: int) -> str:
    return f"0000000000000000_{pos:016d}"


def sha(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def create(client: httpx.Client, path: str, *appends: bytes, headers: dict[str, str] | None = None) -> list[str]:
    """Creates the stream (empty), appends each body separately; the offsets: [empty tail, after 1st, ...]."""
    hdrs = TEXT if headers is None else headers
    resp = client.put(path, headers=hdrs)
    assert resp.status_code == 201, resp.text
    offsets = [resp.headers["stream-next-offset"]]
    for body in appends:
        resp = client.post(path, headers={"content-type": hdrs.get("content-type", "text/plain")}, content=body)
        assert resp.status_code == 204, resp.text
        offsets.append(resp.headers["stream-next-offset"])
    return offsets


def tail(client: httpx.Client, path: str) -> str:
    resp = client.head(path)
    assert resp.status_code == 200
    return resp.headers["stream-next-offset"]


def read(client: httpx.Client, path: str, offset: str = "-1") -> httpx.Response:
    resp = client.get(path, params={"offset": offset})
    assert resp.status_code == 200, resp.text
    return resp


def frames(*payloads: bytes) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + p for p in payloads)


def parse_multipart(resp: httpx.Response) -> list[tuple[str, bytes]]:
    """(content type, body) of each part of a multipart/mixed response, split by its boundary."""
    main, _, params = resp.headers["content-type"].partition(";")
    assert main.strip().lower() == "multipart/mixed", resp.headers
    found = re.search(r'boundary="?([^";\s]+)"?', params)
    assert found, params
    delimiter = b"\r\n--" + found.group(1).encode()
    pieces = (b"\r\n" + resp.content).split(delimiter)
    assert pieces[0] == b"", "the body must start with the first boundary"
    assert pieces[-1].startswith(b"--") and pieces[-1][2:].strip() == b"", "missing close delimiter"
    parts = []
    for piece in pieces[1:-1]:
        assert piece.startswith(b"\r\n"), piece[:40]
        head, sep, body = piece[2:].partition(b"\r\n\r\n")
        assert sep, piece[:200]
        headers = {}
        for line in head.decode("latin-1").split("\r\n"):
            name, colon, value = line.partition(":")
            assert colon, line
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            assert int(headers["content-length"]) == len(body)
        parts.append((headers.get("content-type", "text/plain"), body))
    return parts


def declared_only(rill: RillProcess, method: str, path: str, length: int, content_type: str) -> httpx.Response:
    """Sends only the head of a request declaring a `length`-byte body, and reads the answer."""
    with socket.create_connection(("127.0.0.1", rill.port), timeout=5) as sock:
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{rill.port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {length}\r\nConnection: close\r\n\r\n"
        )
        sock.sendall(head.encode())
        raw = http.client.HTTPResponse(sock)
        raw.begin()
        body = raw.read()
        return httpx.Response(raw.status, headers=raw.getheaders(), content=body)


def snapshot_files(rill: RillProcess) -> set[str]:
    return {p.name for p in Path(rill.data_dir, "cold").rglob("*.bin")}
