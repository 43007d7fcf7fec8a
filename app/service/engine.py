"""The Engine: submit commands through Raft, look up and read streams, renew TTLs.

Every route family, the cluster routes and the tiering worker go through an `Engine`; none of
them drives the Raft node or the state machine directly. Time comes from an injected clock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, Protocol, cast

from app.cluster.driver import RaftNode
from app.cluster.driver_errors import NotLeader, ProposalDropped
from app.counters.counts import WriteCounters
from app.domain.errors import LeaderOnly, ProtocolError, missing_bucket, missing_stream
from app.raft.messages import Membership
from app.security.quotas import Quotas
from app.service.budget import BodyBudget
from app.service.clock import Clock, wall_clock_ms
from app.service.limits import Limits
from app.service.signals import Signals
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
from app.state_machine.records import PublishedSnapshot, SegmentInfo, StreamMeta
from app.state_machine.table import StreamTable
from app.storage.disk import DiskGuard
from app.subscriptions.settings import WebhookSettings
from app.subscriptions.trouble import DeliveryTrouble
from app.tiering.cache import CacheBusy, read_through
from app.tiering.store import ObjectStore, StoreUnavailable

COLLECT_AT_ONCE = 1000  # expired streams removed per entry
log = logging.getLogger("rill.engine")


READ_AHEAD_SEGMENTS = 2
LARGE_BODY = 1 << 20
COLD_TRIES = 8  # fetches one read may make, each evicted by other reads before it could use it


class ColdCache(ColdSource, Protocol):
    async def fetch(self, segment: SegmentInfo) -> None: ...

    def cached(self, segment: SegmentInfo) -> bool: ...

    def prefetch(self, segment: SegmentInfo) -> None: ...


def _cold_cache_busy() -> ProtocolError:
    return ProtocolError(
        503, "cold_cache_busy", "other reads keep evicting this range from the cold cache; retry", {"retry-after": "1"}
    )


def _adds_data(command: Command) -> bool:
    if isinstance(command, AppendBatch):
        return any(command.bodies)
    return isinstance(command, Append | CreateStream) and bool(command.body)


def _grows_storage(command: Command) -> bool:
    """What a nearly full disk refuses. Deletes, trims, closes, TTL renewals and tiering pass: they free space."""
    if isinstance(command, Append):
        return bool(command.body)
    return isinstance(command, CreateBucket | CreateStream | AppendBatch | SetAttrs | PublishSnapshot)


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
        webhooks: WebhookSettings | None = None,
        delivery_trouble: DeliveryTrouble | None = None,
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
        self.uploading: collections.Counter[str] = collections.Counter()  # keys being uploaded, and by how many
        self.hot_backlog_budget = hot_backlog_budget
        # Static configuration until a membership change is applied; then the replicated one.
        self.static_membership = Membership(dict(peers or {node.id: ""}))
        self._members: tuple[Membership | None, dict[int, str]] = (None, {})
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
        self.webhooks = webhooks  # None: subscriptions are not served
        self._delivery_trouble = delivery_trouble

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
        """Keeps the collector off `key` meanwhile. Counted: two publishes of the same content share
        a key, and the first to finish must not expose the other's object."""
        self.uploading[key] += 1
        try:
            yield
        finally:
            self.uploading[key] -= 1
            if not self.uploading[key]:
                del self.uploading[key]

    async def read(self, meta: StreamMeta, pos: int, whole_records: bool = False, max_bytes: int = 0) -> Chunk:
        """The chunk at `pos`, fetching segments that are only in the object store as the read reaches them."""
        max_bytes = min(max_bytes or self.limits.read_chunk_bytes, self.limits.read_chunk_bytes)
        try:
            chunk = self.machine.read(meta, pos, max_bytes, self.cold, whole_records)
        except ColdMiss:
            if self.cold is None:
                raise
            chunk = await self._read_cold(meta, pos, max_bytes, whole_records)
        self.counters.read_bytes += chunk.size
        self._read_ahead(meta, chunk.next_pos)
        return chunk

    async def _read_cold(self, meta: StreamMeta, pos: int, max_bytes: int, whole_records: bool) -> Chunk:
        async def fetch(segment: SegmentInfo) -> None:
            await self._fetch(segment)
            if self.machine.streams.get(meta.sid) is not meta:
                raise missing_stream()  # deleted (or made again) while the fetch was awaited

        try:
            return await read_through(
                lambda: self.machine.read(meta, pos, max_bytes, self.cold, whole_records), fetch, COLD_TRIES
            )
        except CacheBusy:
            raise _cold_cache_busy() from None

    async def evicted_record(self, meta: StreamMeta, pos: int) -> bytes | None:
        """The whole record at `pos` if it has been evicted to the object store; None otherwise."""
        length = self.machine.record_length(meta, pos)
        if length is None or self.cold is None:
            return None
        owner = self.machine.owner(meta, pos)
        segment = self.machine.segment_at(owner.sid, pos)
        if segment is None:
            return None
        for _ in range(COLD_TRIES):
            await self._fetch(segment)
            try:
                return next((bytes(p) for _, p in self.cold.records(segment, pos, pos + 1)), None)
            except ColdMiss:
                continue  # other reads evicted it meanwhile
        raise _cold_cache_busy()

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

    # What the protocol asks of the state (it never reaches into the state machine itself)

    @property
    def table(self) -> StreamTable:
        """The replicated state's tables, for the subscription rules that read them."""
        return self.machine.table

    def stream(self, sid: int) -> StreamMeta | None:
        return self.machine.streams.get(sid)

    def lookup(self, bucket: str, name: str) -> StreamMeta | None:
        """The stream at (bucket, name), whatever its state (deleted, expired); `find` for a live one."""
        return self.machine.lookup(bucket, name)

    def buckets(self) -> dict[str, int]:
        """Every bucket's creation time (ms), by name."""
        return self.machine.buckets

    def bucket_names(self, start: str = "") -> Iterator[str]:
        return self.machine.bucket_names(start)

    def bucket_streams(self, bucket: str, prefix: str = "", after: str = "") -> Iterator[StreamMeta]:
        return self.machine.bucket_streams(bucket, prefix, after)

    def is_boundary(self, meta: StreamMeta, pos: int) -> bool:
        """Whether `pos` starts a record (a JSON stream's offsets must)."""
        return self.machine.is_boundary(meta, pos)

    def read_local(self, meta: StreamMeta, pos: int) -> Chunk:
        """A chunk from this node's own records only (the live tail): never waits on the object store."""
        return self.machine.read(meta, pos, self.limits.read_chunk_bytes)

    def local_records(
        self, meta: StreamMeta, pos: int, max_records: int = 0
    ) -> tuple[list[tuple[int, bytes]], int] | None:
        return self.machine.local_records(meta, pos, self.limits.read_chunk_bytes, max_records)

    def evicted_span(self, meta: StreamMeta, pos: int) -> tuple[StreamMeta, int]:
        return self.machine.evicted_span(meta, pos)

    def snapshot_at(self, sid: int, pos: int) -> PublishedSnapshot | None:
        return self.machine.snapshot_at(sid, pos)

    def membership(self) -> Membership:
        return self.machine.membership or self.static_membership

    @property
    def peers(self) -> dict[int, str]:
        """Every member's URL by node id, as of the last membership change applied (else the static one)."""
        membership = self.membership()
        if membership is not self._members[0]:
            self._members = (membership, {**membership.learners, **membership.voters})
        return self._members[1]

    def delivery_status(self, key: bytes) -> dict[str, Any] | None:
        """The leader's trouble delivering to a subscription (by key): the last error and when it retries."""
        trouble = self._delivery_trouble
        return trouble.status(key, self.now_ms()) if trouble is not None else None

    @property
    def is_leader(self) -> bool:
        return self.node.is_leader

    @property
    def clustered(self) -> bool:
        return len(self.peers) > 1

    async def led_elsewhere(self) -> bool:
        """Whether another node leads, once a node that knows no leader yet (it just started, or an
        election is on) has waited a little for one: a write is then sent on, not refused 503 at once."""
        if not self.clustered or self.node.is_leader:
            return False
        await self.node.until_leader_known()
        return not self.node.is_leader

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

    def touched_at(self, bucket: str, name: str) -> int:
        """The stream's latest read here, which renewed its sliding TTL on this node only: a command
        naming the stream carries it, so its apply does not take the stream for expired."""
        meta = self.lookup(bucket, name)
        return self.touched(meta.sid) if meta else 0

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
            if self.node.is_leader:
                await self.collect_expired()

    async def collect_expired(self) -> None:
        """Removes the streams expired by now, up to COLLECT_AT_ONCE, looking only at those scheduled
        to expire by now (app/state_machine/upkeep.py)."""
        now, upkeep, streams = self.now_ms(), self.machine.upkeep, self.machine.streams
        expired: list[int] = []
        for sid in upkeep.may_have_expired(now):
            meta = streams.get(sid)
            at = None if meta is None or meta.deleted else meta.expiry(self.touched(sid))
            if at is None:
                self._read_touches.pop(sid, None)
            elif at <= now:
                expired.append(sid)
                if len(expired) == COLLECT_AT_ONCE:
                    break  # the rest stay scheduled: a sweep looks at what it can collect, not at all that is due
            else:
                upkeep.schedule(sid, at)  # touched since it was scheduled
        if len(self._read_touches) > 2 * upkeep.expiring + 1024:  # streams deleted meanwhile
            self._read_touches = {s: t for s, t in self._read_touches.items() if upkeep.is_expiring(s)}
        try:
            if expired:
                await self.submit(CollectExpired(expired))
        except ProtocolError:
            log.info("expiry sweep deferred: no leader")
        finally:
            for sid in expired:  # not collected (the proposal failed): the next sweep's
                meta = self.machine.streams.get(sid)
                if meta is None or meta.deleted:
                    self._read_touches.pop(sid, None)
                else:
                    self.machine.upkeep.schedule(sid, now)
