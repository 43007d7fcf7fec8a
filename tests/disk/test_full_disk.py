"""Real `rill serve` processes on a small tmpfs: the 507 guard, ENOSPC in the append path, and a
start on a full disk. Each test mounts its own tmpfs (root only; skipped otherwise)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from app.cluster import log_store
from app.storage.kv import Batch
from app.storage.rocks import RocksKV
from tests.disk.conftest import MIB, Tmpfs
from tests.server import RillProcess

BINARY = {"content-type": "application/octet-stream"}
RECORD = 256 << 10

Mount = Callable[[int], Tmpfs]


def _env(watermark: int, ballast: int) -> dict[str, str]:
    return {
        "RILL_DISK_MIN_FREE_BYTES": str(watermark),
        "RILL_DISK_MIN_FREE_RATIO": "1",  # the byte watermark applies as given, even on a tiny disk
        "RILL_DISK_BALLAST_BYTES": str(ballast),
    }


def _record(i: int) -> bytes:
    return bytes([i % 256]) * RECORD


def _read_all(client: httpx.Client, stream: str = "s") -> bytes:
    out, offset = b"", "-1"
    while True:
        r = client.get(f"/v1/stream/{stream}", params={"offset": offset})
        assert r.status_code == 200, r.text
        out += r.content
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return out


def _append_until_refused(client: httpx.Client, first: int = 0) -> tuple[list[bytes], httpx.Response]:
    acked: list[bytes] = []
    for i in range(first, first + 200):
        r = client.post("/v1/stream/s", content=_record(i), headers=BINARY)
        if r.status_code not in (200, 204):
            return acked, r
        acked.append(_record(i))
    raise AssertionError("the disk never filled")


def _assert_507(r: httpx.Response) -> None:
    assert r.status_code == 507, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "insufficient_storage"


def _until_appended(client: httpx.Client, body: bytes, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        r = client.post("/v1/stream/s", content=body, headers=BINARY)
        if r.status_code in (200, 204):
            return
        _assert_507(r)
        assert time.monotonic() < deadline, "writes never resumed after space was freed"
        time.sleep(0.1)


@pytest.fixture()
def serve() -> Iterator[Callable[[Tmpfs, dict[str, str]], RillProcess]]:
    """`serve(fs, env)` runs a node whose data directory is the whole tmpfs (its log stays outside)."""
    started: list[RillProcess] = []

    def start(fs: Tmpfs, env: dict[str, str]) -> RillProcess:
        server = RillProcess(fs.path, None, env=env)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def test_appends_get_507_below_the_watermark_and_resume_when_the_disk_grows(
    tmpfs: Mount, serve: Callable[[Tmpfs, dict[str, str]], RillProcess]
) -> None:
    fs = tmpfs(24 * MIB)
    server = serve(fs, _env(watermark=4 * MIB, ballast=MIB))
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.put("/v1/stream/s", headers=BINARY).status_code == 201
        assert client.put("/v1/stream/other", headers=BINARY, content=b"x").status_code == 201
        acked, refused = _append_until_refused(client)
        _assert_507(refused)
        assert len(acked) > 5
        assert fs.free() > 2 * MIB  # refused before the disk filled
        assert _read_all(client) == b"".join(acked)
        assert client.get("/healthz").status_code == 200
        assert client.put("/v1/stream/new", headers=BINARY).status_code == 507  # creating adds data too
        assert client.delete("/v1/stream/other").status_code == 204  # deleting frees space: allowed
        assert server.alive()
        fs.resize(48 * MIB)
        _until_appended(client, b"after")
        assert _read_all(client) == b"".join(acked) + b"after"


def test_enospc_in_the_log_write_answers_507_and_the_node_recovers(
    tmpfs: Mount, serve: Callable[[Tmpfs, dict[str, str]], RillProcess]
) -> None:
    fs = tmpfs(24 * MIB)
    env = _env(watermark=0, ballast=0)  # no guard: the write itself meets ENOSPC
    server = serve(fs, env)
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.put("/v1/stream/s", headers=BINARY).status_code == 201
        acked = [_record(i) for i in range(4)]
        for body in acked:
            assert client.post("/v1/stream/s", content=body, headers=BINARY).status_code in (200, 204)
        filler = fs.fill()
        more, refused = _append_until_refused(client, first=len(acked))
        acked += more
        _assert_507(refused)
        _assert_507(client.post("/v1/stream/s", content=b"again", headers=BINARY))
        assert server.alive()
        assert client.get("/healthz").status_code == 200
        assert _read_all(client) == b"".join(acked)  # the refused appends left nothing behind
        filler.unlink()
        _until_appended(client, b"after")
        assert _read_all(client) == b"".join(acked) + b"after"
    server.stop()  # and it all survives a restart from the reopened stores
    server.start()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert _read_all(client) == b"".join(acked) + b"after"


@pytest.mark.parametrize("shutdown", ["stop", "kill"])
def test_a_node_starts_on_a_full_disk_serves_reads_and_refuses_writes(
    tmpfs: Mount, serve: Callable[[Tmpfs, dict[str, str]], RillProcess], shutdown: str
) -> None:
    """After a clean stop the ballast gives the stores room to open; after kill -9 (logs to replay)
    and with no ballast, they open read-only."""
    fs = tmpfs(24 * MIB)
    server = serve(fs, _env(watermark=4 * MIB, ballast=MIB if shutdown == "stop" else 0))
    acked = [_record(i) for i in range(8)]
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.put("/v1/stream/s", headers=BINARY).status_code == 201
        for body in acked:
            assert client.post("/v1/stream/s", content=body, headers=BINARY).status_code in (200, 204)
    server.stop() if shutdown == "stop" else server.kill()
    filler = fs.fill()
    assert fs.free() == 0
    server.start()
    with httpx.Client(base_url=server.url, timeout=10) as client:
        assert client.get("/healthz").status_code == 200
        assert _read_all(client) == b"".join(acked)
        _assert_507(client.post("/v1/stream/s", content=b"x", headers=BINARY))
        filler.unlink()
        _until_appended(client, b"after")
        assert _read_all(client) == b"".join(acked) + b"after"


def test_a_rocksdb_store_reopens_once_space_returns(tmpfs: Mount) -> None:
    fs = tmpfs(8 * MIB)
    kv = RocksKV(fs.path / "raft", log_store.COLUMN_FAMILIES)
    written = 0
    with pytest.raises(Exception, match="No space left on device"):
        while True:
            batch = Batch()
            batch.put(log_store.LOG_CF, written.to_bytes(8, "big"), b"v" * 65536)
            kv.write(batch)
            written += 1
    assert not kv.recover()  # full: RocksDB keeps refusing writes
    assert kv.get(log_store.LOG_CF, (written - 1).to_bytes(8, "big")) == b"v" * 65536  # reads still work
    fs.resize(32 * MIB)
    assert kv.recover()
    batch = Batch()
    batch.put(log_store.LOG_CF, written.to_bytes(8, "big"), b"after")
    kv.write(batch)
    assert sum(1 for _ in kv.scan(log_store.LOG_CF, b"")) == written + 1
    kv.close()


def _until(
    client: httpx.Client, method: str, path: str, ok: tuple[int, ...], timeout: float = 15.0, **kw: object
) -> None:
    """Retries a request the full disk refuses (507) until it succeeds."""
    deadline = time.monotonic() + timeout
    while True:
        r = client.request(method, path, **kw)  # type: ignore[arg-type]
        if r.status_code in ok:
            return
        _assert_507(r)
        assert time.monotonic() < deadline, f"{method} {path} stayed refused: {r.text}"
        time.sleep(0.1)


def _fill_until_refused(client: httpx.Client, fs: Tmpfs) -> tuple[list[bytes], Path]:
    acked = [_record(i) for i in range(4)]
    for body in acked:
        assert client.post("/v1/stream/s", content=body, headers=BINARY).status_code in (200, 204)
    filler = fs.fill()
    more, refused = _append_until_refused(client, first=len(acked))
    _assert_507(refused)
    return acked + more, filler


def test_once_free_space_passes_the_watermark_deletes_closes_and_writes_resume_without_a_restart(
    tmpfs: Mount, serve: Callable[[Tmpfs, dict[str, str]], RillProcess]
) -> None:
    """The disk filled by something else, the stores met ENOSPC; freeing a little more than the
    watermark /healthz shows (which covers what the stores need to reopen) is enough."""
    fs = tmpfs(48 * MIB)
    server = serve(fs, _env(watermark=2 * MIB, ballast=0))
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for stream in ("s", "other", "closing"):
            assert client.put(f"/v1/stream/{stream}", headers=BINARY, content=b"x").status_code == 201
        acked, filler = _fill_until_refused(client, fs)
        time.sleep(0.6)  # free space is measured at most every 0.5 s
        disk = client.get("/healthz").json()["disk"]
        assert disk["writes_refused"] and disk["watermark_bytes"] > 2 * MIB  # the stores' reopen counted in
        os.truncate(filler, max(0, filler.stat().st_size - disk["watermark_bytes"] - MIB))
        _until(client, "DELETE", "/v1/stream/other", (204,))
        _until(client, "POST", "/v1/stream/closing", (200, 204), headers={"stream-closed": "true"})
        assert client.head("/v1/stream/closing").headers.get("stream-closed") == "true"
        _until_appended(client, b"after")
        assert _read_all(client) == b"x" + b"".join(acked) + b"after"
        assert server.alive()


def test_on_a_full_disk_the_ballast_makes_room_for_deletes(
    tmpfs: Mount, serve: Callable[[Tmpfs, dict[str, str]], RillProcess]
) -> None:
    fs = tmpfs(64 * MIB)
    server = serve(fs, _env(watermark=2 * MIB, ballast=24 * MIB))
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for stream in ("s", "other"):
            assert client.put(f"/v1/stream/{stream}", headers=BINARY, content=b"x").status_code == 201
        assert client.get("/healthz").json()["disk"]["ballast"]
        acked, filler = _fill_until_refused(client, fs)
        _until(client, "DELETE", "/v1/stream/other", (204,))  # nothing else freed: the ballast's room
        assert client.get("/v1/stream/other").status_code == 404
        assert _read_all(client) == b"x" + b"".join(acked)
        filler.unlink()
        _until_appended(client, b"after")
        assert server.alive()
