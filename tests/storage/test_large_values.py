"""app/storage/large_values.py through RocksKV: large values as chunks, read back whole or by head."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from app.storage import large_values as large
from app.storage.kv import Batch, MemoryKV
from app.storage.rocks import RocksKV

CFS = ["default", "data", "meta"]


def _key(i: int) -> bytes:
    return i.to_bytes(8, "big")


@pytest.fixture()
def kv(tmp_path: Path) -> RocksKV:
    return RocksKV(tmp_path / "db", CFS)


def _chunk_keys(kv: RocksKV) -> list[bytes]:
    return list(kv._chunks.keys())


def test_a_large_value_in_pieces_reads_back_whole_and_as_stored_chunks(kv: RocksKV) -> None:
    payload = os.urandom(3 * large.CHUNK + 123)
    batch = Batch()
    batch.put("data", _key(1), (b"head", memoryview(payload)))
    batch.put("data", _key(2), b"small")
    kv.write(batch)
    assert kv.get("data", _key(1)) == b"head" + payload
    assert [k for k, _ in kv.scan("data", b"")] == [_key(1), _key(2)]
    assert dict(kv.scan("data", b""))[_key(1)] == b"head" + payload
    assert kv.floor("data", _key(1)) == (_key(1), b"head" + payload)
    assert len(_chunk_keys(kv)) == 4  # 3 MiB + 127 bytes in 1 MiB chunks
    # The raw value under the key is only a pointer.
    assert large.is_pointer(kv._cfs["data"][_key(1)])


def test_heads_read_only_the_first_bytes(kv: RocksKV) -> None:
    batch = Batch()
    batch.put("data", _key(1), b"a" * 10 + os.urandom(2 * large.CHUNK))
    batch.put("data", _key(2), b"b" * 20)
    kv.write(batch)
    assert list(kv.scan_heads("data", b"", None, 10)) == [(_key(1), b"a" * 10), (_key(2), b"b" * 10)]
    assert list(kv.scan_heads("data", b"", _key(2), 0)) == [(_key(1), b"")]


def test_deletes_take_the_chunks_with_them(kv: RocksKV) -> None:
    batch = Batch()
    for i in range(3):
        batch.put("data", _key(i), os.urandom(large.CHUNK + 1))
    kv.write(batch)
    assert len(_chunk_keys(kv)) == 6
    batch = Batch()
    batch.delete("data", _key(0))
    kv.write(batch)
    kv.delete_range("data", _key(1), _key(3))
    assert kv.get("data", _key(1)) is None and list(kv.scan("data", b"")) == []
    assert _chunk_keys(kv) == []


def test_a_rewrite_with_fewer_chunks_reads_the_new_value(kv: RocksKV) -> None:
    for size in (3 * large.CHUNK, large.CHUNK + 5):
        batch = Batch()
        value = os.urandom(size)
        batch.put("data", _key(7), value)
        kv.write(batch)
        assert kv.get("data", _key(7)) == value


def test_chunked_values_survive_a_reopen_and_their_families_are_found_again(tmp_path: Path) -> None:
    kv = RocksKV(tmp_path / "db", CFS)
    value = os.urandom(2 * large.CHUNK + 9)
    batch = Batch()
    batch.put("data", _key(1), value)
    batch.put("meta", b"k", b"v")
    kv.write(batch, sync=True)
    kv.close()
    kv = RocksKV(tmp_path / "db", CFS)
    assert kv.get("data", _key(1)) == value
    assert kv._chunked == {"data"}
    kv.delete_range("data", _key(0), _key(9))
    assert _chunk_keys(kv) == []
    kv.close()


def test_memory_kv_joins_pieces_as_rocks_does(kv: RocksKV) -> None:
    memory = MemoryKV(CFS)
    value = (b"h", memoryview(os.urandom(large.CHUNK + 3)))
    for store in (memory, kv):
        batch = Batch()
        batch.put("data", _key(1), value)
        store.write(batch)
    assert memory.get("data", _key(1)) == kv.get("data", _key(1)) == b"h" + bytes(value[1])
    assert list(memory.scan_heads("data", b"", None, 1)) == list(kv.scan_heads("data", b"", None, 1))
