"""`rill cluster up` (a local cluster until Ctrl-C), `status` (every node's Raft view), and
`add` / `remove` (one-node membership changes through the admin routes of any node).

Membership changes need a token with `admin:*` (`--token`, default `$RILL_TOKEN`); the cluster
secret only signs traffic between nodes. `up` makes such a token for the cluster it starts.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from app.cli.client import CliError, checked_token, verify_option
from app.security.tokens import new_token, toml_entry


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cluster = sub.add_parser("cluster", help="run or inspect a Rill cluster")
    commands = cluster.add_subparsers(dest="cluster_command", required=True)
    up = commands.add_parser("up", help="start a local cluster on 127.0.0.1; Ctrl-C stops it")
    up.add_argument("--nodes", type=int, default=3, choices=(1, 3, 5))
    up.add_argument("--base-port", type=int, default=4437, help="node N listens on base-port + N - 1")
    up.add_argument("--data-dir", type=Path, default=Path("./data"), help="node N keeps its data in DIR/node-N")
    up.add_argument(
        "--forward-writes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="followers proxy writes to the leader (the default); --no-forward-writes: they answer 307",
    )
    up.add_argument("--cold-store", help="the nodes' shared object store (default: the directory DIR/cold)")
    up.add_argument("--auth", choices=("on", "off"), default="off", help="on: data routes need tokens too")
    up.add_argument("--tls-cert", type=Path, help="serve HTTPS (the certificate must name 127.0.0.1)")
    up.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    up.add_argument("--tls-ca", type=Path, help="CA bundle the nodes (and this command) verify each other with")
    status = commands.add_parser("status", help="term, leader, commit and applied index of every node")
    status.add_argument("--url", action="append", required=True, help="any node (its peers are found from it)")
    _credentials(status)
    add = commands.add_parser("add", help="add a node (started with `rill serve --join`): learner, then voter")
    add.add_argument("--url", required=True, help="any node of the cluster")
    add.add_argument("--node-id", type=int, required=True)
    add.add_argument("--node-url", required=True, help="the new node's advertised base URL")
    _credentials(add)
    remove = commands.add_parser("remove", help="remove a node from the cluster")
    remove.add_argument("--url", required=True, help="any node of the cluster")
    remove.add_argument("--node-id", type=int, required=True)
    _credentials(remove)


def _credentials(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token", help="a bearer token with admin:* (default: $RILL_TOKEN)")
    parser.add_argument("--tls-ca", type=Path, help="CA bundle for https:// nodes (default: system CAs)")


def main(args: argparse.Namespace) -> None:
    if args.cluster_command == "up":
        up(args)
        return
    try:
        token = checked_token(args.token or os.environ.get("RILL_TOKEN", ""))
        client = _client_options(token, args.tls_ca)
    except CliError as exc:
        raise SystemExit(f"rill: error: {exc}") from None
    if args.cluster_command == "status":
        if not print_status(args.url, client=client):
            raise SystemExit(1)  # no node answered
    else:
        if not token:
            raise SystemExit("membership changes need --token (or RILL_TOKEN) with the admin:* scope")
        change(args, client)


def _client_options(token: str, ca: Path | None) -> dict[str, Any]:
    """httpx keyword arguments: the bearer token (if any) and the CA to verify https:// nodes with."""
    options: dict[str, Any] = {"headers": {"authorization": f"Bearer {token}"} if token else {}}
    if ca is not None:
        options["verify"] = verify_option(ca)
    return options


# A learner that cannot catch up (unreachable, or far too slow) answers 503 after each 120 s wait: the
# command gives up after this long, leaving the learner for `rill cluster remove` or a later `add`.
CHANGE_WAIT_SECONDS = 600.0
# A node's own stop is bounded by about 20 s: 5 for open requests, 3 for a hand-over, 5 each for its
# tasks and its blocking calls to end (app/service/build.py), then closing.
STOP_SECONDS = 30.0


def change(args: argparse.Namespace, client: dict[str, Any]) -> None:
    """Sends a membership change to any node (followers redirect to the leader) and shows the result."""
    base = args.url.rstrip("/")
    if args.cluster_command == "add":
        method, url, body = "POST", base + "/_rill/members", {"id": args.node_id, "url": args.node_url}
    else:
        method, url, body = "DELETE", f"{base}/_rill/members/{args.node_id}", None
    # Redirects are followed here, not by httpx: it drops Authorization when the leader is another origin.
    deadline = time.monotonic() + CHANGE_WAIT_SECONDS
    with httpx.Client(timeout=300, **client) as http:
        for _ in range(60):
            try:
                response = http.request(method, url, json=body)
            except (httpx.HTTPError, httpx.InvalidURL) as exc:
                reason = " ".join(str(exc).split()) or type(exc).__name__
                raise SystemExit(f"rill: error: {method} {url}: {reason}") from None
            if response.status_code == 307:
                url = response.headers["location"]
            elif response.status_code == 503 and time.monotonic() < deadline:
                time.sleep(float(response.headers.get("retry-after", "1")))  # leadership moving or catching up
            else:
                break
    if response.status_code != 200:
        raise SystemExit(f"{response.status_code}: {response.text}")
    print_status([base], client=client)


def _private_file(path: Path, text: str) -> None:
    """Writes `text` to a file only its owner may read (created so: never briefly world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(text)


def up(args: argparse.Namespace) -> None:
    if (args.tls_cert is None) != (args.tls_key is None):
        raise SystemExit("--tls-cert and --tls-key go together")
    scheme = "https" if args.tls_cert else "http"
    urls = {n: f"{scheme}://127.0.0.1:{args.base_port + n - 1}" for n in range(1, args.nodes + 1)}
    peers = ",".join(f"{n}={url}" for n, url in urls.items())
    args.data_dir.mkdir(parents=True, exist_ok=True)
    # The secret and the admin token's digest go to files, not argv, so they stay out of `ps`.
    secret_file = args.data_dir / "cluster-secret"
    _private_file(secret_file, secrets.token_hex(32) + "\n")
    token = new_token()
    config = args.data_dir / "cluster.toml"
    _private_file(config, f'[auth]\nmode = "{args.auth}"\n\n' + toml_entry(token, ["admin:*"], "cluster-admin"))
    # Stop signals are held from before the first node starts until sigwait takes them (a stop then
    # stops every node, not this process alone); each node unblocks them for itself before it runs.
    stop = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for n, url in urls.items():
            cmd = [sys.executable, "-m", "app.cli", "serve", "--config", str(config), "--port", url.rsplit(":", 1)[1]]
            cmd += ["--data-dir", str(args.data_dir / f"node-{n}"), "--node-id", str(n), "--peers", peers]
            cmd += ["--cluster-secret-file", str(secret_file)]
            cmd += ["--forward-writes" if args.forward_writes else "--no-forward-writes"]
            # Every node must reach the segments the leader tiers, so they share one store.
            cmd += ["--cold-store", args.cold_store or (args.data_dir / "cold").resolve().as_uri()]
            if args.tls_cert:
                cmd += ["--tls-cert", str(args.tls_cert), "--tls-key", str(args.tls_key)]
            if args.tls_ca:
                cmd += ["--tls-ca", str(args.tls_ca)]
            processes.append(subprocess.Popen(cmd, preexec_fn=lambda: _unblock(stop)))
        _run_until_stopped(args, urls, token, secret_file, stop, processes)
    finally:
        stop_nodes(processes)


def _unblock(stop: set[signal.Signals]) -> None:
    """In a node's child before it runs: a stop already pending ends it here, by the signal's default
    action (Python's handler would raise KeyboardInterrupt in this function, and Popen with it)."""
    for signum in stop:
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stop)


def _run_until_stopped(
    args: argparse.Namespace,
    urls: dict[int, str],
    token: str,
    secret_file: Path,
    stop: set[signal.Signals],
    processes: list[subprocess.Popen[bytes]],
) -> None:
    client = _client_options(token, args.tls_ca)
    console = Console()
    try:
        if _wait_until_up(list(urls.values()), client=client, stopped=lambda: _stopped(stop, processes)):
            print_status(list(urls.values()), console, client=client)
            who = "membership changes, and every bucket when auth is on"
            console.print(f"admin token ({who}): {token}", soft_wrap=True)
            console.print(f"cluster secret for nodes you add: --cluster-secret-file {secret_file}", soft_wrap=True)
            console.print("Ctrl-C stops the cluster.")
            signal.sigwait(stop)
    except KeyboardInterrupt:
        pass


def stop_nodes(processes: list[subprocess.Popen[bytes]], seconds: float = STOP_SECONDS) -> None:
    """Stops every node, killing any still running after `seconds` (a stuck node must not outlive
    this command); SystemExit naming those it killed."""
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + seconds
    killed = []
    for n, process in enumerate(processes, start=1):
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            killed.append(str(n))
    if killed:
        which = f"node {killed[0]} was" if len(killed) == 1 else f"nodes {', '.join(killed)} were"
        raise SystemExit(f"{which} killed: still running {seconds:.0f} s after being told to stop")


def _stopped(signals: set[signal.Signals], processes: list[subprocess.Popen[bytes]]) -> bool:
    """Whether a stop signal came (taken here: it is blocked) or a node exited; SystemExit for the latter."""
    # The nodes first: a Ctrl-C that ended one is pending here by the time its exit shows.
    exited = [(n, process.returncode) for n, process in enumerate(processes, start=1) if process.poll() is not None]
    if signal.sigtimedwait(signals, 0) is not None:
        return True
    if exited:
        raise SystemExit(f"node {exited[0][0]} exited with status {exited[0][1]} before the cluster was up")
    return False


def _wait_until_up(
    urls: list[str],
    timeout: float = 30,
    client: dict[str, Any] | None = None,
    stopped: Callable[[], bool] = lambda: False,
) -> bool:
    """Whether every node answers and a leader was elected; False if `stopped` said to give up first.
    Every node, not a majority: one that cannot start (its port taken) would otherwise go unnoticed
    whenever the others elected a leader before it exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = [_health(url, client) for url in urls]
        if all(health) and any(h and h.get("role") == "leader" for h in health):
            return True
        if stopped():
            return False
        time.sleep(0.1)
    raise SystemExit("the cluster was not up in time (every node answering, a leader elected)")


def _health(url: str, client: dict[str, Any] | None = None) -> dict[str, Any] | None:
    try:
        return dict(httpx.get(url.rstrip("/") + "/healthz", timeout=2, **(client or {})).json())
    except (httpx.HTTPError, httpx.InvalidURL, ValueError):
        return None


def print_status(urls: list[str], console: Console | None = None, client: dict[str, Any] | None = None) -> bool:
    """Prints each node's row; whether any node answered."""
    console = console or Console()
    known = {url.rstrip("/") for url in urls}
    for found in filter(None, (_health(url, client) for url in list(known))):
        known.update(url for url in found.get("peers", {}).values() if url)  # a lone node lists itself as ""
    healths = {url: _health(url, client) for url in sorted(known)}
    console.print(status_table(healths))
    return any(health is not None for health in healths.values())


def status_table(healths: dict[str, dict[str, Any] | None]) -> Table:
    """One row per node URL, in 80 columns for five nodes on 127.0.0.1 with log indexes of up to 7
    digits: short headers, two spaces between columns, no outer border. Past that the numbers fold
    onto a second line; a URL is never cut (it is what `--url` takes)."""
    limited = False  # a node answered but hid its details: no admin token
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True)
    table.add_column("id", justify="right", overflow="fold")
    table.add_column("url", no_wrap=True)
    table.add_column("role", no_wrap=True)
    for header in ("term", "lead", "commit", "applied", "last"):
        table.add_column(header, justify="right", overflow="fold")
    for url, health in healths.items():
        if health is None:
            table.add_row("?", Text(url), Text("no answer", style="red"))
        elif "role" not in health:
            table.add_row("?", Text(url), Text("up*", style="yellow"))
            limited = True
        else:
            fields = ("node", "role", "term", "leader", "commit", "applied", "last_index")
            node, role, *rest = (Text(str(health.get(k, ""))) for k in fields)  # what a node says, as text
            table.add_row(node, Text(url), role, *rest)
    if limited:
        table.caption = "up*: its details need a token with admin:* (--token)"
    return table
