"""What the object store says each stream holds, read without a server: its manifest (own segments,
and slices of packs once it has a segment of its own) together with the indexes of its bucket's
packs (the only record of a stream whose sealed data is all in packs).

Used by the Spark source and by `rill restore`. Each stream's entries are returned in offset order
without overlaps: where a manifest and a pack index disagree (one was published a moment before the
other), the manifest wins.
"""

from __future__ import annotations

import bisect
import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from app.tiering import keys
from app.tiering import pack as packs
from app.tiering import segment as seg
from app.tiering.store import ObjectStore


@dataclass(frozen=True)
class Entry:
    """A segment, or a slice of a pack, of one stream (positions, not offset tokens)."""

    key: str  # the object's key in the store
    first: int
    next: int
    records: int
    size: int  # of the object
    sha256: str  # of the object
    min_append_time: int
    max_append_time: int
    group: int = -1  # a slice: row group and first row in the pack, SHA-256 of its payloads
    row: int = 0
    digest: str = ""

    @property
    def packed(self) -> bool:
        return self.group >= 0


@dataclass
class StreamEntries:
    bucket: str
    stream: str
    content_type: str
    entries: list[Entry] = field(default_factory=list)


def _from_manifest(directory: str, manifest: seg.Manifest) -> list[Entry]:
    return [
        Entry(
            posixpath.normpath(posixpath.join(directory, e.path)),
            seg.offset_of(e.first_offset),
            seg.offset_of(e.next_offset),
            e.records,
            e.bytes,
            e.sha256,
            e.min_append_time,
            e.max_append_time,
            e.group,
            e.row,
            e.digest,
        )  # fmt: skip
        for e in manifest.segments
    ]


def _from_index(key: str, index: packs.PackIndex) -> Iterator[tuple[str, str, Entry]]:
    for s in index.slices:
        entry = Entry(
            key, seg.offset_of(s.first_offset), seg.offset_of(s.next_offset), s.records, index.size, index.sha256,
            s.min_append_time, s.max_append_time, s.group, s.row, s.sha256,
        )  # fmt: skip
        yield s.stream, s.content_type, entry


def _merged(own: list[Entry], sliced: list[Entry]) -> list[Entry]:
    """The manifest's entries, and the pack slices that overlap none of them, in offset order."""
    own = sorted(own, key=lambda e: e.first)
    starts = [e.first for e in own]
    out = list(own)
    for entry in sliced:
        i = bisect.bisect_right(starts, entry.first) - 1
        clear_before = i < 0 or own[i].next <= entry.first
        clear_after = i + 1 >= len(own) or entry.next <= own[i + 1].first
        if clear_before and clear_after:
            out.append(entry)
    return sorted(out, key=lambda e: e.first)


def read(store: ObjectStore, keys_listed: Iterable[str]) -> dict[tuple[str, str], StreamEntries]:
    """Every stream the listed manifests and pack indexes name."""
    found: dict[tuple[str, str], StreamEntries] = {}
    sliced: dict[tuple[str, str], list[Entry]] = {}
    for key in keys_listed:
        try:
            raw = store.get(key)
        except KeyError:  # deleted since the listing
            continue
        if packs.is_pack_key(key):
            pack_key = key.removesuffix(".json") + ".parquet"
            bucket = key.split("/", 1)[0]
            for name, content_type, entry in _from_index(pack_key, packs.PackIndex.from_json(raw)):
                found.setdefault((bucket, name), StreamEntries(bucket, name, content_type))
                sliced.setdefault((bucket, name), []).append(entry)
        else:
            manifest = seg.Manifest.from_json(raw)
            at = found.setdefault(
                (manifest.bucket, manifest.stream),
                StreamEntries(manifest.bucket, manifest.stream, manifest.content_type),
            )
            at.content_type = manifest.content_type
            at.entries = _from_manifest(posixpath.dirname(key), manifest)
    for which, entries in sliced.items():
        found[which].entries = _merged(found[which].entries, entries)
    return found


def listing(store: ObjectStore, bucket: str | None = None) -> list[str]:
    """The keys of every stream manifest and pack index (of one bucket, or of all)."""
    out = []
    for key in store.list("" if bucket is None else f"{bucket}/"):
        if key.endswith(".json") and packs.is_pack_key(key) or key.endswith("/manifest.json") and key.count("/") == 2:
            out.append(key)
    return out


def stream(store: ObjectStore, bucket: str, name: str) -> StreamEntries | None:
    """One stream: its manifest (where it has one) and the indexes of its bucket's packs."""
    candidates = keys.manifest_candidates(bucket, name)
    indexes = [k for k in store.list(f"{bucket}/{packs.DIRECTORY}/") if k.endswith(".json")]
    own = read(store, candidates[:1]).get((bucket, name)) or read(store, candidates[1:]).get((bucket, name))
    found = read(store, indexes).get((bucket, name))
    if own is None:
        return found
    if found is not None:
        own.entries = _merged(own.entries, found.entries)
    return own
