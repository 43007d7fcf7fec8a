"""Which segments of the cold tier, and which hot ranges, a `rill` read covers.

Planning reads only manifests: filters on stream, offset and append time (pushed down by Spark or
given as options) drop whole segments here. What a stream's own segments do not hold is left to the
server, as hot ranges. Everything planned is plain data, pickled to Spark's executors as is; the
Spark classes that carry it are in app/pipeline/datasource.py.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from urllib.parse import quote

from app.domain.offsets import format_offset
from app.pipeline.options import Bounds, Range, ReadOptions
from app.tiering.keys import HASHED, manifest_candidates
from app.tiering.segment import Manifest, offset_of
from app.tiering.store import ObjectStore, StoreOptions, open_store


@dataclass
class PlannedSegment:
    """One segment to read: its object key in the store and its manifest entry's range."""

    stream: str
    key: str
    first_offset: str
    next_offset: str
    records: int
    bytes: int


_STORES: dict[tuple[str, StoreOptions], ObjectStore] = {}
MANIFEST_WAITS, MANIFEST_WAIT_SECONDS = 20, 0.5


def store_for(opts: ReadOptions) -> ObjectStore:
    """One store (boto3 client) per worker process and options, reused across tasks."""
    key = (opts.store, opts.s3)
    if key not in _STORES:
        _STORES[key] = open_store(opts.store, opts.s3)
    return _STORES[key]


def _manifest_keys(store: ObjectStore, opts: ReadOptions, bounds: Bounds) -> list[str]:
    if opts.stream is not None:
        return manifest_candidates(opts.bucket, opts.stream)
    if bounds.streams is not None:  # pushed `stream = …` / `stream IN (…)`: no listing needed
        names = [s for s in sorted(bounds.streams) if s.startswith(opts.prefix or "")]
        return [key for name in names for key in manifest_candidates(opts.bucket, name)]
    # A stream's directory name has no '/', so its manifest is exactly `{bucket}/{name}/manifest.json`.
    # Long names have hashed directories: those are listed whatever the prefix, and `plan_streams`
    # keeps the ones whose manifest names a matching stream.
    prefixes = [f"{opts.bucket}/"]
    if opts.prefix:
        prefixes = [f"{opts.bucket}/{HASHED}", f"{opts.bucket}/{quote(opts.prefix, safe='-_.~')}"]
    listed = (key for prefix in prefixes for key in store.list(prefix))
    return [k for k in listed if k.endswith("/manifest.json") and k.count("/") == 2]


def plan(options: Mapping[str, str] | ReadOptions, bounds: Bounds | None = None) -> list[PlannedSegment]:
    """The segments a read with these options (and pushed-down `bounds`) has to open, in stream/offset order."""
    return plan_streams(options, bounds)[0]


def plan_streams(
    options: Mapping[str, str] | ReadOptions, bounds: Bounds | None = None
) -> tuple[list[PlannedSegment], dict[str, tuple[int, int]]]:
    """`plan`'s segments, and where each stream's own segments start and end (by its manifest)."""
    opts = options if isinstance(options, ReadOptions) else ReadOptions.parse(options)
    b = bounds or opts.bounds
    ends: dict[str, tuple[int, int]] = {}
    if b.nothing:
        return [], ends
    store = store_for(opts)
    out: list[PlannedSegment] = []
    for key in _manifest_keys(store, opts, b):
        try:
            manifest = Manifest.from_json(store.get(key))
        except KeyError:  # no such stream, or dropped since the listing
            continue
        name = manifest.stream
        if (b.streams is not None and name not in b.streams) or not name.startswith(opts.prefix or ""):
            continue
        if opts.stream is not None and name != opts.stream:
            continue
        base = key[: -len("manifest.json")]
        if manifest.segments:
            head, last = manifest.segments[0], manifest.segments[-1]
            ends[name] = (offset_of(head.first_offset), offset_of(last.next_offset))
        for seg in manifest.segments:
            in_offsets = b.offsets.overlaps(seg.first_offset, seg.next_offset, most_open=True)
            if in_offsets and b.times.overlaps(seg.min_append_time * 1000, seg.max_append_time * 1000):
                path, first, nxt = base + seg.path, seg.first_offset, seg.next_offset
                out.append(PlannedSegment(name, path, first, nxt, seg.records, seg.bytes))
    return out, ends


def covering(opts: ReadOptions, stream: str, lo: int, hi: int) -> tuple[Bounds, list[PlannedSegment]]:
    """Bounds for the records of `stream` starting in [lo, hi), and the segments holding them, once the
    manifest reaches `hi`: the server evicts records after tiering them, and the manifest that lists
    their segments may be published a moment later."""
    only = Bounds(offsets=Range(format_offset(lo), False, format_offset(hi), True))
    for _ in range(MANIFEST_WAITS):
        segments, spans = plan_streams(replace(opts, stream=stream, prefix=None), only)
        if spans.get(stream, (0, 0))[1] >= hi:
            return only, segments
        time.sleep(MANIFEST_WAIT_SECONDS)
    raise FileNotFoundError(f"the manifest of {opts.bucket}/{stream} does not reach {format_offset(hi)} yet")


def pack(segments: list[PlannedSegment], max_bytes: int, min_partitions: int = 1) -> list[list[PlannedSegment]]:
    """Segments in runs of about equal bytes: enough runs to keep each under `max_bytes` (0: a run per segment)
    and at least `min_partitions` of them while there are segments to spread, so every core gets work."""
    if max_bytes <= 0:
        return [[s] for s in segments]
    total = sum(s.bytes for s in segments)
    n = min(len(segments), max(min_partitions, -(-total // max_bytes)))
    runs: list[list[PlannedSegment]] = []
    done = 0
    for i, seg in enumerate(segments):
        # A new run once the segment's middle passes this run's share of bytes, or when each remaining
        # segment must start one.
        short = n - len(runs)
        passed = done + seg.bytes / 2 > total * len(runs) / n
        if not runs or (short > 0 and (passed or len(segments) - i <= short)):
            runs.append([])
        runs[-1].append(seg)
        done += seg.bytes
    return runs


def hot_ranges(
    tails: Mapping[str, int], spans: Mapping[str, tuple[int, int]], bounds: Bounds
) -> list[tuple[str, int, int]]:
    """Per stream (by name), the ranges [lo, hi) below its `tails` that its own segments (`spans`,
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
