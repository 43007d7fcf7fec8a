"""Bucket rules: create, delete (only when empty of live streams), and the built-in buckets."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import Append, Code, CreateBucket, CreateStream, DeleteBucket, DeleteStream
from app.state_machine.machine import BUILTIN_BUCKETS, COMPAT_BUCKET, LEGACY_BUCKET
from tests.state_machine.helpers import JSON, T0, TEXT, B, H, dump


def test_bucket_create_is_idempotent() -> None:
    h = H(bucket=None)
    assert h.one(CreateBucket("x")).code is Code.CREATED
    assert h.one(CreateBucket("x")).code is Code.EXISTS
    assert "x" in h.sm.buckets
    assert h.kv.get(r.BUCKETS, b"x") == r.U64.pack(T0)


def test_builtin_buckets_exist_and_cannot_be_deleted() -> None:
    h = H(bucket=None)
    for bucket in BUILTIN_BUCKETS:
        assert h.one(CreateBucket(bucket)).code is Code.EXISTS
        assert h.one(DeleteBucket(bucket)).code is Code.BUCKET_NOT_FOUND
    out = h.one(CreateStream(LEGACY_BUCKET, "s", TEXT, False))
    assert out.code is Code.CREATED
    assert h.one(Append(LEGACY_BUCKET, "s", TEXT, b"x")).code is Code.APPENDED
    assert h.one(CreateStream(COMPAT_BUCKET, "s", TEXT, False)).sid != out.sid


def test_delete_missing_bucket() -> None:
    h = H(bucket=None)
    assert h.one(DeleteBucket("nope")).code is Code.BUCKET_NOT_FOUND


def test_commands_on_a_missing_bucket() -> None:
    h = H(bucket=None)
    assert h.one(CreateStream("nope", "s", TEXT, False)).code is Code.BUCKET_NOT_FOUND
    assert h.one(Append("nope", "s", TEXT, b"x")).code is Code.BUCKET_NOT_FOUND
    assert h.one(DeleteStream("nope", "s")).code is Code.BUCKET_NOT_FOUND


def test_delete_bucket_requires_it_to_be_empty(h: H) -> None:
    h.create("s")
    out = h.one(DeleteBucket(B))
    assert out.code is Code.BUCKET_NOT_EMPTY
    assert B in h.sm.buckets
    assert h.delete("s").code is Code.DELETED
    assert h.one(DeleteBucket(B)).code is Code.DELETED
    assert B not in h.sm.buckets
    assert h.kv.get(r.BUCKETS, B.encode()) is None
    assert h.create("s").code is Code.BUCKET_NOT_FOUND
    assert h.append("s", b"x").code is Code.BUCKET_NOT_FOUND
    assert h.one(DeleteBucket(B)).code is Code.BUCKET_NOT_FOUND
    # and it can come back
    assert h.one(CreateBucket(B)).code is Code.CREATED
    assert h.create("s").code is Code.CREATED


def test_delete_bucket_ignores_streams_of_other_buckets_with_a_common_prefix(h: H) -> None:
    h.one(CreateBucket(B + "b"))
    h.one(CreateStream(B + "b", "s", TEXT, False))
    assert h.one(DeleteBucket(B)).code is Code.DELETED
    assert h.one(DeleteBucket(B + "b")).code is Code.BUCKET_NOT_EMPTY


def test_buckets_are_separate_namespaces(h: H) -> None:
    h.one(CreateBucket("other"))
    a = h.create("s", body=b"in b")
    b = h.one(CreateStream("other", "s", JSON, True))
    assert a.code is b.code is Code.CREATED and a.sid != b.sid
    assert h.text("s") == b"in b"
    assert h.sm.lookup("other", "s").json


def test_delete_bucket_collects_expired_streams(h: H) -> None:
    h.create("s", ttl=1)
    assert h.one(DeleteBucket(B), now=T0 + 999).code is Code.BUCKET_NOT_EMPTY
    assert h.one(DeleteBucket(B), now=T0 + 1000).code is Code.DELETED
    assert h.meta("s") is None
    assert dump(h.kv)[r.NAMES] == [] and dump(h.kv)[r.STREAMS] == []


def test_delete_bucket_collects_expired_stream_created_in_the_same_batch() -> None:
    """BUG: DeleteBucket only scans committed names to collect expired streams.

    The same entries applied one per batch give DELETED; applied in one batch the
    stream created by an earlier entry of the batch is not collected.
    """
    separate = H()
    assert separate.one(CreateStream(B, "s", TEXT, False, ttl=1)).code is Code.CREATED
    assert separate.one(DeleteBucket(B), now=T0 + 5000).code is Code.DELETED

    batched = H()
    entries = batched.entries(CreateStream(B, "s", TEXT, False, ttl=1))
    entries += batched.entries(DeleteBucket(B), now=T0 + 5000)
    out = batched.sm.apply(entries)
    assert [o.code for o in out] == [Code.CREATED, Code.DELETED]


def test_delete_bucket_with_soft_deleted_stream_is_not_empty(h: H) -> None:
    h.create("src", body=b"x")
    h.fork("f", "src")
    h.delete("src")
    h.delete("f")  # cascades: src goes too
    assert h.one(DeleteBucket(B)).code is Code.DELETED
    h.one(CreateBucket(B))
    h.create("src", body=b"x")
    h.fork("f", "src")
    h.delete("src")
    assert h.one(DeleteBucket(B)).code is Code.BUCKET_NOT_EMPTY
