"""Small thread pools for blocking calls, one per kind of work.

asyncio's default executor is shared by everything that calls `asyncio.to_thread`, so a call that
hangs (a JWKS endpoint that never answers, a stalled object store) held threads every other kind
of work waited for. Here each kind has its own few threads: a stuck kind queues only its own work.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypeVar, TypeVarTuple

Kind = Literal["tiering", "cold", "jwks", "webhook_dns", "checkpoints", "snapshots", "backups"]

SIZES: dict[Kind, int] = {
    "tiering": 2,  # segment builds, uploads, manifests and deletes: one worker task, in sequence
    "cold": 4,  # segment fetches for reads of evicted ranges
    "jwks": 2,  # JWKS fetches: one in flight per URL
    "webhook_dns": 4,  # resolving webhook hosts (getaddrinfo has no timeout of its own)
    "checkpoints": 2,  # taking, streaming and loading Raft checkpoints
    "snapshots": 4,  # large snapshot blobs to and from the object store
    "backups": 1,  # the leader's state backups: one at a time
}

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

_lock = threading.Lock()
_pools: dict[Kind, ThreadPoolExecutor] = {}
_servers = 0  # started and not yet shut down: in-process tests run several nodes at once
_calls: set[Future[Any]] = set()  # submitted and not finished: a stopping node waits for them


def pool(kind: Kind) -> ThreadPoolExecutor:
    """The kind's pool, started on first use (and again after `shutdown`)."""
    with _lock:
        executor = _pools.get(kind)
        if executor is None:
            executor = _pools[kind] = ThreadPoolExecutor(SIZES[kind], thread_name_prefix=f"rill-{kind}")
        return executor


async def run(kind: Kind, fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """`fn(*args)` on the kind's pool. Cancelling the caller drops the call if it has not started yet."""
    call = pool(kind).submit(fn, *args)
    _calls.add(call)
    call.add_done_callback(_calls.discard)
    return await asyncio.wrap_future(call)


def running() -> int:
    """How many calls are submitted and not finished."""
    return sum(not call.done() for call in list(_calls))


async def settle(timeout: float) -> bool:
    """Waits up to `timeout` seconds for the calls running now (a node closes its stores only after
    the threads reading them are done); whether they all finished."""
    running = [asyncio.wrap_future(call) for call in list(_calls) if not call.done()]
    if not running:
        return True
    _, pending = await asyncio.wait(running, timeout=timeout)
    return not pending


def start() -> None:
    """A server is starting: the pools stay up until it calls `shutdown`."""
    global _servers
    with _lock:
        _servers += 1


def shutdown() -> None:
    """A server is stopping. The last one stops the pools: queued calls are cancelled, and calls still
    running are not waited for (a stuck one ends with its own timeout)."""
    global _servers
    with _lock:
        _servers = max(0, _servers - 1)
        if _servers:
            return
        executors = list(_pools.values())
        _pools.clear()
    for executor in executors:
        executor.shutdown(wait=False, cancel_futures=True)
