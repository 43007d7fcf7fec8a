"""The simulated world: its seeded randomness, members, clients, network and trace, and the crashes
and restarts of its nodes. A node is stopped gracefully, killed (unsynced writes survive in the OS)
or loses power (only a prefix of its unsynced writes survives)."""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import random
from collections.abc import Coroutine
from typing import Any, TypeVar

from app.raft.messages import Entry
from tests.simulation.driver.clients import Client
from tests.simulation.driver.config import CLIENTS, STATS, STREAMS
from tests.simulation.driver.disk import DiskKV
from tests.simulation.driver.network import Network
from tests.simulation.driver.process import Incarnation, Member

T = TypeVar("T")


class Simulation:
    def __init__(self, seed: int, verbose: bool = False, join: bool = True) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.verbose = verbose
        self.join = join
        self.members: dict[int, Member] = {}
        self.clients = [Client(c, STREAMS[c % len(STREAMS)]) for c in range(CLIENTS)]
        self.log: dict[int, Entry] = {}  # index -> the entry every replica must apply there
        self.leaders: dict[int, set[int]] = {}  # term -> nodes seen leading it
        self.network = Network(self)
        self.failures: list[str] = []
        self.failed = asyncio.Event()
        self.trace = hashlib.sha256()
        self.stats = dict.fromkeys(STATS, 0)
        self.reconfigured = not join
        self.applied = 0  # the final applied index, once checked
        self.removed = 0
        self.consumers_done = 0
        self.delivered: list[dict[str, object]] = []  # notifications the webhook receiver took
        self.hooked_at: dict[str, int] | None = None  # each stream's offset when the webhook was made
        # (subscription key, generation) -> its holder, as any replica applied it
        self.holders: dict[tuple[bytes, int], str] = {}
        self.healing = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.reported: list[BaseException] = []  # driver failures already recorded
        # node -> when to crash it: "before" or "after" its next sync, "vote" before syncing a vote,
        # "install" when it swaps a checkpoint in
        self.armed: dict[int, str] = {}

    def now(self) -> float:
        return self.loop.time() if self.loop is not None else 0.0

    def event(self, text: str) -> None:
        line = f"{self.now():10.4f} {text}"
        self.trace.update(line.encode())
        if self.verbose:
            print(line)

    def fail(self, text: str) -> None:
        self.event(f"FAILURE {text}")
        self.failures.append(text)
        self.failed.set()

    def disk_delay(self) -> float:
        roll = self.rng.random()
        if roll < 0.005:
            return self.rng.uniform(0.5, 3.0)  # a stalled disk
        if roll < 0.05:
            return self.rng.uniform(0.01, 0.2)
        return self.rng.uniform(0.0002, 0.004)

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """A task of the simulation's own, which no node's crash cancels."""
        return asyncio.get_running_loop().create_task(coro, context=contextvars.Context())

    async def sleep(self, lo: float, hi: float) -> None:
        await asyncio.sleep(self.rng.uniform(lo, hi))

    def up(self) -> list[Member]:
        return [m for m in self.members.values() if m.current is not None]

    def leader(self) -> Member | None:
        leading = [m for m in self.up() if m.current is not None and m.current.raft.is_leader]
        return max(leading, key=lambda m: m.current.raft.status().term) if leading else None  # type: ignore[union-attr]

    def boot(self, member: Member) -> None:
        member.boots += 1
        member.current = Incarnation(self, member, member.boots)
        self.event(f"boot {member.id} (#{member.boots})")

    async def crash(
        self, member: Member, kind: str, when: str = "", disks: tuple[DiskKV, DiskKV] | None = None
    ) -> None:
        """Stops, kills or cuts the power to a node; `disks` are what it left, if that is decided."""
        incarnation = member.current
        if incarnation is None:
            return
        member.current = None
        self.stats["crashes"] += 1
        if kind == "stop":
            await incarnation.raft.stop()
        incarnation.kill()
        raft_kept = state_kept = 1 << 62  # a killed process's writes are in the OS: they survive
        if kind == "power":  # only a prefix of what was written since the last sync survives
            raft_kept = self.rng.randint(0, member.raft_kv.unsynced)
            state_kept = self.rng.randint(0, member.state_kv.unsynced)
        if disks is not None:
            self.event(f"{kind} {member.id} {when}")
            member.raft_kv, member.state_kv = disks
            return
        if kind == "power":
            self.event(f"power {member.id} {when} (kept {raft_kept} unsynced raft writes, {state_kept} state writes)")
        else:
            self.event(f"{kind} {member.id} {when}")
        member.raft_kv = member.raft_kv.after_crash(raft_kept)
        member.state_kv = member.state_kv.after_crash(state_kept)
