"""The Raft log and hard state, durable in an ordered KV (RocksDB in the server)."""

from __future__ import annotations

import struct

import msgspec

from app.raft.messages import Entry, HardState, decode_entry, decode_hard_state, encode
from app.storage.kv import KV, Batch, Parts

LOG_CF = "log"
META_CF = "raft_meta"
COLUMN_FAMILIES = ["default", LOG_CF, META_CF]

_HARD_STATE = b"hard_state"
_COMPACTED = b"compacted"
_U64 = struct.Struct(">Q")
_PAIR = struct.Struct(">QQ")
_BIN32 = struct.Struct(">BI")
LARGE_ENTRY = 1 << 20


def _encoded(entry: Entry) -> bytes | Parts:
    """The entry's msgpack encoding; a large one in pieces around its data, which is not copied."""
    if len(entry.data) <= LARGE_ENTRY:
        return encode(entry)
    # [term, index, data, kind] as an array of four, with data as bin 32.
    head = b"\x94" + msgspec.msgpack.encode(entry.term) + msgspec.msgpack.encode(entry.index)
    return head + _BIN32.pack(0xC6, len(entry.data)), entry.data, msgspec.msgpack.encode(entry.kind)


def _key(index: int) -> bytes:
    return _U64.pack(index)


class LogStore:
    def __init__(self, kv: KV) -> None:
        self.kv = kv
        raw = kv.get(META_CF, _COMPACTED)
        self.compacted_index, self.compacted_term = _PAIR.unpack(raw) if raw else (0, 0)
        last = kv.floor(LOG_CF, _U64.pack(2**64 - 1))
        self.last_index = _U64.unpack(last[0])[0] if last else self.compacted_index

    def hard_state(self) -> HardState:
        raw = self.kv.get(META_CF, _HARD_STATE)
        return decode_hard_state(raw) if raw else HardState()

    def entries(self) -> list[Entry]:
        start = _key(self.compacted_index + 1)
        return [decode_entry(value) for _, value in self.kv.scan(LOG_CF, start)]

    def save(self, hard_state: HardState | None, entries: list[Entry]) -> None:
        """Writes the hard state and entries in one batch and syncs it before returning."""
        batch = Batch()
        if hard_state is not None:
            batch.put(META_CF, _HARD_STATE, encode(hard_state))
        if entries:
            new_last = entries[-1].index
            # Entries that replace a divergent suffix: drop the old tail beyond them.
            for index in range(new_last + 1, self.last_index + 1):
                batch.delete(LOG_CF, _key(index))
            for entry in entries:
                batch.put(LOG_CF, _key(entry.index), _encoded(entry))
            self.last_index = new_last
        if batch:
            self.kv.write(batch)
            self.kv.sync_wal()

    def term_at(self, index: int) -> int | None:
        raw = self.kv.get(LOG_CF, _key(index))
        return decode_entry(raw).term if raw else None

    def restore(self, index: int, term: int) -> None:
        """Moves the log behind a checkpoint installed at (index, term), synced before returning.

        Entries past the checkpoint survive only if the log agrees with it at `index`.
        """
        keep_suffix = self.term_at(index) == term
        batch = Batch()
        batch.put(META_CF, _COMPACTED, _PAIR.pack(index, term))
        batch.delete_range(LOG_CF, _key(0), _key(index + 1 if keep_suffix else 2**64 - 1))
        self.kv.write(batch)
        self.kv.sync_wal()
        self.compacted_index, self.compacted_term = index, term
        if not keep_suffix or self.last_index < index:
            self.last_index = index

    def drop_after(self, index: int) -> None:
        """Drops the entries past `index` (a failed sync's, never acknowledged), synced before returning."""
        batch = Batch()
        batch.delete_range(LOG_CF, _key(index + 1), _key(2**64 - 1))
        self.kv.write(batch)
        self.kv.sync_wal()
        self.last_index = max(min(self.last_index, index), self.compacted_index)

    def compact(self, index: int, term: int) -> None:
        """Drops entries up to `index`; only once the state machine covering them is durable."""
        if index <= self.compacted_index:
            return
        batch = Batch()
        batch.put(META_CF, _COMPACTED, _PAIR.pack(index, term))
        self.kv.write(batch, sync=True)
        self.kv.delete_range(LOG_CF, _key(0), _key(index + 1))
        self.compacted_index, self.compacted_term = index, term
