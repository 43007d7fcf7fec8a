"""`rill bench chaos`: a real cluster, real network faults from a seeded nemesis, clients recording
every operation, and the checker's verdict on the history, as a table and a JSON file."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import shutil
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from app.bench.chaos import workload
from app.bench.chaos.checker import UNAVAILABLE_BOUND_SECONDS, Verdict, check
from app.bench.chaos.cluster import ChaosCluster
from app.bench.chaos.history import History
from app.bench.chaos.nemesis import Nemesis, Step, plan
from app.bench.chaos.options import KINDS, ChaosOptions
from app.bench.chaos.proxy import ProxyHub

SETTLE_SECONDS = 60.0  # after the last heal, at most this long for every node to apply everything
CALM_SECONDS = 6.0  # clients go on at least this long after the last heal
OVERRUN_SECONDS = 120.0  # how much longer than --seconds late faults may take before the rest are dropped


def main(options: ChaosOptions, json_out: Path | None) -> int:
    kinds = [k.strip() for k in options.faults.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or options.nodes < 3:
        raise SystemExit(f"unknown faults {unknown} (choose from {', '.join(KINDS)})" if unknown else "--nodes >= 3")
    history, verdict, errors = run(options, kinds)
    print(report(options, history, verdict, errors))
    if json_out is not None:
        summary = {"options": dataclasses.asdict(options), "verdict": _verdict_json(verdict), "node_errors": errors}
        json_out.write_text(json.dumps({**summary, "history": history.to_json()}))
    return 0 if verdict.ok else 1


def run(options: ChaosOptions, kinds: list[str]) -> tuple[History, Verdict, list[str]]:
    steps = plan(options.seed, kinds, options.seconds)
    history = History(options.seed, options.nodes)
    root = Path(tempfile.mkdtemp(prefix="rill-chaos-"))
    hub = ProxyHub(options.seed)
    hub.start()
    env = {"RILL_UNSAFE_TEST_FAULT": options.broken} if options.broken else {}
    spares = sum(1 for s in steps if s.kind == "membership")
    cluster = ChaosCluster(root, options.nodes, spares, hub, options.nodes if "disk" in kinds else None, env)
    if cluster.disk_skipped:
        history.skipped.append(f"disk: {cluster.disk_skipped}")
    try:
        for node in sorted(cluster.voters):
            cluster.start(node)
        for node in sorted(cluster.voters):
            cluster.wait_healthy(node)
        cluster.leader(timeout=60)
        asyncio.run(_drive(options, cluster, history, steps))
        errors = cluster.log_errors()
        history.links = _link_totals(hub)
    finally:
        cluster.stop()
        hub.stop()
        if options.keep:
            print(f"kept the nodes' data and logs in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return history, check(history), errors


async def _drive(options: ChaosOptions, cluster: ChaosCluster, history: History, steps: list[Step]) -> None:
    urls = {n: cluster.members[n].url for n in sorted(cluster.voters)}
    clients = workload.Clients(urls, history, random.Random(options.seed))
    shape = workload.Options()
    await workload.setup(clients, shape)
    clients.t0 = time.monotonic()
    nemesis = Nemesis(cluster, clients.quiet, clients.now)
    stopping = threading.Event()
    tasks = [asyncio.create_task(client) for client in workload.clients_of(clients, shape)]
    striking = asyncio.create_task(asyncio.to_thread(nemesis.run, steps, stopping))
    try:
        await asyncio.sleep(options.seconds)
        # Faults that ran late push the rest back: all of them run, then writes go on for a settle.
        await asyncio.wait({striking}, timeout=options.seconds + OVERRUN_SECONDS)
        if nemesis.faults and nemesis.faults[-1].healed > clients.now() - CALM_SECONDS:
            await asyncio.sleep(CALM_SECONDS)
    finally:
        stopping.set()
        await striking
        clients.stopping.set()
        await asyncio.wait(tasks, timeout=15)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    history.faults, history.nemesis_errors = nemesis.faults, nemesis.log
    await asyncio.to_thread(_settle, cluster)
    history.final_leader = await asyncio.to_thread(cluster.leader, 30)
    final_urls = {n: cluster.members[n].url for n in sorted(cluster.voters)}
    history.final, history.final_offsets = await workload.final_state(final_urls, workload.stream_names(shape))
    history.subscription_final = await _subscription(final_urls)


def _link_totals(hub: ProxyHub) -> dict[str, int]:
    totals: Counter[str] = Counter()
    for stats in hub.stats().values():
        totals["bytes"] += stats["to_target"] + stats["to_client"]
        for name in ("accepted", "resets", "drops"):
            totals[name] += stats[name]
    return dict(totals)


def _settle(cluster: ChaosCluster) -> None:
    """Waits until every voter has applied what the leader has committed."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline:
        try:
            leader = cluster.leader(timeout=10)
        except RuntimeError:
            continue
        commit = cluster.health(leader).get("commit")
        applied = [cluster.health(n).get("applied") for n in sorted(cluster.voters)]
        if isinstance(commit, int) and all(isinstance(a, int) and a >= commit for a in applied):
            return
        time.sleep(0.2)


async def _subscription(urls: dict[int, str]) -> dict[str, str]:
    async with httpx.AsyncClient(timeout=10) as http:
        for base in urls.values():
            try:
                r = await http.get(f"{base}/v1/stream/__ds/subscriptions/{workload.SUBSCRIPTION}")
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                streams = r.json().get("streams", [])
                return {s["path"]: s.get("acked_offset") or "" for s in streams if isinstance(s, dict)}
    return {}


def _verdict_json(verdict: Verdict) -> dict[str, Any]:
    found = dataclasses.asdict(verdict)
    found["ok"] = verdict.ok
    return found


def report(options: ChaosOptions, history: History, verdict: Verdict, errors: list[str]) -> str:
    kinds = Counter(f.kind for f in history.faults)
    ok = sum(1 for a in history.appends if a.outcome == "ok")
    rows = [
        ("seed", options.seed),
        ("nodes", options.nodes),
        ("faults", ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + f" ({len(history.faults)})"),
        ("append attempts / acknowledged", f"{verdict.appends} / {ok} ({verdict.acknowledged} payloads)"),
        ("reads / claims / acks", f"{verdict.reads} / {verdict.claims} / {verdict.acks}"),
        ("lost / duplicated", f"{verdict.lost} / {verdict.duplicated}"),
        ("stale / backwards / uncommitted reads",
         f"{verdict.stale_reads} / {verdict.backwards_reads} / {verdict.uncommitted_reads}"),
        ("worst unavailability after a heal",
         f"{verdict.worst_unavailable:.1f} s (bound {UNAVAILABLE_BOUND_SECONDS:.0f} s)"),
        ("peer traffic through the proxies",
         f"{history.links.get('bytes', 0) / 2**20:.1f} MiB, {history.links.get('accepted', 0)} connections, "
         f"{history.links.get('resets', 0)} reset, {history.links.get('drops', 0)} dropped"),
        ("violations", len(verdict.violations)),
    ]  # fmt: skip
    lines = [f"rill bench chaos{' (BROKEN BUILD: ' + options.broken + ')' if options.broken else ''}"]
    lines += [f"  {name:<40} {value}" for name, value in rows]
    lines += [f"  skipped: {s}" for s in history.skipped]
    lines += [f"  the nemesis failed: {e}" for e in history.nemesis_errors]
    if verdict.violations:
        lines.append(
            f"\nVIOLATIONS (replay with --seed {options.seed} --nodes {options.nodes} --faults {options.faults})"
        )
        lines.append("fault timeline:")
        lines += [f"  {f.start:7.1f}-{f.healed:7.1f} s  {f.kind}: {f.detail}" for f in history.faults]
        by_kind = Counter(v.kind for v in verdict.violations)
        lines.append("violations by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items())))
        for v in verdict.violations[:10]:
            during = [f.kind for f in history.faults if f.start <= v.at <= max(f.healed, f.start) + 1.0]
            lines.append(f"- [{v.kind}] at {v.at:.2f} s (during: {', '.join(during) or 'no fault'}): {v.message}")
            lines += [f"    {json.dumps(op)[:300]}" for op in v.excerpt]
    if errors:
        lines.append("\nnode log errors:")
        lines += [f"  {e}" for e in errors[:80]]
    return "\n".join(lines)
