"""Packs, their indexes and stream manifests when the object store holds damaged or hostile objects.

Three readers face them:
- `SegmentCache.fetch` of a pack's slice (a `SegmentInfo` with `group >= 0`, as the state machine
  recorded it): whatever the object at the key is, it raises `StoreUnavailable` (the read is retried
  or answered 503) and never caches or serves bytes other than the slice's, nor raises another
  exception (which would surface as a 500 and a traceback).
- `PackReader.payloads` (which the cache calls): it returns exactly the rows asked for, or raises
  KeyError (no object) or one of pyarrow's errors (a damaged footer can raise NotImplementedError),
  which the cache turns into `StoreUnavailable`.
- `catalog.read` (the Spark source and `rill restore`): an object that is not a manifest or pack
  index this version reads makes it raise a ValueError (JSONDecodeError included) or be skipped;
  what it returns is well formed: integer positions with first < next, slices with a row group and
  row >= 0 and at least one record, keys inside the store (no '..' component, not absolute) and in
  the stream's own directory or its bucket's `!packs/`.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import posixpath
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.domain.offsets import format_offset
from app.state_machine import records as r
from app.state_machine.cold_tier import is_pack, pack_index_of
from app.tiering import catalog, keys
from app.tiering import pack as packs
from app.tiering import segment as seg
from app.tiering.cache import SegmentCache
from app.tiering.store import FileStore, StoreUnavailable, sha256_hex

B = "b"
OCTET = "application/octet-stream"
T0 = 1_700_000_000_000
BIG = b"B" * (300 << 10)  # one record past GROUP_BYTES: the pack's first row group holds it alone
SLICES = {"big": [BIG], "a": [b"alpha;", b"alpha-2;"], "c": [b"gamma;"]}


def _records(payloads: list[bytes], first: int = 0) -> list[seg.Record]:
    out, pos = [], first
    for i, payload in enumerate(payloads):
        out.append(seg.Record(pos, T0 + i, payload))
        pos += len(payload)
    return out


@dataclass
class Packed:
    store: FileStore
    key: str
    data: bytes
    infos: dict[str, r.SegmentInfo]  # what TierPack recorded for each stream's slice
    index: dict[str, Any]  # the index as a JSON document


def _build(store: FileStore, slices: dict[str, list[bytes]] | None = None) -> Packed:
    """A pack of `slices` (row group 0: "big"; row group 1: "a" then "c"), its index, and each slice's
    SegmentInfo, as the tiering worker writes and records them."""
    slices = SLICES if slices is None else slices
    built = [packs.Slice(name, OCTET, _records(payloads)) for name, payloads in slices.items()]
    view, placements = packs.build(B, built)
    data = bytes(view)
    key = packs.pack_key(B, sha256_hex(data))
    store.put(key, data)
    infos, index = {}, packs.PackIndex(B, key.rsplit("/", 1)[1], len(data), sha256_hex(data))
    for piece, place in zip(built, placements, strict=True):
        recs = piece.records
        lo, hi = recs[0].pos, recs[-1].pos + len(recs[-1].payload)
        digest = packs.slice_digest([rec.payload for rec in recs])
        starts = r.encode_starts(lo, [rec.pos for rec in recs])
        infos[piece.stream] = r.SegmentInfo(
            lo, hi, key, len(data), sha256_hex(data), T0, T0 + len(recs) - 1, starts, place.group, place.row, digest
        )
        index.slices.append(
            packs.IndexEntry(
                piece.stream,
                OCTET,
                format_offset(lo),
                format_offset(hi),
                len(recs),
                place.group,
                place.row,
                digest,
                T0,
                T0 + len(recs) - 1,
            )  # fmt: skip
        )
    store.put(pack_index_of(key), index.to_json())
    return Packed(store, key, data, infos, json.loads(index.to_json()))


@pytest.fixture()
def packed(tmp_path: Path) -> Packed:
    p = _build(FileStore(tmp_path / "cold"))
    assert [(i.group, i.row) for i in p.infos.values()] == [(0, 0), (1, 0), (1, 2)]
    return p


def _fetch(store: FileStore, info: r.SegmentInfo) -> list[tuple[int, bytes]]:
    """Fetches the slice through a fresh cache and reads it whole."""
    cache = SegmentCache(store)
    asyncio.run(cache.fetch(info))
    return [(pos, bytes(payload)) for pos, payload in cache.records(info, info.lo, info.hi)]


def _unavailable(store: FileStore, info: r.SegmentInfo) -> None:
    """The fetch raises StoreUnavailable: no other exception, and nothing is served."""
    with pytest.raises(StoreUnavailable):
        _fetch(store, info)


def _unavailable_or_exact(store: FileStore, info: r.SegmentInfo, name: str) -> None:
    """The fetch raises StoreUnavailable, or serves exactly the slice's records (damage the read never
    touches is harmless); no other exception, and never other bytes."""
    try:
        got = _fetch(store, info)
    except StoreUnavailable:
        return
    assert got == _expected(name)


def _expected(name: str) -> list[tuple[int, bytes]]:
    return [(rec.pos, bytes(rec.payload)) for rec in _records(SLICES[name])]


# --- SegmentCache: fetches of pack slices --------------------------------------------------------


def test_a_slice_is_served_from_a_sound_pack(packed: Packed) -> None:
    """The baseline: each slice of a sound pack is served, exactly."""
    for name in SLICES:
        assert _fetch(packed.store, packed.infos[name]) == _expected(name)


def test_a_missing_pack_is_unavailable(packed: Packed) -> None:
    """The pack was deleted (or never uploaded): StoreUnavailable, not KeyError."""
    packed.store.delete(packed.key)
    _unavailable(packed.store, packed.infos["a"])


def test_an_object_that_is_not_parquet_is_unavailable(packed: Packed) -> None:
    """The key holds bytes of the pack's length that are not Parquet: StoreUnavailable."""
    packed.store.put(packed.key, bytes(len(packed.data)))
    _unavailable(packed.store, packed.infos["a"])


_CUTS = {
    "empty": lambda n: 0,
    "4-bytes": lambda n: 4,
    "100-bytes": lambda n: 100,
    "half": lambda n: n // 2,
    "no-closing-magic": lambda n: n - 4,
    "no-footer-length": lambda n: n - 8,
    "footer-cut": lambda n: n - 12,
}


@pytest.mark.parametrize("cut", list(_CUTS.values()), ids=list(_CUTS))
def test_a_truncated_pack_is_unavailable(packed: Packed, cut: Any) -> None:
    """The pack is cut short (nothing left; 4 or 100 bytes; half; its closing magic, footer length or
    part of the footer itself missing) while the recorded size is the whole pack's: StoreUnavailable."""
    packed.store.put(packed.key, packed.data[: cut(len(packed.data))])
    _unavailable(packed.store, packed.infos["a"])


def test_every_flipped_bit_of_the_footer_is_unavailable_or_exact(packed: Packed) -> None:
    """One bit of the pack's footer flipped, for each of its bytes (some flips make pyarrow raise
    NotImplementedError, which once escaped as a 500): StoreUnavailable or exactly the slice."""
    (length,) = struct.unpack("<I", packed.data[-8:-4])
    for i in range(len(packed.data) - 8 - length, len(packed.data)):
        damaged = bytearray(packed.data)
        damaged[i] ^= 1
        packed.store.put(packed.key, bytes(damaged))
        _unavailable_or_exact(packed.store, packed.infos["a"], "a")


@pytest.mark.parametrize("length", [0x7FFFFFF0, 0xFFFFFFFF, 0, 1, "whole"], ids=str)
def test_a_footer_claiming_another_length_is_unavailable(packed: Packed, length: int | str) -> None:
    """The footer's length field (the 4 bytes before the closing `PAR1`) claims 2 GiB, 4 GiB, nothing,
    one byte, or the whole file: StoreUnavailable, quickly, without allocating what it claims."""
    claimed = len(packed.data) - 8 if length == "whole" else int(length)
    forged = packed.data[:-8] + struct.pack("<I", claimed) + b"PAR1"
    packed.store.put(packed.key, forged)
    _unavailable(packed.store, packed.infos["a"])


def _chunk(data: bytes, group: int, column: str) -> tuple[int, int]:
    """(start, length) of a column chunk in a Parquet file."""
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    names = [meta.schema.column(i).name for i in range(meta.num_columns)]
    chunk = meta.row_group(group).column(names.index(column))
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    return start, chunk.total_compressed_size


@pytest.mark.parametrize("where", ["page-header", "middle", "end"])
def test_damaged_payload_bytes_are_unavailable(packed: Packed, where: str) -> None:
    """Bytes inside the payload column chunk of the slice's row group are overwritten (its page
    header, the compressed data, its last bytes): StoreUnavailable (a decode error, or the slice's
    digest) or, where the damage does not change what decodes, exactly the slice; never other bytes
    and never another exception."""
    start, length = _chunk(packed.data, 1, "payload")
    at = {"page-header": start + 2, "middle": start + length // 2, "end": start + length - 6}[where]
    damaged = bytearray(packed.data)
    damaged[at : at + 4] = b"\xff\x7f\x00\xff"
    packed.store.put(packed.key, bytes(damaged))
    _unavailable_or_exact(packed.store, packed.infos["a"], "a")


@pytest.mark.parametrize("size", [2**40, 10, 0, -1], ids=str)
def test_a_recorded_size_that_is_not_the_packs_is_unavailable(packed: Packed, size: int) -> None:
    """The SegmentInfo's `size` is not the object's (2**40, 10, 0, -1): ranged reads from that size
    find no footer, so StoreUnavailable, quickly."""
    info = r.SegmentInfo(**{**_fields(packed.infos["a"]), "size": size})
    _unavailable(packed.store, info)


def _fields(info: r.SegmentInfo) -> dict[str, Any]:
    return {name: getattr(info, name) for name in info.__struct_fields__}


@pytest.mark.parametrize(
    "change",
    [{"group": 10**9}, {"group": 2}, {"row": 10**9}, {"row": 1}, {"row": -1}, {"row": -(10**9)}],
    ids=["group-10**9", "group-past-last", "row-10**9", "row-plus-count-past-group", "row-minus-1", "row-minus-10**9"],
)
def test_a_slice_outside_its_row_group_is_unavailable(packed: Packed, change: dict[str, int]) -> None:
    """A recorded row group that the pack does not have, or a row where `row + records` runs past the
    group (slice "a" is rows 0-1 of group 1, which has 3 rows) or is negative: StoreUnavailable, not an
    IndexError from pyarrow's slice."""
    info = r.SegmentInfo(**{**_fields(packed.infos["a"]), **change})
    _unavailable(packed.store, info)


def test_a_slice_pointing_at_another_slices_rows_is_unavailable(packed: Packed) -> None:
    """The SegmentInfo of "c" (one record, row 2 of group 1) with row 1: that row is "a"'s second record,
    of another length and content, so the length and digest checks refuse it."""
    info = r.SegmentInfo(**{**_fields(packed.infos["c"]), "row": 1})
    _unavailable(packed.store, info)


def _foreign(columns: dict[str, pa.Array]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(columns), sink, row_group_size=3)
    return sink.getvalue()


_PAYLOADS = [b"alpha;", b"alpha-2;", b"gamma;"]
_NOT_BINARY = {
    "int64": lambda: pa.array([1, 2, 3], pa.int64()),
    "large-binary": lambda: pa.array(_PAYLOADS, pa.large_binary()),
    "list-of-binary": lambda: pa.array([[p] for p in _PAYLOADS], pa.list_(pa.binary())),
    "struct": lambda: pa.array([{"x": p} for p in _PAYLOADS], pa.struct([("x", pa.binary())])),
    "fixed-size": lambda: pa.array([p[:6] for p in _PAYLOADS], pa.binary(6)),
    "all-null": lambda: pa.array([None, None, None], pa.binary()),
}


@pytest.mark.parametrize("column", list(_NOT_BINARY.values()), ids=list(_NOT_BINARY))
def test_a_pack_whose_payload_column_is_not_binary_is_unavailable(packed: Packed, column: Any) -> None:
    """The key holds a Parquet file whose `payload` column is not variable-length binary (integers,
    large_binary with 64-bit offsets, a list, a struct, fixed-size binary, or all null) and whose only
    row group has the slice's rows: StoreUnavailable, never payloads cut at misread offsets, never a
    ValueError-less crash."""
    data = _foreign({"payload": column()})
    packed.store.put(packed.key, data)
    info = r.SegmentInfo(**{**_fields(packed.infos["a"]), "size": len(data), "group": 0, "row": 0})
    _unavailable(packed.store, info)


def test_a_pack_without_a_payload_column_is_unavailable(packed: Packed) -> None:
    """A Parquet file with no `payload` column at all: StoreUnavailable."""
    data = _foreign({"other": pa.array(_PAYLOADS, pa.binary())})
    packed.store.put(packed.key, data)
    info = r.SegmentInfo(**{**_fields(packed.infos["a"]), "size": len(data), "group": 0, "row": 0})
    _unavailable(packed.store, info)


def test_a_pack_replaced_after_its_footer_was_cached_is_unavailable(packed: Packed) -> None:
    """The cache's PackReader keeps a pack's footer. The object at the key is then replaced by another
    pack (of other streams, so other offsets): the next slice read with the stale footer is refused
    (StoreUnavailable), never served from wherever the old footer points in the new bytes."""
    cache = SegmentCache(packed.store)
    asyncio.run(cache.fetch(packed.infos["a"]))
    other = _build(FileStore(packed.store.root.parent / "elsewhere"), {"x": [b"X" * 5000], "y": [b"Y" * 7000]})
    packed.store.put(packed.key, other.data)
    with pytest.raises(StoreUnavailable):
        asyncio.run(cache.fetch(packed.infos["c"]))


def test_a_pack_with_forged_records_is_unavailable(packed: Packed) -> None:
    """The key holds a well-formed pack of the same layout whose slice "a" has other bytes of the same
    lengths: the slice's digest refuses them (StoreUnavailable)."""
    forged = {"big": [BIG], "a": [b"ALPHA;", b"ALPHA-2;"], "c": [b"gamma;"]}
    other = _build(FileStore(packed.store.root.parent / "forgery"), forged)
    packed.store.put(packed.key, other.data)
    info = r.SegmentInfo(**{**_fields(packed.infos["a"]), "size": len(other.data)})
    _unavailable(packed.store, info)


# --- PackReader.payloads directly ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("group", "row", "count"),
    [(1, 0, 3), (1, 2, 1), (0, 0, 1)],
)
def test_pack_reader_returns_exactly_the_rows_asked_for(packed: Packed, group: int, row: int, count: int) -> None:
    """The baseline: `count` payloads, those rows'."""
    got = packs.PackReader(packed.store).payloads(packed.key, len(packed.data), group, row, count)
    assert len(got) == count


@pytest.mark.parametrize(
    ("group", "row", "count"),
    [(-1, 0, 1), (2, 0, 1), (1, 3, 1), (1, 2, 2), (1, -1, 1), (1, -3, 2), (1, 0, -1), (1, 1, -5), (1, 0, 2**40)],
    ids=[
        "group-minus-1",
        "group-past-last",
        "row-past-group",
        "count-past-group",
        "row-minus-1",
        "row-minus-3",
        "count-minus-1",
        "count-minus-5",
        "count-2**40",
    ],  # fmt: skip
)
def test_pack_reader_refuses_rows_the_group_does_not_have(packed: Packed, group: int, row: int, count: int) -> None:
    """Rows outside the row group (a negative group, row or count; past its end) raise ValueError or
    OSError (what the cache turns into StoreUnavailable), never IndexError, and never return a number
    of payloads other than `count`."""
    reader = packs.PackReader(packed.store)
    with pytest.raises((ValueError, OSError)):
        got = reader.payloads(packed.key, len(packed.data), group, row, count)
        assert len(got) == count, f"asked for {count} rows at {row} of group {group}, got {len(got)}"


# --- catalog.read against hostile manifests and indexes ------------------------------------------


def _read(store: FileStore) -> dict[tuple[str, str], catalog.StreamEntries] | None:
    """catalog.read over the whole store; None when it refused with a ValueError (an acceptable
    outcome); any other exception propagates and fails the test."""
    try:
        found = catalog.read(store, catalog.listing(store))
    except ValueError:
        return None
    _well_formed(found)
    return found


def _well_formed(found: dict[tuple[str, str], catalog.StreamEntries]) -> None:
    for (bucket, name), entries in found.items():
        assert isinstance(bucket, str) and isinstance(name, str), f"a stream named {bucket!r}/{name!r}"
        assert isinstance(entries.content_type, str), f"{name}: content type {entries.content_type!r}"
        assert "\x00" not in name, f"a stream name with a NUL byte: {name!r}"
        own = f"{seg.stream_dir(bucket, name)}/"
        legacy = posixpath.dirname(keys.manifest_candidates(bucket, name)[-1]) + "/"
        previous = None
        for e in entries.entries:
            ints = (e.first, e.next, e.records, e.size, e.group, e.row, e.min_append_time, e.max_append_time)
            assert all(type(v) is int for v in ints), f"{name}: an entry with a field that is not an int: {e}"
            assert 0 <= e.first < e.next, f"{name}: an entry of range [{e.first}, {e.next})"
            assert e.records >= 1 and e.size >= 0, f"{name}: {e.records} records, {e.size} bytes"
            parts = e.key.split("/")
            assert not e.key.startswith("/") and ".." not in parts and "\x00" not in e.key, f"{name}: key {e.key!r}"
            if e.packed:
                assert e.row >= 0 and is_pack(e.key) and e.key.startswith(f"{bucket}/"), e
            else:
                assert e.key.startswith((own, legacy)), f"{name}: {e.key!r} is not in its directory {own!r}"
            if previous is not None:
                assert previous.next <= e.first, f"{name}: entries overlap: {previous} and {e}"
            previous = e


def _put_stream(store: FileStore, name: str, chunks: list[list[bytes]]) -> seg.Manifest:
    """Segments of `name` (each chunk one segment, consecutive) and its manifest."""
    entries, pos = [], 0
    for payloads in chunks:
        recs = _records(payloads, pos)
        data = seg.build(B, name, OCTET, recs)
        pos = recs[-1].pos + len(recs[-1].payload)
        store.put(seg.segment_key(B, name, recs[0].pos, pos), data)
        entries.append(seg.entry(B, name, recs, data))
    manifest = seg.Manifest(B, name, OCTET, entries)
    store.put(seg.manifest_key(B, name), manifest.to_json())
    return manifest


def _manifest_doc(store: FileStore, name: str) -> dict[str, Any]:
    return json.loads(store.get(seg.manifest_key(B, name)))


@pytest.fixture()
def cataloged(packed: Packed) -> Packed:
    """Beside the pack: stream "s" with two segments of its own, and then a slice in a second pack."""
    _put_stream(packed.store, "s", [[b"one;"], [b"two;"]])
    return packed


def test_the_catalog_reads_a_sound_store(cataloged: Packed) -> None:
    """The baseline, including a manifest entry naming a pack slice (`../!packs/…`)."""
    doc = _manifest_doc(cataloged.store, "s")
    slice_c = cataloged.index["slices"][2]
    doc["segments"].append(
        {
            **slice_c,
            "path": f"../!packs/{cataloged.key.rsplit('/', 1)[1]}",
            "first_offset": format_offset(8),
            "next_offset": format_offset(14),
            "bytes": cataloged.index["size"],
            "sha256": cataloged.index["sha256"],
            "digest": slice_c["sha256"],
        }  # fmt: skip
    )
    for k in ("stream", "content_type"):
        doc["segments"][-1].pop(k)
    cataloged.store.put(seg.manifest_key(B, "s"), json.dumps(doc).encode())
    found = _read(cataloged.store)
    assert found is not None
    assert [(e.first, e.next, e.packed) for e in found[(B, "s")].entries] == [
        (0, 4, False),
        (4, 8, False),
        (8, 14, True),
    ]
    assert {name for _, name in found} == {"s", "big", "a", "c"}


def _index_doc(**fields: Any) -> bytes:
    return json.dumps({"bucket": B, "path": "p", "size": 1, "sha256": "0", "slices": [], **fields}).encode()


_NOT_AN_INDEX = {
    "list": b"[]",
    "null": b"null",
    "number": b"7",
    "invalid": b"{not json",
    "deeply-nested": b"[" * 100_000,
    "empty-object": b"{}",
    "format-99": _index_doc(format=99),
    "format-string": _index_doc(format="1"),
    "slices-a-string": _index_doc(slices="x"),
    "slice-not-an-object": _index_doc(slices=[7]),
    "slice-missing-fields": _index_doc(slices=[{"stream": "x"}]),
    "extra-field": _index_doc(evil=1),
}


@pytest.mark.parametrize("raw", list(_NOT_AN_INDEX.values()), ids=list(_NOT_AN_INDEX))
def test_an_index_that_is_not_a_pack_index_is_refused_or_skipped(cataloged: Packed, raw: bytes) -> None:
    """A second `b/!packs/<digest>.json` that is not a pack index this version reads (not an object,
    too deeply nested, a newer format, fields missing or of the wrong type): ValueError, or the object
    is skipped and the rest of the store still read. Never AttributeError/KeyError/TypeError/
    RecursionError."""
    cataloged.store.put(f"{B}/{packs.DIRECTORY}/{'ab' * 20}.json", raw)
    found = _read(cataloged.store)
    if found is not None:
        assert {name for _, name in found} >= {"s", "big", "a", "c"}


_HOSTILE_SLICE: dict[str, dict[str, Any]] = {
    "group-minus-5": {"group": -5},
    "group-a-string": {"group": "1"},
    "row-minus-1": {"row": -1},
    "records-0": {"records": 0},
    "records-minus-1": {"records": -1},
    "records-a-string": {"records": "2"},
    "first-an-int": {"first_offset": 0},
    "first-negative": {"first_offset": "-000000000000001"},
    "first-not-digits": {"first_offset": "0000000000000000_000000000000000x"},
    "next-equal-first": {"next_offset": format_offset(0)},
    "next-before-first": {"first_offset": format_offset(20), "next_offset": format_offset(5)},
    "stream-with-nul": {"stream": "a\x00b"},
    "stream-a-number": {"stream": 5},
    "content-type-a-number": {"content_type": 5},
    "time-a-string": {"min_append_time": "yesterday"},
    "size-negative": {"__size": -1},
}


@pytest.mark.parametrize("change", list(_HOSTILE_SLICE.values()), ids=list(_HOSTILE_SLICE))
def test_an_index_slice_with_hostile_fields_is_refused_or_skipped(cataloged: Packed, change: dict[str, Any]) -> None:
    """Slice "a" of the index has a field no writer produces (a negative or non-integer row group, row
    or count; an offset token that is not one, or a range that is empty or backwards; a name with a
    NUL byte or that is not a string): ValueError, or that slice is skipped. Whatever comes back is
    well formed (`_well_formed`): group -5 in particular must not turn the slice into an "own
    segment" whose object is the whole pack."""
    doc = cataloged.index
    if "__size" in change:
        doc["size"] = change["__size"]
    else:
        doc["slices"][1].update(change)
    cataloged.store.put(pack_index_of(cataloged.key), json.dumps(doc).encode())
    found = _read(cataloged.store)
    if found is not None:
        assert (B, "s") in found


_NOT_A_MANIFEST = {
    "list": lambda d: b"[]",
    "null": lambda d: b"null",
    "invalid": lambda d: b"{not json",
    "deeply-nested": lambda d: b"[" * 100_000,
    "format-99": lambda d: json.dumps({**d, "format": 99}).encode(),
    "format-string": lambda d: json.dumps({**d, "format": "2"}).encode(),
    "no-segments": lambda d: json.dumps({k: v for k, v in d.items() if k != "segments"}).encode(),
    "segments-an-object": lambda d: json.dumps({**d, "segments": {"x": 1}}).encode(),
    "entry-not-an-object": lambda d: json.dumps({**d, "segments": [1]}).encode(),
    "entry-missing-fields": lambda d: json.dumps({**d, "segments": [{"path": "x"}]}).encode(),
    "entry-offset-an-int": lambda d: json.dumps({**d, "segments": [{**d["segments"][0], "first_offset": 0}]}).encode(),
    "entry-records-a-string": lambda d: json.dumps({**d, "segments": [{**d["segments"][0], "records": "1"}]}).encode(),
    "entry-group-a-string": lambda d: json.dumps({**d, "segments": [{**d["segments"][0], "group": "0"}]}).encode(),
    "entry-empty-range": lambda d: json.dumps(
        {**d, "segments": [{**d["segments"][0], "next_offset": d["segments"][0]["first_offset"]}]}
    ).encode(),
    "stream-a-number": lambda d: json.dumps({**d, "stream": 5}).encode(),
    "content-type-a-list": lambda d: json.dumps({**d, "content_type": ["x"]}).encode(),
}


@pytest.mark.parametrize("make", list(_NOT_A_MANIFEST.values()), ids=list(_NOT_A_MANIFEST))
def test_a_manifest_that_is_not_a_manifest_is_refused_or_skipped(cataloged: Packed, make: Any) -> None:
    """`b/junk/manifest.json` (beside the sound stream "s") is not a manifest this version reads: not
    an object, too deeply nested, a newer format, entries missing or of the wrong type, an empty
    range: ValueError, or it is skipped (and "s" still read). Never AttributeError/KeyError/
    TypeError/RecursionError, and nothing ill-formed returned."""
    _put_stream(cataloged.store, "junk", [[b"junk;"]])
    cataloged.store.put(seg.manifest_key(B, "junk"), make(_manifest_doc(cataloged.store, "junk")))
    found = _read(cataloged.store)
    if found is not None:
        assert [(e.first, e.next) for e in found[(B, "s")].entries] == [(0, 4), (4, 8)]


@pytest.mark.parametrize(
    "path",
    ["../../../etc/passwd", "/etc/passwd", "../other/segments/x.parquet", "segments/../../other/x.parquet",
     "segments/\x00.parquet", "../../other-bucket/!packs/x.parquet"],
    ids=["dotdot-out-of-the-store", "absolute", "another-streams-directory", "dotdot-inside",
         "nul-byte", "another-buckets-pack"],
)  # fmt: skip
def test_a_manifest_path_out_of_its_place_is_refused_or_skipped(cataloged: Packed, path: str) -> None:
    """An entry of "s"'s manifest whose `path` leaves the store, is absolute, or names another stream's
    directory or another bucket's pack: ValueError, or the entry is skipped. A key the catalog returns
    never has a '..' component or a leading '/', and is in the stream's own directory or its bucket's
    `!packs/` (the only places a writer puts a stream's objects)."""
    doc = _manifest_doc(cataloged.store, "s")
    doc["segments"][1]["path"] = path
    cataloged.store.put(seg.manifest_key(B, "s"), json.dumps(doc).encode())
    _read(cataloged.store)


def test_a_manifest_in_another_directory_does_not_speak_for_a_stream(cataloged: Packed) -> None:
    """`b/zzz/manifest.json` (listed after "s"'s own) claims to be stream "s"'s and lists nothing, or
    a forged segment. A manifest speaks only for the stream whose directory it is in: "s"'s entries
    are those of `b/s/manifest.json` (or the decoy makes the catalog raise ValueError)."""
    decoy = _put_stream(cataloged.store, "zzz", [[b"FORGED;"]])
    decoy.stream = "s"
    cataloged.store.put(seg.manifest_key(B, "zzz"), decoy.to_json())
    found = _read(cataloged.store)
    if found is not None:
        assert [(e.first, e.next) for e in found[(B, "s")].entries] == [(0, 4), (4, 8)]
        assert all(e.key.startswith(f"{B}/s/") for e in found[(B, "s")].entries)


def test_a_manifest_claiming_another_bucket_is_not_listed_there(cataloged: Packed) -> None:
    """`b/t/manifest.json` says its bucket is "elsewhere": its stream is not listed under a bucket
    whose directory it is not in (or the catalog raises ValueError)."""
    manifest = _put_stream(cataloged.store, "t", [[b"t;"]])
    manifest.bucket = "elsewhere"
    cataloged.store.put(seg.manifest_key(B, "t"), manifest.to_json())
    found = _read(cataloged.store)
    if found is not None:
        assert ("elsewhere", "t") not in found


def test_overlapping_slices_from_two_indexes_are_not_both_returned(cataloged: Packed) -> None:
    """Two packs each list a slice of stream "a" starting at 0 (an index not yet rewritten after "a"
    was deleted and created again, or a hostile one): the catalog's promise is entries "in offset
    order without overlaps", so at most one of them is returned."""
    _build(cataloged.store, {"a": [b"another-a;"]})
    found = _read(cataloged.store)
    if found is not None:
        entries = found[(B, "a")].entries
        assert len(entries) == 1, f"overlapping slices of 'a': {entries}"


def test_a_manifest_of_100k_entries_is_read_in_proportion(cataloged: Packed) -> None:
    """A manifest of 100,000 entries (copies of one) is read (or refused with ValueError) in a few
    seconds: nothing is quadratic in the entry count."""
    doc = _manifest_doc(cataloged.store, "s")
    doc["segments"] = [doc["segments"][0]] * 100_000
    cataloged.store.put(seg.manifest_key(B, "s"), json.dumps(doc).encode())
    with contextlib.suppress(ValueError):
        catalog.read(cataloged.store, catalog.listing(cataloged.store))


def test_duplicate_entries_of_one_manifest_are_returned_once(cataloged: Packed) -> None:
    """ "s"'s manifest lists its first segment twice and an entry overlapping both of its segments: the
    catalog's promise is entries "in offset order without overlaps", so they do not all come back
    (or the manifest is refused with ValueError)."""
    doc = _manifest_doc(cataloged.store, "s")
    overlapping = {**doc["segments"][0], "first_offset": format_offset(2), "next_offset": format_offset(6)}
    doc["segments"] = [doc["segments"][0], doc["segments"][0], overlapping, doc["segments"][1]]
    cataloged.store.put(seg.manifest_key(B, "s"), json.dumps(doc).encode())
    _read(cataloged.store)


def test_catalog_stream_skips_a_hostile_index_in_its_bucket(cataloged: Packed) -> None:
    """`catalog.stream` reads every index of the bucket: one that is a JSON list is skipped (or makes
    it raise ValueError); never AttributeError."""
    cataloged.store.put(f"{B}/{packs.DIRECTORY}/{'cd' * 20}.json", b"[]")
    try:
        found = catalog.stream(cataloged.store, B, "s")
    except ValueError:
        return
    assert found is not None and [(e.first, e.next) for e in found.entries] == [(0, 4), (4, 8)]
