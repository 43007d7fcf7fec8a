"""Sealed segments: the Parquet format other tools read, `load` for serving reads, object keys, the manifest."""

from __future__ import annotations

import io
import json
import random
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.domain.offsets import format_offset
from app.tiering import segment as seg

T0 = 1_700_000_000_000


def records(payloads: list[bytes], first: int = 0, producers: dict[int, tuple[str, int, int]] | None = None) -> list:
    out, pos = [], first
    for i, payload in enumerate(payloads):
        out.append(seg.Record(pos, T0 + i, payload, (producers or {}).get(i)))
        pos += len(payload)
    return out


@pytest.fixture()
def sample() -> tuple[list[seg.Record], bytes]:
    recs = records([b"abc", b"\x00\xff", b'{"k":1}', b"z"], first=100, producers={1: ("prod-\u00fc", 3, 7)})
    return recs, seg.build("bkt", "a/stream \u00fc", "application/octet-stream", recs)


def test_schema_columns_and_types(sample: tuple[list[seg.Record], bytes], tmp_path: Path) -> None:
    _, data = sample
    path = tmp_path / "seg.parquet"
    path.write_bytes(data)
    table = pq.read_table(path)  # plain pyarrow, no Rill code
    assert table.schema.remove_metadata() == seg.SCHEMA.remove_metadata()
    assert table.schema.names == [
        "bucket", "stream", "offset", "next_offset", "append_time", "content_type",
        "producer_id", "producer_epoch", "producer_seq", "payload",
    ]  # fmt: skip
    for name in ("bucket", "stream", "offset", "next_offset", "append_time", "content_type", "payload"):
        assert not table.schema.field(name).nullable, name
    for name in ("producer_id", "producer_epoch", "producer_seq"):
        assert table.schema.field(name).nullable, name
    assert table.schema.field("append_time").type == pa.timestamp("ms", tz="UTC")
    assert table.schema.metadata == {b"rill.format": b"1", b"rill.first": b"100", b"rill.next": b"113"}
    assert pq.ParquetFile(path).schema.column(9).physical_type == "BYTE_ARRAY"


def test_rows_read_back_with_plain_pyarrow(sample: tuple[list[seg.Record], bytes]) -> None:
    recs, data = sample
    rows = pq.read_table(io.BytesIO(data)).to_pylist()
    assert len(rows) == len(recs)
    for row, rec in zip(rows, recs, strict=True):
        assert row["bucket"] == "bkt" and row["stream"] == "a/stream \u00fc"
        assert row["content_type"] == "application/octet-stream"
        assert row["offset"] == format_offset(rec.pos)
        assert row["next_offset"] == format_offset(rec.pos + len(rec.payload))
        assert seg.offset_of(row["offset"]) == rec.pos
        assert row["payload"] == rec.payload
        assert row["append_time"] == datetime.fromtimestamp(rec.time / 1000, UTC)
    assert [(r["producer_id"], r["producer_epoch"], r["producer_seq"]) for r in rows] == [
        (None, None, None),
        ("prod-\u00fc", 3, 7),
        (None, None, None),
        (None, None, None),
    ]
    assert [r["next_offset"] for r in rows[:-1]] == [r["offset"] for r in rows[1:]], "rows are contiguous"
    assert rows[-1]["next_offset"] == format_offset(113)


def test_offset_tokens_sort_like_positions() -> None:
    positions = [0, 9, 10, 99, 100, 12345, 10**15]
    tokens = [format_offset(p) for p in positions]
    assert sorted(tokens) == tokens
    assert [seg.offset_of(t) for t in tokens] == positions


def test_zstd_compression_and_statistics(sample: tuple[list[seg.Record], bytes]) -> None:
    _, data = sample
    meta = pq.ParquetFile(io.BytesIO(data)).metadata
    assert meta.num_rows == 4
    for g in range(meta.num_row_groups):
        group = meta.row_group(g)
        for c in range(group.num_columns):
            assert group.column(c).compression == "ZSTD", group.column(c).path_in_schema
        stats = group.column(2).statistics  # offset
        assert stats is not None and stats.has_min_max
        assert (stats.min, stats.max) == (format_offset(100), format_offset(112))


def test_large_segment_has_row_groups_of_about_one_mib() -> None:
    rng = random.Random(5)
    recs = records([rng.randbytes(rng.randint(5_000, 20_000)) for _ in range(400)])
    total = sum(len(r.payload) for r in recs)
    assert total > 4_500_000
    data = seg.build("b", "big", "application/octet-stream", recs)
    file = pq.ParquetFile(io.BytesIO(data))
    meta = file.metadata
    assert meta.num_row_groups >= 4
    largest = max(len(r.payload) for r in recs)
    start = 0
    for g in range(meta.num_row_groups):
        n = meta.row_group(g).num_rows
        size = sum(len(r.payload) + 64 for r in recs[start : start + n])
        if g < meta.num_row_groups - 1:
            assert seg.ROW_GROUP_BYTES <= size < seg.ROW_GROUP_BYTES + largest + 64, (g, size)
        else:
            assert size < seg.ROW_GROUP_BYTES + largest + 64
        stats = meta.row_group(g).column(2).statistics
        assert (stats.min, stats.max) == (format_offset(recs[start].pos), format_offset(recs[start + n - 1].pos))
        start += n
    assert start == len(recs)
    assert file.read_row_group(1).column("payload").to_pylist() == [
        r.payload for r in recs[meta.row_group(0).num_rows : meta.row_group(0).num_rows + meta.row_group(1).num_rows]
    ]
    loaded = seg.load(data)
    assert [bytes(p) for p in loaded.payloads] == [r.payload for r in recs]
    assert loaded.positions == [r.pos for r in recs]


def test_load_round_trip(sample: tuple[list[seg.Record], bytes]) -> None:
    recs, data = sample
    loaded = seg.load(data)
    assert loaded.positions == [100, 103, 105, 112]
    assert [bytes(p) for p in loaded.payloads] == [r.payload for r in recs]
    assert loaded.size == 13 + 64 * 4


@given(st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=30), st.integers(0, 2**40))
def test_load_round_trip_random(payloads: list[bytes], first: int) -> None:
    recs = records(payloads, first)
    loaded = seg.load(seg.build("b", "s", "text/plain", recs))
    assert loaded.positions == [r.pos for r in recs]
    assert [bytes(p) for p in loaded.payloads] == payloads


def test_load_rejects_a_segment_whose_records_do_not_add_up(sample: tuple[list[seg.Record], bytes]) -> None:
    _, data = sample
    table = pq.read_table(io.BytesIO(data))
    metadata = dict(table.schema.metadata)
    intact = io.BytesIO()
    pq.write_table(table, intact)
    assert seg.load(intact.getvalue()).positions == [100, 103, 105, 112]
    metadata[b"rill.next"] = b"114"
    sink = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(metadata), sink)
    with pytest.raises(ValueError):
        seg.load(sink.getvalue())


def test_build_needs_records() -> None:
    with pytest.raises(ValueError):
        seg.build("b", "s", "text/plain", [])


def test_duckdb_reads_segments(sample: tuple[list[seg.Record], bytes], tmp_path: Path) -> None:
    import duckdb

    recs, data = sample
    path = tmp_path / "seg.parquet"
    path.write_bytes(data)
    query = f'select "offset", payload, producer_seq from read_parquet(\'{path}\') order by "offset"'
    rows = duckdb.sql(query).fetchall()
    assert [(o, bytes(p), s) for o, p, s in rows] == [
        (format_offset(r.pos), r.payload, r.producer[2] if r.producer else None) for r in recs
    ]


# Keys


def test_key_layout() -> None:
    assert seg.segment_key("b", "s", 5, 10) == (
        "b/s/segments/0000000000000000_0000000000000005-0000000000000000_0000000000000010.parquet"
    )
    assert seg.manifest_key("b", "s") == "b/s/manifest.json"
    assert seg.stream_dir("b", "a/b") == "b/a%2Fb"
    assert seg.stream_dir("b", ".") == "b/%2E"
    assert seg.stream_dir("b", "..") == "b/%2E%2E"
    assert seg.stream_dir("b", "a..b") == "b/a..b"
    assert seg.stream_dir("b", "%") == "b/%25"
    assert seg.stream_dir("b", "\u00fc x") == "b/%C3%BC%20x"
    assert seg.stream_dir("b", "keep-_.~") == "b/keep-_.~"


@pytest.mark.parametrize(
    "name",
    ["s", "a/b", "a/b/", "/lead", "..", ".", "...", "../x", "%", "%2F", "%252F", "\u00fc\u65e5\U0001f600", "x y+z",
     "segments", "a/segments/b", "manifest.json", "x-1-2"],
)  # fmt: skip
def test_parse_key_round_trip(name: str) -> None:
    key = seg.segment_key("bkt", name, 12, 34)
    assert seg.parse_key(key) == ("bkt", name, 12)
    assert seg.parse_key(seg.manifest_key("bkt", name)) == ("bkt", name, None)
    encoded = seg.stream_dir("bkt", name).removeprefix("bkt/")
    assert "/" not in encoded and encoded not in (".", ".."), "a stream's objects sit in one directory of their own"


@given(
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=12),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=12),
    st.integers(0, 10**15),
)
def test_parse_key_round_trip_random(name: str, other: str, lo: int) -> None:
    key = seg.segment_key("bkt", name, lo, lo + 1)
    assert seg.parse_key(key) == ("bkt", name, lo)
    assert seg.parse_key(seg.manifest_key("bkt", name)) == ("bkt", name, None)
    a, b = seg.stream_dir("bkt", name) + "/", seg.stream_dir("bkt", other) + "/"
    assert (a == b) == (name == other)
    assert name == other or not (a.startswith(b) or b.startswith(a)), "no stream's objects nest in another's"


@pytest.mark.parametrize(
    "key",
    ["", "b/s/other.json", "b/s/segments/not-an-offset.parquet", "manifest.json", "nobucket/segments/x", "plain"],
)
def test_parse_key_rejects_other_keys(key: str) -> None:
    assert seg.parse_key(key) is None


# Manifest


def test_manifest_json_round_trip() -> None:
    entries = [
        seg.SegmentEntry(
            path="segments/" + seg.segment_key("b", "s", lo, hi).rsplit("/", 1)[1],
            first_offset=format_offset(lo),
            next_offset=format_offset(hi),
            records=n,
            bytes=size,
            sha256="ab" * 32,
            min_append_time=T0 + lo,
            max_append_time=T0 + hi,
        )
        for lo, hi, n, size in [(0, 10, 2, 999), (10, 25, 3, 1234)]
    ]
    manifest = seg.Manifest("b", "s/\u00fc", "application/json", entries)
    raw = manifest.to_json()
    doc = json.loads(raw)
    assert doc["format"] == seg.MANIFEST_FORMAT == 2
    assert (doc["bucket"], doc["stream"], doc["content_type"]) == ("b", "s/\u00fc", "application/json")
    assert doc["segments"][1] == {
        "path": entries[1].path,
        "first_offset": format_offset(10),
        "next_offset": format_offset(25),
        "records": 3,
        "bytes": 1234,
        "sha256": "ab" * 32,
        "min_append_time": T0 + 10,
        "max_append_time": T0 + 25,
    }
    again = seg.Manifest.from_json(raw)
    assert again == manifest
    assert seg.Manifest.from_json(seg.Manifest("b", "s", "text/plain").to_json()) == seg.Manifest(
        "b", "s", "text/plain"
    )
