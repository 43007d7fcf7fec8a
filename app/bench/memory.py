"""`rill bench memory`: how far one large append lifts the server's peak resident memory.

It exits 0 whatever the ratio, unless --max-ratio is given and exceeded, or an append fails.
Each shape runs on a fresh `rill serve` (VmHWM is a per-process high-water mark), or with
--follower on a fresh 3-node cluster: create the streams, wait until the nodes are idle, read
VmRSS, reset VmHWM to it where Linux allows (clear_refs), send the append(s) to the leader, read
the leader's VmHWM, wait until each follower has applied them, read theirs. The ratio is the peak
increase over the bytes sent: about 1 means the node held the body once; each extra copy adds
about 1.
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

from app.bench.memory_cluster import applied_everywhere, base, leader_first, log_errors, start_cluster
from app.bench.proc import MIB, alive, peak_rss, reset_peak, rss, wait_idle
from app.bench.report import machine, write_json
from app.bench.servers import Server, start_rill

# JSON shapes: the per-message cost of a JSON append depends on how many messages a body holds.
SHAPES = {
    "binary": "random bytes",
    "json": "an array of ~1 KiB objects",
    "tiny": "[0,0,...]: a message every 2 bytes",
    "string": "an array of one string",
    "objects": 'small objects as json.dumps writes them: [{"a": 0}, {"a": 0}, ...]',
    "nested": "arrays of arrays: [[0,[0,[0]]],...]",
}
GROUPS = {"both": ("binary", "json"), "all": tuple(SHAPES)}
ATTEMPTS = 5


@dataclass
class MemoryOptions:
    body_mib: float = 64.0
    kind: str = "both"  # a shape of SHAPES, several joined by commas, both (binary,json) or all
    concurrent: int = 1  # appends sent at once, each to its own stream
    max_ratio: float | None = None  # exit 1 when a kind's ratio (leader or follower) is above this
    # Then seconds of background work (the record tiered to the cold store), reported as its own peak.
    settle_seconds: float = 5.0
    follower: bool = False  # each shape on a 3-node cluster: the leader's peak and each follower's
    # With --follower: the nodes' Raft tick (an election takes 10 without word from the leader); unset,
    # the server's 0.1 s. A longer one keeps a loaded machine's leader through a large append.
    raft_tick_seconds: float | None = None
    pin_server: int | None = None


def kinds(option: str) -> tuple[str, ...]:
    names = GROUPS.get(option) or tuple(k.strip() for k in option.split(",") if k.strip())
    unknown = [k for k in names if k not in SHAPES]
    if unknown or not names:
        raise SystemExit(f"--kind must be {', '.join(SHAPES)} (or several, comma-separated), both or all")
    return names


def make_body(kind: str, size: int) -> bytes:
    """A body of `kind` about `size` bytes long (JSON ones within an item of it)."""
    if kind == "binary":
        return os.urandom(size)
    if kind == "json":  # each object padded to 1023 bytes, so with its comma the array is `size` give or take one
        items = [b'{"i":%d,"pad":"%s"}' % (i, b"x" * (1008 - len(str(i)))) for i in range(max(size // 1024, 1))]
        return b"[" + b",".join(items) + b"]"
    if kind == "string":
        return b'["' + b"x" * max(size - 4, 0) + b'"]'
    item, sep = {"tiny": (b"0", b","), "objects": (b'{"a": 0}', b", "), "nested": (b"[0,[0,[0]]]", b",")}[kind]
    n = max((size - 2 + len(sep)) // (len(item) + len(sep)), 1)
    return b"[" + (item + sep) * (n - 1) + item + b"]"


def measure(kind: str, opts: MemoryOptions) -> dict[str, Any]:
    """One shape on fresh server(s); a cluster that fails it (on a loaded machine its leader may
    change under a large append: a 503 to retry) is replaced by a fresh one, up to ATTEMPTS times."""
    for attempt in range(1, ATTEMPTS + 1):
        result = _measure_once(kind, opts)
        result["attempts"] = attempt
        if not opts.follower or "error" not in result:
            break
    return result


def _measure_once(kind: str, opts: MemoryOptions) -> dict[str, Any]:
    size = int(opts.body_mib * MIB)
    bodies = [make_body(kind, size) for _ in range(max(opts.concurrent, 1))]
    limit = max(len(b) for b in bodies) + MIB
    content_type = "application/octet-stream" if kind == "binary" else "application/json"
    extra = ["--max-body-bytes", str(limit)]
    first = {"kind": kind, "appends": len(bodies), "body_mib": len(bodies[0]) / MIB}
    with tempfile.TemporaryDirectory(prefix="rill-memory-") as tmp:
        try:
            if opts.follower:
                tick = {} if opts.raft_tick_seconds is None else {"RILL_RAFT_TICK_SECONDS": str(opts.raft_tick_seconds)}
                servers = leader_first(start_cluster(Path(tmp), opts.pin_server, extra, tick))
            else:
                servers = [start_rill(Path(tmp) / "rill", opts.pin_server, extra)]
        except RuntimeError as exc:
            return {**first, "error": str(exc)}
        try:
            result = _run(servers, first, bodies, content_type, opts)
        finally:
            for server in servers:
                server.stop()
        if "error" in result and opts.follower:
            result["node_errors"] = log_errors(Path(tmp))
    return result


def _run(
    servers: list[Server], first: dict[str, Any], bodies: list[bytes], content_type: str, opts: MemoryOptions
) -> dict[str, Any]:
    pids = [s.process.pid for s in servers]
    try:
        urls = _create(base(servers[0]), len(bodies), content_type)
    except httpx.HTTPError as exc:
        return {**first, "error": f"creating the streams failed: {exc}"}
    for pid in pids:
        wait_idle(pid)
    before, peak_before = [rss(pid) for pid in pids], [peak_rss(pid) for pid in pids]
    reset = all([reset_peak(pid) for pid in pids])
    start = time.perf_counter()
    statuses, error = asyncio.run(_append(urls, bodies, content_type))
    seconds = time.perf_counter() - start
    up = alive(pids[0])
    peaks, after = [peak_rss(pids[0]) if up else 0], [rss(pids[0]) if up else 0]
    if not error and len(servers) > 1:  # followers: once they have applied what the leader committed
        error = applied_everywhere([base(s) for s in servers])
        peaks += [peak_rss(pid) if alive(pid) else 0 for pid in pids[1:]]
        after += [rss(pid) if alive(pid) else 0 for pid in pids[1:]]
    error = error or next((f"{s.name} died" for s in servers if not alive(s.process.pid)), "")
    if error:
        return {**first, "error": error}
    time.sleep(opts.settle_seconds)
    settled = [peak_rss(pid) for pid in pids]
    sent = sum(len(b) for b in bodies)
    nodes = [
        {
            "role": "leader" if i == 0 else "follower",
            "rss_before_mib": before[i] / MIB,
            "peak_before_mib": peak_before[i] / MIB,
            "peak_after_mib": peaks[i] / MIB,
            "rss_after_mib": after[i] / MIB,
            "peak_increase_mib": (peaks[i] - before[i]) / MIB,
            "ratio": (peaks[i] - before[i]) / sent,
            "settled_peak_increase_mib": (settled[i] - before[i]) / MIB,
            "settled_ratio": (settled[i] - before[i]) / sent,
            "settled_rss_mib": rss(pid) / MIB,
        }
        for i, pid in enumerate(pids)
    ]
    result = {**first, "sent_mib": sent / MIB, "statuses": statuses, "seconds": seconds, "peak_reset": reset}
    result |= nodes[0]  # the leader's figures, as a single server's always were
    if len(nodes) > 1:
        worst = max(nodes[1:], key=lambda n: n["ratio"])
        result["followers"] = nodes[1:]
        result["follower_peak_increase_mib"], result["follower_ratio"] = worst["peak_increase_mib"], worst["ratio"]
        result["follower_settled_ratio"] = max(n["settled_ratio"] for n in nodes[1:])
    return result


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
            tries = f" ({r['attempts']} attempts)" if r.get("attempts", 1) > 1 else ""
            print(f"[{r['kind']}] {r['appends']} append(s) of {r['body_mib']:.1f} MiB: FAILED{tries}, {r['error']}")
            for line in r.get("node_errors", []):
                print(f"  {line}")
            continue
        print(f"[{r['kind']}] {r['appends']} append(s) of {r['body_mib']:.1f} MiB, {r['sent_mib']:.1f} MiB sent")
        print(f"  {'append time':<22}{r['seconds']:.2f} s (statuses {', '.join(map(str, r['statuses']))})")
        if r.get("attempts", 1) > 1:
            print(f"  {'attempts':<22}{r['attempts']} (the leader changed under the earlier ones)")
        for i, node in enumerate([r, *r.get("followers", [])]):
            if "followers" in r:
                print(f"  {'leader' if i == 0 else f'follower {i}'}")
            _print_node(node)
        if not r["peak_reset"]:
            print(f"  note: VmHWM could not be reset; the start-up peak was {r['peak_before_mib']:.1f} MiB")
    done = [r for r in results if "error" not in r]
    if done:
        _print_table(done)
    if max_ratio is not None and len(done) == len(results):
        worst = max(max(r["ratio"], r.get("follower_ratio", 0)) for r in results)
        print(f"max ratio {max_ratio:g}: {'PASS' if worst <= max_ratio else 'FAIL'} (worst {worst:.2f})")


def _print_node(n: dict[str, Any]) -> None:
    rows = [
        ("RSS before", f"{n['rss_before_mib']:.1f} MiB"),
        ("peak (VmHWM) after", f"{n['peak_after_mib']:.1f} MiB"),
        ("RSS after", f"{n['rss_after_mib']:.1f} MiB"),
        ("peak increase", f"{n['peak_increase_mib']:.1f} MiB"),
        ("ratio increase/body", f"{n['ratio']:.2f}"),
        (
            "with tiering after",
            f"peak increase {n['settled_peak_increase_mib']:.1f} MiB, "
            f"ratio {n['settled_ratio']:.2f}, RSS then {n['settled_rss_mib']:.1f} MiB",
        ),
    ]
    for label, value in rows:
        print(f"  {label:<22}{value}")


def _print_table(results: list[dict[str, Any]]) -> None:
    """One Markdown row per shape: what docs/benchmarks.md shows."""
    cluster = "followers" in results[0]
    head = ["shape", "body", "leader: append" if cluster else "append", "with tiering"]
    head += ["follower: append", "with tiering"] if cluster else []
    print("\n| " + " | ".join(head) + " |\n|" + " --- |" * len(head))
    for r in results:
        cells = [r["kind"], f"{r['sent_mib']:.1f} MiB", _cell(r["peak_increase_mib"], r["ratio"])]
        cells.append(_cell(r["settled_peak_increase_mib"], r["settled_ratio"]))
        if "followers" in r:
            worst = max(r["followers"], key=lambda n: n["ratio"])
            settled = max(r["followers"], key=lambda n: n["settled_ratio"])
            cells += [_cell(worst["peak_increase_mib"], worst["ratio"])]
            cells += [_cell(settled["settled_peak_increase_mib"], settled["settled_ratio"])]
        print("| " + " | ".join(cells) + " |")


def _cell(mib: float, ratio: float) -> str:
    return f"+{mib:.0f} MiB ({ratio:.2f}×)"


def main(opts: MemoryOptions, json_out: Path | None) -> int:
    shapes = kinds(opts.kind)
    results = [measure(kind, opts) for kind in shapes]  # in sequence: each on its own fresh server(s)
    print_memory(results, opts.max_ratio)
    if json_out:
        write_json(json_out, "memory", dataclasses.asdict(opts), {r["kind"]: r for r in results})
    failed = any("error" in r for r in results)  # no measurement at all: not a figure to trust
    worst = max((max(r.get("ratio", 0), r.get("follower_ratio", 0)) for r in results), default=0)
    return 1 if failed or (opts.max_ratio is not None and worst > opts.max_ratio) else 0
