"""`rill bench packing`: what packs save, in one run on one S3 endpoint. Two servers get the same
many small streams (one append each), one packing them (the default) and one giving each stream its
own segment (`pack_below_bytes = 0`); the table compares the objects each wrote, how long the Spark
source's planner takes over the bucket, and the latency of a cold read of one small stream (every
record evicted, each stream read once, so every read fetches from the store), alternating between
the two servers read by read so both see the same noise.

Without --store it starts moto's S3 server on 127.0.0.1 (each request costs what a local HTTP round
trip costs, so the number of GETs per read shows); with --store and --s3-endpoint-url it uses an
existing S3 with the usual AWS_* credentials.
"""

from __future__ import annotations

import random
import resource
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.bench.cold import _wait_tiered, on_s3
from app.bench.servers import Server, start_rill
from app.tiering.store import StoreOptions, open_store


@dataclass
class PackingOptions:
    streams: int = 10_000
    append_bytes: int = 64
    reads: int = 300  # cold reads per server, each of a different stream
    writers: int = 8  # client threads creating streams
    store: str = ""  # s3://bucket/prefix; empty: start moto's server
    s3_endpoint_url: str = ""
    pin_server: int | None = None


def run_packing(options: PackingOptions) -> dict[str, dict[str, Any]]:
    return on_s3(options.store, options.s3_endpoint_url, "packing", lambda url, ep, env: _run(options, url, ep, env))


def _run(
    options: PackingOptions, store_url: str, endpoint: str | None, env: dict[str, str]
) -> dict[str, dict[str, Any]]:
    kinds = {"packed": "", "own segments": "0"}
    results: dict[str, dict[str, Any]] = {}
    servers: dict[str, Server] = {}
    bucket = f"bench{int(time.time())}"
    with tempfile.TemporaryDirectory(prefix="rill-bench-packing-") as tmp:
        try:
            for kind, below in kinds.items():
                prefix = f"{store_url}/{kind.replace(' ', '-')}"
                extra = ["--cold-store", prefix, "--segment-max-age", "1", "--local-disk-budget", "0"]
                extra += ["--s3-endpoint-url", endpoint] if endpoint else []
                server_env = {**env, "RILL_COLD_CACHE_BYTES": str(1 << 20)}
                if below:
                    server_env["RILL_PACK_BELOW_BYTES"] = below
                servers[kind] = start_rill(Path(tmp) / kind.replace(" ", "-"), options.pin_server, extra, server_env)
                base = servers[kind].url.removesuffix("/v1/stream")
                started = time.perf_counter()
                _write(base, bucket, options)
                written = time.perf_counter() - started
                with httpx.Client(base_url=base, timeout=60) as client:
                    _wait_tiered(client)
                objects = list(open_store(prefix, StoreOptions(endpoint_url=endpoint)).list(f"{bucket}/"))
                results[kind] = {
                    "streams": options.streams,
                    "objects": len(objects),
                    "write_s": round(written, 1),
                    "plan_s": _plan_seconds(prefix, endpoint, bucket),
                }
            latencies = _cold_reads(servers, bucket, options)
        finally:
            for server in servers.values():
                server.stop()
    for kind, samples in latencies.items():
        results[kind]["cold_read_p50_ms"] = round(statistics.median(samples) * 1000, 2)
        results[kind]["cold_read_p99_ms"] = round(_p99(samples) * 1000, 2)
    usage = resource.getrusage(resource.RUSAGE_SELF)  # the client: threads writing, then one reader
    for row in results.values():
        row["client_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)
    return results


def _write(base: str, bucket: str, options: PackingOptions) -> None:
    httpx.put(f"{base}/ds/{bucket}", timeout=30).raise_for_status()
    headers = {"content-type": "application/octet-stream"}
    body = b"x" * options.append_bytes

    def create(names: range) -> None:
        with httpx.Client(base_url=base, timeout=60) as client:
            for i in names:
                client.put(f"/ds/{bucket}/s{i:06d}", headers=headers, content=body).raise_for_status()

    share = -(-options.streams // options.writers)
    with ThreadPoolExecutor(options.writers) as pool:
        parts = [range(start, min(options.streams, start + share)) for start in range(0, options.streams, share)]
        list(pool.map(create, parts))


def _plan_seconds(store_url: str, endpoint: str | None, bucket: str) -> float:
    """The Spark source's planning of a batch read of the whole bucket (the median of three)."""
    from app.pipeline.planning import plan

    options = {"store": store_url, "bucket": bucket, "include_hot": "false"}
    if endpoint:
        options["s3_endpoint_url"] = endpoint
    times = []
    for _ in range(3):
        started = time.perf_counter()
        plan(options)
        times.append(time.perf_counter() - started)
    return round(statistics.median(times), 3)


def _cold_reads(servers: dict[str, Server], bucket: str, options: PackingOptions) -> dict[str, list[float]]:
    """Each server reads `reads` different streams whole, once each, alternating server by server."""
    rng = random.Random(1)
    streams = rng.sample(range(options.streams), min(options.reads, options.streams))
    clients = {kind: httpx.Client(base_url=s.url.removesuffix("/v1/stream"), timeout=30) for kind, s in servers.items()}
    samples: dict[str, list[float]] = {kind: [] for kind in servers}
    try:
        for i in streams:
            for kind, client in clients.items():
                started = time.perf_counter()
                response = client.get(f"/ds/{bucket}/s{i:06d}", params={"offset": "-1"})
                samples[kind].append(time.perf_counter() - started)
                if response.status_code != 200 or len(response.content) != options.append_bytes:
                    raise RuntimeError(f"{kind}: read of s{i:06d} answered {response.status_code}")
    finally:
        for client in clients.values():
            client.close()
    return samples


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
