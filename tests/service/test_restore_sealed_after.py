"""What a restore takes from the segments sealed after its backup, and what it does with objects it
cannot use: a segment whose columns are of other types is skipped (the restore once aborted with a
traceback), a stream's TTL counts from its last append there, and a backup pruned while the
restore chose among them is passed over."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.service.restore import choose, restore
from app.state_machine import backup
from app.state_machine import records as r
from app.state_machine.commands import Producer
from app.state_machine.machine import StateMachine
from app.storage.rocks import RocksKV
from app.tiering import segment as seg
from app.tiering.store import FileStore
from tests.service.test_restore import _back_up, _seal
from tests.state_machine.helpers import T0, B
from tests.state_machine.tiering_helpers import TH


def _opened(node: Path) -> StateMachine:
    return StateMachine(RocksKV(node / "state", r.COLUMN_FAMILIES))


@pytest.mark.parametrize("bad", [7, "zz"], ids=["ints", "not-offsets"])
def test_a_segment_whose_next_offsets_are_not_offsets_is_skipped(tmp_path: Path, bad: object) -> None:
    h, store = TH(), FileStore(tmp_path / "cold")
    h.create("s", body=b"a;")
    _back_up(h, store, T0 + 1000)
    h.append("s", b"b;", producer=Producer("p", 0, 0))
    _seal(h, store, "s")
    # Rewritten with a bad column, and its manifest entry with it: the digests match (a hostile writer).
    manifest_key = seg.manifest_key(B, "s")
    manifest = json.loads(store.get(manifest_key))
    key = f"{seg.stream_dir(B, 's')}/{manifest['segments'][0]['path']}"
    table = pq.read_table(io.BytesIO(store.get(key)))
    at = table.schema.get_field_index("next_offset")
    column = pa.array([bad] * table.num_rows)
    table = table.set_column(at, pa.field("next_offset", column.type), column).replace_schema_metadata(
        table.schema.metadata
    )
    out = io.BytesIO()
    pq.write_table(table, out)
    store.put(key, out.getvalue())
    manifest["segments"][0].update(bytes=len(out.getvalue()), sha256=hashlib.sha256(out.getvalue()).hexdigest())
    store.put(manifest_key, json.dumps(manifest).encode())

    done = restore(store, tmp_path / "node")
    assert done.segments_after == 0  # skipped, and the restore went on
    machine = _opened(tmp_path / "node")
    try:
        meta = machine.lookup(B, "s")
        assert meta is not None and meta.tail == len(b"a;")
    finally:
        machine.kv.close()


def test_a_streams_ttl_counts_from_its_last_append_sealed_after_the_backup(tmp_path: Path) -> None:
    h, store = TH(), FileStore(tmp_path / "cold")
    h.create("s", body=b"a;", ttl=60)
    _back_up(h, store, T0 + 1000)
    h.append("s", b"b;", now=T0 + 50_000)  # acknowledged at +50 s: the stream lives until +110 s
    _seal(h, store, "s")
    restore(store, tmp_path / "node")
    machine = _opened(tmp_path / "node")
    try:
        meta = machine.lookup(B, "s")
        assert meta is not None and meta.touched_at >= T0 + 50_000
        assert not meta.expired(T0 + 70_000) and meta.expired(T0 + 111_000)
    finally:
        machine.kv.close()


def test_a_backup_pruned_while_the_restore_chooses_is_passed_over(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    h, store = TH(), FileStore(tmp_path / "cold")
    h.create("s", body=b"a;")
    older = _back_up(h, store, T0 + 1000)
    h.append("s", b"b;")
    newer = _back_up(h, store, T0 + 2000)
    newest_key = backup.key_for(newer, "")[: -len(".state")]
    real_get = store.get

    def pruned(key: str) -> bytes:
        if key.startswith(newest_key[: newest_key.index("-")]):
            raise KeyError(key)  # listed a moment ago, gone now
        return real_get(key)

    monkeypatch.setattr(store, "get", pruned)
    key, _ = choose(store)
    assert backup.parse_key(key) is not None and backup.parse_key(key)[0] == older  # type: ignore[index]
