"""`rill bench WORKLOAD --url URL ...`, `rill bench compare WORKLOAD ...`, and the server-health
commands `rill bench soak`, `rill bench memory` and `rill bench chaos`."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from app.bench import chores, memory, patterns, soak
from app.bench.append import AppendOptions, run_append
from app.bench.chaos.options import ChaosOptions
from app.bench.cold import ColdOptions, run_cold
from app.bench.fanout import FanoutOptions, run_fanout
from app.bench.packing import PackingOptions, run_packing
from app.bench.replay import ReplayOptions, run_replay
from app.bench.replication import ReplicationOptions, run_replication
from app.bench.report import markdown_table, print_results, write_json
from app.bench.run import Run
from app.bench.servers import Server, cpu_seconds, fsync_ms, start_baseline, start_reference, start_rill
from app.bench.subscriptions import SubscriptionOptions, run_subscriptions
from app.bench.webhooks import WebhookOptions, run_webhooks

Workload = tuple[type, Callable[[Run, Any], Awaitable[dict[str, Any]]]]
WORKLOADS: dict[str, Workload] = {
    "append": (AppendOptions, run_append),
    "fanout": (FanoutOptions, run_fanout),
    "replay": (ReplayOptions, run_replay),
}


# Workloads that start the servers they measure, and report a table of their own.
SELF_HOSTED: dict[str, tuple[type, Callable[[Any], dict[str, dict[str, Any]]]]] = {
    "cold": (ColdOptions, run_cold),
    "packing": (PackingOptions, run_packing),
    "webhooks": (WebhookOptions, run_webhooks),
    "subscriptions": (SubscriptionOptions, run_subscriptions),
    "replication": (ReplicationOptions, run_replication),
}


def _add_options(parser: argparse.ArgumentParser, options: type, table: bool = True) -> None:
    for f in dataclasses.fields(options):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", help=f"(default {f.default})")
        else:
            kind = {"int": int, "float": float, "int | None": int, "float | None": float}.get(str(f.type), str)
            parser.add_argument(flag, type=kind, default=f.default, help=f"(default {f.default})")
    parser.add_argument("--json-out", type=Path, help="also write the results as JSON here")
    if table:
        parser.add_argument("--markdown-out", type=Path, help="also write the table as Markdown here")
    parser.add_argument("--pin-client", type=int, metavar="CPU", help="run the load generator on this CPU only")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="measure a Durable Streams server (any implementation)")
    workloads = bench.add_subparsers(dest="workload", required=True)
    for name, (options, _) in WORKLOADS.items():
        p = workloads.add_parser(name, help=f"the {name} workload")
        p.add_argument(
            "--url", action="append", required=True, help="stream prefix, e.g. http://127.0.0.1:4437/v1/stream"
        )
        _add_options(p, options)
    cold = workloads.add_parser("cold", help="catch-up reads from the object store vs boto3 fetching the same objects")
    _add_options(cold, ColdOptions)
    packed = workloads.add_parser(
        "packing", help="objects, Spark planning and cold-read latency of many small streams, packed or not"
    )
    _add_options(packed, PackingOptions)
    hooks = workloads.add_parser("webhooks", help="webhook deliveries/s and latency with many subscriptions")
    _add_options(hooks, WebhookOptions)
    subs = workloads.add_parser(
        "subscriptions", help="idle CPU, append p99 and wake latency with many subscriptions on a 3-node cluster"
    )
    _add_options(subs, SubscriptionOptions)
    replicated = workloads.add_parser(
        "replication", help="CPU per replicated append and throughput: 3 nodes (HTTP, channels) against 1, alternating"
    )
    _add_options(replicated, ReplicationOptions)
    workloads.add_parser("patterns", help="subscription patterns against 1 KiB stream names, worst shapes first")
    chores = workloads.add_parser(
        "chores", help="one tiering pass and one expiry sweep, with few and with many streams"
    )
    chores.add_argument("--streams", type=int, nargs="+", default=[0, 100_000], help="idle streams (default 0 100000)")
    chores.add_argument(
        "--served",
        type=int,
        metavar="SECONDS",
        help="instead: a real server given idle TTL streams for SECONDS, then appends",
    )
    soaked = workloads.add_parser(
        "soak", help="long mixed load at a fixed rate: leaks, 5xx, lost or duplicated appends"
    )
    _add_options(soaked, soak.SoakOptions, table=False)
    chaotic = workloads.add_parser(
        "chaos", help="a real cluster under network faults, kills and pauses; every acknowledged write checked"
    )
    _add_options(chaotic, ChaosOptions, table=False)
    mem = workloads.add_parser("memory", help="peak server memory during one large append, per body byte")
    _add_options(mem, memory.MemoryOptions, table=False)
    compare = workloads.add_parser("compare", help="run a workload against Rill and the Node reference server")
    compared = compare.add_subparsers(dest="compared", required=True)
    for name, (options, _) in WORKLOADS.items():
        p = compared.add_parser(name)
        p.add_argument("--pin-server", type=int, metavar="CPU", help="run each server on this CPU only")
        p.add_argument("--skip-reference", action="store_true", help="do not run the Node reference server")
        if name == "append":
            p.add_argument("--baseline", action="store_true", help="also run bare uvicorn answering an empty 204")
        _add_options(p, options)


def _options(args: argparse.Namespace, options: type) -> Any:
    return options(**{f.name: getattr(args, f.name) for f in dataclasses.fields(options)})


def _check(options: Any) -> None:
    """Options that need an outside program (wrk, node) check for it in one line of error."""
    check = getattr(options, "check", None)
    if check is not None:
        check()


async def _measure(urls: list[str], workload: str, options: Any) -> dict[str, Any]:
    run = Run(urls)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, run.stop)  # Ctrl-C: stop early, still report
    try:
        result = await WORKLOADS[workload][1](run, options)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    if run.stopped():
        result["note"] = "stopped early by Ctrl-C"
    return result


def main(args: argparse.Namespace) -> None:
    if getattr(args, "pin_client", None) is not None:
        os.sched_setaffinity(0, {args.pin_client})
    if args.workload in SELF_HOSTED:
        options_type, runner = SELF_HOSTED[args.workload]
        chosen = _options(args, options_type)
        _check(chosen)
        results = runner(chosen)
        print_results(f"rill bench {args.workload}", results)
        if args.json_out:
            write_json(args.json_out, args.workload, dataclasses.asdict(chosen), results)
        if args.markdown_out:
            args.markdown_out.write_text(markdown_table(results))
        return
    if args.workload == "patterns":
        patterns.main()
        return
    if args.workload == "chores":
        chores.main(args.streams, args.served)
        return
    if args.workload == "soak":
        raise SystemExit(soak.main(_options(args, soak.SoakOptions), args.json_out))
    if args.workload == "chaos":
        from app.bench.chaos import run as chaos  # the cluster, proxy and clients load only for this command

        raise SystemExit(chaos.main(_options(args, ChaosOptions), args.json_out))
    if args.workload == "memory":
        raise SystemExit(memory.main(_options(args, memory.MemoryOptions), args.json_out))
    if args.workload == "compare":
        workload = args.compared
        options = _options(args, WORKLOADS[workload][0])
        _check(options)  # a missing wrk or node fails here, before any server starts
        results = _compare(workload, options, args.pin_server, args.skip_reference, getattr(args, "baseline", False))
    else:
        workload = args.workload
        options = _options(args, WORKLOADS[workload][0])
        _check(options)
        results = {"server": asyncio.run(_measure(args.url, workload, options))}
    print_results(f"rill bench {args.workload}{' ' + workload if args.workload == 'compare' else ''}", results)
    if args.json_out:
        write_json(args.json_out, workload, dataclasses.asdict(options), results)
    if args.markdown_out:
        args.markdown_out.write_text(markdown_table(results))


def _compare(
    workload: str, options: Any, pin_server: int | None, skip_reference: bool, baseline: bool
) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rill-bench-") as tmp:
        disk_fsync = fsync_ms(Path(tmp))
        # Every subscriber of `fanout` comes from 127.0.0.1, where real ones come from many addresses:
        # Rill's per-address connection cap is off for it, as behind a proxy.
        env = {"RILL_MAX_CONNECTIONS_PER_CLIENT": "0"} if workload == "fanout" else None
        starters: list[Callable[[], Server]] = [lambda: start_rill(Path(tmp) / "rill", pin_server, env=env)]
        if not skip_reference:
            starters.append(lambda: start_reference(None, pin_server))
            starters.append(lambda: start_reference(Path(tmp) / "reference", pin_server))
        if baseline:
            starters.append(lambda: start_baseline(pin_server))
        for start in starters:
            server = start()
            try:
                cpu_before = cpu_seconds(server.process.pid)
                result = asyncio.run(_measure([server.url], workload, options))
                _add_server_cpu(result, cpu_seconds(server.process.pid) - cpu_before)
                result["disk_fsync_p50_ms"] = disk_fsync
                results[server.name] = result
            finally:
                server.stop()
            if "note" in result:
                break  # Ctrl-C: report what was measured, start no more servers
    return results


def _add_server_cpu(result: dict[str, Any], cpu: float) -> None:
    """The server's CPU over the whole run (setup included), per operation where there is a count."""
    operations = result.get("_requests_total") or result.get("delivered") or result.get("clients")
    if operations:
        result["server_cpu_us_per_op"] = cpu / operations * 1e6
