"""`rill bench cold`: catch-up reads of data that lives only in the object store, against fetching
the same segment objects straight from S3 with boto3, in the same run on the same endpoint.

Without --store it starts moto's S3 server (a separate process) on 127.0.0.1; with --store and
--s3-endpoint-url it uses an existing S3 (MinIO, AWS) with the usual AWS_* credentials.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import urllib3

from app.bench.servers import _wait, free_port, start_rill
from app.tiering.store import S3Store, StoreOptions, open_store

MOTO_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class ColdOptions:
    megabytes: int = 128
    streams: int = 4
    append_kib: int = 256
    segment_mib: int = 8
    rounds: int = 3
    store: str = ""  # s3://bucket/prefix; empty: start moto's server
    s3_endpoint_url: str = ""
    pin_server: int | None = None


@contextmanager
def _moto() -> Iterator[str]:
    port = free_port()
    cmd = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(process, f"http://127.0.0.1:{port}/")
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait()


def run_cold(options: ColdOptions) -> dict[str, dict[str, Any]]:
    return on_s3(options.store, options.s3_endpoint_url, "cold", lambda url, ep, env: _run(options, url, ep, env))


T = TypeVar("T")


def on_s3(store: str, endpoint: str, prefix: str, run: Callable[[str, str | None, dict[str, str]], T]) -> T:
    """`run(store URL, endpoint, the servers' extra env)` on the S3 store given, or, with none, on
    moto's server started for it (bucket `rill-bench`, under `prefix`)."""
    if store:
        return run(store, endpoint or None, {})
    os.environ.update({k: v for k, v in MOTO_ENV.items() if k not in os.environ})
    with _moto() as started:
        made = open_store(f"s3://rill-bench/{prefix}", StoreOptions(endpoint_url=started))
        assert isinstance(made, S3Store)
        made.client.create_bucket(Bucket="rill-bench")
        return run(f"s3://rill-bench/{prefix}", started, MOTO_ENV)


def _run(options: ColdOptions, store_url: str, endpoint: str | None, env: dict[str, str]) -> dict[str, dict[str, Any]]:
    store = open_store(store_url, StoreOptions(endpoint_url=endpoint))
    extra = ["--cold-store", store_url, "--segment-max-bytes", str(options.segment_mib << 20)]
    extra += ["--segment-max-age", "1", "--local-disk-budget", "0"]
    if endpoint:
        extra += ["--s3-endpoint-url", endpoint]
    with tempfile.TemporaryDirectory(prefix="rill-bench-cold-") as tmp:
        server = start_rill(Path(tmp) / "rill", options.pin_server, extra, env)
        base = server.url.removesuffix("/v1/stream")
        try:
            with httpx.Client(base_url=base, timeout=60) as client:
                bucket = f"bench{int(time.time())}"
                names = _write(client, bucket, options)
                _wait_tiered(client)
                keys = [k for k in store.list(f"{bucket}/") if k.endswith(".parquet")]
                # urllib3 on both sides: boto3 fetches with it too, so the client costs the same.
                pool = urllib3.HTTPConnectionPool("127.0.0.1", int(base.rsplit(":", 1)[1]), maxsize=1)
                http_s, boto_s = [], []
                for _ in range(options.rounds):
                    start = time.perf_counter()
                    payload = sum(_read_stream(pool, f"/ds/{bucket}/{name}") for name in names)
                    http_s.append(time.perf_counter() - start)
                    start = time.perf_counter()
                    fetched = sum(len(store.get(key)) for key in keys)
                    boto_s.append(time.perf_counter() - start)
        finally:
            server.stop()
    mb = payload / 1e6
    http, boto = statistics.median(http_s), statistics.median(boto_s)
    return {
        "rill catch-up read (HTTP)": {"objects": len(keys), "mb": mb, "seconds_median": http, "mb_per_s": mb / http},
        "boto3 get_object": {
            "objects": len(keys),
            "mb": fetched / 1e6,
            "seconds_median": boto,
            "mb_per_s": fetched / 1e6 / boto,
        },
    }


def _write(client: httpx.Client, bucket: str, options: ColdOptions) -> list[str]:
    client.put(f"/ds/{bucket}").raise_for_status()
    names = [f"s{i}" for i in range(options.streams)]
    per_stream = (options.megabytes << 20) // options.streams
    headers = {"content-type": "application/octet-stream"}
    for name in names:
        client.put(f"/ds/{bucket}/{name}", headers=headers).raise_for_status()
        for _ in range(max(1, per_stream // (options.append_kib << 10))):
            client.post(f"/ds/{bucket}/{name}", content=os.urandom(options.append_kib << 10), headers=headers)
    return names


def _wait_tiered(client: httpx.Client, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = client.get("/healthz").json()["tiering"]
        if status["untiered_bytes"] == 0 and status["local_bytes"] == 0:
            return
        time.sleep(0.2)
    raise RuntimeError("the data was not tiered and evicted in time")


def _read_stream(pool: urllib3.HTTPConnectionPool, path: str) -> int:
    offset, total = "-1", 0
    while True:
        r = pool.request("GET", f"{path}?offset={offset}")
        if r.status != 200:
            raise RuntimeError(f"GET {path} answered {r.status}: {r.data[:200]!r}")
        total += len(r.data)
        offset = r.headers["stream-next-offset"]
        if r.headers.get("stream-up-to-date") == "true":
            return total
