"""`rill bench soak`: a long mixed load at a fixed rate, watching the server's memory and fds, then a
check that every acknowledged append is stored exactly once.

The scheduler is open-loop: request i starts at start + i/rate whether or not earlier ones have
answered, so a slow server builds a backlog instead of quietly slowing the load down. The mix (see
`soak_abuse.MIX`) is half appends, a third reads (catch-up, long-poll, SSE) and the rest bad or
abandoned requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import tempfile
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.bench.proc import MIB, Samples, alive
from app.bench.report import machine, write_json
from app.bench.run import Run
from app.bench.servers import cpu_seconds, start_rill
from app.bench.soak_abuse import MIX
from app.bench.soak_records import Verdict
from app.bench.soak_traffic import Traffic
from app.bench.stats import client_cpu, percentile


@dataclass
class SoakOptions:
    seconds: float = 600.0
    rate: float = 200.0  # requests started per second, all kinds together
    streams: int = 8  # half binary, half JSON
    url: str = ""  # a running server's root (http://host:port); empty: start `rill serve` on a temp dir
    pid: int | None = None  # with --url: the server's process id, to sample its RSS, fds and CPU
    max_body_bytes: int = 65536  # passed to the server started here; with --url, the server's limit
    long_poll_timeout: float = 3.0  # passed to the server started here; with --url, give the server's (20)
    sample_every: float = 10.0  # seconds between RSS/fd samples
    seed: int = 1
    pin_server: int | None = None


@dataclass
class Schedule:
    started: int = 0
    skipped: int = 0  # not started: too many requests already in flight (the generator fell behind)
    lags: list[float] = dataclasses.field(default_factory=list)  # how late each start was, seconds
    client_exceptions: int = 0  # bugs in the generator itself, reported, never hidden
    cancelled_at_end: int = 0


def run_soak(opts: SoakOptions) -> dict[str, Any]:
    if opts.url:
        return asyncio.run(_soak(opts, opts.url.rstrip("/"), opts.pid))
    extra = ["--max-body-bytes", str(opts.max_body_bytes), "--long-poll-timeout", str(opts.long_poll_timeout)]
    with tempfile.TemporaryDirectory(prefix="rill-soak-") as tmp:
        server = start_rill(Path(tmp) / "rill", opts.pin_server, extra)
        try:
            return asyncio.run(_soak(opts, server.url.removesuffix("/v1/stream"), server.process.pid))
        finally:
            server.stop()


async def _soak(opts: SoakOptions, base: str, pid: int | None) -> dict[str, Any]:
    run = Run([base])
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, run.stop)  # Ctrl-C: stop the load early, still verify and report
    traffic = Traffic(
        base, f"soak{uuid.uuid4().hex[:8]}", opts.streams, opts.max_body_bytes, opts.long_poll_timeout, opts.seed
    )
    try:
        await traffic.setup()
        samples = Samples(pid) if pid else None
        server_cpu_start = cpu_seconds(pid) if pid else 0.0
        if samples:
            samples.take()
        cpu, start = client_cpu(), loop.time()
        schedule = Schedule()
        inflight: set[asyncio.Task[None]] = set()
        load = asyncio.create_task(_schedule(run, traffic, opts, schedule, inflight))
        sampler = asyncio.create_task(_sample(run, samples, opts.sample_every))
        await run.progress("soak", opts.seconds, [load])
        await load
        sent_for = loop.time() - start
        await _drain(inflight, schedule, opts.long_poll_timeout + 35)
        wall = loop.time() - start
        cpu = client_cpu() - cpu
        sampler.cancel()
        await traffic.close()  # our idle keep-alive connections would count among the server's fds
        await asyncio.sleep(1)  # let the server notice the closed connections before the last sample
        died = pid is not None and not alive(pid)
        server_cpu = None
        if samples and not died:
            samples.take()
            server_cpu = cpu_seconds(samples.pid) - server_cpu_start
        healthy = await _healthy(base)
        verdict = await _verify(traffic) if healthy else None
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        await traffic.close()
    result = _result(opts, traffic, schedule, sent_for, wall, cpu, samples, server_cpu)
    result.update(_verdict(verdict))
    result["stored_mib"] = traffic.stored_bytes / MIB
    result["server_alive"] = healthy and not died
    if run.stopped():
        result["note"] = "stopped early (Ctrl-C or the server died)"
    result["failures"] = _failures(result, verdict)
    return result


async def _schedule(
    run: Run, traffic: Traffic, opts: SoakOptions, schedule: Schedule, inflight: set[asyncio.Task[None]]
) -> None:
    loop = asyncio.get_running_loop()
    kinds, weights = list(MIX), [weight for weight, _ in MIX.values()]
    start = loop.time()
    total = int(opts.seconds * opts.rate)
    for i in range(total):
        if run.stopped():
            return
        due = start + i / opts.rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        schedule.lags.append(max(loop.time() - due, 0.0))
        if len(inflight) >= 5000:
            schedule.skipped += 1
            continue
        kind = traffic.rng.choices(kinds, weights)[0]
        task = asyncio.create_task(_guarded(traffic, kind, schedule))
        inflight.add(task)
        task.add_done_callback(inflight.discard)
        schedule.started += 1


async def _guarded(traffic: Traffic, kind: str, schedule: Schedule) -> None:
    try:
        await MIX[kind][1](traffic)
    except Exception as exc:  # a generator bug must not end the run; it is counted and shown
        schedule.client_exceptions += 1
        traffic.tally.note(f"client exception in {kind}: {type(exc).__name__}: {exc}"[:300])


async def _drain(inflight: set[asyncio.Task[None]], schedule: Schedule, timeout: float) -> None:
    """Waits for started requests (long-polls and SSE readers included) to finish; cancels stragglers."""
    if inflight:
        _, pending = await asyncio.wait(set(inflight), timeout=timeout)
        schedule.cancelled_at_end = len(pending)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


async def _sample(run: Run, samples: Samples | None, every: float) -> None:
    while samples is not None:
        await asyncio.sleep(every)
        if not alive(samples.pid):
            run.stop()  # the server died: stop sending, report what happened
            return
        samples.take()


async def _healthy(base: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        async with httpx.AsyncClient(timeout=10) as client:
            return (await client.get(f"{base}/healthz")).status_code == 200
    return False


async def _verify(traffic: Traffic) -> Verdict:
    stored: dict[str, Counter[str]] = {}
    junk: dict[str, int] = {}
    for stream in traffic.streams:
        stored[stream.name], junk[stream.name] = await traffic.read_back(stream)
    return traffic.ledger.verify(stored, junk)


def _result(
    opts: SoakOptions,
    traffic: Traffic,
    schedule: Schedule,
    sent_for: float,
    wall: float,
    cpu: float,
    samples: Samples | None,
    server_cpu: float | None,
) -> dict[str, Any]:
    t = traffic.tally
    lags = sorted(schedule.lags)
    result: dict[str, Any] = {
        "seconds": sent_for,
        "wall_seconds": wall,  # the load plus waiting for the last long-polls and SSE readers
        "rate_target": opts.rate,
        "started": schedule.started,
        "started_per_second": schedule.started / sent_for if sent_for else 0.0,
        "skipped": schedule.skipped,
        "start_lag_p99_ms": percentile(lags, 99) * 1000 if lags else 0.0,
        "start_lag_max_ms": lags[-1] * 1000 if lags else 0.0,
        "requests_by_kind": dict(sorted(t.by_kind.items())),
        "statuses_by_kind": {k: dict(sorted(v.items())) for k, v in sorted(t.kind_statuses.items())},
        "statuses": dict(sorted(t.statuses.items())),
        "connection_errors": dict(sorted(t.connection_errors.items())),
        "connection_error_types": dict(sorted(t.error_types.items())),
        "bad_5xx": t.bad_5xx,
        "read_corrupt": t.read_corrupt,
        "sse_events": t.sse_events,
        "client_exceptions": schedule.client_exceptions,
        "cancelled_at_end": schedule.cancelled_at_end,
        "client_cpu_seconds": cpu,
        "client_cpu_share": cpu / wall if wall else 0.0,  # of one core
        "server_cpu_seconds": server_cpu,
        "server_cpu_share": server_cpu / wall if server_cpu is not None and wall else None,
        "examples": t.examples,
    }
    result.update(samples.summary() if samples else {})
    return result


def _verdict(v: Verdict | None) -> dict[str, Any]:
    if v is None:
        return {"verified": False}
    fields = dataclasses.asdict(v)
    examples = fields.pop("examples")
    return {"verified": True, **fields, "verify_examples": examples}


def _failures(result: dict[str, Any], verdict: Verdict | None) -> list[str]:
    failures = []
    if not result["server_alive"]:
        failures.append("the server died or stopped answering /healthz")
    if verdict is None:
        failures.append("the streams could not be read back, so nothing was verified")
    elif not verdict.ok():
        failures.append("stored data does not match what was acknowledged (see lost/duplicated/torn/foreign)")
    if result["bad_5xx"]:
        failures.append(f"{result['bad_5xx']} 5xx answers other than 503/507 with Retry-After")
    if result["read_corrupt"]:
        failures.append(f"{result['read_corrupt']} reads returned bytes that do not parse back into records")
    return failures


def main(opts: SoakOptions, json_out: Path | None) -> int:
    result = run_soak(opts)
    print_soak(result)
    if json_out:
        write_json(json_out, "soak", dataclasses.asdict(opts), {"server": result})
    return 1 if result["failures"] else 0


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}: {v:,}" for k, v in counts.items()) or "none"


def print_soak(r: dict[str, Any]) -> None:
    m = machine()
    print(f"rill bench soak  machine: {m['cores']} cores, load {m['load_1m']} (1 min), {m['date']}")
    rows: list[tuple[str, str]] = [
        ("duration", f"{r['seconds']:.1f} s of load, {r['wall_seconds']:.1f} s with the last live readers"),
        ("rate", f"{r['started_per_second']:.1f} req/s started (target {r['rate_target']:g}), {r['skipped']} skipped"),
        ("start lag", f"p99 {r['start_lag_p99_ms']:.1f} ms, max {r['start_lag_max_ms']:.1f} ms"),
        ("requests", f"{sum(r['requests_by_kind'].values()):,}"),
    ]
    rows += [
        (f"  {kind}", f"{n:,}  ({_counts(r['statuses_by_kind'].get(kind, {}))})")
        for kind, n in r["requests_by_kind"].items()
    ]
    rows += [
        ("status counts", _counts(r["statuses"])),
        ("connection errors", f"{sum(r['connection_errors'].values())}  ({_counts(r['connection_error_types'])})"),
        ("bad 5xx", str(r["bad_5xx"])),
    ]
    if "rss_start_mib" in r:
        rows.append(
            (
                "server RSS MiB",
                f"start {r['rss_start_mib']:.1f}  max {r['rss_max_mib']:.1f}  end {r['rss_end_mib']:.1f}",
            )
        )
        rows.append(("server open fds", f"start {r['fds_start']}  max {r['fds_max']}  end {r['fds_end']}"))
        rows.append(("samples", str(r["samples"])))
        trend = "  ".join(f"{t:.0f}s {mib:.0f}/{fds}" for t, mib, fds in r["trend"])
        rows.append(("RSS MiB/fds over time", trend))
    else:
        rows.append(("server RSS MiB", "n/a (pass --pid with --url)"))
    if r["verified"]:
        rows += [
            ("acknowledged appends", f"{r['acknowledged']:,}  ({r['stored_mib']:.1f} MiB stored in all)"),
            ("lost", str(r["lost"])),
            ("duplicated", str(r["duplicated"])),
            ("torn", str(r["torn"])),
            ("rejected but stored", str(r["rejected_but_stored"])),
            ("foreign records", str(r["foreign"])),
            ("unanswered appends", f"{r['unknown']} ({r['unknown_stored']} of them stored, once)"),
        ]
    else:
        rows.append(("verification", "not done: the server was not answering"))
    rows += [
        ("corrupt reads", str(r["read_corrupt"])),
        ("sse events read", f"{r['sse_events']:,}"),
        ("client exceptions", str(r["client_exceptions"])),
        (
            "client CPU",
            f"{r['client_cpu_seconds']:.2f} s over {r['wall_seconds']:.1f} s ({r['client_cpu_share']:.0%} of a core)",
        ),
    ]
    if r["server_cpu_seconds"] is not None:
        rows.append(("server CPU", f"{r['server_cpu_seconds']:.2f} s ({r['server_cpu_share']:.0%} of a core)"))
    rows.append(("server alive", "yes" if r["server_alive"] else "NO"))
    width = max(len(label) for label, _ in rows) + 2
    for label, value in rows:
        print(f"{label:<{width}}{value}")
    for example in r["examples"] + r.get("verify_examples", []):
        print(f"  note: {example}")
    if "note" in r:
        print(f"note: {r['note']}")
    print("result".ljust(width) + ("PASS" if not r["failures"] else "FAIL: " + "; ".join(r["failures"])))
