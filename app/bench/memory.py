"""`rill bench memory`: how far one large append lifts the server's peak resident memory.

It exits 0 whatever the ratio, unless --max-ratio is given and exceeded, or an append fails.
Each kind runs on a fresh `rill serve` (VmHWM is a per-process high-water mark): create the
streams, wait until the server is idle, read VmRSS, reset VmHWM to it where Linux allows
(clear_refs), send the append(s), then read VmHWM. The ratio is the peak increase over the bytes
sent: about 1 means the server held the body once; each extra copy adds about 1.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.bench.proc import MIB, alive, peak_rss, reset_peak, rss, wait_idle
from app.bench.report import machine, write_json
from app.bench.servers import start_rill

KINDS = ("binary", "json")


@dataclass
class MemoryOptions:
    body_mib: float = 64.0
    kind: str = "both"  # binary, json or both (each on its own server)
    concurrent: int = 1  # appends sent at once, each to its own stream
    max_ratio: float | None = None  # exit 1 when a kind's ratio is above this
    # Then seconds of background work (the record tiered to the cold store), reported as its own peak.
    settle_seconds: float = 5.0
    pin_server: int | None = None


def make_body(kind: str, size: int) -> bytes:
    """`size` random bytes, or a JSON array of ~1 KiB objects about `size` long."""
    if kind == "binary":
        return os.urandom(size)
    # Each object padded to 1023 bytes, so with its comma the array is `size` bytes give or take one.
    items = [b'{"i":%d,"pad":"%s"}' % (i, b"x" * (1008 - len(str(i)))) for i in range(max(size // 1024, 1))]
    return b"[" + b",".join(items) + b"]"


def measure(kind: str, opts: MemoryOptions) -> dict[str, Any]:
    size = int(opts.body_mib * MIB)
    bodies = [make_body(kind, size) for _ in range(max(opts.concurrent, 1))]
    limit = max(len(b) for b in bodies) + MIB
    content_type = "application/json" if kind == "json" else "application/octet-stream"
    with tempfile.TemporaryDirectory(prefix="rill-memory-") as tmp:
        server = start_rill(Path(tmp) / "rill", opts.pin_server, ["--max-body-bytes", str(limit)])
        base, pid = server.url.removesuffix("/v1/stream"), server.process.pid
        try:
            urls = _create(base, len(bodies), content_type)
            wait_idle(pid)
            before, peak_before = rss(pid), peak_rss(pid)
            reset = reset_peak(pid)
            start = time.perf_counter()
            statuses, error = asyncio.run(_append(urls, bodies, content_type))
            seconds = time.perf_counter() - start
            error = error or ("" if alive(pid) else "the server died")
            peak, after = (peak_rss(pid), rss(pid)) if not error else (0, 0)
            if not error:
                time.sleep(opts.settle_seconds)
                settled, settled_after = peak_rss(pid), rss(pid)
        finally:
            server.stop()
    if error:
        return {"kind": kind, "appends": len(bodies), "body_mib": len(bodies[0]) / MIB, "error": error}
    sent = sum(len(b) for b in bodies)
    increase = peak - before
    return {
        "kind": kind,
        "appends": len(bodies),
        "body_mib": len(bodies[0]) / MIB,
        "sent_mib": sent / MIB,
        "statuses": statuses,
        "seconds": seconds,
        "rss_before_mib": before / MIB,
        "peak_before_mib": peak_before / MIB,
        "peak_reset": reset,
        "peak_after_mib": peak / MIB,
        "rss_after_mib": after / MIB,
        "peak_increase_mib": increase / MIB,
        "ratio": increase / sent,
        "settled_peak_increase_mib": (settled - before) / MIB,
        "settled_ratio": (settled - before) / sent,
        "settled_rss_mib": settled_after / MIB,
    }


def _create(base: str, n: int, content_type: str) -> list[str]:
    urls = [f"{base}/ds/memory/s{i}" for i in range(n)]
    with httpx.Client(timeout=30) as client:
        client.put(f"{base}/ds/memory").raise_for_status()
        for url in urls:
            client.put(url, headers={"content-type": content_type}).raise_for_status()
    return urls


async def _append(urls: list[str], bodies: list[bytes], content_type: str) -> tuple[list[int], str]:
    """Statuses of the appends sent at once, and what went wrong if any did not succeed."""
    headers = {"content-type": content_type}
    async with httpx.AsyncClient(timeout=600) as client:
        sends = (client.post(url, content=body, headers=headers) for url, body in zip(urls, bodies, strict=True))
        try:
            replies = await asyncio.gather(*sends)
        except httpx.HTTPError as exc:
            return [], f"the append failed: {type(exc).__name__}: {exc}"
    failed = [r for r in replies if not r.is_success]
    error = f"the append answered {failed[0].status_code}: {failed[0].text[:200]}" if failed else ""
    return [r.status_code for r in replies], error


def print_memory(results: list[dict[str, Any]], max_ratio: float | None) -> None:
    m = machine()
    print(f"rill bench memory  machine: {m['cores']} cores, load {m['load_1m']} (1 min), {m['date']}")
    for r in results:
        if "error" in r:
            print(f"[{r['kind']}] {r['appends']} append(s) of {r['body_mib']:.1f} MiB: FAILED, {r['error']}")
            continue
        print(f"[{r['kind']}] {r['appends']} append(s) of {r['body_mib']:.1f} MiB, {r['sent_mib']:.1f} MiB sent")
        rows = [
            ("append time", f"{r['seconds']:.2f} s (statuses {', '.join(map(str, r['statuses']))})"),
            ("RSS before", f"{r['rss_before_mib']:.1f} MiB"),
            ("peak (VmHWM) after", f"{r['peak_after_mib']:.1f} MiB" + ("" if r["peak_reset"] else " (not reset)")),
            ("RSS after", f"{r['rss_after_mib']:.1f} MiB"),
            ("peak increase", f"{r['peak_increase_mib']:.1f} MiB"),
            ("ratio increase/body", f"{r['ratio']:.2f}"),
            (
                "with tiering after",
                f"peak increase {r['settled_peak_increase_mib']:.1f} MiB, "
                f"ratio {r['settled_ratio']:.2f}, RSS then {r['settled_rss_mib']:.1f} MiB",
            ),
        ]
        for label, value in rows:
            print(f"  {label:<22}{value}")
        if not r["peak_reset"]:
            print(f"  note: VmHWM could not be reset; the start-up peak was {r['peak_before_mib']:.1f} MiB")
    if max_ratio is not None and all("ratio" in r for r in results):
        worst = max(r["ratio"] for r in results)
        print(f"max ratio {max_ratio:g}: {'PASS' if worst <= max_ratio else 'FAIL'} (worst {worst:.2f})")


def main(opts: MemoryOptions, json_out: Path | None) -> int:
    if opts.kind not in (*KINDS, "both"):
        raise SystemExit(f"--kind must be binary, json or both, not {opts.kind!r}")
    kinds = KINDS if opts.kind == "both" else (opts.kind,)
    results = [measure(kind, opts) for kind in kinds]  # in sequence: each on its own fresh server
    print_memory(results, opts.max_ratio)
    if json_out:
        write_json(json_out, "memory", dataclasses.asdict(opts), {r["kind"]: r for r in results})
    failed = any("error" in r for r in results)  # no measurement at all: not a figure to trust
    too_high = opts.max_ratio is not None and any(r.get("ratio", 0) > opts.max_ratio for r in results)
    return 1 if failed or too_high else 0
