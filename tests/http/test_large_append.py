"""Appends past 1 MiB on a real process: stored as chunks, read back whole after a SIGKILL and a
restart, and from the cold store once tiered and evicted."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx

from tests.server import RillProcess

BINARY = {"content-type": "application/octet-stream"}
JSON_CT = {"content-type": "application/json"}


def _reads(client: httpx.Client, path: str) -> list[bytes]:
    """Bodies of reads following Stream-Next-Offset until up to date: one read is about 1 MiB at most."""
    bodies, offset = [], "-1"
    while True:
        resp = client.get(path, params={"offset": offset})
        assert resp.status_code == 200, resp.text
        bodies.append(resp.content)
        offset = resp.headers["stream-next-offset"]
        if resp.headers.get("stream-up-to-date") == "true":
            return bodies


def _read_bytes(client: httpx.Client, path: str) -> bytes:
    return b"".join(_reads(client, path))


def _read_messages(client: httpx.Client, path: str) -> list[object]:
    return [m for body in _reads(client, path) for m in json.loads(body)]


def _json_body(n: int, spaced: bool) -> bytes:
    items = [json.dumps({"i": i, "pad": "x" * 1000}).encode() for i in range(n)]
    return b"[" + (b", " if spaced else b",").join(items) + b"]"


def test_large_appends_survive_a_kill_and_read_back_from_the_cold_store(tmp_path: Path) -> None:
    server = RillProcess(tmp_path / "data", None, "--segment-max-age", "0.2", "--local-disk-budget", "0").start()
    binary = os.urandom(9 << 20)
    tight, spaced = _json_body(3000, spaced=False), _json_body(3000, spaced=True)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            assert client.put("/ds/large").status_code == 201
            assert client.put("/ds/large/b", headers=BINARY).status_code == 201
            assert client.put("/ds/large/j", headers=JSON_CT).status_code == 201
            assert client.post("/ds/large/b", headers=BINARY, content=binary).status_code == 204
            assert client.post("/ds/large/b", headers=BINARY, content=b"tail").status_code == 204
            for body in (tight, spaced):
                assert client.post("/ds/large/j", headers=JSON_CT, content=body).status_code == 204
        server.kill()
        server.start()
        with httpx.Client(base_url=server.url, timeout=60) as client:
            expected = json.loads(tight) + json.loads(spaced)
            assert _read_bytes(client, "/ds/large/b") == binary + b"tail"
            assert _read_messages(client, "/ds/large/j") == expected
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                tiering = client.get("/healthz").json()["tiering"]
                if tiering["untiered_bytes"] == 0 and tiering["local_bytes"] == 0:
                    break
                time.sleep(0.2)
            assert tiering["untiered_bytes"] == tiering["local_bytes"] == 0, tiering
            assert _read_bytes(client, "/ds/large/b") == binary + b"tail"
            assert _read_messages(client, "/ds/large/j") == expected
            assert list((tmp_path / "data" / "cold").rglob("*.parquet"))
    finally:
        server.stop()
