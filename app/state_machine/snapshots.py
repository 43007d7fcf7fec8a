"""Applications' published snapshots as stored: by (sid, position), with their objects' keys.

Snapshot objects are content-addressed, so two offsets of a stream may share one key; an object
is queued for deletion only when no snapshot of its stream names it any more.
"""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.cold_tier import enqueue_object
from app.state_machine.table import StreamTable


def snapshot_at(table: StreamTable, sid: int, pos: int) -> r.PublishedSnapshot | None:
    raw = table.get(r.STREAM_SNAPSHOTS, r.data_key(sid, pos))
    return None if raw is None else r.decode_snapshot(raw)


def snapshot_keys(table: StreamTable, sid: int, but: int | None = None) -> set[str]:
    """Object keys of the stream's snapshots, other than the one at `but`."""
    found = table.scan(r.STREAM_SNAPSHOTS, r.sid_key(sid), r.sid_key(sid + 1))
    if but is not None:
        found.pop(r.data_key(sid, but), None)
    keys = (r.decode_snapshot(raw).key for raw in found.values())
    return {k for k in keys if k is not None}


def drop_snapshots(table: StreamTable, sid: int) -> None:
    """A hard-deleted stream's snapshots, and their objects."""
    keys = snapshot_keys(table, sid)
    owner = table.streams.get(sid)
    if owner is not None:
        found = table.scan(r.STREAM_SNAPSHOTS, r.sid_key(sid), r.sid_key(sid + 1))
        table.count_snapshot(owner.bucket, -sum(r.decode_snapshot(raw).size for raw in found.values()))
    table.batch.delete_range(r.STREAM_SNAPSHOTS, r.sid_key(sid), r.sid_key(sid + 1))
    for key in sorted(keys):
        enqueue_object(table, key)
