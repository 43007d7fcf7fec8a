"""One node, built from its settings in order: stores, Raft, engine, and the background workers.

`build_node` opens the stores and constructs every part, each given what it needs when it is made;
nothing is wired in afterwards. `Node.start` and `Node.stop` are the app's lifespan: they start the
Raft driver and the background tasks, and stop them and close the stores in reverse order.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from app.cluster.checkpoints import Checkpoints
from app.cluster.driver import RaftNode
from app.cluster.log_store import COLUMN_FAMILIES as LOG_COLUMN_FAMILIES
from app.cluster.log_store import LogStore
from app.cluster.peer_client import client_context
from app.cluster.transport import Transport, Verifier
from app.config import Settings
from app.raft.messages import Membership
from app.runtime import blocking
from app.security.quotas import Quotas
from app.service.clock import ForwardClock
from app.service.engine import Engine
from app.service.limits import Limits
from app.service.signals import Signals
from app.serving.clients import ClientSlots
from app.state_machine.machine import StateMachine
from app.state_machine.records import COLUMN_FAMILIES
from app.storage.disk import DiskGuard
from app.storage.kv import KV
from app.storage.rocks import RocksKV, reopen_need
from app.storage.state_store import StateStore
from app.subscriptions.delivery import Deliveries
from app.subscriptions.settings import WebhookSettings
from app.subscriptions.signing import WebhookSigner
from app.subscriptions.trouble import DeliveryTrouble
from app.subscriptions.urls import parse_networks
from app.tiering.backups import BackupConfig, StateBackups
from app.tiering.cache import SegmentCache
from app.tiering.store import FileStore, ObjectStore, StoreOptions, open_store
from app.tiering.worker import TieringConfig, TieringWorker

log = logging.getLogger("rill.server")

OpenKV = Callable[[Path, list[str]], KV]
STOP_WAIT_SECONDS = 5.0  # for each of: the background tasks to end, the blocking calls to finish


@dataclass
class Node:
    """A node's parts. The app's routes use the engine; its lifespan calls start and stop."""

    settings: Settings
    peer_tls: ssl.SSLContext | None
    disk: DiskGuard
    raft_kv: KV
    machine: StateMachine
    transport: Transport | None
    verifier: Verifier
    checkpoints: Checkpoints
    raft: RaftNode
    engine: Engine
    tiering: TieringWorker
    backups: StateBackups
    deliveries: Deliveries
    clients: ClientSlots | None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        if self.transport is not None:
            self.transport.start()
        await self.raft.start()
        # Long-lived startup objects leave the collector's view, and young collections run less
        # often: request objects die by reference counting, and full passes cost p99 latency.
        gc.collect()
        gc.freeze()
        gc.set_threshold(20_000, 20, 100)
        background = [
            self.engine.collect_expired_forever(),
            self.tiering.run_forever(),
            self.backups.run_forever(),
            self.deliveries.run_forever(),
        ]
        if self.clients is not None:
            # The other nodes' Raft messages and forwarded writes must not meet the per-client connection limit.
            background.append(self.clients.follow_peers(self._other_members))
        self._tasks = [asyncio.create_task(work) for work in background]
        blocking.start()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self._tasks:  # bounded: a task that ignored its cancellation must not hold the stop for good
            await asyncio.wait(self._tasks, timeout=STOP_WAIT_SECONDS)
        if self.transport is not None and await self.raft.transfer_leadership():
            log.info("handed leadership over before shutting down")
        await self.raft.stop()
        await self.checkpoints.close()
        if self.transport is not None:
            await self.transport.close()
        # A thread still reading a store (a segment build, a backup) would keep it open, and locked.
        if not await blocking.settle(STOP_WAIT_SECONDS):
            log.warning("closing the stores with blocking calls still running after %.0f s", STOP_WAIT_SECONDS)
        self.machine.kv.close()
        self.raft_kv.close()

    def stop_pools(self) -> None:
        """Stops the thread pools blocking calls run on: after everything that may still use them."""
        blocking.shutdown()

    def _other_members(self) -> list[str]:
        return [url for pid, url in self.engine.peers.items() if pid != self.settings.node_id]


def build_node(settings: Settings, open_kv: OpenKV | None = None, clients: ClientSlots | None = None) -> Node:
    """`open_kv(path, column_families)` opens the Raft log's and the state machine's stores (RocksDB by
    default); `clients` is the HTTP edge's count of connections per address, which exempts the members."""
    data_dir = Path(settings.data_dir)
    # Peers and a forwarded write's leader at https:// URLs are verified against --tls-ca (default: system CAs).
    peer_tls = client_context(settings.tls_ca) if settings.tls_ca is not None else None
    state_store = StateStore(data_dir, COLUMN_FAMILIES)
    disk = DiskGuard(
        data_dir,
        settings.disk_min_free_bytes,
        settings.disk_min_free_ratio,
        settings.disk_ballast_bytes,
        reserve=lambda: reopen_need(data_dir / "raft") + reopen_need(state_store.path),
    )
    disk.start()  # before the stores open: opening writes, and on a full disk the ballast makes room
    raft_kv = (open_kv or RocksKV)(data_dir / "raft", LOG_COLUMN_FAMILIES)
    signals = Signals()
    state_kv = state_store.open() if open_kv is None else open_kv(state_store.path, COLUMN_FAMILIES)
    machine = StateMachine(
        state_kv,
        on_change=signals.notify,
        tail_cache_bytes=settings.tail_cache_bytes,
        tail_stream_bytes=settings.tail_stream_bytes,
    )
    membership = machine.membership or Membership(settings.peers or {settings.node_id: ""})
    secret = settings.cluster_secret.encode()
    if settings.unsafe_test_fault:
        log.warning("UNSAFE TEST BUILD (%s): writes may be lost, reads stale", settings.unsafe_test_fault)
    clustered = bool(settings.peers) or len(membership.voters) + len(membership.learners) > 1
    verifier = Verifier(secret, settings.node_id)
    transport = (
        # Replies to this node's messages go to its Raft node, made below: the two send to each other.
        Transport(
            settings.node_id,
            _members(membership),
            secret,
            peer_tls,
            settings.peer_routes,
            verifier=verifier,
            deliver=lambda msg: raft.receive(msg),
            channels=settings.peer_channels,
        )  # fmt: skip
        if clustered
        else None
    )
    checkpoints = Checkpoints(settings.node_id, state_store, machine, transport)

    def membership_changed(new: Membership) -> None:
        if transport is not None:
            transport.set_peers(_members(new))
        if clients is not None:
            clients.peers_changed()

    raft = RaftNode(
        settings.node_id,
        sorted(membership.voters),
        LogStore(raft_kv),
        machine,
        learners=sorted(membership.learners),
        send=transport.send if transport else None,
        checkpoints=checkpoints,
        on_membership=membership_changed,
        on_failure=lambda: os.kill(os.getpid(), signal.SIGTERM),
        tick_seconds=settings.raft_tick_seconds,
        compact_entries=settings.raft_compact_entries,
        compact_keep=settings.raft_compact_keep,
        unsafe_commit_alone=settings.unsafe_test_fault == "commit-alone",
    )
    store = _cold_store(settings, data_dir, clustered)
    signer = WebhookSigner.from_secret(secret) if secret else WebhookSigner.from_file(data_dir / "webhook.key")
    trouble = DeliveryTrouble()
    engine = Engine(
        raft,
        machine,
        signals,
        _limits(settings),
        settings.peers,
        settings.forward_writes,
        cold=SegmentCache(store, settings.cold_cache_bytes),
        hot_backlog_budget=settings.hot_backlog_budget,
        store=store,
        clock=ForwardClock(lambda: machine.latest_now),
        disk=disk,
        quotas=Quotas(machine, settings.bucket_quota, settings.bucket_quotas),
        peer_routes=settings.peer_routes,
        webhooks=WebhookSettings(signer, parse_networks(settings.webhook_allowed_networks)),
        delivery_trouble=trouble,
        unsafe_skip_read_barrier=settings.unsafe_test_fault == "read-without-barrier",
    )
    tiering = TieringWorker(
        engine,
        store,
        TieringConfig(
            segment_max_bytes=settings.segment_max_bytes,
            segment_max_age=settings.segment_max_age,
            pack_below_bytes=settings.pack_below_bytes,
            merge_min_segments=settings.merge_min_segments,
            local_disk_budget=settings.local_disk_budget,
            interval=settings.tiering_interval,
        ),
    )
    backups = StateBackups(
        engine,
        settings.node_id,
        store,
        state_store if open_kv is None else None,
        BackupConfig(
            interval=settings.state_checkpoint_interval,
            entries=settings.state_checkpoint_entries,
            keep=settings.state_checkpoint_keep,
        ),
    )
    tiering.backup_floor = backups.floor
    deliveries = Deliveries(engine, trouble=trouble)
    return Node(
        settings, peer_tls, disk, raft_kv, machine, transport, verifier, checkpoints, raft, engine, tiering,
        backups, deliveries, clients,
    )  # fmt: skip


def _members(membership: Membership) -> dict[int, str]:
    return {**membership.learners, **membership.voters}


def _cold_store(settings: Settings, data_dir: Path, clustered: bool) -> ObjectStore:
    store = open_store(
        settings.cold_store or str((data_dir / "cold").resolve()),
        StoreOptions(
            endpoint_url=settings.s3_endpoint_url, region=settings.s3_region, path_style=settings.s3_path_style
        ),
    )
    if clustered and isinstance(store, FileStore):
        log.warning("cold store %s is a local directory: every node must see the same one", store.url)
    return store


def _limits(settings: Settings) -> Limits:
    return Limits(
        max_body_bytes=settings.max_body_bytes,
        read_chunk_bytes=settings.read_chunk_bytes,
        snapshot_max_bytes=settings.snapshot_max_bytes,
        bootstrap_max_bytes=settings.bootstrap_max_bytes,
        long_poll_seconds=settings.long_poll_timeout,
        sse_max_seconds=settings.sse_max_seconds,
        sse_ping_seconds=settings.sse_ping_seconds,
        sse_buffer_bytes=settings.sse_buffer_bytes,
        public_url=settings.public_url.rstrip("/") if settings.public_url else None,
        base_url=base_url(settings),
        body_budget_bytes=settings.body_budget_bytes,
    )


def own_origins(settings: Settings) -> frozenset[str]:
    """The origins of this node's own pages (the console), whose writes are not cross-origin: its
    base URL's and its peer URL's, and the loopback names at the port it listens on. Never one the
    Host header names: a page at a name re-pointed to this machine (DNS rebinding) would send both."""
    scheme = "https" if settings.tls_cert else "http"
    port = "" if settings.port == {"http": 80, "https": 443}[scheme] else f":{settings.port}"
    found = {f"{scheme}://{host}{port}" for host in ("localhost", "127.0.0.1", "[::1]")}
    for url in (base_url(settings), settings.peers.get(settings.node_id)):
        if url:
            parts = urlsplit(url)
            found.add(f"{parts.scheme}://{parts.netloc}".lower())
    return frozenset(found)


def base_url(settings: Settings) -> str:
    """What the URLs this node hands out start with (Location headers, a subscription's callback and
    JWKS URLs): `public_url`; else this node's URL in `peers` (the address the operator gave it, which
    the other nodes and 307 redirects use); else the address it listens on, a wildcard one (0.0.0.0,
    ::) standing for the machine's host name. Never a request's Host header, which the client chooses."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    own = settings.peers.get(settings.node_id)
    if own:
        return own.rstrip("/")
    host = settings.host
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"  # an IPv6 literal
    return f"{'https' if settings.tls_cert else 'http'}://{host}:{settings.port}"
