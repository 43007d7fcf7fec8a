"""The asyncio driver: group commit, replay after restart, and compaction behind durable state."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.cluster import driver as raft_node
from app.cluster import log_store
from app.cluster.driver import RaftNode
from app.cluster.log_store import LogStore
from app.state_machine import records
from app.state_machine.commands import Append, Code, CreateStream, encode_envelope
from app.state_machine.machine import COMPAT_BUCKET, StateMachine
from app.storage.rocks import RocksKV


class Node:
    def __init__(self, path: Path) -> None:
        self.raft_kv = RocksKV(path / "raft", log_store.COLUMN_FAMILIES)
        self.state_kv = RocksKV(path / "state", records.COLUMN_FAMILIES)
        self.machine = StateMachine(self.state_kv)
        self.log = LogStore(self.raft_kv)
        self.node = RaftNode(1, [1], self.log, self.machine, seed=1)

    async def propose(self, command: object) -> object:
        return await self.node.propose(encode_envelope(1, command))  # type: ignore[arg-type]

    async def close(self) -> None:
        await self.node.stop()
        self.state_kv.close()
        self.raft_kv.close()


async def _started(path: Path, stream: str) -> Node:
    """A started single node holding an empty text stream."""
    n = Node(path)
    await n.node.start()
    await n.propose(CreateStream(COMPAT_BUCKET, stream, "text/plain", False))
    return n


def _read_all(machine: StateMachine, name: str) -> bytes:
    meta = machine.lookup(COMPAT_BUCKET, name)
    assert meta is not None
    return b"".join(machine.read(meta, 0, 1 << 30).payloads)


def test_concurrent_proposals_share_syncs_and_survive_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        n = await _started(tmp_path, "s")
        saves = 0
        original = n.log.save

        def counting_save(*args: object) -> None:
            nonlocal saves
            saves += 1
            original(*args)  # type: ignore[arg-type]

        n.log.save = counting_save  # type: ignore[method-assign]
        outcomes = await asyncio.gather(
            *(n.propose(Append(COMPAT_BUCKET, "s", "text/plain", b"%03d," % i)) for i in range(100))
        )
        assert all(o.code is Code.APPENDED for o in outcomes)  # type: ignore[attr-defined]
        assert saves < 100  # group commit: many proposals per synced write
        await n.close()

        n = Node(tmp_path)
        await n.node.start()
        assert _read_all(n.machine, "s") == b"".join(b"%03d," % i for i in range(100))
        await n.close()

    asyncio.run(scenario())


def test_compaction_keeps_state_readable_after_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raft_node, "COMPACT_EVERY", 10)

    async def scenario() -> None:
        n = await _started(tmp_path, "c")
        for i in range(35):
            await n.propose(Append(COMPAT_BUCKET, "c", "text/plain", b"%d;" % i))
        assert n.log.compacted_index > 0
        compacted = n.log.compacted_index
        await n.close()

        n = Node(tmp_path)
        assert n.log.compacted_index == compacted
        await n.node.start()
        assert _read_all(n.machine, "c") == b"".join(b"%d;" % i for i in range(35))
        await n.propose(Append(COMPAT_BUCKET, "c", "text/plain", b"after"))
        assert _read_all(n.machine, "c").endswith(b"after")
        await n.close()

    asyncio.run(scenario())


def test_compaction_also_triggers_on_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(raft_node, "COMPACT_BYTES", 10_000)

    async def scenario() -> None:
        n = await _started(tmp_path, "big")
        for _ in range(5):
            await n.propose(Append(COMPAT_BUCKET, "big", "text/plain", b"x" * 4000))
        assert n.log.compacted_index > 0  # long before COMPACT_EVERY entries
        status = n.node.status()
        assert status.last_index - status.checkpoint_index < 5  # the entries the log still holds
        await n.close()

    asyncio.run(scenario())


def test_a_proposal_given_decoded_is_applied_without_decoding_and_as_if_decoded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.state_machine import machine as machine_module
    from app.state_machine.commands import Envelope, decode_envelope

    decodes = 0

    def counting_decode(raw: bytes) -> Envelope:
        nonlocal decodes
        decodes += 1
        return decode_envelope(raw)

    async def scenario() -> None:
        nonlocal decodes
        n = await _started(tmp_path, "s")
        monkeypatch.setattr(machine_module, "decode_envelope", counting_decode)
        command = Append(COMPAT_BUCKET, "s", "text/plain", memoryview(bytearray(b"given,")))
        data = encode_envelope(7, command)
        outcome = await n.node.propose(data, Envelope(7, command))  # type: ignore[arg-type]
        assert outcome.code is Code.APPENDED and decodes == 0
        await n.propose(Append(COMPAT_BUCKET, "s", "text/plain", b"decoded,"))
        assert decodes == 1  # no decoded form given: decoded from the entry
        await n.close()
        n = Node(tmp_path)  # both were stored as their bytes say
        await n.node.start()
        assert _read_all(n.machine, "s") == b"given,decoded,"
        await n.close()

    asyncio.run(scenario())
