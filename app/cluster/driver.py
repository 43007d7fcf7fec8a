"""The asyncio driver around the pure Raft core.

It turns proposals into log entries, persists each Ready with one synced
write (group commit, app/cluster/log_sync.py: everything proposed while the
previous sync ran goes into the next one), sends messages, applies committed
entries through the state machine and resolves the waiting proposals with
their results.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

from app.cluster.driver_errors import MembershipBusy, MembershipRefused, NotLeader, ProposalDropped
from app.cluster.driver_types import CheckpointLink, Send, StateMachine, Status
from app.cluster.log_store import LogStore
from app.cluster.log_sync import LogSync, Unsaved
from app.cluster.proposals import Proposals
from app.cluster.read_waits import ReadWaits
from app.raft.core import CHANGE_IN_PROGRESS, RaftCore
from app.raft.messages import AppendEntries, Entry, Membership, Message, encode
from app.raft.ready import Role
from app.raft.validate import STALE_TERM
from app.storage.disk import OutOfSpace, insufficient_storage, out_of_space

log = logging.getLogger("rill.raft")

# Compact the log behind durable state after this many applied entries or bytes: the log since
# the last compaction is held in memory and reloaded at startup, so both bound memory and replay.
# A cluster keeps the latest COMPACT_KEEP entries, so a follower a little behind catches up from
# the log; one further behind gets a checkpoint (the state machine's store).
COMPACT_EVERY = 20_000
COMPACT_BYTES = 64 * 1024 * 1024
COMPACT_KEEP = 5_000
CHECKPOINT_RETRY_SECONDS = 1.0
RECOVER_SECONDS = 1.0  # how often a node out of disk space tries its stores again
REFUSAL_LOG_SECONDS = 10.0
READ_RETRY_SECONDS = 0.3  # a ReadIndex unanswered this long is asked again, then after twice as long
LEADERLESS_POLL = 0.05  # how often a request on a node that knows no leader looks again


class RaftNode:
    def __init__(
        self,
        node_id: int,
        voters: list[int],
        log_store: LogStore,
        machine: StateMachine,
        *,
        learners: list[int] | None = None,
        send: Send | None = None,
        checkpoints: CheckpointLink | None = None,
        on_membership: Callable[[Membership], None] | None = None,
        on_failure: Callable[[], None] | None = None,
        tick_seconds: float = 0.1,
        seed: int | None = None,
        compact_entries: int | None = None,
        compact_keep: int | None = None,
        executor: Executor | None = None,
        inline_syncs: bool = True,
        sync_clock: Callable[[], float] = time.perf_counter,
        unsafe_commit_alone: bool = False,
    ) -> None:
        self.id = node_id
        self._commit_alone = unsafe_commit_alone  # TEST ONLY: see RaftCore.commit_alone
        self._wake = asyncio.Event()
        # One worker, so syncs and compactions run in order; a simulation passes its own.
        self._persister = executor or ThreadPoolExecutor(max_workers=1, thread_name_prefix="raft-log")
        # `set` looked up when called: tests/cluster/test_driver_waiting.py replaces it on a live node.
        self._log = LogSync(log_store, self._persister, lambda: self._wake.set(), inline=inline_syncs, clock=sync_clock)
        self.fsync = self._log.fsync  # for /metrics
        self.machine = machine
        self._send = send
        self.checkpoints = checkpoints
        self.on_membership = on_membership
        self.on_failure = on_failure  # a node whose driver died must not linger
        self._tick_seconds = tick_seconds
        self._compact_entries = compact_entries or COMPACT_EVERY
        self._compact_keep = COMPACT_KEEP if compact_keep is None else compact_keep
        self._seed = seed if seed is not None else time.monotonic_ns()
        self.core = self._load_core(voters, learners or [])
        self._full = False  # a store ran out of space: no writes until it takes them again
        self._proposals = Proposals()
        self._inbox: list[Message] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._last_compacted = log_store.compacted_index
        self._applied_bytes = 0  # payload bytes applied since the last compaction
        self._installs: list[tuple[int, int, int, int, asyncio.Future[bool]]] = []
        # A ReadIndex answer meant for an earlier run of this node must not answer this one's reads.
        self._reads = ReadWaits(first_ctx=random.Random(self._seed).getrandbits(48))
        self._sending: set[int] = set()  # peers a checkpoint is streaming to
        # For /metrics: read when scraped, never on the way of a proposal.
        self.leader_changes = 0
        self.checkpoint_installs = 0
        self.refused: Counter[tuple[int, str]] = Counter()  # (peer, why) -> peer messages refused
        self._refusals_logged: dict[tuple[int, str], float] = {}
        self._leader_seen = (0, 0)  # (term, leader)
        self.caught_up_at = 0.0  # monotonic time this node last had applied all it knew committed

    @property
    def log_store(self) -> LogStore:
        return self._log.log_store

    def _load_core(self, voters: list[int], learners: list[int]) -> RaftCore:
        """The Raft core as the stores hold it (at startup, and after running out of disk space)."""
        log_store, machine = self.log_store, self.machine
        applied, applied_term = machine.applied_index, machine.applied_term
        if applied > log_store.compacted_index and applied_term and log_store.term_at(applied) != applied_term:
            log_store.restore(applied, applied_term)  # a crash came between installing a checkpoint and this
        core = RaftCore(
            self.id,
            voters,
            log_store.hard_state(),
            log_store.entries(),
            compacted_index=log_store.compacted_index,
            compacted_term=log_store.compacted_term,
            learners=learners,
            applied=applied,
            seed=self._seed,
        )
        self._seed += 1  # a core loaded again draws other election timeouts
        core.commit_alone = self._commit_alone
        return core

    def hears_from_leader(self) -> bool:
        """Whether a leader is known and, on a follower or learner, was heard from within an election
        timeout (a learner never campaigns, so it would keep a lost leader's id)."""
        core = self.core
        return bool(core.leader) and (core.role is Role.LEADER or core.elapsed < core.election_ticks)

    @property
    def is_leader(self) -> bool:
        return self.core.role is Role.LEADER

    def status(self) -> Status:
        """This node's Raft state, copied: callers never hold the core itself."""
        core = self.core
        return Status(
            id=core.id,
            role=core.role,
            term=core.term,
            leader=core.leader,
            commit=core.commit,
            applied=core.applied,
            last_index=core.log.last_index(),
            checkpoint_index=core.log.checkpoint_index,
            voters=tuple(core.voters),
            learners=tuple(core.learners),
            match=core.tracker.match_indexes() if core.role is Role.LEADER else {},
        )

    async def start(self) -> None:
        single = self.core.voters == [self.id]
        if single:
            self.core.campaign()
        self._tasks = [asyncio.create_task(self._run()), asyncio.create_task(self._ticker())]
        self._wake.set()
        if single:
            # Replay the log up to the new term's no-op before serving.
            target = self.core.log.last_index()
            driver = self._tasks[0]
            while self.core.applied < target and not self._full:  # out of space: serve reads meanwhile
                if driver.done():  # it failed replaying: the startup fails with it, not waits for good
                    raise driver.exception() or RuntimeError("the Raft driver stopped during replay")
                await asyncio.sleep(0.001)

    async def transfer_leadership(self, timeout: float = 3.0) -> bool:
        """Hands leadership to a caught-up follower before this node goes away; True once it has."""
        if not self.is_leader or self.core.transfer_leadership() == 0:
            return False
        self._wake.set()
        deadline = asyncio.get_running_loop().time() + timeout
        while self.is_leader and self.core.transferee and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)  # the core gives up on a target that stopped answering
        return not self.is_leader

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._proposals.fail(ProposalDropped)
        for *_, install in self._installs:
            _settle(install, False)
        self._persister.shutdown(wait=True)
        try:
            self.machine.make_durable()
        except Exception as exc:  # out of space: the state store's log still holds every apply
            log.warning("could not sync the state store: %s", exc)

    async def propose(self, data: bytes, decoded: Any = None) -> Any:
        """Replicates `data` and returns the state machine's result for it.

        `decoded`, if given, is what the state machine would decode `data` into; applied here, the
        entry uses it instead of decoding its bytes again.
        """
        if not self.is_leader:
            raise NotLeader(self.core.leader)
        if self._full:
            raise _disk_full()
        fut = self._proposals.queue(data, decoded)
        self._wake.set()
        return await fut

    async def change_membership(self, new: Membership) -> None:
        """Replicates a one-node membership change; returns once it is applied here."""
        if not self.is_leader:
            raise NotLeader(self.core.leader)
        if self._full:
            raise _disk_full()
        error = self.core.membership_error(new)
        if error is not None:
            raise (MembershipBusy if error == CHANGE_IN_PROGRESS else MembershipRefused)(error)
        index = self.core.propose_membership(new, encode(new))
        assert index is not None
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._proposals.wait(index, self.core.term, fut)
        self._wake.set()
        await fut

    async def read_barrier(self, timeout: float = 3.0) -> None:
        """Returns once this node has applied everything committed before the call (ReadIndex)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        retry = READ_RETRY_SECONDS
        while True:
            # A ReadIndex or its answer may be lost on the way (Raft does not resend them): ask again.
            fut = self._reads.request(loop)
            self._wake.set()
            try:
                async with asyncio.timeout(max(0.0, min(retry, deadline - loop.time()))):
                    index = await fut
                break
            except TimeoutError:
                if loop.time() >= deadline:
                    raise
                retry *= 2
            except NotLeader:
                # No leader known yet (a node just started, or an election is on), or the one asked has
                # stepped down: an election takes well under the read's deadline, so wait for its end.
                if loop.time() + LEADERLESS_POLL >= deadline or not self._member:
                    raise
                await asyncio.sleep(LEADERLESS_POLL)
        if self.core.applied < index:
            async with asyncio.timeout_at(deadline):
                await self._reads.until_applied(loop, index)

    async def until_leader_known(self, timeout: float = 3.0) -> None:
        """Returns once this node knows a leader (itself or another), or after `timeout`; at once on a
        node that is no member as far as it knows (removed, or joining and not caught up): a removed
        one would wait for nothing, every time."""
        deadline = asyncio.get_running_loop().time() + timeout
        while not self.core.leader and self._member and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(LEADERLESS_POLL)

    @property
    def _member(self) -> bool:
        return self.id in self.core.voters or self.id in self.core.learners

    def note_refused(self, peer: int, reason: str) -> None:
        """Counts a refused peer message (app/raft/validate.py), and logs it at most every 10 s per peer
        and kind; peer 0 stands for every sender that is not a member."""
        member = peer in self.core.voters or peer in self.core.learners
        key = (peer if member else 0, reason)  # a sender may name any id: one series for non-members
        self.refused[key] += 1
        now = time.monotonic()
        if reason != STALE_TERM and now - self._refusals_logged.get(key, -REFUSAL_LOG_SECONDS) >= REFUSAL_LOG_SECONDS:
            self._refusals_logged[key] = now
            log.warning("refused a Raft message from node %s: %s (%d so far)", peer, reason, self.refused[key])

    def can_install_checkpoint(self, term: int, index: int) -> bool:
        """Whether a checkpoint at `index` from a leader of `term` would move this node forward."""
        return self.core.can_install_checkpoint(term, index)

    async def install_checkpoint(self, term: int, leader: int, index: int, index_term: int) -> bool:
        """Installs the staged checkpoint once the driver is between Readys; False if it is stale."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._installs.append((term, leader, index, index_term, fut))
        self._wake.set()
        return await fut

    def receive(self, msg: Message) -> None:
        if self._full:
            return  # dropped when the node starts over anyway, and Raft sends again
        self._inbox.append(msg)
        self._wake.set()

    def receive_all(self, messages: list[Message]) -> None:
        if self._full:
            return
        self._inbox.extend(messages)
        self._wake.set()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(self._tick_seconds)
            self.core.tick()
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                try:
                    await self._step_once()
                except OutOfSpace as exc:
                    await self._restart_after_disk_full(exc)
            except Exception:
                log.exception("raft driver failed; stopping")
                if self.on_failure is not None:
                    self.on_failure()
                raise

    async def _step_once(self) -> None:
        if self._installs and not await self._install_when_idle():
            return
        inbox, self._inbox = self._inbox, []
        for msg in inbox:
            self.core.step(msg)
        if inbox and not self.is_leader:
            self._proposals.cut_after(self.core.log.last_index())
        for data, fut, decoded in self._proposals.take():
            index = self.core.propose(data)
            if index is None:  # a leader handing over says it does not know who leads next
                fut.set_exception(NotLeader(0 if self.core.leader == self.id else self.core.leader))
            else:
                self._proposals.wait(index, self.core.term, fut, data, decoded)
        if self._reads.requests:
            self._reads.ask(self.core.read_index)
        while True:
            rd = self.core.ready()
            # A leader's AppendEntries may go out before its own sync (its entries count toward the
            # commit only once persisted); votes and acknowledgements wait for the disk.
            replicate: list[Message] = [m for m in rd.messages if isinstance(m, AppendEntries)]
            if replicate:
                rd.messages = [m for m in rd.messages if not isinstance(m, AppendEntries)]
                await self._deliver(replicate)
            if rd.hard_state is not None or rd.entries or self._log.unsaved:
                self._log.unsaved.add(rd)
                if self._log.syncs_here(self.is_leader):
                    await self._persisted(self._log.sync_here())
            elif not self._log.hold(rd.messages) and rd.messages:
                await self._deliver(rd.messages)
            if rd.committed:
                self._apply(rd.committed)
            for peer in rd.checkpoints:
                self._send_checkpoint(peer)
            for ctx, index in rd.reads:
                self._reads.answer(ctx, index, self.core.leader)
            for peer, reason in rd.refused:
                self.note_refused(peer, reason)
            seen = (self.core.term, self.core.leader)
            if self.core.leader and seen != self._leader_seen:  # a leader of a new term, not a lost one
                self._leader_seen = seen
                self.leader_changes += 1
            synced = await self._finish_sync()
            self._log.start()
            if not rd and not synced:
                return

    async def _install_when_idle(self) -> bool:
        """Installs a staged checkpoint once nothing is being persisted; False while it must wait."""
        await asyncio.get_running_loop().run_in_executor(self._persister, lambda: None)
        await self._finish_sync()
        if self._log.busy:
            self._log.start()
            return False
        term, leader, index, index_term, fut = self._installs.pop(0)
        if self.checkpoints is None or not self.core.can_install_checkpoint(term, index):
            _settle(fut, False)
            return True
        try:
            self.checkpoints.install()
            self.log_store.restore(index, index_term)
        except BaseException:
            _settle(fut, False)  # its sender hears it was not installed; this driver stops or starts over
            raise
        membership = self.machine.membership or Membership(dict.fromkeys(self.core.voters, ""))
        self.core.install_checkpoint(term, leader, index, index_term, membership)
        self._proposals.installed(index)
        self._reads.applied(self.core.applied)
        self._last_compacted, self._applied_bytes = index, 0
        self._membership_changed()
        self.checkpoint_installs += 1
        log.info("installed a checkpoint at index %s from node %s", index, leader)
        _settle(fut, True)
        return True

    def _send_checkpoint(self, peer: int) -> None:
        if self.checkpoints is None or peer in self._sending or not self.is_leader:
            return
        self._sending.add(peer)
        task = asyncio.create_task(self._stream_checkpoint(peer, self.checkpoints))
        self._tasks.append(task)
        task.add_done_callback(self._tasks.remove)

    async def _stream_checkpoint(self, peer: int, checkpoints: CheckpointLink) -> None:
        try:
            ok = await checkpoints.send(peer, self.core.term)
        except Exception:
            log.exception("checkpoint to node %s failed", peer)
            ok = False
        try:
            if not ok:
                await asyncio.sleep(CHECKPOINT_RETRY_SECONDS)
        finally:
            self._sending.discard(peer)
        self.core.checkpoint_finished(peer)
        self._wake.set()

    def _membership_changed(self) -> None:
        membership = self.machine.membership
        if membership is not None and self.id not in membership.voters and self.id not in membership.learners:
            # Removed: no entry past this one reaches this node, so none of its proposals will apply here.
            self._proposals.fail(ProposalDropped, after=self.core.applied)
        if self.on_membership is not None and membership is not None:
            self.on_membership(membership)

    async def _finish_sync(self) -> bool:
        batch = self._log.finished()
        if batch is None:
            return False
        await self._persisted(batch)
        return True

    async def _persisted(self, batch: Unsaved) -> None:
        if batch.entries:
            last = batch.entries[-1]
            self.core.on_persisted(last.index, last.term)
        await self._deliver(batch.messages)

    async def _deliver(self, messages: list[Message]) -> None:
        if messages and self._send is not None:
            await self._send(messages)

    def _apply(self, entries: list[Entry]) -> None:
        membership = self.machine.membership
        with out_of_space():
            results = self.machine.apply(entries, self._proposals.decoded(entries))
        self._proposals.applied(entries, results)
        self.core.on_applied(entries[-1].index)
        if self.core.applied >= self.core.commit:
            self.caught_up_at = time.monotonic()
        self._reads.applied(self.core.applied)
        if self.machine.membership is not membership:
            self._membership_changed()
        self._applied_bytes += sum(len(e.data) for e in entries)
        due = self.core.applied - self._last_compacted >= self._compact_entries or self._applied_bytes >= COMPACT_BYTES
        if due:
            self._compact()

    def _compact(self) -> None:
        alone = self.core.voters == [self.id] and not self.core.learners
        index = min(self.core.applied - (0 if alone else self._compact_keep), self.core.log.stable)
        if index <= self._last_compacted:
            return
        term = self.core.log.term_at(index) or 0
        self.core.compact(index)
        self._last_compacted = index
        self._applied_bytes = 0
        # On the persister, after the syncs before it: the state is made durable, then the log trimmed.
        self._persister.submit(self._compact_on_disk, index, term)

    def _compact_on_disk(self, index: int, term: int) -> None:
        self.machine.make_durable()
        self.log_store.compact(index, term)

    async def _restart_after_disk_full(self, exc: OutOfSpace) -> None:
        """Starts over from the stores, as a restart would, once they take writes again.

        Nothing is acknowledged before its entry is synced, so dropping what is only in memory is
        what a crash would do, and as safe. Proposals whose entries were synced keep waiting: they
        commit and apply once the node is back. The others answer 507: on a single node their
        entries are gone for good (a cluster may still commit one its followers got, as after any
        leader's crash). Meanwhile reads go on from the state machine, reloaded from its store in
        case an apply failed half-way, and the 507 disk guard keeps this rare.
        """
        log.error("out of disk space (%s): no writes until the stores take them again", exc)
        self._full = True
        await self._log.settle()
        with contextlib.suppress(OutOfSpace):
            await self._finish_sync()
        await asyncio.get_running_loop().run_in_executor(self._persister, lambda: None)  # queued compactions
        synced = self.core.log.stable
        self._fail_waiting(synced)
        self.machine.reload(self.machine.kv)
        stores = [self.log_store.kv, self.machine.kv]
        while not all([kv.recover() for kv in stores]):  # a list: every store gets its try
            await asyncio.sleep(RECOVER_SECONDS)
        # A write whose sync failed may be in the store all the same: its proposals were answered
        # "not acknowledged", so it must not come back as synced when the log is loaded again.
        self.log_store.drop_after(synced)
        self._log.reset(LogStore(self.log_store.kv))
        membership = self.machine.membership
        voters = sorted(membership.voters) if membership else self.core.voters
        learners = sorted(membership.learners) if membership else self.core.learners
        self.core = self._load_core(voters, learners)
        self._inbox = []
        self._last_compacted, self._applied_bytes = self.log_store.compacted_index, 0
        if self.core.voters == [self.id]:
            self.core.campaign()
        self._full = False
        self._wake.set()
        log.info("the stores take writes again")

    def _fail_waiting(self, synced: int) -> None:
        """Fails pending reads and the proposals whose entries are not synced (index past `synced`)."""
        self._proposals.fail(_disk_full, after=synced)
        self._reads.fail()


def _disk_full() -> Exception:
    return insufficient_storage("the node is out of disk space: this write was not acknowledged; retry later")


def _settle(fut: asyncio.Future[bool], installed: bool) -> None:
    """Answers a checkpoint's sender, unless its request was cancelled meanwhile (the server stopping)."""
    if not fut.done():
        fut.set_result(installed)
