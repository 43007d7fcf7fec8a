"""Shared by the state machine tests: the harness `H`, and the constants and shortcuts they use.

Everything runs on `MemoryKV` unless a test is about RocksDB. Commands are wrapped in Raft entries
the way the node does it (`encode_envelope(now, command)`), and the `now` stamped in the envelope
is the only clock the machine sees.
"""

from __future__ import annotations

import json

from app.domain.media import media_type
from app.raft.messages import Entry
from app.state_machine import records as r
from app.state_machine.commands import (
    Append,
    Code,
    Command,
    CreateBucket,
    CreateStream,
    DeleteStream,
    Outcome,
    Producer,
    encode_envelope,
)
from app.state_machine.machine import StateMachine
from app.storage.kv import KV, MemoryKV

B = "b"  # the user bucket the tests create
T0 = 1_700_000_000_000  # a fixed start time, ms
TEXT = "text/plain"
JSON = "application/json"
OCTET = "application/octet-stream"


def dump(kv: KV) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every key/value of every column family, in key order."""
    return {cf: [(bytes(k), bytes(v)) for k, v in kv.scan(cf, b"")] for cf in r.COLUMN_FAMILIES}


def jrec(*values: object) -> bytes:
    """A JSON record as the protocol layer stores it: messages joined by commas."""
    return b",".join(json.dumps(v, separators=(",", ":")).encode() for v in values)


class H:
    """A state machine plus a Raft-like index counter and a clock."""

    def __init__(self, kv=None, bucket: str | None = B, now: int = T0, tail_cache_bytes: int = 64 << 20) -> None:
        self.kv = kv if kv is not None else MemoryKV(r.COLUMN_FAMILIES)
        self.sm = StateMachine(self.kv, tail_cache_bytes=tail_cache_bytes)
        self.index = self.sm.applied_index
        self.now = now
        self.batches: list[list[Entry]] = []
        if bucket is not None:
            assert self.one(CreateBucket(bucket)).code is Code.CREATED

    def entries(self, *cmds: Command, now: int | None = None) -> list[Entry]:
        out = []
        for cmd in cmds:
            self.index += 1
            out.append(Entry(1, self.index, encode_envelope(self.now if now is None else now, cmd)))
        return out

    def batch(self, *cmds: Command, now: int | None = None) -> list[Outcome]:
        entries = self.entries(*cmds, now=now)
        self.batches.append(entries)
        return self.sm.apply(entries)

    def one(self, cmd: Command, now: int | None = None) -> Outcome:
        return self.batch(cmd, now=now)[0]

    def create(self, name: str, ct: str = TEXT, body: bytes = b"", now: int | None = None, **kw) -> Outcome:
        return self.one(CreateStream(B, name, ct, media_type(ct) == JSON, body=body, **kw), now)

    def fork(
        self,
        name: str,
        source: str,
        offset: int | None = None,
        sub: int = 0,
        ct: str | None = None,
        now: int | None = None,
        **kw,
    ) -> Outcome:
        cmd = CreateStream(
            B,
            name,
            ct or OCTET,
            media_type(ct or OCTET) == JSON,
            fork_stream=source,
            fork_offset=offset,
            fork_sub=sub,
            content_type_given=ct is not None,
            **kw,
        )
        return self.one(cmd, now)

    def append(self, name: str, body: bytes, ct: str | None = TEXT, now: int | None = None, **kw) -> Outcome:
        return self.one(Append(B, name, ct, body, **kw), now)

    def close(self, name: str, producer: Producer | None = None, ct: str | None = None) -> Outcome:
        return self.one(Append(B, name, ct, b"", producer=producer, close=True))

    def delete(self, name: str) -> Outcome:
        return self.one(DeleteStream(B, name))

    def meta(self, name: str) -> r.StreamMeta | None:
        return self.sm.lookup(B, name)

    def parts(self, name: str, start: int = 0, max_bytes: int = 1 << 20) -> list[bytes]:
        meta = self.meta(name)
        assert meta is not None, name
        pos, parts = start, []
        while True:
            chunk = self.sm.read(meta, pos, max_bytes)
            parts += [bytes(p) for p in chunk.payloads]
            if chunk.next_pos >= meta.tail:
                assert chunk.next_pos == meta.tail
                return parts
            assert chunk.next_pos > pos, "a read must make progress"
            pos = chunk.next_pos

    def text(self, name: str, start: int = 0, max_bytes: int = 1 << 20) -> bytes:
        return b"".join(self.parts(name, start, max_bytes))

    def json(self, name: str, start: int = 0, max_bytes: int = 1 << 20) -> list:
        return json.loads(b"[" + b",".join(self.parts(name, start, max_bytes)) + b"]")


def P(epoch: int, seq: int, pid: str = "p") -> Producer:
    return Producer(pid, epoch, seq)
