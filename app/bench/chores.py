"""`chores`: what one pass of the leader's periodic chores costs, with few streams and with many.

The leader runs a tiering pass (seal, publish manifests and pack indexes, retention, eviction,
collection) every half second and an expiry sweep every second, on its event loop. Each visits
only the streams with work (app/state_machine/upkeep.py), so a pass should cost the same however
many idle streams there are. This builds that state in memory (a tenth of the streams with a TTL,
a tenth with retention, every one with a record already in the object store), keeps a few streams
busy, and times the real passes: the Engine's sweep and the TieringWorker's pass over a file store,
on a node that applies each proposal at once to a RocksDB state store (no Raft, no HTTP). Then it
takes a state backup of the same state twice, encoded in a child process (as the server does) and on
a thread (as it did), and times how late a 1 ms timer of the event loop runs meanwhile.

`served` shows the same from outside: a real `rill serve` (on CPU 0, its data on /dev/shm where
there is one) given idle TTL streams by wrk for some seconds, then wrk appending to 100 busy
streams from 8 connections (on CPU 1); a leader stalled by its chores shows in the appends' p99
and max.
"""

from __future__ import annotations

import asyncio
import os
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

from app.bench.append_wrk import run_wrk
from app.bench.report import machine
from app.bench.run import Run
from app.bench.servers import start_rill
from app.raft.messages import Entry
from app.runtime import blocking
from app.service.engine import Engine
from app.service.limits import Limits
from app.service.signals import Signals
from app.state_machine import backup, records
from app.state_machine.commands import Append, CreateBucket, CreateStream, encode_envelope
from app.state_machine.machine import StateMachine
from app.storage.rocks import RocksKV
from app.storage.state_store import StateStore
from app.tiering import backup_writer
from app.tiering.backups import BackupConfig, StateBackups
from app.tiering.proposer import TieringConfig
from app.tiering.store import FileStore
from app.tiering.worker import TieringWorker

BUCKET = "chores"
BUSY = 10  # streams appended to before every pass
PASSES = 20
CT = "application/octet-stream"
# One Lua state per wrk thread: with one thread, every request creates a stream of its own.
CREATE_LUA = """
n = 0
request = function()
  n = n + 1
  return wrk.format("PUT", "/v1/stream/idle" .. n, {["Content-Type"] = "application/octet-stream",
                                                    ["Stream-TTL"] = "3600"}, nil)
end
"""


class DirectNode:
    """A one-voter log that applies each proposal as it is made."""

    id = 1
    is_leader = True

    def __init__(self, machine: StateMachine) -> None:
        self.machine = machine
        self.index = machine.applied_index

    def apply(self, data: list[bytes | bytearray]) -> list[Any]:
        entries = []
        for one in data:
            self.index += 1
            entries.append(Entry(1, self.index, bytes(one)))
        return self.machine.apply(entries)

    async def propose(self, data: bytes, decoded: Any = None) -> Any:
        return self.apply([data])[0]

    async def read_barrier(self, timeout: float = 3.0) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.now = int(time.time() * 1000)

    def __call__(self) -> int:
        return self.now


def _populate(node: DirectNode, clock: Clock, streams: int) -> None:
    node.apply([encode_envelope(clock.now, CreateBucket(BUCKET))])
    for first in range(0, streams, 1000):
        creates, appends = [], []
        for i in range(first, min(first + 1000, streams)):
            ttl = 3600 if i % 10 == 1 else None
            retention = 1 << 20 if i % 10 == 2 else None
            cmd = CreateStream(BUCKET, f"idle-{i}", CT, False, ttl=ttl, retention_bytes=retention)
            creates.append(encode_envelope(clock.now, cmd))
            appends.append(encode_envelope(clock.now, Append(BUCKET, f"idle-{i}", CT, memoryview(b"x" * 16))))
        node.apply(creates)
        node.apply(appends)
    for i in range(BUSY):
        node.apply([encode_envelope(clock.now, CreateStream(BUCKET, f"busy-{i}", CT, False, ttl=3600))])


def _busy(node: DirectNode, clock: Clock) -> None:
    node.apply(
        [encode_envelope(clock.now, Append(BUCKET, f"busy-{i}", CT, memoryview(b"y" * 64))) for i in range(BUSY)]
    )


async def _measure(streams: int, root: Path) -> dict[str, Any]:
    clock = Clock()
    kv = RocksKV(root / "state", records.COLUMN_FAMILIES)
    try:
        return await _passes(StateMachine(kv), clock, streams, root)
    finally:
        kv.close()


async def _passes(state: StateMachine, clock: Clock, streams: int, root: Path) -> dict[str, Any]:
    node = DirectNode(state)
    _populate(node, clock, streams)
    engine = Engine(node, state, Signals(), Limits(), clock=clock)  # type: ignore[arg-type]
    config = TieringConfig(segment_max_age=1.0, local_disk_budget=1 << 40)
    worker = TieringWorker(engine, FileStore(root / "cold"), config)
    clock.now += 2_000
    await worker.run_once()  # the term's first pass: every stream's record goes to the store
    tiering, sweeps = [], []
    for _ in range(PASSES):
        clock.now += 500
        _busy(node, clock)
        started = time.perf_counter()
        await worker.run_once()
        tiering.append(time.perf_counter() - started)
        started = time.perf_counter()
        await engine.collect_expired()
        sweeps.append(time.perf_counter() - started)
    pending = sum(m.tail - m.tiered for m in state.streams.values() if m.name.startswith("idle-"))
    return {
        "streams": streams + BUSY,
        "tiering_pass_ms": statistics.median(tiering) * 1000,
        "expiry_sweep_ms": statistics.median(sweeps) * 1000,
        "idle_bytes_untiered": pending,
        **await _backup(state, clock, root, "thread"),
        **await _backup(state, clock, root, "child"),
    }


async def _backup(state: StateMachine, clock: Clock, root: Path, label: str) -> dict[str, Any]:
    """One state backup, and how late a 1 ms timer of the event loop ran meanwhile (what requests
    in flight would wait on top of their own work): `child` as the server takes it, `thread` encoded
    on a thread of this process, as it was before."""
    state_store = StateStore(root, records.COLUMN_FAMILIES)  # root / "state" is the store _measure opened
    store = FileStore(root / f"backups-{label}")
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    taking: Coroutine[Any, Any, object]
    if label == "child":
        taking = StateBackups(Leading(state, clock), 1, store, state_store, BackupConfig()).write_once()
    else:
        taking = _on_a_thread(state, state_store, store, clock())
    written: asyncio.Future[object] = asyncio.ensure_future(taking)
    lags = []
    while not written.done():
        at = loop.time()
        await asyncio.sleep(0.001)
        lags.append((loop.time() - at - 0.001) * 1000)
    if await written is None:
        raise RuntimeError("the backup failed")
    lags.sort()
    return {
        f"backup_{label}_s": time.perf_counter() - started,
        f"backup_{label}_lag_p99_ms": lags[int(len(lags) * 0.99)],
        f"backup_{label}_lag_max_ms": lags[-1],
    }


async def _on_a_thread(state: StateMachine, state_store: StateStore, store: FileStore, now: int) -> str:
    checkpoint = await blocking.run("backups", state_store.checkpoint, state.kv, "thread")  # type: ignore[arg-type]
    file = checkpoint.with_name("thread.state")
    header, sha256 = await blocking.run("backups", backup_writer.encode, checkpoint, file, now, 1)
    key = backup.key_for(header.index, sha256)
    await blocking.run("backups", store.put_file, key, file, sha256)
    return key


class Leading:
    """What StateBackups needs of the node: this state, led here, on the bench's clock."""

    is_leader = True

    def __init__(self, machine: StateMachine, clock: Clock) -> None:
        self.machine, self.clock = machine, clock

    def now_ms(self) -> int:
        return self.clock()


def served(create_seconds: int, append_seconds: float = 10.0) -> dict[str, Any]:
    """Appends to busy streams on a real server after `create_seconds` of creating idle TTL streams."""
    cpus = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {1} if len(cpus) > 1 else cpus)  # wrk inherits it; the server runs on CPU 0
    try:
        return _served(create_seconds, append_seconds)
    finally:
        os.sched_setaffinity(0, cpus)


def _served(create_seconds: int, append_seconds: float) -> dict[str, Any]:
    shm = Path("/dev/shm")  # where there is one: the disk's own stalls would hide the loop's
    with tempfile.TemporaryDirectory(prefix="rill-bench-chores-", dir=shm if shm.is_dir() else None) as tmp:
        server = start_rill(Path(tmp) / "data", cpu=0)
        try:
            idle = 0
            if create_seconds:
                script = Path(tmp) / "create.lua"
                script.write_text(CREATE_LUA)
                cmd = ["wrk", "-t1", "-c32", f"-d{create_seconds}s", "-s", str(script), server.url]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                idle = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
            targets = [f"{server.url}/busy{i}" for i in range(100)]
            with httpx.Client() as client:
                for target in targets:
                    client.put(target, headers={"content-type": CT}).raise_for_status()
            result = asyncio.run(run_wrk(Run(targets), targets, b"x" * 256, CT, 8, 2, append_seconds))
        finally:
            server.stop()
    keys = ("per_second", "p50_ms", "p99_ms", "max_ms", "errors")
    return {"idle_streams": idle, **{key: result.get(key) for key in keys}}


def run_chores(streams: list[int]) -> list[dict[str, Any]]:
    rows = []
    for n in streams:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(asyncio.run(_measure(n, Path(tmp))))
    return rows


def main(streams: list[int] | None = None, create_seconds: int | None = None) -> None:
    m = machine()
    console = Console()
    if create_seconds is not None:
        row = served(create_seconds)
        console.print(
            f"[bold]chores, served[/bold]  {create_seconds} s of creates, machine: {m['cores']} cores, {m['date']}"
        )
        console.print(row)
        return
    rows = run_chores(streams or [0, 100_000])
    console.print(
        f"[bold]chores[/bold]  median of {PASSES} passes, {BUSY} busy streams, machine: {m['cores']} cores, {m['date']}"
    )
    table = Table("streams", "tiering pass ms", "expiry sweep ms", "idle bytes untiered")
    for row in rows:
        table.add_row(
            f"{row['streams']:,}",
            f"{row['tiering_pass_ms']:.2f}",
            f"{row['expiry_sweep_ms']:.3f}",
            f"{row['idle_bytes_untiered']:,}",
        )
    console.print(table)
    backups = Table("streams", "backup encoded on", "backup s", "loop lag p99 ms", "loop lag max ms")
    for row in rows:
        for label in ("thread", "child"):
            backups.add_row(
                f"{row['streams']:,}",
                "a thread" if label == "thread" else "a child process",
                f"{row[f'backup_{label}_s']:.2f}",
                f"{row[f'backup_{label}_lag_p99_ms']:.2f}",
                f"{row[f'backup_{label}_lag_max_ms']:.2f}",
            )
    console.print(backups)
