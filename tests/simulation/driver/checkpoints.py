"""Checkpoints: the driver's checkpoint link, faked. Logs are compacted often, so lagging and
restarted nodes catch up from the leader's state store, copied pair by pair after a virtual delay
(or failing) and installed through the driver's own path."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from app.state_machine import records
from app.state_machine.export import Pair, applied_point, export, load
from tests.simulation.driver.config import CHECKPOINT_TIMEOUT
from tests.simulation.driver.disk import DiskKV

if TYPE_CHECKING:
    from tests.simulation.driver.process import Incarnation, Member
    from tests.simulation.driver.world import Simulation


class Link:
    """The driver's checkpoint link for one incarnation of a node: copies the leader's state store."""

    def __init__(self, sim: Simulation, member: Member, incarnation: Incarnation) -> None:
        self.sim = sim
        self.member = member
        self.incarnation = incarnation
        self.staged: list[Pair] | None = None
        self._lock = asyncio.Lock()

    async def send(self, peer: int, term: int) -> bool:
        sim, src = self.sim, self.member.id
        kv = self.incarnation.raft.machine.kv  # type: ignore[attr-defined]
        index, index_term = applied_point(kv)
        pairs = [pair for batch in export(kv) for pair in batch]
        await asyncio.sleep(sim.rng.uniform(0.02, 0.5))
        dst = sim.members.get(peer)
        target = dst.current if dst is not None else None
        if target is None or not sim.network.reachable(src, peer) or sim.rng.random() < 0.2:
            sim.event(f"checkpoint {src}->{peer} at {index} lost")
            return False
        result: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        # The receiving side runs as the peer's own task (a request handler): it outlives the sender.
        receiver = target.spawn(target.link.receive(term, src, index, index_term, pairs))
        receiver.add_done_callback(lambda t: _reply(sim, result, t))
        try:
            return await asyncio.wait_for(result, CHECKPOINT_TIMEOUT)
        except TimeoutError:
            return False

    async def receive(self, term: int, src: int, index: int, index_term: int, pairs: list[Pair]) -> bool:
        async with self._lock:  # one transfer at a time, as the real receiver's lock
            raft = self.incarnation.raft
            if not raft.can_install_checkpoint(term, index):
                return False
            self.staged = pairs
            try:
                installed = await raft.install_checkpoint(term, src, index, index_term)
            finally:
                self.staged = None
            self.sim.event(f"checkpoint {src}->{self.member.id} at {index}: installed={installed}")
            return installed

    def install(self) -> None:
        """Swaps the staged store in (the driver calls this between Readys)."""
        assert self.staged is not None, "install without a staged checkpoint"
        kv = DiskKV(records.COLUMN_FAMILIES)
        load(kv, self.staged)
        kv.sync_wal()  # the real receiver syncs its staging store before asking to install
        self.member.state_kv = kv
        self.incarnation.raft.machine.reload(kv)  # type: ignore[attr-defined]
        self.sim.stats["installs"] += 1
        sim, member = self.sim, self.member
        if sim.armed.get(member.id) == "install" and member.current is self.incarnation:
            # The power fails after the swap, before the driver moves the log behind the checkpoint.
            del sim.armed[member.id]
            self.incarnation.dead = True
            disks = member.raft_kv.after_crash(sim.rng.randint(0, member.raft_kv.unsynced)), kv.after_crash(0)
            sim.spawn(sim.crash(member, "power", "between swapping a checkpoint in and moving the log", disks))


def _reply(sim: Simulation, result: asyncio.Future[bool], task: asyncio.Task[bool]) -> None:
    """Hands the receiver's answer to the waiting sender."""
    if task.cancelled():
        ok = False
    elif task.exception() is not None:
        sim.fail(f"a checkpoint receiver failed: {task.exception()!r}")
        ok = False
    else:
        ok = task.result()
    if not result.done():
        result.set_result(ok)
