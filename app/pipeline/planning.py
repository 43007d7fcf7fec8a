"""Which segments and pack slices of the cold tier, and which hot ranges, a `rill` read covers.

Planning reads only the catalog (app/tiering/catalog.py): the streams' manifests and the indexes of
their bucket's packs, so a stream whose sealed data is all in packs (and has no manifest) is read
too. Filters on stream, offset and append time (pushed down by Spark or given as options) drop whole
entries here. What a stream's cold entries do not hold is left to the server, as hot ranges.
Everything planned is plain data, pickled to Spark's executors as is; the Spark classes that carry
it are in app/pipeline/datasource.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from urllib.parse import quote

from app.domain.offsets import format_offset
from app.pipeline.options import Bounds, Range, ReadOptions
from app.state_machine.cold_tier import is_pack
from app.tiering import catalog
from app.tiering import pack as packs
from app.tiering.keys import manifest_candidates
from app.tiering.store import ObjectStore, StoreOptions, open_store

log = logging.getLogger("rill.pipeline")


@dataclass
class PlannedSegment:
    """One entry to read: a segment of its own, or a slice of a pack (`group` >= 0): rows
    [row, row + records) of row group `group`, never the pack's other rows, which may be other
    streams' or a deleted stream's of the same name."""

    stream: str
    key: str
    first_offset: str
    next_offset: str
    records: int
    bytes: int  # what reading it weighs, for `pack`: a segment's size, a slice's payload bytes
    size: int = 0  # of the object: a pack is read by ranged GETs up to its end (0: `bytes`)
    group: int = -1
    row: int = 0
    keep_from: str = ""  # rows below it are dropped: retention removed them (a segment may straddle it)

    @property
    def packed(self) -> bool:
        return self.group >= 0


_STORES: dict[tuple[str, StoreOptions], ObjectStore] = {}
MANIFEST_WAITS, MANIFEST_WAIT_SECONDS = 20, 0.5


def store_for(opts: ReadOptions) -> ObjectStore:
    """One store (boto3 client) per worker process and options, reused across tasks."""
    key = (opts.store, opts.s3)
    if key not in _STORES:
        _STORES[key] = open_store(opts.store, opts.s3)
    return _STORES[key]


def _is_catalog_key(key: str) -> bool:
    """A stream's manifest or a pack's index (as `catalog.listing` keeps them)."""
    if key.endswith("/manifest.json"):
        return key.count("/") == 2  # a stream's directory name has no '/'
    return key.endswith(".json") and is_pack(key)


def _listed(store: ObjectStore, opts: ReadOptions) -> list[str]:
    """The catalog keys a bucket or prefix read looks at."""
    if not opts.prefix:
        return catalog.listing(store, opts.bucket)
    # Hashed directories (long names, `!h-…`) and packs (`!packs`) are under `!`, listed whatever the
    # prefix; the streams they hold are kept by name afterwards. A name of dots only is encoded as %2E….
    starts = [f"{opts.bucket}/!", f"{opts.bucket}/{quote(opts.prefix, safe='-_.~')}"]
    if set(opts.prefix) == {"."}:
        starts.append(f"{opts.bucket}/{'%2E' * len(opts.prefix)}")
    return [key for start in starts for key in store.list(start) if _is_catalog_key(key)]


def _named(store: ObjectStore, bucket: str, names: list[str]) -> list[str]:
    """The catalog keys of a read of these streams: the bucket's pack indexes and their manifests.
    Of a long name's two manifest places, the hashed one comes last and so wins (as `catalog.stream`)."""
    indexes = [k for k in store.list(f"{bucket}/{packs.DIRECTORY}/") if k.endswith(".json")]
    return [*indexes, *(key for name in names for key in reversed(manifest_candidates(bucket, name)))]


def _streams(store: ObjectStore, opts: ReadOptions, b: Bounds) -> list[catalog.StreamEntries]:
    """The selected streams' entries, by name."""
    prefix = opts.prefix or ""
    if opts.stream is not None:
        keys = _named(store, opts.bucket, [opts.stream])
    elif b.streams is not None:  # pushed `stream = …` / `stream IN (…)`: no listing of manifests needed
        keys = _named(store, opts.bucket, sorted(s for s in b.streams if s.startswith(prefix)))
    else:
        keys = _listed(store, opts)
    problems: list[str] = []
    found = catalog.read(store, keys, problems)
    for problem in problems:  # the rest of the read goes on: the server, if any, serves what is left out
        log.warning("the catalog's %s is left out of the read: %s", opts.bucket, problem)
    return [
        entries
        for (bucket, name), entries in sorted(found.items())
        if bucket == opts.bucket
        and name.startswith(prefix)
        and (b.streams is None or name in b.streams)
        and (opts.stream is None or name == opts.stream)
    ]


def _contiguous(entries: list[catalog.Entry]) -> list[catalog.Entry]:
    """The entries up to the first gap. A gap is an index or manifest not published yet (a slice
    merged into a segment whose manifest is still to come): what follows is left to the server,
    which has it, or to `covering`, which waits for the catalog to close it."""
    for i in range(1, len(entries)):
        if entries[i].first != entries[i - 1].next:
            return entries[:i]
    return entries


def _planned(name: str, e: catalog.Entry) -> PlannedSegment:
    # A slice weighs its payload bytes (its share of the pack is not known), at most the pack's size.
    weight = min(e.size, max(1, e.next - e.first)) if e.packed else e.size
    first, nxt = format_offset(e.first), format_offset(e.next)
    return PlannedSegment(name, e.key, first, nxt, e.records, weight, e.size, e.group, e.row)


def plan(options: Mapping[str, str] | ReadOptions, bounds: Bounds | None = None) -> list[PlannedSegment]:
    """The entries a read with these options (and pushed-down `bounds`) has to open, in stream/offset order."""
    return plan_streams(options, bounds)[0]


def plan_streams(
    options: Mapping[str, str] | ReadOptions, bounds: Bounds | None = None
) -> tuple[list[PlannedSegment], dict[str, tuple[int, int]]]:
    """`plan`'s entries, and where each stream's cold entries start and end (by the catalog)."""
    opts = options if isinstance(options, ReadOptions) else ReadOptions.parse(options)
    b = bounds or opts.bounds
    ends: dict[str, tuple[int, int]] = {}
    if b.nothing:
        return [], ends
    out: list[PlannedSegment] = []
    for found in _streams(store_for(opts), opts, b):
        entries = _contiguous(found.entries)
        if entries:
            ends[found.stream] = (entries[0].first, entries[-1].next)
        for e in entries:
            in_offsets = b.offsets.overlaps(format_offset(e.first), format_offset(e.next), most_open=True)
            if in_offsets and b.times.overlaps(e.min_append_time * 1000, e.max_append_time * 1000):
                out.append(_planned(found.stream, e))
    return out, ends


def covering(opts: ReadOptions, stream: str, lo: int, hi: int) -> tuple[Bounds, list[PlannedSegment]]:
    """Bounds for the records of `stream` starting in [lo, hi), and the entries holding them, once the
    catalog (its manifest or its packs' indexes) reaches `hi`: the server evicts records after tiering
    them, and the manifest or index that lists them may be published a moment later."""
    only = Bounds(offsets=Range(format_offset(lo), False, format_offset(hi), True))
    for _ in range(MANIFEST_WAITS):
        segments, spans = plan_streams(replace(opts, stream=stream, prefix=None), only)
        if spans.get(stream, (0, 0))[1] >= hi:
            return only, segments
        time.sleep(MANIFEST_WAIT_SECONDS)
    raise FileNotFoundError(f"the catalog of {opts.bucket}/{stream} does not reach {format_offset(hi)} yet")


def units(segments: list[PlannedSegment]) -> list[list[PlannedSegment]]:
    """What one task reads at least: a segment of its own, or every planned slice of one pack (by row
    group and row, where its first slice was), so a pack's footer is fetched once and its slices
    do not each become a task."""
    out: list[list[PlannedSegment]] = []
    at: dict[str, int] = {}
    for s in segments:
        if not s.packed:
            out.append([s])
        elif s.key in at:
            out[at[s.key]].append(s)
        else:
            at[s.key] = len(out)
            out.append([s])
    for i in at.values():
        out[i].sort(key=lambda s: (s.group, s.row))
    return out


def pack(segments: list[PlannedSegment], max_bytes: int, min_partitions: int = 1) -> list[list[PlannedSegment]]:
    """Segments (and packs' slices, a pack's together: see `units`) in runs of about equal bytes: enough
    runs to keep each under `max_bytes` (0: a run per segment or pack) and at least `min_partitions`
    of them while there are units to spread, so every core gets work."""
    whole = units(segments)
    if max_bytes <= 0:
        return whole
    weights = [sum(s.bytes for s in unit) for unit in whole]
    total = sum(weights)
    n = min(len(whole), max(min_partitions, -(-total // max_bytes)))
    runs: list[list[PlannedSegment]] = []
    done = 0
    for i, (unit, weight) in enumerate(zip(whole, weights, strict=True)):
        # A new run once the unit's middle passes this run's share of bytes, or when each remaining
        # unit must start one.
        short = n - len(runs)
        passed = done + weight / 2 > total * len(runs) / n
        if not runs or (short > 0 and (passed or len(whole) - i <= short)):
            runs.append([])
        runs[-1].extend(unit)
        done += weight
    return runs


def hot_ranges(
    tails: Mapping[str, int], spans: Mapping[str, tuple[int, int]], bounds: Bounds
) -> list[tuple[str, int, int]]:
    """Per stream (by name), the ranges [lo, hi) below its `tails` that its cold entries (`spans`,
    from `plan_streams`) do not hold and `bounds` may want: before them (a fork's inherited records,
    or what retention removed) and after them (not tiered yet)."""
    out: list[tuple[str, int, int]] = []
    for name, tail in sorted(tails.items()):
        if bounds.nothing or (bounds.streams is not None and name not in bounds.streams):
            continue
        first, end = spans.get(name, (0, 0))
        for lo, hi in ((0, first), (end, tail)):
            if lo < hi and bounds.offsets.overlaps(format_offset(lo), format_offset(hi), most_open=True):
                out.append((name, lo, hi))
    return out
