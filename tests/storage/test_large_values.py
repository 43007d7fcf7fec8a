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


def test_an_overwrite_cut_short_leaves_the_old_value_whole(kv: RocksKV) -> None:
    old = os.urandom(3 * large.CHUNK + 5)
    batch = Batch()
    batch.put("data", _key(1), old)
    kv.write(batch)
    # A crash after the new value's chunks but before its pointer: the chunks of a new generation.
    large.write_chunks(kv.db, kv._chunks_handle, kv._nosync, "data", _key(1), os.urandom(3 * large.CHUNK + 5))
    assert kv.get("data", _key(1)) == old


def test_an_overwrite_deletes_the_old_generation_after_its_pointer_is_replaced(kv: RocksKV) -> None:
    for size in (3 * large.CHUNK, 2 * large.CHUNK):
        batch = Batch()
        batch.put("data", _key(1), os.urandom(size))
        kv.write(batch)
    assert len(_chunk_keys(kv)) == 2


def test_a_batch_may_not_delete_a_key_and_then_write_a_large_value_under_it(kv: RocksKV) -> None:
    batch = Batch()
    batch.delete_range("data", _key(0), _key(5))
    batch.put("data", _key(3), os.urandom(large.CHUNK + 1))
    with pytest.raises(ValueError):
        kv.write(batch)


def test_deleting_a_key_keeps_the_chunks_of_longer_keys_that_start_with_it(kv: RocksKV) -> None:
    """Keys of other lengths (a subscription's bucket, root and id) may start with the deleted one,
    and so may their chunk keys: the delete takes only the generation its own pointer names."""
    kept = os.urandom(large.CHUNK + 7)
    batch = Batch()
    batch.put("meta", b"bkt\x00orders", os.urandom(large.CHUNK + 3))
    batch.put("meta", b"bkt\x00orders-v2", kept)
    kv.write(batch)
    batch = Batch()
    batch.delete("meta", b"bkt\x00orders")
    kv.write(batch)
    assert kv.get("meta", b"bkt\x00orders") is None
    assert kv.get("meta", b"bkt\x00orders-v2") == kept
    assert [key for key, _ in kv.scan("meta", b"")] == [b"bkt\x00orders-v2"]
    assert len(_chunk_keys(kv)) == 2  # the deleted value's chunks went with it


def test_a_batch_may_delete_a_key_and_then_write_a_large_value_under_it(kv: RocksKV) -> None:
    """As MemoryKV does: a subscription deleted and made again large in one apply batch."""
    value = os.urandom(large.CHUNK + 1)
    for store in (kv, MemoryKV(CFS)):
        batch = Batch()
        batch.put("meta", b"k", os.urandom(large.CHUNK + 9))
        store.write(batch)
        batch = Batch()
        batch.delete("meta", b"k")
        batch.put("meta", b"k", value)
        store.write(batch)
        assert store.get("meta", b"k") == value


def test_a_store_from_before_chunks_opens_read_only(tmp_path: Path) -> None:
    import rocksdict

    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    path = tmp_path / "old"
    db = rocksdict.Rdict(str(path), options, column_families={"data": options, "meta": options})
    db.get_column_family("data")[_key(1)] = b"v"
    db.close()
    kv = RocksKV.__new__(RocksKV)
    kv.path, kv._column_families = path, CFS
    kv._open(read_only=True)
    assert kv.get("data", _key(1)) == b"v"
    kv.close()
