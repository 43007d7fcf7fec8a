"""Applications' published snapshots as stored: by (sid, position), with their objects' keys.

Snapshot objects are content-addressed, so two offsets of a stream may share one key; an object
is queued for deletion only when no snapshot of its stream names it any more. The table counts, per
stream, the snapshots naming each object and their bytes (built at load, kept as they change), so
no rule scans a stream's snapshots (inline ones are up to 256 KiB each).
"""

from __future__ import annotations

from collections.abc import Collection

from app.state_machine import records as r
from app.state_machine.cold_tier import enqueue_object
from app.state_machine.table import StreamTable


def snapshot_at(table: StreamTable, sid: int, pos: int) -> r.PublishedSnapshot | None:
    raw = table.get(r.STREAM_SNAPSHOTS, r.data_key(sid, pos))
    return None if raw is None else r.decode_snapshot(raw)


def snapshot_keys(table: StreamTable, sid: int) -> Collection[str]:
    """Object keys of the stream's snapshots."""
    return table.snapshot_objects.get(sid, {}).keys()


def drop_snapshots(table: StreamTable, sid: int) -> None:
    """A hard-deleted stream's snapshots, and their objects."""
    owner = table.streams.get(sid)
    keys = table.forget_snapshots(sid, owner.bucket if owner is not None else None)
    table.batch.delete_range(r.STREAM_SNAPSHOTS, r.sid_key(sid), r.sid_key(sid + 1))
    for key in keys:
        enqueue_object(table, key)
