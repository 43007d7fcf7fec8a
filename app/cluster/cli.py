"""`rill cluster up` (a local cluster until Ctrl-C), `status` (every node's Raft view), and
`add` / `remove` (one-node membership changes through the admin routes of any node)."""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = sub.add_parser("cluster", help="run or inspect a Rill cluster")
    commands = cluster.add_subparsers(dest="cluster_command", required=True)
    up = commands.add_parser("up", help="start a local cluster on 127.0.0.1; Ctrl-C stops it")
    up.add_argument("--nodes", type=int, default=3, choices=(1, 3, 5))
    up.add_argument("--base-port", type=int, default=4437, help="node N listens on base-port + N - 1")
    up.add_argument("--data-dir", type=Path, default=Path("./data"), help="node N keeps its data in DIR/node-N")
    up.add_argument("--forward-writes", action="store_true", help="followers proxy writes to the leader")
    up.add_argument("--cold-store", help="the nodes' shared object store (default: the directory DIR/cold)")
    status = commands.add_parser("status", help="term, leader, commit and applied index of every node")
    status.add_argument("--url", action="append", required=True, help="any node (its peers are found from it)")
    add = commands.add_parser("add", help="add a node (started with `rill serve --join`): learner, then voter")
    add.add_argument("--url", required=True, help="any node of the cluster")
    add.add_argument("--node-id", type=int, required=True)
    add.add_argument("--node-url", required=True, help="the new node's advertised base URL")
    add.add_argument("--cluster-secret", help="default: $RILL_CLUSTER_SECRET")
    remove = commands.add_parser("remove", help="remove a node from the cluster")
    remove.add_argument("--url", required=True, help="any node of the cluster")
    remove.add_argument("--node-id", type=int, required=True)
    remove.add_argument("--cluster-secret", help="default: $RILL_CLUSTER_SECRET")


def main(args: argparse.Namespace) -> None:
    if args.cluster_command == "up":
        up(args)
    elif args.cluster_command == "status":
        print_status(args.url)
    else:
        change(args)


def change(args: argparse.Namespace) -> None:
    """Sends a membership change to any node (followers redirect to the leader) and shows the result."""
    secret = args.cluster_secret or os.environ.get("RILL_CLUSTER_SECRET", "")
    if not secret:
        raise SystemExit("membership changes need --cluster-secret (or RILL_CLUSTER_SECRET)")
    base = args.url.rstrip("/")
    if args.cluster_command == "add":
        method, url, body = "POST", base + "/_rill/members", {"id": args.node_id, "url": args.node_url}
    else:
        method, url, body = "DELETE", f"{base}/_rill/members/{args.node_id}", None
    # Redirects are followed here, not by httpx: it drops Authorization when the leader is another origin.
    with httpx.Client(timeout=300, headers={"authorization": f"Bearer {secret}"}) as client:
        for _ in range(60):
            response = client.request(method, url, json=body)
            if response.status_code == 307:
                url = response.headers["location"]
            elif response.status_code == 503:
                time.sleep(float(response.headers.get("retry-after", "1")))  # leadership moving or catching up
            else:
                break
    if response.status_code != 200:
        raise SystemExit(f"{response.status_code}: {response.text}")
    print_status([base])


def up(args: argparse.Namespace) -> None:
    urls = {n: f"http://127.0.0.1:{args.base_port + n - 1}" for n in range(1, args.nodes + 1)}
    peers = ",".join(f"{n}={url}" for n, url in urls.items())
    secret = secrets.token_hex(16)
    processes = []
    for n, url in urls.items():
        cmd = [sys.executable, "-m", "app.cli", "serve", "--port", url.rsplit(":", 1)[1]]
        cmd += ["--data-dir", str(args.data_dir / f"node-{n}"), "--node-id", str(n), "--peers", peers]
        cmd += ["--cluster-secret", secret] + (["--forward-writes"] if args.forward_writes else [])
        # Every node must reach the segments the leader tiers, so they share one store.
        cmd += ["--cold-store", args.cold_store or (args.data_dir / "cold").resolve().as_uri()]
        processes.append(subprocess.Popen(cmd))
    # Blocked once the nodes are started (they must not inherit a mask blocking their own SIGTERM);
    # a stop signal from now on waits for sigwait below instead of killing this process alone.
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    console = Console()
    try:
        _wait_for_leader(list(urls.values()))
        print_status(list(urls.values()), console)
        console.print(f"cluster secret (give it to nodes you add): {secret}")
        console.print("Ctrl-C stops the cluster.")
        signal.sigwait(stop)
    except KeyboardInterrupt:
        pass
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(15)


def _wait_for_leader(urls: list[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(h and h.get("role") == "leader" for h in map(_health, urls)):
            return
        time.sleep(0.1)
    raise SystemExit("no leader was elected in time")


def _health(url: str) -> dict[str, Any] | None:
    try:
        return dict(httpx.get(url.rstrip("/") + "/healthz", timeout=2).json())
    except (httpx.HTTPError, ValueError):
        return None


def print_status(urls: list[str], console: Console | None = None) -> None:
    console = console or Console()
    known = {url.rstrip("/") for url in urls}
    for found in filter(None, map(_health, list(known))):
        known.update(found.get("peers", {}).values())
    table = Table("node", "url", "role", "term", "leader", "commit", "applied", "last index")
    for url in sorted(known):
        health = _health(url)
        if health is None:
            table.add_row("?", url, "[red]unreachable", "", "", "", "", "")
            continue
        fields = ("node", "role", "term", "leader", "commit", "applied", "last_index")
        node, role, *rest = (str(health.get(k, "")) for k in fields)
        table.add_row(node, url, role, *rest)
    console.print(table)
