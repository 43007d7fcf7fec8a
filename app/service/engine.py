"""The node's service layer: submit commands through Raft, look up and read streams, renew TTLs.

Every route family, the cluster routes and the tiering worker go through an `Engine`; none of
them drives the Raft node or the state machine directly. Time comes from an injected clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol, cast

from app.cluster.driver import NotLeader, ProposalDropped, RaftNode
from app.domain.errors import LeaderOnly, ProtocolError, missing_bucket, missing_stream
from app.observability.counters import WriteCounters
from app.raft.messages import Membership
from app.security.quotas import Quotas
from app.state_machine.commands import (
    Append,
    AppendBatch,
    Code,
    CollectExpired,
    Command,
    CreateBucket,
    CreateStream,
    Envelope,
    Outcome,
    PublishSnapshot,
    SetAttrs,
    Touch,
    encode_envelope,
)
from app.state_machine.machine import StateMachine
from app.state_machine.reader import Chunk, ColdMiss, ColdSource
from app.state_machine.records import SegmentInfo, StreamMeta
from app.storage.disk import DiskGuard
from app.subscriptions.settings import WebhookSettings
from app.tiering.store import ObjectStore, StoreUnavailable

log = logging.getLogger("rill.engine")


READ_AHEAD_SEGMENTS = 2
LARGE_BODY = 1 << 20


class ColdCache(ColdSource, Protocol):
    async def fetch(self, segment: SegmentInfo) -> None: ...

    def cached(self, segment: SegmentInfo) -> bool: ...

    def prefetch(self, segment: SegmentInfo) -> None: ...


@dataclass
class Limits:
    max_body_bytes: int = 64 * 1024 * 1024
    read_chunk_bytes: int = 1024 * 1024
    long_poll_seconds: float = 20.0
    sse_max_seconds: float = 60.0
    sse_ping_seconds: float = 15.0
    sse_buffer_bytes: int = 1 << 20  # unsent bytes a live subscriber may fall behind by
    snapshot_max_bytes: int = 64 * 1024 * 1024
    bootstrap_max_bytes: int = 8 * 1024 * 1024
    public_url: str | None = None  # this node's URL as clients see it, if configured
    # What the URLs the node hands out start with (Location, callback and JWKS URLs): public_url, else
    # the node's own address (app/server.py: base_url). Never a host the request's Host header names,
    # unless it is a cluster member's (app/protocol/http.py: absolute_url).
    base_url: str = "http://127.0.0.1:4437"
    body_budget_bytes: int = 256 * 1024 * 1024  # request bodies held at once, all requests together


class BodyBudget:
    """Bytes of request bodies the node holds at once; past the budget a request gets a 503."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, size: int) -> int:
        if self.used + size > self.total:
            raise ProtocolError(
                503, "server_busy", "too many request bodies in flight; retry shortly", {"retry-after": "1"}
            )
        self.used += size
        return size

    def give_back(self, size: int) -> None:
        self.used -= size


def _adds_data(command: Command) -> bool:
    return isinstance(command, Append | CreateStream) and bool(command.body)


def _grows_storage(command: Command) -> bool:
    """What a nearly full disk refuses. Deletes, trims, closes, TTL renewals and tiering pass: they free space."""
    if isinstance(command, Append):
        return bool(command.body)
    return isinstance(command, CreateBucket | CreateStream | AppendBatch | SetAttrs | PublishSnapshot)


Clock = Callable[[], int]  # milliseconds since the epoch


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Signals:
    def __init__(self) -> None:
        self._waiters: dict[int, set[asyncio.Future[None]]] = {}
        self._listeners: list[Callable[[set[int]], None]] = []

    def listen(self, listener: Callable[[set[int]], None]) -> None:
        """Calls `listener` with the changed streams after every apply (the SSE fan-out's hook)."""
        self._listeners.append(listener)

    async def wait(self, sid: int, timeout: float) -> bool:
        """Waits until `sid` changes; False on timeout. Register before any await, right after checking."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault(sid, set())
        waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            waiters.discard(fut)
            if not waiters and self._waiters.get(sid) is waiters:
                del self._waiters[sid]

    def notify(self, sids: set[int]) -> None:
        for listener in self._listeners:
            listener(sids)
        for sid in sids:
            for fut in self._waiters.pop(sid, ()):
                if not fut.done():
                    fut.set_result(None)


class Engine:
    def __init__(
        self,
        node: RaftNode,
        machine: StateMachine,
        signals: Signals,
        limits: Limits,
        peers: dict[int, str] | None = None,
        forward_writes: bool = False,
        cold: ColdCache | None = None,
        hot_backlog_budget: int = 2 << 30,
        store: ObjectStore | None = None,
        clock: Clock = wall_clock_ms,
        disk: DiskGuard | None = None,
        quotas: Quotas | None = None,
        peer_routes: dict[int, str] | None = None,
        unsafe_skip_read_barrier: bool = False,
    ) -> None:
        self.node = node
        self.skip_read_barrier = unsafe_skip_read_barrier  # TEST ONLY: stale reads for the chaos checker
        self.peer_routes = dict(peer_routes or {})
        self.quotas = quotas
        self.disk = disk
        self.now_ms = clock
        self.cold = cold
        self.store = store
        # Keys being uploaded and not yet recorded: the deletion queue must leave them alone.
        self.uploading: set[str] = set()
        self.hot_backlog_budget = hot_backlog_budget
        # Static configuration until a membership change is applied; then the replicated one.
        self.static_membership = Membership(dict(peers or {node.id: ""}))
        self.peers: dict[int, str] = {}
        self.set_membership(machine.membership or self.static_membership)
        self.forward_writes = forward_writes
        self.machine = machine
        self.signals = signals
        self.limits = limits
        self.body_budget = BodyBudget(limits.body_budget_bytes)
        # Reads renew sliding TTLs here at once; the replicated renewal is rate-limited.
        self._read_touches: dict[int, int] = {}
        self._touching: set[int] = set()
        self._background: set[asyncio.Future[None]] = set()
        self.counters = WriteCounters()
        self.webhooks: WebhookSettings | None = None  # set by the server: subscriptions are served
        # The leader's trouble delivering to a subscription (by key), set by the server's deliveries.
        self.delivery_status: Callable[[bytes], dict[str, Any] | None] = lambda key: None

    async def submit(self, command: Command) -> Outcome:
        if self.machine.untiered_bytes > self.hot_backlog_budget and _adds_data(command):
            raise ProtocolError(
                503, "cold_tier_backlog", "too much data is waiting for the object store; retry later",
                {"retry-after": "5"},
            )  # fmt: skip
        now = self.now_ms()
        charge = self.quotas.check(command, now) if self.quotas is not None else None
        data = encode_envelope(now, command)
        # An append's apply on this node can take the command as it is, not decoded from the entry.
        decoded = Envelope(now, command) if isinstance(command, Append) and len(command.body) <= LARGE_BODY else None
        if self.disk is not None:
            if _grows_storage(command):
                self.disk.check(len(data))  # 507 below the free-space watermark
            else:
                self.disk.usage()  # measured now and then: a full disk gives up its ballast, so deletes can run
        appended = len(command.body) if isinstance(command, Append) else 0
        if isinstance(command, Append | CreateStream) and len(command.body) > LARGE_BODY:
            # The entry holds the body now: drop this reference so a large one is held once.
            command.body = memoryview(b"")
        try:
            # A large entry is a bytearray; the log only encodes, slices and decodes it, as bytes.
            outcome = await self.node.propose(cast(bytes, data), decoded)
        except NotLeader:
            raise ProtocolError(503, "no_leader", "this node cannot accept writes now", {"retry-after": "1"}) from None
        except ProposalDropped:
            raise ProtocolError(503, "retry", "leadership changed; retry the request", {"retry-after": "1"}) from None
        if appended and outcome.code is Code.APPENDED:
            self.counters.appends += 1
            self.counters.appended_bytes += appended
        elif isinstance(command, AppendBatch):
            self._count_batch(command, outcome)
        if charge is not None and self.quotas is not None and outcome.code in (Code.CREATED, Code.APPENDED, Code.OK):
            self.quotas.charge(charge)  # refusals add nothing
        return outcome

    def _count_batch(self, command: AppendBatch, outcome: Outcome) -> None:
        for body, each in zip(command.bodies, outcome.batch or [], strict=False):
            if each.code is Code.APPENDED:
                self.counters.appends += 1
                self.counters.appended_bytes += len(body)

    async def read_barrier(self) -> None:
        """Brings this node's state up to everything committed so far (no-op on a single node)."""
        if not self.clustered or self.skip_read_barrier:
            return
        try:
            await self.node.read_barrier()
        except (NotLeader, TimeoutError):
            raise ProtocolError(503, "no_leader", "cannot confirm the latest state now", {"retry-after": "1"}) from None

    async def find_latest(self, bucket: str, name: str) -> StreamMeta:
        """`find`, after a read barrier: for answers about the stream's tail."""
        await self.read_barrier()
        return self.find(bucket, name)

    @contextlib.asynccontextmanager
    async def uploading_key(self, key: str) -> AsyncIterator[None]:
        self.uploading.add(key)
        try:
            yield
        finally:
            self.uploading.discard(key)

    async def read(self, meta: StreamMeta, pos: int, whole_records: bool = False, max_bytes: int = 0) -> Chunk:
        """The chunk at `pos`, fetching segments that are only in the object store as the read reaches them."""
        max_bytes = min(max_bytes or self.limits.read_chunk_bytes, self.limits.read_chunk_bytes)
        while True:
            try:
                chunk = self.machine.read(meta, pos, max_bytes, self.cold, whole_records)
                self.counters.read_bytes += chunk.size
                self._read_ahead(meta, chunk.next_pos)
                return chunk
            except ColdMiss as miss:
                if self.cold is None:
                    raise
                await self._fetch(miss.segment)
                if self.machine.streams.get(meta.sid) is not meta:
                    raise missing_stream() from None

    async def evicted_record(self, meta: StreamMeta, pos: int) -> bytes | None:
        """The whole record at `pos` if it has been evicted to the object store; None otherwise."""
        length = self.machine.record_length(meta, pos)
        if length is None or self.cold is None:
            return None
        owner = self.machine.owner(meta, pos)
        segment = self.machine.segment_at(owner.sid, pos)
        if segment is None:
            return None
        await self._fetch(segment)
        return next((bytes(p) for _, p in self.cold.records(segment, pos, pos + 1)), None)

    async def _fetch(self, segment: SegmentInfo) -> None:
        assert self.cold is not None
        try:
            await self.cold.fetch(segment)
        except StoreUnavailable as exc:
            log.warning("cold read failed: %s", exc)
            raise ProtocolError(
                503,
                "cold_tier_unavailable",
                "the object store holding this range is unavailable",
                {"retry-after": "2"},
            ) from None

    def _read_ahead(self, meta: StreamMeta, pos: int) -> None:
        """A catch-up reader in the cold range will want the next segment: fetch it while this chunk goes out."""
        if self.cold is None or pos >= meta.tail:
            return
        owner = self.machine.owner(meta, pos)
        if pos >= owner.evicted:
            return
        segment = self.machine.segment_at(owner.sid, pos)
        for _ in range(READ_AHEAD_SEGMENTS + 1):
            if segment is None:
                return
            self.cold.prefetch(segment)
            segment = self.machine.segment_at(owner.sid, segment.hi) if segment.hi < owner.evicted else None

    def membership(self) -> Membership:
        return self.machine.membership or self.static_membership

    def set_membership(self, membership: Membership) -> None:
        self.peers = {**membership.learners, **membership.voters}

    @property
    def is_leader(self) -> bool:
        return self.node.is_leader

    @property
    def clustered(self) -> bool:
        return len(self.peers) > 1

    def leader_url(self) -> str | None:
        """The leader's base URL when another node leads; None when unknown."""
        return self.peers.get(self.node.status().leader)

    def leader_route(self) -> str | None:
        """Where this node reaches the leader to forward a write: its --peer-routes entry, else its URL."""
        leader = self.node.status().leader
        return self.peer_routes.get(leader) or self.peers.get(leader)

    def bucket_exists(self, bucket: str) -> bool:
        return bucket in self.machine.buckets

    def touched(self, sid: int) -> int:
        return self._read_touches.get(sid, 0)

    def find(self, bucket: str, name: str) -> StreamMeta:
        """The live stream at (bucket, name), or a 404/410 ProtocolError."""
        if bucket not in self.machine.buckets:
            raise missing_bucket(bucket)
        meta = self.machine.lookup(bucket, name)
        if meta is None:
            raise missing_stream()
        if meta.ttl is not None and self.clustered and not self.node.is_leader:
            # The leader keeps the sliding-TTL clock its expiry sweep goes by: it serves these.
            raise LeaderOnly()
        if meta.deleted:
            raise ProtocolError(410, "stream_gone", "stream was deleted; forks still reference its data")
        if meta.expired(self.now_ms(), self.touched(meta.sid)):
            if meta.forks:
                raise ProtocolError(410, "stream_gone", "stream expired; forks still reference its data")
            raise missing_stream()
        return meta

    def renew(self, meta: StreamMeta) -> None:
        """A read renews a sliding TTL: locally now, replicated when a quarter of it has passed."""
        if meta.ttl is None:
            return
        now = self.now_ms()
        self._read_touches[meta.sid] = now
        if now - meta.touched_at >= meta.ttl * 250 and meta.sid not in self._touching:
            self._touching.add(meta.sid)
            self._spawn(self._touch(meta))

    async def _touch(self, meta: StreamMeta) -> None:
        try:
            await self.submit(Touch(meta.bucket, meta.name))
        except ProtocolError:
            pass
        finally:
            self._touching.discard(meta.sid)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def collect_expired_forever(self, every_seconds: float = 1.0) -> None:
        """Leader-side sweeper: replicates the removal of streams that expired."""
        while True:
            await asyncio.sleep(every_seconds)
            if not self.node.is_leader:
                continue
            now = self.now_ms()
            sids = [
                m.sid
                for m in list(self.machine.streams.values())
                if not m.deleted and m.expired(now, self.touched(m.sid))
            ]
            for sid in [*sids, *(s for s in self._read_touches if s not in self.machine.streams)]:
                self._read_touches.pop(sid, None)
            if sids:
                try:
                    await self.submit(CollectExpired(sids[:1000]))
                except ProtocolError:
                    log.info("expiry sweep deferred: no leader")
