"""TTL and absolute expiry: an expired stream is removed the first time a command looks at it.

Expiry is judged by the entry's stamped `now` (and the leader's latest local read, `touched`),
never a local clock, so every replica removes the same streams at the same entry.
"""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import Code, CollectExpired, Outcome, Touch
from app.state_machine.removal import remove
from app.state_machine.table import StreamTable


def live(table: StreamTable, bucket: str, name: str, now: int, touched: int = 0) -> r.StreamMeta | None:
    """The stream at this name after collecting it if it has expired (may be soft-deleted)."""
    sid = table.names.get((bucket, name))
    if sid is None:
        return None
    meta = table.streams[sid]
    if not meta.deleted and meta.expired(now, touched):
        remove(table, meta)
        return table.streams.get(sid)
    return meta


def existing(table: StreamTable, bucket: str, name: str, now: int, touched: int = 0) -> r.StreamMeta | Outcome:
    """The live, not deleted stream at this name, else the outcome that says why not."""
    meta = live(table, bucket, name, now, touched)
    if meta is None:
        return Outcome(Code.NOT_FOUND)
    if meta.deleted:
        return Outcome(Code.GONE)
    return meta


def present(table: StreamTable, bucket: str, name: str, now: int, touched: int = 0) -> r.StreamMeta | Outcome:
    """`existing` without collecting an expired stream: what it would answer (for refusals known
    before a command is proposed)."""
    sid = table.names.get((bucket, name))
    if sid is None:
        return Outcome(Code.NOT_FOUND)
    meta = table.streams[sid]
    if meta.deleted or (meta.expired(now, touched) and meta.forks > 0):
        return Outcome(Code.GONE)  # an expired stream that forks read through is only soft-deleted
    if meta.expired(now, touched):
        return Outcome(Code.NOT_FOUND)
    return meta


def touch(table: StreamTable, cmd: Touch, now: int) -> Outcome:
    meta = live(table, cmd.bucket, cmd.stream, now, now)  # the Touch stands for a read of the live stream
    if meta is None or meta.deleted:
        return Outcome(Code.NOT_FOUND)
    meta.touched_at = max(meta.touched_at, now)
    table.dirty.add(meta.sid)
    return Outcome(Code.OK)


def collect_expired(table: StreamTable, cmd: CollectExpired, now: int) -> Outcome:
    for sid in cmd.sids:
        meta = table.streams.get(sid)
        if meta is not None:
            live(table, meta.bucket, meta.name, now)
    return Outcome(Code.OK)
