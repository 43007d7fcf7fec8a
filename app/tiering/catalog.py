"""What the object store says each stream holds, read without a server: its manifest (own segments,
and slices of packs once it has a segment of its own) together with the indexes of its bucket's
packs (the only record of a stream whose sealed data is all in packs).

Used by the Spark source and by `rill restore`. Each stream's entries are returned in offset order
without overlaps: where a manifest and a pack index disagree (one was published a moment before the
other), the manifest wins.

The store's objects are not trusted: a document that does not decode, a manifest that is not where
its stream's manifest belongs, an entry naming an object outside its stream's directory or its
bucket's packs, or a stream id no request could have used, is skipped and named in `problems`.
"""

from __future__ import annotations

import bisect
import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from app.domain.names import stream_id_problem
from app.state_machine.cold_tier import is_pack, pack_of_index
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
    manifest: str | None = None  # its manifest's key, if it has one


def _entry_key(directory: str, bucket: str, e: seg.SegmentEntry) -> str | None:
    """The key a manifest entry names, if it is where such an object may be: a segment in the
    stream's own `segments/`, or a pack of its bucket."""
    key = posixpath.normpath(posixpath.join(directory, e.path))
    if e.group >= 0:
        return key if is_pack(key) and key.startswith(f"{bucket}/") and key.endswith(".parquet") else None
    inside = key.startswith(f"{directory}/segments/") and "/" not in key.removeprefix(f"{directory}/segments/")
    return key if inside and key.endswith(".parquet") else None


def _from_manifest(directory: str, manifest: seg.Manifest) -> list[Entry] | None:
    """The manifest's entries; None if any names an object out of its place."""
    out = []
    for e in manifest.segments:
        key = _entry_key(directory, manifest.bucket, e)
        if key is None:
            return None
        lo, hi = seg.offset_of(e.first_offset), seg.offset_of(e.next_offset)
        out.append(
            Entry(
                key,
                lo,
                hi,
                e.records,
                e.bytes,
                e.sha256,
                e.min_append_time,
                e.max_append_time,
                e.group,
                e.row,
                e.digest,
            )  # fmt: skip
        )
    return out


def _from_index(key: str, index: packs.PackIndex) -> Iterator[tuple[str, str, Entry]]:
    for s in index.slices:
        entry = Entry(
            key, seg.offset_of(s.first_offset), seg.offset_of(s.next_offset), s.records, index.size, index.sha256,
            s.min_append_time, s.max_append_time, s.group, s.row, s.sha256,
        )  # fmt: skip
        yield s.stream, s.content_type, entry


def _merged(own: list[Entry], sliced: list[Entry]) -> list[Entry]:
    """The manifest's entries, then the pack slices, each kept only if it overlaps none kept before
    it, in offset order (n log n: a hostile manifest of many entries costs in proportion)."""
    mine = _without_overlaps(sorted(own, key=lambda e: e.first))
    starts = [e.first for e in mine]
    others = []
    for entry in _without_overlaps(sorted(sliced, key=lambda e: e.first)):
        i = bisect.bisect_right(starts, entry.first)
        if (i == 0 or mine[i - 1].next <= entry.first) and (i == len(mine) or entry.next <= mine[i].first):
            others.append(entry)
    return sorted([*mine, *others], key=lambda e: e.first)


def _without_overlaps(ordered: list[Entry]) -> list[Entry]:
    """Entries sorted by start, less each one that overlaps the one kept before it."""
    kept: list[Entry] = []
    for entry in ordered:
        if not kept or kept[-1].next <= entry.first:
            kept.append(entry)
    return kept


def read(
    store: ObjectStore, keys_listed: Iterable[str], problems: list[str] | None = None
) -> dict[tuple[str, str], StreamEntries]:
    """Every stream the listed manifests and pack indexes name; what is skipped goes to `problems`."""
    found: dict[tuple[str, str], StreamEntries] = {}
    sliced: dict[tuple[str, str], list[Entry]] = {}
    own: dict[tuple[str, str], list[Entry]] = {}
    skipped = problems if problems is not None else []
    for key in keys_listed:
        try:
            raw = store.get(key)
        except KeyError:  # deleted since the listing
            continue
        try:
            if is_pack(key):
                _read_index(key, packs.PackIndex.from_json(raw), found, sliced, skipped)
            else:
                _read_manifest(key, seg.Manifest.from_json(raw), found, own, skipped)
        except ValueError as exc:
            skipped.append(f"{key}: {exc}")
    for which, entries in found.items():
        entries.entries = _merged(own.get(which, []), sliced.get(which, []))
    return found


def _read_index(
    key: str,
    index: packs.PackIndex,
    found: dict[tuple[str, str], StreamEntries],
    sliced: dict[tuple[str, str], list[Entry]],
    skipped: list[str],
) -> None:
    bucket = key.split("/", 1)[0]
    if index.bucket != bucket:
        raise ValueError(f"the index names bucket {index.bucket[:100]!r}")
    if index.rejected:
        skipped.append(f"{key}: {index.rejected} slices that are not well formed")
    for name, content_type, entry in _from_index(pack_of_index(key), index):
        problem = stream_id_problem(name)
        if problem is not None:
            skipped.append(f"{key}: a slice of {name[:100]!r}: {problem}")
            continue
        found.setdefault((bucket, name), StreamEntries(bucket, name, content_type))
        sliced.setdefault((bucket, name), []).append(entry)


def _read_manifest(
    key: str,
    manifest: seg.Manifest,
    found: dict[tuple[str, str], StreamEntries],
    own: dict[tuple[str, str], list[Entry]],
    skipped: list[str],
) -> None:
    problem = stream_id_problem(manifest.stream)
    if problem is not None or key not in keys.manifest_candidates(manifest.bucket, manifest.stream):
        raise ValueError(problem or "not where the manifest of the stream it names belongs")
    entries = _from_manifest(posixpath.dirname(key), manifest)
    if entries is None:
        raise ValueError("an entry names an object outside the stream's directory and its bucket's packs")
    if not entries:  # emptied when its stream was dropped: it speaks for no stream
        return
    name = (manifest.bucket, manifest.stream)
    at = found.setdefault(name, StreamEntries(*name, manifest.content_type))
    at.content_type, at.manifest = manifest.content_type, key
    own[name] = entries


def listing(store: ObjectStore, bucket: str | None = None) -> list[str]:
    """The keys of every stream manifest and pack index (of one bucket, or of all)."""
    out = []
    for key in store.list("" if bucket is None else f"{bucket}/"):
        if key.endswith(".json") and is_pack(key) or key.endswith("/manifest.json") and key.count("/") == 2:
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
