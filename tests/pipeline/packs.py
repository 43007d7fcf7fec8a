"""Packs written straight into a store the way the tiering worker lays them out: the Parquet object,
its index of live slices, and manifest entries (format 2) naming a slice."""

from __future__ import annotations

import posixpath
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from app.domain.offsets import format_offset
from app.state_machine.cold_tier import pack_index_of
from app.tiering import pack as packs
from app.tiering.segment import Record, SegmentEntry, stream_dir
from app.tiering.store import ObjectStore, sha256_hex


@dataclass
class Written:
    key: str
    size: int
    sha256: str
    placements: list[packs.Placement]
    index: packs.PackIndex  # the live slices


def records(start: int, times: Sequence[int], payloads: Sequence[bytes]) -> list[Record]:
    """Consecutive records from position `start`."""
    out, pos = [], start
    for time, payload in zip(times, payloads, strict=True):
        out.append(Record(pos, time, payload))
        pos += len(payload)
    return out


def index_entry(piece: packs.Slice, place: packs.Placement) -> packs.IndexEntry:
    recs = piece.records
    times = [r.time for r in recs]
    lo, hi = format_offset(recs[0].pos), format_offset(recs[-1].pos + len(recs[-1].payload))
    digest = packs.slice_digest([r.payload for r in recs])
    return packs.IndexEntry(
        piece.stream, piece.content_type, lo, hi, len(recs), place.group, place.row, digest, min(times), max(times)
    )


def write_pack(store: ObjectStore, bucket: str, slices: Sequence[packs.Slice], dead: Collection[int] = ()) -> Written:
    """A pack of `slices`, and its index listing all but those at the positions in `dead` (a deleted
    stream's: its rows stay in the pack until the pack is rewritten)."""
    data, placements = packs.build(bucket, slices)
    digest = sha256_hex(data)
    key = packs.pack_key(bucket, digest)
    store.put(key, data)
    index = packs.PackIndex(bucket, posixpath.basename(key), len(data), digest)
    index.slices = [index_entry(s, p) for i, (s, p) in enumerate(zip(slices, placements, strict=True)) if i not in dead]
    store.put(pack_index_of(key), index.to_json())
    return Written(key, len(data), digest, placements, index)


def manifest_entry(bucket: str, pack: Written, stream: str) -> SegmentEntry:
    """A manifest's entry (format 2) for the stream's live slice in `pack`, its path relative to the manifest."""
    (e,) = [e for e in pack.index.slices if e.stream == stream]
    path = posixpath.relpath(pack.key, stream_dir(bucket, stream))
    return SegmentEntry(
        path, e.first_offset, e.next_offset, e.records, pack.size, pack.sha256, e.min_append_time,
        e.max_append_time, e.group, e.row, e.sha256,
    )  # fmt: skip
