"""Raft checkpoints between nodes: the state machine's store, streamed in signed chunks.

A follower that needs entries the leader has compacted away gets a checkpoint instead. The leader
takes a RocksDB checkpoint of the state machine's store (consistent across column families, cheap:
hard links) and streams its pairs to the follower in signed chunks, one in flight at a time. The
follower loads them into a staging store beside its own; when the last chunk arrives it syncs the
staging store, marks it complete, and asks the Raft driver to install it: the directories are
swapped, the state machine reloads, and the Raft log moves behind the checkpoint. A crash between
those steps is finished (or undone) when the node next opens its store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from app.raft.validate import STALE_CHECKPOINT
from app.runtime import blocking
from app.state_machine import records
from app.state_machine.export import Pair, applied_point, export, load
from app.state_machine.machine import StateMachine
from app.storage.rocks import RocksKV
from app.storage.state_store import StateStore

if TYPE_CHECKING:
    from app.cluster.driver import RaftNode
    from app.cluster.transport import Transport

log = logging.getLogger("rill.checkpoints")

PATH = "/_rill/snapshot"  # the URL other nodes post chunks to: wire format, so it keeps its old name
CHUNK_BYTES = 1 << 20


class CheckpointChunk(msgspec.Struct, array_like=True):
    term: int  # the sending leader's term
    src: int
    dst: int
    index: int  # the applied index (and term) the checkpoint holds
    index_term: int
    seq: int
    done: bool  # the last chunk carries no pairs: it asks the follower to install
    pairs: list[Pair]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(CheckpointChunk)


def decode_chunk(body: bytes) -> CheckpointChunk:
    return _decoder.decode(body)


class Checkpoints:
    """Ships checkpoints to followers (as leader) and installs them (as follower)."""

    def __init__(self, node_id: int, store: StateStore, machine: StateMachine, transport: Transport | None) -> None:
        self.node_id = node_id
        self.store = store
        self.machine = machine
        self.transport = transport
        self._lock = asyncio.Lock()
        self._staging: RocksKV | None = None
        self._receiving: tuple[int, int, int, int] | None = None  # (src, term, index, index_term)
        self._next_seq = 0

    # Leader side

    async def send(self, peer: int, term: int) -> bool:
        """Streams a fresh checkpoint to `peer`; True once the peer has installed it."""
        assert self.transport is not None
        kv = self.machine.kv
        assert isinstance(kv, RocksKV)
        path = await blocking.run("checkpoints", self.store.checkpoint, kv, f"to-{peer}")
        checkpoint = await blocking.run("checkpoints", RocksKV, path, records.COLUMN_FAMILIES)
        try:
            index, index_term = applied_point(checkpoint)
            log.info("sending node %s a checkpoint at index %s", peer, index)
            chunks = self._chunks(checkpoint, term, peer, index, index_term)
            return await self.transport.stream(peer, PATH, chunks)
        finally:
            await blocking.run("checkpoints", _discard, checkpoint, path)

    async def _chunks(self, kv: RocksKV, term: int, peer: int, index: int, index_term: int) -> AsyncIterator[bytes]:
        batches: Iterator[list[Pair]] = export(kv, CHUNK_BYTES)
        seq = 0
        while True:
            pairs = await blocking.run("checkpoints", next, batches, None)
            chunk = CheckpointChunk(term, self.node_id, peer, index, index_term, seq, pairs is None, pairs or [])
            yield _encoder.encode(chunk)
            if pairs is None:
                return
            seq += 1

    # Follower side

    async def receive(self, node: RaftNode, chunk: CheckpointChunk) -> bool:
        """Takes one chunk for `node`; False tells the leader to give up this transfer."""
        async with self._lock:
            point = (chunk.src, chunk.term, chunk.index, chunk.index_term)
            if chunk.seq == 0:
                await self._abort()
                if not node.can_install_checkpoint(chunk.term, chunk.index):
                    node.note_refused(chunk.src, STALE_CHECKPOINT)
                    return False
                self._staging = await blocking.run("checkpoints", self.store.begin_staging)
                self._receiving, self._next_seq = point, 0
            if self._staging is None or point != self._receiving or chunk.seq != self._next_seq:
                return False
            self._next_seq += 1
            if not chunk.done:
                await blocking.run("checkpoints", load, self._staging, chunk.pairs)
                return True
            staging, self._staging, self._receiving = self._staging, None, None
            if applied_point(staging) != (chunk.index, chunk.index_term):
                staging.close()
                return False
            await blocking.run("checkpoints", self.store.complete_staging, staging)
            installed = await node.install_checkpoint(chunk.term, chunk.src, chunk.index, chunk.index_term)
            if not installed:
                shutil.rmtree(self.store.staging, ignore_errors=True)
            return installed

    def install(self) -> None:
        """Swaps the complete staging store in; runs inside the driver, between Readys."""
        self.machine.kv.close()  # RocksDB locks by path: the old store must let go of it first
        self.store.mark_complete()
        self.store.swap()
        self.machine.reload(RocksKV(self.store.path, records.COLUMN_FAMILIES))

    async def _abort(self) -> None:
        staging, self._staging, self._receiving = self._staging, None, None
        if staging is not None:
            staging.close()
            await blocking.run("checkpoints", shutil.rmtree, self.store.staging, True)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self._abort()


def _discard(kv: RocksKV, path: Path) -> None:
    kv.close()
    shutil.rmtree(path, ignore_errors=True)
