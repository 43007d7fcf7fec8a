"""`rill restore` against an object store whose contents are damaged or hostile.

The object store is shared infrastructure: a backup, manifest, pack index, pack or segment may be cut
short, replaced by another object, or written by someone else (a prefix shared by mistake, a bug).
Whatever it holds, a restore must end in a clean refusal (`RestoreError`, `BackupError`) or a
restore that skips what it cannot trust and brings back the rest; never another exception, never a
file outside the data directory or a read outside the store, never bytes other than those written,
never a deleted stream brought back, and never time or memory out of proportion to its input.

Each test builds one precise hostile store and states the safe outcome in its docstring.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import struct
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from app.domain.offsets import format_offset
from app.service import restore as restore_module
from app.service.restore import Restored, RestoreError, restore
from app.state_machine import backup
from app.state_machine import records as r
from app.state_machine.cold_tier import pack_index_of
from app.state_machine.commands import ForgetObjects
from app.state_machine.machine import StateMachine
from app.storage.rocks import RocksKV
from app.tiering import pack as packs
from app.tiering import segment as seg
from app.tiering.store import FileStore, sha256_hex
from tests.service.test_restore import _back_up, _content, _seal
from tests.state_machine.helpers import OCTET, T0, B
from tests.state_machine.tiering_helpers import TH

_U32 = struct.Struct(">I")
_CLEAN = (RestoreError, backup.BackupError)


# --- helpers -------------------------------------------------------------------------------------


def _attempt(store: FileStore, node: Path, **kwargs: Any) -> Restored | None:
    """The restore's outcome: Restored, or None for a clean refusal. Any other exception propagates,
    so a test fails with the traceback the operator would have seen."""
    try:
        return restore(store, node, **kwargs)
    except _CLEAN:
        return None


@contextmanager
def _machine(node: Path) -> Iterator[StateMachine]:
    machine = StateMachine(RocksKV(node / "state", r.COLUMN_FAMILIES))
    try:
        yield machine
    finally:
        machine.kv.close()


def _objects(store: FileStore) -> dict[str, bytes]:
    return {key: store.get(key) for key in store.list("") if key.endswith(".parquet")}


def _read(node: Path, store: FileStore, name: str) -> bytes | None:
    """The restored stream's bytes, read through its segments; None when the stream does not exist.

    First checks that every segment or slice the restored state names is an object of the size and
    SHA-256 it records: otherwise every cold read of the stream would fail (StoreUnavailable)."""
    with _machine(node) as machine:
        meta = machine.lookup(B, name)
        if meta is None:
            return None
        for info in machine.segments(meta.sid, meta.fork_pos, meta.tiered):
            try:
                data = store.get(info.key)
            except KeyError:
                raise AssertionError(f"restored {name!r} names {info.key}, which is not in the store") from None
            assert (len(data), sha256_hex(data)) == (info.size, info.sha256), (
                f"restored {name!r} names {info.key} as {info.size} bytes with SHA-256 {info.sha256[:12]}, "
                f"but the object is {len(data)} bytes with {sha256_hex(data)[:12]}: every read would fail"
            )
        return _content(machine, _objects(store), name)


def _only_our_directories(tmp_path: Path, *allowed: str) -> None:
    """Nothing was created beside the store and the data directory (no path escaped them)."""
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"cold", "node", *allowed})


def _records(payloads: list[bytes], first: int = 0) -> list[seg.Record]:
    out, pos = [], first
    for i, payload in enumerate(payloads):
        out.append(seg.Record(pos, T0 + 5000 + i, payload))
        pos += len(payload)
    return out


def _put_segment(store: FileStore, name: str, payloads: list[bytes], first: int = 0) -> seg.SegmentEntry:
    """A segment of `name` in its own directory, as the worker writes it; returns its manifest entry."""
    recs = _records(payloads, first)
    data = seg.build(B, name, OCTET, recs)
    store.put(seg.segment_key(B, name, recs[0].pos, recs[-1].pos + len(recs[-1].payload)), data)
    return seg.entry(B, name, recs, data)


def _put_manifest(store: FileStore, name: str, entries: list[seg.SegmentEntry]) -> None:
    store.put(seg.manifest_key(B, name), seg.Manifest(B, name, OCTET, entries).to_json())


def _put_pack(store: FileStore, slices: list[tuple[str, list[bytes]]]) -> tuple[str, dict[str, Any]]:
    """A pack of new streams and its index, as the worker writes them; returns the pack's key and the
    index as a JSON document (for tests to damage and put back with `_put_index`)."""
    built = [packs.Slice(name, OCTET, _records(payloads)) for name, payloads in slices]
    data, placements = packs.build(B, built)
    key = packs.pack_key(B, sha256_hex(data))
    store.put(key, data)
    index = packs.PackIndex(B, key.rsplit("/", 1)[1], len(data), sha256_hex(data))
    for piece, place in zip(built, placements, strict=True):
        recs = piece.records
        index.slices.append(
            packs.IndexEntry(
                piece.stream,
                OCTET,
                format_offset(recs[0].pos),
                format_offset(recs[-1].pos + len(recs[-1].payload)),
                len(recs),
                place.group,
                place.row,
                packs.slice_digest([rec.payload for rec in recs]),
                min(rec.time for rec in recs),
                max(rec.time for rec in recs),
            )  # fmt: skip
        )
    doc = json.loads(index.to_json())
    _put_index(store, key, doc)
    return key, doc


def _put_index(store: FileStore, key: str, doc: dict[str, Any] | bytes) -> None:
    store.put(pack_index_of(key), doc if isinstance(doc, bytes) else json.dumps(doc).encode())


@dataclass
class World:
    """Stream "s": `before;` sealed and in the backup, `after;` sealed after it (manifest entry 1)."""

    h: TH
    store: FileStore
    node: Path
    index: int  # of the backup

    def manifest(self) -> seg.Manifest:
        return seg.Manifest.from_json(self.store.get(seg.manifest_key(B, "s")))

    def put_manifest_doc(self, doc: dict[str, Any]) -> None:
        self.store.put(seg.manifest_key(B, "s"), json.dumps(doc).encode())

    def after_key(self) -> str:
        return f"{seg.stream_dir(B, 's')}/{self.manifest().segments[1].path}"


WHOLE = b"before;after;"
BACKED_UP = b"before;"


@pytest.fixture()
def world(tmp_path: Path) -> World:
    h = TH()
    store = FileStore(tmp_path / "cold")
    h.create("s", body=b"before;")
    _seal(h, store, "s")
    index = _back_up(h, store, T0 + 1000)
    h.append("s", b"after;")
    _seal(h, store, "s")
    assert len(seg.Manifest.from_json(store.get(seg.manifest_key(B, "s"))).segments) == 2
    return World(h, store, tmp_path / "node", index)


# --- hostile backups -----------------------------------------------------------------------------


def _good_backup() -> tuple[dict[str, Any], bytes]:
    """A real backup's header (as a JSON document) and its inflated frames, to build hostile ones from."""
    h = TH()
    h.create("s", body=b"before;")
    _, data = backup.encode(h.kv, T0 + 1000, 1)
    (length,) = _U32.unpack_from(data, len(backup.MAGIC))
    start = len(backup.MAGIC) + 4
    return json.loads(data[start : start + length]), zlib.decompress(data[start + length :])


def _backup_bytes(header: dict[str, Any] | bytes, body: bytes) -> bytes:
    head = header if isinstance(header, bytes) else json.dumps(header).encode()
    return backup.MAGIC + _U32.pack(len(head)) + head + body


def _put_backup(store: FileStore, data: bytes, index: int) -> str:
    """Stored under a key naming its true digest: what a hostile writer does, so the digest check passes."""
    key = backup.key_for(index, hashlib.sha256(data).hexdigest())
    store.put(key, data)
    return key


def _frame(payload: bytes) -> bytes:
    return _U32.pack(len(payload)) + payload


def test_a_backup_cut_short_is_refused(tmp_path: Path) -> None:
    """A backup object cut in the middle of its compressed body (but stored under its own digest) is
    refused with BackupError: the zlib stream never reaches its end."""
    header, frames = _good_backup()
    data = _backup_bytes(header, zlib.compress(frames))
    store = FileStore(tmp_path / "cold")
    _put_backup(store, data[: len(data) - 20], header["index"])
    with pytest.raises(_CLEAN):
        restore(store, tmp_path / "node")


def test_a_refused_backup_leaves_the_data_directory_empty_for_a_retry(tmp_path: Path) -> None:
    """The newest backup is cut short; the restore refuses it. The operator then asks for the older,
    sound backup (`at_index`) into the same directory: that must work, so the refusal must not have
    left a half-loaded state store behind (RestoreError says "nothing was written")."""
    header, frames = _good_backup()
    store = FileStore(tmp_path / "cold")
    _put_backup(store, _backup_bytes(header, zlib.compress(frames)), header["index"])
    newer = dict(header, index=header["index"] + 10)
    data = _backup_bytes(newer, zlib.compress(frames))
    _put_backup(store, data[: len(data) - 20], newer["index"])
    node = tmp_path / "node"
    with pytest.raises(_CLEAN):
        restore(store, node)
    done = restore(store, node, at_index=header["index"])
    assert done.index == header["index"]


@pytest.mark.parametrize(
    "change",
    [
        {"format": 99},
        {"format": "1"},
        {"format": None},
        {"column_families": None},
        {"column_families": [1, 2, 3]},
        {"column_families": "default"},
        {"index": "7"},
        {"term": -1},
        {"term": 2**64},
        {"extra": 1},
    ],
    ids=repr,
)
def test_a_header_with_hostile_fields_is_refused(tmp_path: Path, change: dict[str, Any]) -> None:
    """A header from another format, or with fields of the wrong type or out of range (a term that is
    not a u64, an index that is a string), is refused with BackupError before anything is written;
    never a TypeError/struct.error from deep inside the restore."""
    header, frames = _good_backup()
    store = FileStore(tmp_path / "cold")
    _put_backup(store, _backup_bytes(dict(header, **change), zlib.compress(frames)), header["index"])
    assert _attempt(store, tmp_path / "node") is None
    assert not (tmp_path / "node" / "raft").exists()


@pytest.mark.parametrize(
    "head",
    [b"[]", b"null", b'"a string"', b"42", b"{not json", b"[" * 100_000, b'{"format": 1}'],
    ids=["list", "null", "string", "number", "invalid", "deeply-nested", "missing-fields"],
)
def test_a_header_that_is_not_a_header_object_is_refused(tmp_path: Path, head: bytes) -> None:
    """A header that is not a JSON object of the expected fields (including one nested deeply enough
    to exhaust the JSON parser's recursion) is refused with BackupError, not RecursionError."""
    _, frames = _good_backup()
    store = FileStore(tmp_path / "cold")
    _put_backup(store, _backup_bytes(head, zlib.compress(frames)), 5)
    assert _attempt(store, tmp_path / "node") is None


def test_a_header_whose_index_is_not_its_keys_is_refused(tmp_path: Path) -> None:
    """The key says index 5 (so `--at-index 5` picks it) but the header says 1,000,000: the backup is
    not the one its key names, and BackupError says so (the log must not start at another index)."""
    header, frames = _good_backup()
    store = FileStore(tmp_path / "cold")
    _put_backup(store, _backup_bytes(dict(header, index=1_000_000), zlib.compress(frames)), 5)
    assert _attempt(store, tmp_path / "node", at_index=5) is None


def test_a_header_index_past_u64_is_refused(tmp_path: Path) -> None:
    """Key and header both say index 2**64 (20 digits fit the key's pattern): Raft indexes are u64,
    so the restore refuses it cleanly instead of failing in struct.pack while writing the log."""
    header, frames = _good_backup()
    store = FileStore(tmp_path / "cold")
    _put_backup(store, _backup_bytes(dict(header, index=2**64), zlib.compress(frames)), 2**64)
    assert _attempt(store, tmp_path / "node") is None


def test_a_header_whose_time_is_not_a_number_is_refused_when_choosing_by_time(tmp_path: Path) -> None:
    """`--at-time` compares each header's created_at: a string there is refused with BackupError."""
    header, frames = _good_backup()
    store = FileStore(tmp_path / "cold")
    _put_backup(store, _backup_bytes(dict(header, created_at="yesterday"), zlib.compress(frames)), header["index"])
    assert _attempt(store, tmp_path / "node", at_time=T0 + 5000) is None


@pytest.mark.parametrize(
    "frame",
    [
        b"\xc1\xc1\xc1",  # never a msgpack byte
        msgspec.msgpack.encode([[0, "a string key", b"v"]]),
        msgspec.msgpack.encode({"not": "a list"}),
        msgspec.msgpack.encode([[0, b"k"]]),
        b"",
        msgspec.msgpack.encode([[99, b"k", b"v"]]),  # no such column family
        msgspec.msgpack.encode([[-1, b"k", b"v"]]),  # negative: must not wrap to the last family
        msgspec.msgpack.encode([[2**64 - 1, b"k", b"v"]]),
    ],
    ids=[
        "not-msgpack",
        "str-key",
        "map",
        "pair-of-two",
        "empty",
        "position-99",
        "position-minus-1",
        "position-2**64-1",
    ],
)
def test_a_hostile_frame_is_refused(tmp_path: Path, frame: bytes) -> None:
    """A frame that is not a msgpack list of (position, key, value), or that names a column family
    position the header does not list (99, or -1, which Python indexing would quietly turn into the
    last family), is refused with BackupError; never a msgspec error, IndexError or a silent write."""
    header, frames = _good_backup()
    store = FileStore(tmp_path / "cold")
    _put_backup(store, _backup_bytes(header, zlib.compress(frames + _frame(frame))), header["index"])
    assert _attempt(store, tmp_path / "node") is None


def test_a_stream_record_that_does_not_decode_is_refused(tmp_path: Path) -> None:
    """A well-formed frame whose STREAMS value is not a StreamMeta: refused with BackupError or
    RestoreError, not a msgspec.DecodeError while listing streams."""
    header, frames = _good_backup()
    pair = [r.COLUMN_FAMILIES.index(r.STREAMS), r.sid_key(999), b"\xc1 not a stream"]
    store = FileStore(tmp_path / "cold")
    body = frames + _frame(msgspec.msgpack.encode([pair]))
    _put_backup(store, _backup_bytes(header, zlib.compress(body)), header["index"])
    assert _attempt(store, tmp_path / "node") is None


def _zlib_bomb(prefix: bytes, megabytes: int) -> bytes:
    """A zlib stream of `prefix` and `megabytes` MiB of zeros, about 1,000 times smaller than that:
    one block compressed after a full flush repeats byte for byte, so it is built in well under a second."""
    compressor = zlib.compressobj(9)
    head = compressor.compress(prefix) + compressor.flush(zlib.Z_FULL_FLUSH)
    zeros = bytes(1 << 20)
    block = compressor.compress(zeros) + compressor.flush(zlib.Z_FULL_FLUSH)
    adler = zlib.adler32(prefix)
    for _ in range(megabytes):
        adler = zlib.adler32(zeros, adler)
    return head + block * megabytes + b"\x03\x00" + adler.to_bytes(4, "big")  # an empty final block


def test_a_zlib_bomb_is_refused_without_inflating_it(tmp_path: Path) -> None:
    """A 260 KB backup body inflating to 256 MiB: a frame claiming 2 GiB, then zeros. A restore must
    refuse a frame no writer makes (frames are about 1 MiB) or inflate a bounded piece at a time;
    either way Python-side allocations stay far below what the body inflates to (64 MiB here)."""
    header, _ = _good_backup()
    body = _zlib_bomb(_U32.pack(0x7FFFFFFF), 256)
    assert len(body) < 300_000
    store = FileStore(tmp_path / "cold")
    _put_backup(store, _backup_bytes(header, body), header["index"])
    tracemalloc.start()
    try:
        with pytest.raises(_CLEAN):
            restore(store, tmp_path / "node")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"restore allocated {peak >> 20} MiB for a {len(body) >> 10} KiB body"


def test_empty_frames_are_refused() -> None:
    """A 1 KB body inflating to 200,000 empty frames (1 MB): no writer makes an empty frame, so the
    read stops at the first one (taking frames off one by one with a copy of the rest each time
    would also have been quadratic: hours for a few MB of such frames)."""
    header, frames = _good_backup()
    body = zlib.compress(frames + _frame(msgspec.msgpack.encode([])) * 200_000, 9)
    _, decoded = backup.decode(_backup_bytes(header, body))
    with pytest.raises(backup.BackupError, match="empty"):
        for _ in decoded:
            pass


def test_a_header_claiming_huge_counts_does_not_inflate_the_report(tmp_path: Path) -> None:
    """A small backup whose header claims 2**62 streams and pairs: the restore neither allocates by
    those counts nor reports them. It refuses (counts that do not match the body) or reports the
    streams it actually restored."""
    header, frames = _good_backup()
    store = FileStore(tmp_path / "cold")
    huge = dict(header, streams=2**62, pairs=2**62, skipped_bytes=2**62)
    _put_backup(store, _backup_bytes(huge, zlib.compress(frames)), header["index"])
    done = _attempt(store, tmp_path / "node")
    if done is not None:
        with _machine(tmp_path / "node") as machine:
            assert done.streams == len(machine.streams)


# --- hostile manifests and segments --------------------------------------------------------------


def test_the_world_restores_whole(world: World) -> None:
    """The baseline the hostile variants below are compared with."""
    done = restore(world.store, world.node)
    assert done.segments_after == 1
    assert _read(world.node, world.store, "s") == WHOLE


@pytest.mark.parametrize("how", ["relative", "absolute"])
def test_a_manifest_path_out_of_the_store_is_not_followed(world: World, tmp_path: Path, how: str) -> None:
    """The after-backup entry's `path` is `../../../outside/x.parquet` (or an absolute path) naming a
    copy of the real segment outside the store's root, and the real one is gone. The restore must not
    read outside the store: the entry is skipped (the stream keeps what the backup had) or the restore
    refuses; never a ValueError("key escapes the store") traceback."""
    decoy = tmp_path / "outside" / "x.parquet"
    decoy.parent.mkdir()
    decoy.write_bytes(world.store.get(world.after_key()))
    world.store.delete(world.after_key())
    manifest = world.manifest()
    manifest.segments[1].path = "../../../outside/x.parquet" if how == "relative" else str(decoy)
    world.store.put(seg.manifest_key(B, "s"), manifest.to_json())
    done = _attempt(world.store, world.node)
    if done is not None:
        assert done.segments_after == 0
        assert _read(world.node, world.store, "s") == BACKED_UP
    _only_our_directories(tmp_path, "outside")


def test_a_manifest_path_with_a_nul_byte_is_skipped(world: World) -> None:
    """A `path` holding a NUL byte names no object: the entry is skipped (or the restore refuses),
    not a ValueError("embedded null byte") from the file system."""
    manifest = world.manifest()
    manifest.segments[1].path = "segments/\x00.parquet"
    world.store.put(seg.manifest_key(B, "s"), manifest.to_json())
    done = _attempt(world.store, world.node)
    if done is not None:
        assert done.segments_after == 0
        assert _read(world.node, world.store, "s") == BACKED_UP


def test_a_manifest_naming_another_streams_segment_does_not_replace_the_streams_records(tmp_path: Path) -> None:
    """Stream "s" holds `mine;` on local disk only (in the backup). After the backup its manifest
    (hostile) names `../other/segments/...`, the segment of stream "other" [0, 7), with that segment's
    true digest. Its rows say they are "other"'s: the restore must not record them as "s"'s (and
    must not drop "s"'s own records from the backup). Only `segments/…` or `../!packs/…` are a
    stream's."""
    h = TH()
    store = FileStore(tmp_path / "cold")
    h.create("s", body=b"mine;")
    h.create("other", body=b"theirs;")
    _seal(h, store, "other")
    _back_up(h, store, T0 + 1000)
    theirs = seg.Manifest.from_json(store.get(seg.manifest_key(B, "other"))).segments[0]
    _put_manifest(store, "s", [dataclasses.replace(theirs, path="../other/" + theirs.path)])
    node = tmp_path / "node"
    done = _attempt(store, node)
    if done is not None:
        assert _read(node, store, "s") == b"mine;"
        assert _read(node, store, "other") == b"theirs;"


def test_a_missing_segment_after_the_backup_is_skipped(world: World) -> None:
    """The manifest names a segment sealed after the backup that is not in the store (deleted, or
    never uploaded): the chain stops there and the stream keeps what the backup had; not a KeyError."""
    world.store.delete(world.after_key())
    done = _attempt(world.store, world.node)
    assert done is not None, "a missing segment is no reason to refuse the whole restore"
    assert done.segments_after == 0
    assert _read(world.node, world.store, "s") == BACKED_UP


def test_a_segment_that_is_not_parquet_but_matches_its_digest_is_skipped(world: World) -> None:
    """The after-backup segment is replaced by bytes that are not Parquet, and the (hostile) manifest
    gives their true size and SHA-256: the entry is skipped (not an ArrowInvalid traceback)."""
    junk = b"PAR1 this is not a parquet file PAR1"
    world.store.put(world.after_key(), junk)
    manifest = world.manifest()
    manifest.segments[1].bytes, manifest.segments[1].sha256 = len(junk), sha256_hex(junk)
    world.store.put(seg.manifest_key(B, "s"), manifest.to_json())
    done = _attempt(world.store, world.node)
    assert done is not None
    assert done.segments_after == 0
    assert _read(world.node, world.store, "s") == BACKED_UP


def test_a_parquet_segment_without_rill_metadata_is_skipped(world: World) -> None:
    """The after-backup segment is replaced by a Parquet file of the segments' schema and rows but
    without the `rill.first`/`rill.next` metadata (written by another tool), with a manifest giving
    its true digest: skipped, not a KeyError(b'rill.first') from segment.load."""
    import pyarrow.parquet as pq

    real = world.store.get(world.after_key())
    table = pq.read_table(io.BytesIO(real)).replace_schema_metadata(None)
    sink = io.BytesIO()
    pq.write_table(table, sink)
    foreign = sink.getvalue()
    world.store.put(world.after_key(), foreign)
    manifest = world.manifest()
    manifest.segments[1].bytes, manifest.segments[1].sha256 = len(foreign), sha256_hex(foreign)
    world.store.put(seg.manifest_key(B, "s"), manifest.to_json())
    done = _attempt(world.store, world.node)
    assert done is not None
    assert _read(world.node, world.store, "s") in (BACKED_UP, WHOLE)


def _loop_guard(monkeypatch: pytest.MonkeyPatch, limit: int = 50) -> None:
    """Fails the test, instead of hanging it, when the restore reads entries over and over."""
    real = restore_module._read_entry
    calls = [0]

    def counted(*args: Any) -> Any:
        calls[0] += 1
        assert calls[0] <= limit, f"restore read {calls[0]} entries of a one-segment manifest: it loops"
        return real(*args)

    monkeypatch.setattr(restore_module, "_read_entry", counted)


@pytest.mark.parametrize("end", ["past-the-segment", "zero-length", "backwards"])
def test_an_entry_whose_range_does_not_match_its_segment_is_skipped(
    world: World, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    """The after-backup entry starts where the segment starts (7) but its `next_offset` is not where
    the segment's records end (13): past it (1,000,000: the stream would claim bytes no one wrote),
    equal to its start (a zero-length entry: the chain would find the same entry again, forever), or
    before its start (the stream's tiered offset would go backwards). The entry is skipped: the
    stream ends where its records end, its tail and tiered offset never move back, and the restore
    terminates."""
    _loop_guard(monkeypatch)
    manifest = world.manifest()
    first = seg.offset_of(manifest.segments[1].first_offset)
    manifest.segments[1].next_offset = format_offset(
        {"past-the-segment": 1_000_000, "zero-length": first, "backwards": first - 3}[end]
    )
    world.store.put(seg.manifest_key(B, "s"), manifest.to_json())
    done = _attempt(world.store, world.node)
    if done is not None:
        with _machine(world.node) as machine:
            meta = machine.lookup(B, "s")
            assert meta is not None
            assert meta.tail in (len(BACKED_UP), len(WHOLE)) and meta.tiered >= len(BACKED_UP)
        assert _read(world.node, world.store, "s") in (BACKED_UP, WHOLE)


def test_an_entry_whose_first_offset_does_not_match_its_segment_stops_the_chain(world: World) -> None:
    """A manifest entry that claims the after-backup segment starts at 7 when the segment itself starts
    elsewhere (here: the entry of another range points at it) is not restored."""
    manifest = world.manifest()
    other = _put_segment(world.store, "s", [b"forged"], first=7)  # a different segment, same start
    manifest.segments[1] = dataclasses.replace(other, first_offset=format_offset(8))
    world.store.put(seg.manifest_key(B, "s"), manifest.to_json())
    done = _attempt(world.store, world.node)
    assert done is not None and done.segments_after == 0
    assert _read(world.node, world.store, "s") == BACKED_UP


def test_duplicate_and_overlapping_entries_restore_consistent_bytes(world: World) -> None:
    """The manifest lists the after-backup segment twice, plus an entry overlapping it that names a
    forged object: the restore ends without error, and the stream reads back as a prefix of what was
    written (the forged bytes never appear)."""
    manifest = world.manifest()
    forged = _put_segment(world.store, "s", [b"XXXXXXXXX"], first=9)
    manifest.segments += [manifest.segments[1], forged]
    world.store.put(seg.manifest_key(B, "s"), manifest.to_json())
    done = _attempt(world.store, world.node)
    assert done is not None
    assert _read(world.node, world.store, "s") in (BACKED_UP, WHOLE)


def test_a_manifest_of_50k_entries_takes_time_in_proportion(world: World) -> None:
    """A manifest listing 50,000 entries (copies of the after-backup one, and entries below the
    backup's tiered offset) is read in a few seconds: nothing is quadratic in the entry count."""
    manifest = world.manifest()
    doc = json.loads(manifest.to_json())
    doc["segments"] = [doc["segments"][0]] * 25_000 + [doc["segments"][1]] * 25_000
    world.put_manifest_doc(doc)
    done = _attempt(world.store, world.node)
    assert done is not None and _read(world.node, world.store, "s") == WHOLE


def _junk_manifests() -> list[tuple[str, Callable[[dict[str, Any]], bytes]]]:
    """(id, a function of a valid entry of stream "junk" giving a hostile manifest for "junk")."""

    def doc(**fields: Any) -> Callable[[dict[str, Any]], bytes]:
        def build(entry: dict[str, Any]) -> bytes:
            base: dict[str, Any] = {"bucket": B, "stream": "junk", "content_type": OCTET, "segments": [entry]}
            for key, value in fields.items():
                base[key] = value(entry) if callable(value) else value
            return json.dumps(base).encode()

        return build

    def entry_with(**fields: Any) -> Callable[[dict[str, Any]], list[dict[str, Any]]]:
        return lambda entry: [{**entry, **fields}]

    return [
        ("list", lambda _: b"[]"),
        ("null", lambda _: b"null"),
        ("number", lambda _: b"42"),
        ("invalid-json", lambda _: b"{not json"),
        ("deeply-nested", lambda _: b"[" * 100_000),
        ("format-99", doc(format=99)),
        ("format-string", doc(format="2")),
        ("no-segments", lambda _: json.dumps({"bucket": B, "stream": "junk", "content_type": OCTET}).encode()),
        ("segments-not-a-list", doc(segments={"a": 1})),
        ("entry-missing-fields", doc(segments=lambda e: [{"path": e["path"]}])),
        ("entry-extra-field", doc(segments=entry_with(evil=1))),
        ("offset-not-a-string", doc(segments=entry_with(first_offset=0))),
        ("offset-not-a-number", doc(segments=entry_with(first_offset="0000000000000000_00000000000000zz"))),
        ("records-a-string", doc(segments=entry_with(records="1"))),
        ("time-a-string", doc(segments=entry_with(min_append_time="yesterday", max_append_time="today"))),
        ("bytes-negative", doc(segments=entry_with(bytes=-1))),
        ("content-type-a-number", doc(content_type=5)),
        ("stream-a-number", doc(stream=5)),
        ("bucket-escaping", doc(bucket="../..")),
    ]


_JUNK = _junk_manifests()


@pytest.mark.parametrize("make", [m for _, m in _JUNK], ids=[i for i, _ in _JUNK])
def test_a_hostile_manifest_of_another_stream_is_skipped(world: World, make: Callable[[dict[str, Any]], bytes]) -> None:
    """Beside the world's stream "s", the store holds `b/junk/manifest.json` that is not a manifest
    this version can use: not a JSON object, too deeply nested, a newer format, entries with missing
    fields or wrong types or sizes, a content type, name or bucket that is not one. The manifest is
    skipped and "s" is restored whole; or the restore refuses cleanly. "junk" is either not brought
    back, or brought back exactly (its one segment, `junk;`, readable: a restored size of -1 would
    fail every read). No stream lands outside bucket "b". Never a JSONDecodeError, AttributeError,
    KeyError, TypeError or RecursionError traceback."""
    entry = dataclasses.asdict(_put_segment(world.store, "junk", [b"junk;"]))
    world.store.put(seg.manifest_key(B, "junk"), make(entry))
    done = _attempt(world.store, world.node)
    if done is not None:
        assert _read(world.node, world.store, "s") == WHOLE
        assert _read(world.node, world.store, "junk") in (None, b"junk;")
        with _machine(world.node) as machine:
            assert {m.bucket for m in machine.streams.values()} <= {B}
            assert all(isinstance(m.content_type, str) and isinstance(m.name, str) for m in machine.streams.values())


def test_a_new_stream_whose_segment_is_missing_is_not_created(world: World) -> None:
    """A manifest (unknown to the backup) names a segment that is not in the store: "ghost" is not
    brought back (at most named in `unknown_streams`), and the restore does not fail with KeyError."""
    entry = _put_segment(world.store, "ghost", [b"boo;"])
    world.store.delete(f"{seg.stream_dir(B, 'ghost')}/{entry.path}")
    _put_manifest(world.store, "ghost", [entry])
    done = _attempt(world.store, world.node)
    assert done is not None
    assert _read(world.node, world.store, "ghost") is None
    assert _read(world.node, world.store, "s") == WHOLE


def test_a_new_stream_whose_only_slice_is_forged_is_not_created_empty(world: World) -> None:
    """A pack index (written after the backup) lists stream "n" whose slice does not match its digest:
    nothing of "n" can be restored, so "n" is not created as an empty stream (an empty stream where
    data was would hide the loss; `unknown_streams` is where it belongs)."""
    key, doc = _put_pack(world.store, [("n", [b"n-data;"])])
    doc["slices"][0]["sha256"] = "0" * 64
    _put_index(world.store, key, doc)
    done = _attempt(world.store, world.node)
    assert done is not None
    assert _read(world.node, world.store, "n") is None


def test_a_stream_deleted_before_the_backup_stays_deleted_when_only_its_manifest_is_left(tmp_path: Path) -> None:
    """Stream "gone" was sealed and deleted before the backup. The worker then deleted its segment and took it
    off the deletion queue (ForgetObjects), but deleting its manifest failed: the manifest is still in
    the store and still queued in the backup. The restore must not bring "gone" back (its manifest is
    queued for deletion), and must not fail with KeyError on the missing segment."""
    h = TH()
    store = FileStore(tmp_path / "cold")
    h.create("s", body=b"kept;")
    h.create("gone", body=b"deleted;")
    _seal(h, store, "gone")
    segment_key = next(iter(h.sm.segments(h.m("gone").sid, 0, h.m("gone").tiered))).key
    h.delete("gone")
    assert segment_key in h.gc_queue() and seg.manifest_key(B, "gone") in h.gc_queue()
    store.delete(segment_key)
    h.one(ForgetObjects([segment_key]))
    _back_up(h, store, T0 + 1000)
    node = tmp_path / "node"
    done = _attempt(store, node)
    assert done is not None
    assert _read(node, store, "gone") is None
    assert _read(node, store, "s") == b"kept;"


# --- hostile pack indexes and packs --------------------------------------------------------------


def test_new_streams_come_back_from_a_pack(world: World) -> None:
    """The baseline for the pack variants: two new streams (one named with a '/') from one pack."""
    _put_pack(world.store, [("n1", [b"one;", b"two;"]), ("dir/n2", [b"three;"])])
    done = restore(world.store, world.node)
    assert done.new_streams == 2
    assert _read(world.node, world.store, "n1") == b"one;two;"
    assert _read(world.node, world.store, "dir/n2") == b"three;"


def test_an_index_path_field_is_not_followed(world: World, tmp_path: Path) -> None:
    """An index whose `path` is `../../../outside/p.parquet`: the pack read is always the one beside the
    index, so nothing outside the store is read and the stream comes back from the real pack."""
    key, doc = _put_pack(world.store, [("n1", [b"one;"])])
    doc["path"] = "../../../outside/p.parquet"
    _put_index(world.store, key, doc)
    done = _attempt(world.store, world.node)
    assert done is not None
    assert _read(world.node, world.store, "n1") == b"one;"
    _only_our_directories(tmp_path)


@pytest.mark.parametrize(
    "name",
    ["x\x00y", "../escape", "", "a//b", "./dot", "\x1b[2Jterminal", "x" * 2000],
    ids=["nul", "dotdot", "empty", "empty-segment", "dot", "escape-sequence", "2000-bytes"],
)
def test_index_stream_names_that_are_not_stream_ids_are_not_brought_back(world: World, name: str) -> None:
    """A pack (rows and index alike) naming a stream that no client could have created (a NUL or other
    control character, an empty, '.' or '..' segment, more than 1 KiB): it is not brought back as a
    stream (a NUL in particular would make its NAMES key collide with another bucket's). The valid
    stream in the same pack is restored."""
    _put_pack(world.store, [("good", [b"good;"]), (name, [b"evil;"])])
    done = _attempt(world.store, world.node)
    if done is not None:
        with _machine(world.node) as machine:
            assert machine.lookup(B, name) is None
            assert machine.lookup(B, "good") is not None


_HOSTILE_SLICE = {
    "group-minus-5": {"group": -5},
    "group-10**9": {"group": 10**9},
    "row-10**9": {"row": 10**9},
    "row-minus-1": {"row": -1},
    "records-2**40": {"records": 2**40},
    "records-minus-1": {"records": -1},
    "records-0": {"records": 0},
    "next-before-first": {"next_offset": format_offset(0)},
    "first-negative": {"first_offset": "-000000000000001"},
    "group-a-string": {"group": "0"},
    "records-a-float": {"records": 1.5},
}


@pytest.mark.parametrize("change", list(_HOSTILE_SLICE.values()), ids=list(_HOSTILE_SLICE))
def test_an_index_slice_with_hostile_numbers_is_skipped(
    world: World, monkeypatch: pytest.MonkeyPatch, change: dict[str, Any]
) -> None:
    """One slice of a pack index has a row group, row, record count or offsets that do not describe
    its rows (negative, past the pack, of the wrong type). That slice's stream ("evil") is not brought
    back; the pack's other stream ("good") is. Never a ValueError/IndexError/KeyError/ArrowInvalid.
    (group -5 would even turn the slice into an "own segment" whose object is the whole pack; a slice
    ending where it starts would be read over and over.)"""
    _loop_guard(monkeypatch)
    key, doc = _put_pack(world.store, [("good", [b"good;"]), ("evil", [b"evil-1;", b"evil-2;"])])
    doc["slices"][1].update(change)
    _put_index(world.store, key, doc)
    done = _attempt(world.store, world.node)
    if done is not None:
        assert _read(world.node, world.store, "evil") is None
        assert _read(world.node, world.store, "good") == b"good;"


def test_an_index_whose_pack_is_missing_is_skipped(world: World) -> None:
    """An index whose pack object is gone: its streams are not brought back, and not a KeyError."""
    key, _ = _put_pack(world.store, [("n1", [b"one;"])])
    world.store.delete(key)
    done = _attempt(world.store, world.node)
    assert done is not None
    assert _read(world.node, world.store, "n1") is None
    assert _read(world.node, world.store, "s") == WHOLE


def test_an_index_whose_pack_is_not_parquet_is_skipped(world: World) -> None:
    """The pack beside an index is replaced by bytes that are not Parquet: skipped, not ArrowInvalid."""
    key, _ = _put_pack(world.store, [("n1", [b"one;"])])
    world.store.put(key, b"not a parquet file at all")
    done = _attempt(world.store, world.node)
    assert done is not None
    assert _read(world.node, world.store, "n1") is None


@pytest.mark.parametrize(
    "raw",
    [
        b"[]",
        b"null",
        b"{not json",
        b"[" * 100_000,
        b"{}",
        json.dumps({"bucket": B, "path": "p", "size": 1, "sha256": "0", "slices": [], "format": 99}).encode(),
        json.dumps({"bucket": B, "path": "p", "size": 1, "sha256": "0", "slices": [], "format": "1"}).encode(),
        json.dumps({"bucket": B, "path": "p", "size": 1, "sha256": "0", "slices": [{"stream": "x"}]}).encode(),
        json.dumps({"bucket": B, "path": "p", "size": 1, "sha256": "0", "slices": "many"}).encode(),
    ],
    ids=[
        "list",
        "null",
        "invalid",
        "deeply-nested",
        "empty-object",
        "format-99",
        "format-string",
        "slice-missing-fields",
        "slices-a-string",
    ],  # fmt: skip
)
def test_an_index_that_is_not_a_pack_index_is_skipped(world: World, raw: bytes) -> None:
    """`b/!packs/<digest>.json` holds something other than a pack index this version reads: it is
    skipped and "s" restored whole, or the restore refuses cleanly. Never a traceback of another kind
    (AttributeError, KeyError, TypeError, RecursionError, or the ValueError of format 99)."""
    world.store.put(f"{B}/{packs.DIRECTORY}/{'ab' * 20}.json", raw)
    done = _attempt(world.store, world.node)
    if done is not None:
        assert _read(world.node, world.store, "s") == WHOLE


def test_a_slice_whose_rows_are_another_streams_is_not_restored_as_it(world: World) -> None:
    """The index lists stream "thief" at the group, row and digest of stream "victim"'s slice: the rows
    there say they are "victim"'s, so "thief" is not brought back with "victim"'s records."""
    key, doc = _put_pack(world.store, [("victim", [b"secret;"])])
    doc["slices"].append(dict(doc["slices"][0], stream="thief"))
    _put_index(world.store, key, doc)
    done = _attempt(world.store, world.node)
    if done is not None:
        assert _read(world.node, world.store, "thief") is None
        assert _read(world.node, world.store, "victim") == b"secret;"


def test_a_pack_replaced_at_its_key_with_a_matching_forged_index_is_not_restored(world: World) -> None:
    """A pack's key names its content (`{sha256[:40]}.parquet`) and its index records that SHA-256. The
    pack is replaced at its key by another pack holding forged records for "n1", and the index's slice
    digest is rewritten to match them (but not its key, which cannot change): the bytes at the key no
    longer hash to the name the key and the index give, so "n1" is not restored from them."""
    key, doc = _put_pack(world.store, [("n1", [b"genuine;"])])
    forged, _ = packs.build(B, [packs.Slice("n1", OCTET, _records([b"FORGED!;"]))])
    world.store.put(key, forged)
    doc["size"] = len(forged)
    doc["slices"][0]["sha256"] = packs.slice_digest([b"FORGED!;"])
    _put_index(world.store, key, doc)
    done = _attempt(world.store, world.node)
    assert done is not None
    assert _read(world.node, world.store, "n1") in (None, b"genuine;")
