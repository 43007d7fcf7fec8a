"""Focused unit tests of the pure state machine: `StateMachine(kv).apply(entries)`.

Everything runs on `MemoryKV` unless a test is about RocksDB. Commands are wrapped
in Raft entries the way the node does it (`encode_envelope(now, command)`), and
the `now` stamped in the envelope is the only clock the machine sees.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.domain.media import media_type
from app.raft.messages import Entry
from app.state_machine import records as r
from app.state_machine.commands import (
    Append,
    Code,
    CollectExpired,
    Command,
    CreateBucket,
    CreateStream,
    DeleteBucket,
    DeleteStream,
    Outcome,
    Producer,
    Touch,
    encode_envelope,
)
from app.state_machine.machine import BUILTIN_BUCKETS, COMPAT_BUCKET, LEGACY_BUCKET, StateMachine
from app.storage.kv import MemoryKV
from app.storage.rocks import RocksKV
from tests.state_machine.helpers import T0, B, dump

TEXT = "text/plain"
JSON = "application/json"
OCTET = "application/octet-stream"


def jrec(*values: object) -> bytes:
    """A JSON record as the protocol layer stores it: messages joined by commas."""
    return b",".join(json.dumps(v, separators=(",", ":")).encode() for v in values)


class H:
    """A state machine plus a Raft-like index counter and a clock."""

    def __init__(self, kv=None, bucket: str | None = B, now: int = T0) -> None:
        self.kv = kv if kv is not None else MemoryKV(r.COLUMN_FAMILIES)
        self.sm = StateMachine(self.kv)
        self.index = self.sm.applied_index
        self.now = now
        self.batches: list[list[Entry]] = []
        if bucket is not None:
            assert self.one(CreateBucket(bucket)).code is Code.CREATED

    # Applying

    def entries(self, *cmds: Command, now: int | None = None) -> list[Entry]:
        out = []
        for cmd in cmds:
            self.index += 1
            out.append(Entry(1, self.index, encode_envelope(self.now if now is None else now, cmd)))
        return out

    def batch(self, *cmds: Command, now: int | None = None) -> list[Outcome]:
        entries = self.entries(*cmds, now=now)
        self.batches.append(entries)
        return self.sm.apply(entries)

    def one(self, cmd: Command, now: int | None = None) -> Outcome:
        return self.batch(cmd, now=now)[0]

    # Command shortcuts

    def create(self, name: str, ct: str = TEXT, body: bytes = b"", now: int | None = None, **kw) -> Outcome:
        return self.one(CreateStream(B, name, ct, media_type(ct) == JSON, body=body, **kw), now)

    def fork(
        self,
        name: str,
        source: str,
        offset: int | None = None,
        sub: int = 0,
        ct: str | None = None,
        now: int | None = None,
        **kw,
    ) -> Outcome:
        cmd = CreateStream(
            B,
            name,
            ct or OCTET,
            media_type(ct or OCTET) == JSON,
            fork_stream=source,
            fork_offset=offset,
            fork_sub=sub,
            content_type_given=ct is not None,
            **kw,
        )
        return self.one(cmd, now)

    def append(self, name: str, body: bytes, ct: str | None = TEXT, now: int | None = None, **kw) -> Outcome:
        return self.one(Append(B, name, ct, body, **kw), now)

    def close(self, name: str, producer: Producer | None = None, ct: str | None = None) -> Outcome:
        return self.one(Append(B, name, ct, b"", producer=producer, close=True))

    def delete(self, name: str) -> Outcome:
        return self.one(DeleteStream(B, name))

    # Reading

    def meta(self, name: str) -> r.StreamMeta | None:
        return self.sm.lookup(B, name)

    def parts(self, name: str, start: int = 0, max_bytes: int = 1 << 20) -> list[bytes]:
        meta = self.meta(name)
        assert meta is not None, name
        pos, parts = start, []
        while True:
            chunk = self.sm.read(meta, pos, max_bytes)
            parts += [bytes(p) for p in chunk.payloads]
            if chunk.next_pos >= meta.tail:
                assert chunk.next_pos == meta.tail
                return parts
            assert chunk.next_pos > pos, "a read must make progress"
            pos = chunk.next_pos

    def text(self, name: str, start: int = 0, max_bytes: int = 1 << 20) -> bytes:
        return b"".join(self.parts(name, start, max_bytes))

    def json(self, name: str, start: int = 0, max_bytes: int = 1 << 20) -> list:
        return json.loads(b"[" + b",".join(self.parts(name, start, max_bytes)) + b"]")


def P(epoch: int, seq: int, pid: str = "p") -> Producer:
    return Producer(pid, epoch, seq)


@pytest.fixture()
def h() -> H:
    return H()


# Apply basics


def test_apply_returns_one_outcome_per_entry_and_none_for_noop_entries(h: H) -> None:
    entries = h.entries(CreateStream(B, "s", TEXT, False))
    noop = Entry(1, h.index + 1, b"")
    h.index += 1
    more = h.entries(Append(B, "s", TEXT, b"x"))
    out = h.sm.apply([*entries, noop, *more])
    assert [o.code if o else None for o in out] == [Code.CREATED, None, Code.APPENDED]
    assert h.sm.applied_index == more[-1].index
    assert r.decode_applied(h.kv.get(r.SM_META, r.APPLIED_KEY)) == (more[-1].index, more[-1].term)


def test_noop_only_batch_advances_applied_index(h: H) -> None:
    h.index += 1
    assert h.sm.apply([Entry(2, h.index, b"")]) == [None]
    assert h.sm.applied_index == h.index
    assert r.decode_applied(h.kv.get(r.SM_META, r.APPLIED_KEY)) == (h.index, 2)


def test_sids_are_never_reused(h: H) -> None:
    a = h.create("s").sid
    h.delete("s")
    b = h.create("s").sid
    assert b > a
    assert r.U64.unpack(h.kv.get(r.SM_META, r.NEXT_SID_KEY))[0] == b + 1


# Buckets


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


# Stream create


def test_create_stream(h: H) -> None:
    out = h.create("s")
    assert out.code is Code.CREATED and out.sid > 0 and out.next_pos == 0 and not out.closed
    meta = h.meta("s")
    assert (meta.content_type, meta.json, meta.created_at, meta.tail, meta.closed) == (TEXT, False, T0, 0, False)
    assert h.text("s") == b""
    assert h.kv.get(r.NAMES, r.name_key(B, "s")) == r.sid_key(out.sid)
    assert r.decode_meta(h.kv.get(r.STREAMS, r.sid_key(out.sid))) == meta


def test_create_with_body(h: H) -> None:
    out = h.create("s", body=b"hello")
    assert out.code is Code.CREATED and out.next_pos > 0
    assert h.text("s") == b"hello"
    out = h.create("j", JSON, body=jrec({"a": 1}, [1, 2], "x,y"))
    assert out.code is Code.CREATED
    assert h.json("j") == [{"a": 1}, [1, 2], "x,y"]


def test_create_is_idempotent(h: H) -> None:
    first = h.create("s", ttl=60)
    a = h.append("s", b"abc")
    again = h.create("s", ttl=60)
    assert again.code is Code.EXISTS
    assert again.sid == first.sid and again.next_pos == a.next_pos and not again.closed


def test_idempotent_create_does_not_append_its_body(h: H) -> None:
    h.create("s", body=b"one")
    assert h.create("s", body=b"one").code is Code.EXISTS
    assert h.text("s") == b"one"


def test_create_compares_normalised_content_types(h: H) -> None:
    h.create("s", "application/json")
    assert h.create("s", "APPLICATION/JSON").code is Code.EXISTS
    assert h.create("s", "application/json; charset=utf-8").code is Code.EXISTS
    assert h.meta("s").content_type == "application/json"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"ct": TEXT}, {"ct": JSON}),
        ({"ttl": 3600}, {"ttl": 7200}),
        ({"ttl": 3600}, {}),
        ({}, {"ttl": 3600}),
        ({"expires_at": T0 + 10_000}, {"expires_at": T0 + 20_000}),
        ({"expires_at": T0 + 10_000}, {"ttl": 10}),
        ({"closed": True}, {}),
        ({}, {"closed": True}),
    ],
)
def test_create_with_a_different_config_conflicts(h: H, first: dict, second: dict) -> None:
    assert h.create("s", **first).code is Code.CREATED
    assert h.create("s", **second).code is Code.CONFIG_MISMATCH
    assert h.create("s", **first).code is Code.EXISTS


def test_create_closed_and_idempotency_follows_the_closed_status(h: H) -> None:
    out = h.create("s", body=b"initial content", closed=True)
    assert out.code is Code.CREATED and out.closed and out.next_pos == len(b"initial content")
    assert h.text("s") == b"initial content"
    assert h.create("s", closed=True).code is Code.EXISTS
    assert h.create("s").code is Code.CONFIG_MISMATCH
    # A stream closed by an append now has closed status too.
    h.create("t")
    h.close("t")
    assert h.create("t").code is Code.CONFIG_MISMATCH
    again = h.create("t", closed=True)
    assert again.code is Code.EXISTS and again.closed


def test_plain_create_over_a_fork_conflicts(h: H) -> None:
    h.create("src", body=b"x")
    h.fork("f", "src", ct=TEXT)
    assert h.create("f").code is Code.CONFIG_MISMATCH


# Append


def test_append_and_read(h: H) -> None:
    h.create("s")
    a = h.append("s", b"first ")
    b = h.append("s", b"second")
    assert a.code is b.code is Code.APPENDED
    assert 0 < a.next_pos < b.next_pos == h.meta("s").tail
    assert h.text("s") == b"first second"
    assert h.text("s", a.next_pos) == b"second"
    assert h.text("s", b.next_pos) == b""


def test_append_binary_bytes_round_trip(h: H) -> None:
    h.create("s", OCTET)
    body = bytes(range(256))
    h.append("s", body, OCTET)
    assert h.text("s") == body


def test_append_to_missing_stream(h: H) -> None:
    assert h.append("nope", b"x").code is Code.NOT_FOUND
    assert h.close("nope").code is Code.NOT_FOUND
    assert h.append("nope", b"x", producer=P(0, 0)).code is Code.NOT_FOUND


def test_append_content_type_must_match(h: H) -> None:
    h.create("s")
    out = h.append("s", b"{}", JSON)
    assert out.code is Code.CONTENT_TYPE_MISMATCH and out.next_pos == 0
    assert h.text("s") == b""
    assert h.append("s", b"A", "TEXT/PLAIN").code is Code.APPENDED
    assert h.append("s", b"B", "text/plain; charset=utf-8").code is Code.APPENDED
    assert h.append("s", b"C", None).code is Code.APPENDED
    assert h.text("s") == b"ABC"


def test_stream_seq_must_strictly_increase(h: H) -> None:
    h.create("s")
    assert h.append("s", b"1", stream_seq="001").code is Code.APPENDED
    assert h.append("s", b"2", stream_seq="002").code is Code.APPENDED
    out = h.append("s", b"x", stream_seq="001")
    assert out.code is Code.SEQ_CONFLICT and out.next_pos == h.meta("s").tail
    assert h.append("s", b"x", stream_seq="002").code is Code.SEQ_CONFLICT
    assert h.text("s") == b"12"


def test_stream_seq_examples_from_the_spec(h: H) -> None:
    h.create("a")
    assert h.append("a", b"x", stream_seq="2").code is Code.APPENDED
    assert h.append("a", b"x", stream_seq="10").code is Code.SEQ_CONFLICT
    h.create("b")
    assert h.append("b", b"x", stream_seq="09").code is Code.APPENDED
    assert h.append("b", b"x", stream_seq="10").code is Code.APPENDED
    h.create("c")
    assert h.append("c", b"x", stream_seq="a").code is Code.APPENDED
    assert h.append("c", b"x", stream_seq="B").code is Code.SEQ_CONFLICT
    # A rejected seq does not move the high-water mark; an unsequenced append does not either.
    assert h.append("c", b"y").code is Code.APPENDED
    assert h.append("c", b"x", stream_seq="a").code is Code.SEQ_CONFLICT
    assert h.append("c", b"z", stream_seq="b").code is Code.APPENDED
    assert h.meta("c").stream_seq == "b"
    assert h.text("c") == b"xyz"


def test_append_and_close_is_atomic(h: H) -> None:
    h.create("s")
    h.append("s", b"first message")
    out = h.append("s", b"final message", close=True)
    assert out.code is Code.APPENDED and out.closed
    assert h.text("s") == b"first messagefinal message"
    assert h.meta("s").closed


def test_appending_to_a_closed_stream_is_rejected(h: H) -> None:
    h.create("s", body=b"data")
    closed = h.close("s")
    assert closed.code is Code.APPENDED and closed.closed and closed.next_pos == 4
    for kw in ({}, {"close": True}, {"stream_seq": "z"}):
        out = h.append("s", b"should fail", **kw)
        assert out.code is Code.STREAM_CLOSED
        assert out.closed and out.next_pos == closed.next_pos
    assert h.text("s") == b"data"
    assert h.meta("s").stream_seq is None


def test_close_only_is_idempotent_and_does_not_move_the_tail(h: H) -> None:
    h.create("s", body=b"abc")
    first = h.close("s")
    second = h.close("s")
    third = h.close("s", ct=JSON)  # close-only ignores the content type
    for out in (first, second, third):
        assert out.code is Code.APPENDED and out.closed and out.next_pos == 3
    assert h.text("s") == b"abc"


def test_close_only_ignores_content_type(h: H) -> None:
    h.create("j", JSON)
    out = h.close("j", ct=TEXT)
    assert out.code is Code.APPENDED and out.closed


# Producers


def test_producer_accept_and_echo(h: H) -> None:
    h.create("s")
    out = h.append("s", b"a", producer=P(0, 0))
    assert out.code is Code.APPENDED and out.fresh_producer
    assert (out.producer_epoch, out.producer_seq) == (0, 0)
    out = h.append("s", b"b", producer=P(0, 1))
    assert out.code is Code.APPENDED and out.fresh_producer and out.producer_seq == 1
    assert h.text("s") == b"ab"
    state = r.decode_producer(h.kv.get(r.PRODUCERS, r.producer_key(out.sid, "p")))
    assert state == r.ProducerState(0, 1, out.next_pos)


@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_unknown_producer_starts_at_seq_zero_in_any_epoch(h: H, epoch: int) -> None:
    h.create("s")
    out = h.append("s", b"a", producer=P(epoch, 0))
    assert out.code is Code.APPENDED and out.producer_epoch == epoch


def test_producer_duplicate_returns_original_position_and_last_seq(h: H) -> None:
    h.create("s")
    h.append("s", b"first", producer=P(0, 0))
    second = h.append("s", b"second", producer=P(0, 1))
    h.append("s", b"other writer")  # moves the tail
    dup = h.append("s", b"second", producer=P(0, 1))
    assert dup.code is Code.DUPLICATE and not dup.fresh_producer
    assert dup.next_pos == second.next_pos != h.meta("s").tail
    assert (dup.producer_epoch, dup.producer_seq) == (0, 1)
    older = h.append("s", b"first", producer=P(0, 0))
    assert older.code is Code.DUPLICATE and older.producer_seq == 1
    assert h.text("s") == b"firstsecondother writer"
    nxt = h.append("s", b"third", producer=P(0, 2))
    assert nxt.code is Code.APPENDED
    assert h.text("s") == b"firstsecondother writerthird"


def test_producer_dedup_compares_the_tuple_not_the_body(h: H) -> None:
    h.create("s")
    assert h.append("s", b"body-A", producer=P(0, 0)).code is Code.APPENDED
    assert h.append("s", b"body-B", producer=P(0, 0)).code is Code.DUPLICATE
    assert h.text("s") == b"body-A"


def test_producer_stale_epoch(h: H) -> None:
    h.create("s")
    h.append("s", b"a", producer=P(0, 0))
    h.append("s", b"b", producer=P(1, 0))
    out = h.append("s", b"c", producer=P(0, 1))
    assert out.code is Code.STALE_EPOCH and out.producer_epoch == 1
    h.append("s", b"d", producer=P(2, 0))
    assert h.append("s", b"e", producer=P(1, 1)).code is Code.STALE_EPOCH
    assert h.text("s") == b"abd"


def test_producer_gap(h: H) -> None:
    h.create("s")
    h.append("s", b"a", producer=P(0, 0))
    out = h.append("s", b"c", producer=P(0, 2))
    assert out.code is Code.SEQ_GAP
    assert (out.expected_seq, out.received_seq) == (1, 2)
    fresh = h.append("s", b"x", producer=P(0, 3, "q"))
    assert fresh.code is Code.SEQ_GAP and (fresh.expected_seq, fresh.received_seq) == (0, 3)
    assert h.text("s") == b"a"


def test_producer_epoch_bump(h: H) -> None:
    h.create("s")
    h.append("s", b"a", producer=P(0, 0))
    h.append("s", b"b", producer=P(0, 1))
    assert h.append("s", b"x", producer=P(1, 5)).code is Code.BAD_EPOCH_SEQ
    bump = h.append("s", b"c", producer=P(1, 0))
    assert bump.code is Code.APPENDED and bump.producer_epoch == 1 and bump.producer_seq == 0
    assert h.append("s", b"d", producer=P(1, 1)).code is Code.APPENDED
    assert h.append("s", b"d", producer=P(1, 1)).code is Code.DUPLICATE
    assert h.text("s") == b"abcd"


def test_producers_are_independent_of_each_other_and_of_stream_seq(h: H) -> None:
    h.create("s")
    assert h.append("s", b"A0", producer=P(0, 0, "A"), stream_seq="1").code is Code.APPENDED
    assert h.append("s", b"B0", producer=P(0, 0, "B"), stream_seq="2").code is Code.APPENDED
    # Duplicate wins over the Stream-Seq check.
    assert h.append("s", b"A0", producer=P(0, 0, "A"), stream_seq="1").code is Code.DUPLICATE
    assert h.append("s", b"A1", producer=P(0, 1, "A"), stream_seq="3").code is Code.APPENDED
    # A rejected Stream-Seq does not consume the producer seq.
    assert h.append("s", b"B1", producer=P(0, 1, "B"), stream_seq="0").code is Code.SEQ_CONFLICT
    assert h.append("s", b"B1", producer=P(0, 1, "B"), stream_seq="4").code is Code.APPENDED
    assert h.text("s") == b"A0B0A1B1"


def test_rejected_producer_append_does_not_consume_the_seq(h: H) -> None:
    h.create("s")
    assert h.append("s", b"{}", JSON, producer=P(0, 0)).code is Code.CONTENT_TYPE_MISMATCH
    assert h.append("s", b"ok", producer=P(0, 0)).code is Code.APPENDED


def test_producer_close(h: H) -> None:
    h.create("s")
    h.append("s", b"a", producer=P(0, 0))
    out = h.close("s", producer=P(0, 1))
    assert out.code is Code.APPENDED and out.closed and not out.fresh_producer
    assert (out.producer_epoch, out.producer_seq) == (0, 1)
    dup = h.close("s", producer=P(0, 1))
    assert dup.code is Code.DUPLICATE and dup.closed
    assert h.append("s", b"late", producer=P(0, 2)).code is Code.STREAM_CLOSED
    assert h.append("s", b"other", producer=P(0, 0, "q"), close=True).code is Code.STREAM_CLOSED
    assert h.text("s") == b"a"


def test_producer_close_only_on_a_closed_stream_consumes_the_seq(h: H) -> None:
    """BUG: an accepted producer close-only on an already-closed stream is not recorded.

    The machine answers (0,1) with 204-style APPENDED echoing seq 1, but keeps the producer
    at seq 0, so a retry of (0,1) is accepted again instead of being a duplicate, and the
    next request (0,2) is rejected as a gap that expects seq 1 — which it just acknowledged.
    """
    h.create("s")
    assert h.close("s", producer=P(0, 0)).code is Code.APPENDED
    out = h.close("s", producer=P(0, 1))
    assert out.code is Code.APPENDED and out.closed and (out.producer_epoch, out.producer_seq) == (0, 1)
    retry = h.close("s", producer=P(0, 1))
    assert retry.code is Code.DUPLICATE and retry.producer_seq == 1
    nxt = h.close("s", producer=P(0, 2))
    assert nxt.code is Code.APPENDED, nxt


def test_producer_close_only_on_a_fresh_stream(h: H) -> None:
    h.create("s")
    out = h.close("s", producer=P(0, 0))
    assert out.code is Code.APPENDED and out.closed and not out.fresh_producer


def test_producer_append_and_close_then_duplicate(h: H) -> None:
    h.create("s")
    out = h.append("s", b"final message", producer=P(0, 0), close=True)
    assert out.code is Code.APPENDED and out.fresh_producer and out.closed
    dup = h.append("s", b"final message", producer=P(0, 0), close=True)
    assert dup.code is Code.DUPLICATE and dup.closed and dup.next_pos == out.next_pos
    assert h.append("s", b"more", producer=P(0, 1), close=True).code is Code.STREAM_CLOSED
    assert h.text("s") == b"final message"


def test_stale_epoch_after_close(h: H) -> None:
    h.create("s")
    h.append("s", b"a", producer=P(0, 0))
    h.append("s", b"final", producer=P(1, 0), close=True)
    assert h.append("s", b"x", producer=P(0, 1), close=True).code is Code.STALE_EPOCH


def test_producer_state_is_visible_within_one_batch(h: H) -> None:
    """BUG: producer state is read from the committed KV only, not from the batch being applied.

    Two appends of one producer committed in the same apply batch must behave as when
    applied one by one: (0,0) then (0,1) are both accepted, a retry of (0,0) is a duplicate.
    """
    h.create("s")
    out = h.batch(
        Append(B, "s", TEXT, b"a", producer=P(0, 0)),
        Append(B, "s", TEXT, b"b", producer=P(0, 1)),
        Append(B, "s", TEXT, b"a", producer=P(0, 0)),
    )
    assert [o.code for o in out] == [Code.APPENDED, Code.APPENDED, Code.DUPLICATE]
    assert h.text("s") == b"ab"


# Delete


def test_delete_stream(h: H) -> None:
    sid = h.create("s", body=b"abc").sid
    h.append("s", b"d", producer=P(0, 0), stream_seq="5")
    out = h.delete("s")
    assert out.code is Code.DELETED and out.sid == sid
    assert h.meta("s") is None
    assert h.append("s", b"x").code is Code.NOT_FOUND
    assert h.delete("s").code is Code.NOT_FOUND
    kv = dump(h.kv)
    assert kv[r.NAMES] == kv[r.STREAMS] == kv[r.DATA] == kv[r.PRODUCERS] == []


def test_recreate_after_delete_is_fresh(h: H) -> None:
    old = h.create("s", body=b"old")
    h.append("s", b"x", producer=P(0, 0), stream_seq="9")
    h.delete("s")
    new = h.create("s", JSON)
    assert new.code is Code.CREATED and new.sid != old.sid and new.next_pos == 0
    assert h.json("s") == []
    assert h.append("s", b"1", JSON, producer=P(0, 0), stream_seq="1").code is Code.APPENDED
    assert h.json("s") == [1]


def test_hard_delete_in_the_same_batch_leaves_no_records() -> None:
    """BUG: a hard delete's range deletions run before the batch's puts.

    `Batch.ranges` are applied before `Batch.ops`, so records and producer state written
    earlier in the same apply batch survive the delete_range and leak into the KV.
    """
    h = H()
    h.batch(
        CreateStream(B, "s", TEXT, False, body=b"abc"),
        Append(B, "s", TEXT, b"d", producer=P(0, 0)),
        DeleteStream(B, "s"),
    )
    kv = dump(h.kv)
    assert kv[r.DATA] == []
    assert kv[r.PRODUCERS] == []


def test_delete_then_recreate_in_one_batch(h: H) -> None:
    h.create("s", body=b"old")
    out = h.batch(DeleteStream(B, "s"), CreateStream(B, "s", TEXT, False, body=b"new"))
    assert [o.code for o in out] == [Code.DELETED, Code.CREATED]
    assert h.text("s") == b"new"


# TTL / expiry


def test_sliding_ttl_expiry_uses_the_envelope_time(h: H) -> None:
    h.create("s", ttl=2)
    assert h.append("s", b"a", now=T0 + 1999).code is Code.APPENDED  # renews to T0+3999
    assert h.append("s", b"b", now=T0 + 3998).code is Code.APPENDED  # renews to T0+5998
    assert h.meta("s").touched_at == T0 + 3998
    assert h.append("s", b"c", now=T0 + 5998).code is Code.NOT_FOUND
    assert h.meta("s") is None


@pytest.mark.parametrize("cmd", ["append", "close", "delete", "producer"])
def test_expired_stream_is_absent(h: H, cmd: str) -> None:
    h.create("s", ttl=1, body=b"old")
    h.now = T0 + 1000
    if cmd == "append":
        out = h.append("s", b"x")
    elif cmd == "close":
        out = h.close("s")
    elif cmd == "producer":
        out = h.append("s", b"x", producer=P(0, 0))
    else:
        out = h.delete("s")
    assert out.code is Code.NOT_FOUND
    assert h.meta("s") is None
    kv = dump(h.kv)
    assert kv[r.DATA] == [] and kv[r.STREAMS] == [] and kv[r.NAMES] == []


def test_expired_stream_can_be_recreated_with_any_config(h: H) -> None:
    old = h.create("s", ttl=1, body=b"old")
    h.append("s", b"x", producer=P(0, 0))
    new = h.create("s", JSON, now=T0 + 1000)
    assert new.code is Code.CREATED and new.sid != old.sid
    assert h.json("s") == []
    assert h.meta("s").ttl is None
    assert h.append("s", b"1", JSON, producer=P(0, 0)).code is Code.APPENDED  # no producer state left


def test_expires_at_is_absolute(h: H) -> None:
    h.create("s", expires_at=T0 + 3000)
    assert h.append("s", b"a", now=T0 + 2999).code is Code.APPENDED
    assert h.one(Touch(B, "s"), now=T0 + 2999).code is Code.OK
    assert h.append("s", b"b", now=T0 + 3000).code is Code.NOT_FOUND


def test_touch_renews_sliding_ttl(h: H) -> None:
    h.create("s", ttl=2)
    assert h.one(Touch(B, "s"), now=T0 + 1500).code is Code.OK
    assert h.append("s", b"a", now=T0 + 3000).code is Code.APPENDED
    assert h.one(Touch(B, "s"), now=T0 + 5000).code is Code.NOT_FOUND
    assert h.one(Touch(B, "nope")).code is Code.NOT_FOUND


def test_touched_in_command_counts_for_expiry(h: H) -> None:
    h.create("s", ttl=1)
    out = h.one(Append(B, "s", TEXT, b"a", touched=T0 + 900), now=T0 + 1500)
    assert out.code is Code.APPENDED


def test_close_only_renews_ttl(h: H) -> None:
    h.create("s", ttl=2)
    assert h.one(Append(B, "s", None, b"", close=True), now=T0 + 1500).code is Code.APPENDED
    assert h.meta("s").touched_at == T0 + 1500
    assert h.one(Touch(B, "s"), now=T0 + 3000).code is Code.OK


def test_producer_close_only_renews_ttl(h: H) -> None:
    h.create("s", ttl=2)
    out = h.one(Append(B, "s", None, b"", producer=P(0, 0), close=True), now=T0 + 1500)
    assert out.code is Code.APPENDED
    assert h.one(Touch(B, "s"), now=T0 + 3000).code is Code.OK


def test_collect_expired(h: H) -> None:
    a = h.create("a", ttl=1).sid
    b = h.create("b", ttl=10).sid
    c = h.create("c").sid
    assert h.one(CollectExpired([a, b, c, 999]), now=T0 + 5000).code is Code.OK
    assert h.meta("a") is None
    assert h.meta("b") is not None and h.meta("c") is not None


def test_expired_stream_does_not_block_its_name(h: H) -> None:
    old = h.create("a", ttl=1, body=b"x")
    h.create("b", now=T0 + 5000)
    new = h.create("a", now=T0 + 5000)
    assert new.code is Code.CREATED and new.sid != old.sid
    assert h.text("a") == b""


# Forks


def test_fork_sees_the_prefix_up_to_its_offset(h: H) -> None:
    offsets = [0]
    offsets.append(h.create("src", body=b"A").next_pos)
    offsets.append(h.append("src", b"B").next_pos)
    offsets.append(h.append("src", b"C").next_pos)
    for i, off in enumerate(offsets):
        out = h.fork(f"f{i}", "src", off)
        assert out.code is Code.CREATED and out.next_pos == off
        assert h.text(f"f{i}") == b"ABC"[:i]
        assert h.meta(f"f{i}").content_type == TEXT
    out = h.fork("head", "src")
    assert out.code is Code.CREATED and out.next_pos == offsets[-1]
    assert h.text("head") == b"ABC"
    assert h.meta("src").forks == 5


def test_fork_and_source_are_independent(h: H) -> None:
    tail = h.create("src", body=b"initial").next_pos
    h.fork("f", "src")
    h.append("src", b" extra")
    h.append("f", b" fork")
    assert h.text("src") == b"initial extra"
    assert h.text("f") == b"initial fork"
    assert h.text("f", tail) == b" fork"
    assert h.text("src", tail) == b" extra"


def test_fork_of_closed_source_starts_open(h: H) -> None:
    h.create("src", body=b"x", closed=True)
    out = h.fork("f", "src")
    assert out.code is Code.CREATED and not out.closed
    assert h.append("f", b"y").code is Code.APPENDED
    assert h.text("f") == b"xy"
    h.create("s2")
    h.fork("f2", "s2")
    h.close("s2")
    assert not h.meta("f2").closed
    assert h.append("f2", b"z").code is Code.APPENDED
    h.close("f2")
    h.create("s3")
    h.fork("f3", "s3")
    assert h.close("f3").closed and not h.meta("s3").closed


def test_fork_content_type(h: H) -> None:
    h.create("src", JSON, body=jrec(1))
    out = h.fork("inherit", "src")
    assert out.code is Code.CREATED
    meta = h.meta("inherit")
    assert meta.content_type == JSON and meta.json
    assert h.fork("explicit", "src", ct="application/json; charset=utf-8").code is Code.CREATED
    assert h.fork("bad", "src", ct=TEXT).code is Code.CONTENT_TYPE_MISMATCH
    assert h.meta("bad") is None
    assert h.meta("src").forks == 2


def test_rejected_fork_keeps_no_reference(h: H) -> None:
    h.create("src", body=b"hi")
    assert h.fork("f", "src", ct=JSON).code is Code.CONTENT_TYPE_MISMATCH
    assert h.fork("f", "src", offset=10**9).code is Code.BAD_FORK_OFFSET
    assert h.fork("f", "src", sub=99).code is Code.BAD_SUB_OFFSET
    h.create("taken", JSON)
    assert h.fork("taken", "src").code is Code.CONFIG_MISMATCH
    assert h.meta("src").forks == 0
    assert h.delete("src").code is Code.DELETED
    assert h.meta("src") is None


def test_fork_errors(h: H) -> None:
    assert h.fork("f", "missing").code is Code.NOT_FOUND
    first = h.create("src", body=b"first").next_pos
    h.append("src", b"second")
    assert h.fork("f", "src", offset=h.meta("src").tail + 1).code is Code.BAD_FORK_OFFSET
    assert h.fork("f", "src", offset=first - 2).code is Code.BAD_FORK_OFFSET  # inside a record
    assert h.fork("f", "src", offset=first + 1).code is Code.BAD_FORK_OFFSET
    assert h.meta("f") is None


def test_fork_sub_offset_bytes(h: H) -> None:
    h.create("src", body=b"hello")
    out = h.fork("f3", "src", 0, sub=3)
    assert out.code is Code.CREATED and out.next_pos > 0
    assert h.text("f3") == b"hel"
    assert h.text("f3", out.next_pos) == b""
    assert h.fork("f5", "src", 0, sub=5).code is Code.CREATED
    assert h.text("f5") == b"hello"
    assert h.fork("f6", "src", 0, sub=6).code is Code.BAD_SUB_OFFSET
    assert h.fork("tail", "src", sub=1).code is Code.BAD_SUB_OFFSET
    h.append("f3", b"LO")
    assert h.text("f3") == b"helLO"
    h.create("empty")
    assert h.fork("fe", "empty", 0, sub=1).code is Code.BAD_SUB_OFFSET


def test_fork_sub_offset_mid_stream(h: H) -> None:
    first = h.create("src", body=b"first").next_pos
    h.append("src", b"second")
    out = h.fork("f", "src", first, sub=3)
    assert out.code is Code.CREATED
    assert h.text("f") == b"firstsec"
    assert h.text("f", first) == b"sec"


def test_fork_sub_offset_json(h: H) -> None:
    h.create("src", JSON, body=jrec({"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}))
    assert h.fork("f2", "src", 0, sub=2).code is Code.CREATED
    assert h.json("f2") == [{"a": 1}, {"b": 2}]
    assert h.meta("f2").content_type == JSON
    assert h.fork("f4", "src", 0, sub=4).code is Code.CREATED
    assert h.json("f4") == [{"a": 1}, {"b": 2}, {"c": 3}, {"d": 4}]
    assert h.fork("f5", "src", 0, sub=5).code is Code.BAD_SUB_OFFSET
    h.append("f2", jrec({"i": 99}), JSON)
    assert h.json("f2") == [{"a": 1}, {"b": 2}, {"i": 99}]


def test_fork_sub_offset_json_with_commas_inside_messages(h: H) -> None:
    h.create("src", JSON, body=jrec("a,b", [1, 2], {"x": "y,z"}))
    assert h.fork("f", "src", 0, sub=2).code is Code.CREATED
    assert h.json("f") == ["a,b", [1, 2]]


def test_fork_with_body_follows_the_prefix(h: H) -> None:
    h.create("src", body=b"hello")
    out = h.fork("f", "src", 0, sub=3, body=b"XY")
    assert out.code is Code.CREATED
    assert h.text("f") == b"helXY"
    h.create("j", JSON, body=jrec(1, 2, 3))
    h.fork("jf", "j", 0, sub=1, body=jrec(9))
    assert h.json("jf") == [1, 9]


def test_sub_offsets_compose(h: H) -> None:
    h.create("l0", body=b"abcdef")
    h.fork("l1", "l0", 0, sub=4)
    assert h.text("l1") == b"abcd"
    h.fork("l2", "l1", 0, sub=2)
    h.append("l2", b"Z")
    assert h.text("l2") == b"abZ"
    assert h.fork("l3", "l1", 0, sub=5).code is Code.BAD_SUB_OFFSET


def test_fork_create_is_idempotent(h: H) -> None:
    h.create("src", body=b"hello")
    first = h.fork("f", "src")
    again = h.fork("f", "src")
    assert again.code is Code.EXISTS and again.sid == first.sid
    h.fork("s2", "src", 0, sub=2)
    assert h.fork("s2", "src", 0, sub=2).code is Code.EXISTS
    assert h.fork("s2", "src", 0, sub=3).code is Code.CONFIG_MISMATCH
    h.fork("z", "src", 0)
    assert h.fork("z", "src", 0, sub=0).code is Code.EXISTS
    assert h.meta("src").forks == 3


def test_fork_does_not_inherit_producer_state(h: H) -> None:
    h.create("src")
    h.append("src", b"hello", producer=P(0, 0))
    h.fork("f", "src", 0, sub=3)
    out = h.append("f", b"LO", producer=P(0, 0))
    assert out.code is Code.APPENDED and out.fresh_producer
    assert h.append("f", b"LO", producer=P(0, 0)).code is Code.DUPLICATE
    assert h.text("f") == b"helLO"


def test_fork_inherits_ttl_unless_given(h: H) -> None:
    h.create("src", ttl=3600)
    h.fork("inherit", "src")
    h.fork("own", "src", ttl=7200)
    h.fork("exp", "src", expires_at=T0 + 3_600_000)
    assert (h.meta("inherit").ttl, h.meta("inherit").expires_at) == (3600, None)
    assert (h.meta("own").ttl, h.meta("own").expires_at) == (7200, None)
    assert (h.meta("exp").ttl, h.meta("exp").expires_at) == (None, T0 + 3_600_000)
    h.create("abs", expires_at=T0 + 10_000)
    h.fork("absf", "abs")
    assert h.meta("absf").expires_at == T0 + 10_000


def test_recursive_forks(h: H) -> None:
    h.create("l0", body=b"X")
    h.fork("l1", "l0")
    h.append("l1", b"Y")
    h.fork("l2", "l1")
    h.append("l2", b"Z")
    h.append("l0", b"0")
    h.append("l1", b"1")
    assert (h.text("l0"), h.text("l1"), h.text("l2")) == (b"X0", b"XY1", b"XYZ")
    # Boundaries of an ancestor are boundaries of the descendant.
    x = len(b"X")
    assert h.fork("l3", "l2", x).code is Code.CREATED
    assert h.text("l3") == b"X"


def test_json_fork_reads_as_one_array(h: H) -> None:
    h.create("src", JSON, body=jrec({"from": "source"}))
    h.fork("f", "src")
    h.append("f", jrec({"from": "fork"}), JSON)
    assert h.json("f") == [{"from": "source"}, {"from": "fork"}]


def test_soft_delete_while_forks_exist(h: H) -> None:
    h.create("src", body=b"preserved data")
    h.fork("f", "src")
    out = h.delete("src")
    assert out.code is Code.DELETED
    meta = h.meta("src")
    assert meta is not None and meta.deleted and meta.forks == 1
    assert h.append("src", b"x").code is Code.GONE
    assert h.close("src").code is Code.GONE
    assert h.delete("src").code is Code.GONE
    assert h.create("src").code is Code.CONFIG_MISMATCH
    assert h.fork("g", "src").code is Code.SOURCE_DELETED
    assert h.text("f") == b"preserved data"
    assert h.text("src") == b"preserved data"  # data kept for the fork


def test_cascade_removal_when_last_fork_is_deleted(h: H) -> None:
    src = h.create("src", body=b"shared").sid
    h.fork("f1", "src")
    h.fork("f2", "src")
    h.delete("src")
    assert h.delete("f1").code is Code.DELETED
    assert h.meta("src").deleted and h.meta("src").forks == 1
    assert h.text("f2") == b"shared"
    assert h.delete("f2").code is Code.DELETED
    assert h.meta("src") is None
    assert src not in h.sm.streams
    kv = dump(h.kv)
    assert kv[r.DATA] == [] and kv[r.STREAMS] == [] and kv[r.NAMES] == []
    assert h.create("src").code is Code.CREATED


def _fork_chain(h: H) -> None:
    """l0 holds A; l1 forks it and adds B; l2 forks l1 and adds C."""
    h.create("l0", body=b"A")
    h.fork("l1", "l0")
    h.append("l1", b"B")
    h.fork("l2", "l1")
    h.append("l2", b"C")


def test_three_level_cascade(h: H) -> None:
    _fork_chain(h)
    h.delete("l0")
    h.delete("l1")
    assert h.meta("l0").deleted and h.meta("l1").deleted
    assert h.text("l2") == b"ABC"
    assert h.delete("l2").code is Code.DELETED
    assert h.meta("l2") is h.meta("l1") is h.meta("l0") is None
    assert all(not rows for rows in (dump(h.kv)[r.DATA], dump(h.kv)[r.STREAMS], dump(h.kv)[r.NAMES]))


def test_delete_middle_of_chain(h: H) -> None:
    _fork_chain(h)
    h.delete("l1")
    assert h.meta("l1").deleted
    assert h.text("l2") == b"ABC"
    assert h.text("l0") == b"A"
    assert h.append("l0", b"0").code is Code.APPENDED
    h.delete("l2")
    assert h.meta("l1") is None
    assert h.meta("l0").forks == 0 and not h.meta("l0").deleted
    assert h.text("l0") == b"A0"


def test_live_source_survives_deleting_its_forks(h: H) -> None:
    h.create("src", body=b"alive")
    for i in range(10):
        assert h.fork(f"f{i}", "src").code is Code.CREATED
    for i in range(10):
        assert h.text(f"f{i}") == b"alive"
        assert h.delete(f"f{i}").code is Code.DELETED
    assert h.meta("src").forks == 0 and not h.meta("src").deleted
    assert h.text("src") == b"alive"


def test_expired_source_with_forks_is_soft_deleted(h: H) -> None:
    h.create("src", ttl=1, body=b"ephemeral")
    h.fork("f", "src", ttl=60)
    h.now = T0 + 1000
    assert h.append("src", b"x").code is Code.GONE
    assert h.meta("src").deleted
    assert h.fork("g", "src").code is Code.SOURCE_DELETED
    assert h.text("f") == b"ephemeral"
    assert h.append("f", b"!").code is Code.APPENDED
    assert h.text("f") == b"ephemeral!"
    assert h.delete("f").code is Code.DELETED
    assert h.meta("src") is None


def test_fork_expiry_releases_its_reference(h: H) -> None:
    h.create("src", ttl=60, body=b"x")
    h.fork("f", "src", ttl=1)
    assert h.meta("src").forks == 1
    assert h.append("f", b"y", now=T0 + 1000).code is Code.NOT_FOUND
    assert h.meta("f") is None
    assert h.meta("src").forks == 0
    h.delete("src")
    assert h.meta("src") is None


def test_expired_fork_of_soft_deleted_source_cascades(h: H) -> None:
    h.create("src", body=b"x")
    h.fork("f", "src", ttl=1)
    h.delete("src")
    f_sid = h.meta("f").sid
    h.one(CollectExpired([f_sid]), now=T0 + 1000)
    assert h.meta("f") is None and h.meta("src") is None


def test_fork_of_expired_source_without_forks_is_not_found(h: H) -> None:
    h.create("src", ttl=1, body=b"x")
    assert h.fork("f", "src", 0).code is Code.CREATED  # while alive
    h.delete("f")
    h.now = T0 + 1000
    assert h.fork("g", "src").code is Code.NOT_FOUND
    assert h.meta("src") is None


# Reads


def test_read_chunks_bytes(h: H) -> None:
    body = bytes(range(100))
    h.create("s", OCTET, body=body)
    meta = h.meta("s")
    sizes = []
    pos = 0
    while pos < meta.tail:
        chunk = h.sm.read(meta, pos, 30)
        sizes.append(chunk.size)
        assert b"".join(bytes(p) for p in chunk.payloads) == body[pos : chunk.next_pos]
        pos = chunk.next_pos
    assert sizes == [30, 30, 30, 10]
    assert h.text("s", 0, 7) == body
    assert h.text("s", 55, 1) == body[55:]


def test_read_chunks_span_records(h: H) -> None:
    h.create("s")
    for part in (b"aaa", b"bb", b"cccc", b"d"):
        h.append("s", part)
    meta = h.meta("s")
    chunk = h.sm.read(meta, 0, 6)
    assert [bytes(p) for p in chunk.payloads] == [b"aaa", b"bb", b"c"]
    assert chunk.next_pos == 6
    chunk = h.sm.read(meta, 6, 100)
    assert [bytes(p) for p in chunk.payloads] == [b"ccc", b"d"]
    for mb in range(1, 12):
        for start in range(meta.tail + 1):
            assert h.text("s", start, mb) == b"aaabbccccd"[start:]


def test_read_at_tail_is_empty(h: H) -> None:
    h.create("s", body=b"abc")
    chunk = h.sm.read(h.meta("s"), 3, 100)
    assert chunk.payloads == [] and chunk.next_pos == 3
    h.create("e")
    chunk = h.sm.read(h.meta("e"), 0, 100)
    assert chunk.payloads == [] and chunk.next_pos == 0


def test_json_reads_never_split_a_record(h: H) -> None:
    h.create("j", JSON)
    records = [jrec({"n": i, "pad": "x" * i}) for i in range(6)]
    offsets = [0]
    for rec in records:
        offsets.append(h.append("j", rec, JSON).next_pos)
    meta = h.meta("j")
    # A record bigger than max_bytes is still returned whole.
    chunk = h.sm.read(meta, 0, 1)
    assert [bytes(p) for p in chunk.payloads] == [records[0]]
    assert chunk.next_pos == offsets[1]
    chunk = h.sm.read(meta, 0, len(records[0]) + len(records[1]) + 1)
    assert [bytes(p) for p in chunk.payloads] == records[:2]
    for mb in (1, 10, 25, 1000):
        for i, off in enumerate(offsets):
            assert h.json("j", off, mb) == [{"n": n, "pad": "x" * n} for n in range(i, 6)]


def test_read_across_fork_boundary_with_chunking(h: H) -> None:
    h.create("src", body=b"0123456789")
    h.append("src", b"abcdef")
    h.fork("f", "src", 10, sub=3)
    h.append("f", b"XYZ")
    h.append("src", b"never")
    expected = b"0123456789abcXYZ"
    for mb in (1, 2, 3, 5, 100):
        for start in range(len(expected) + 1):
            assert h.text("f", start, mb) == expected[start:], (mb, start)


def test_read_staged_records_during_batch_for_fork_of_new_stream(h: H) -> None:
    out = h.batch(
        CreateStream(B, "src", TEXT, False, body=b"hello"),
        CreateStream(B, "f", OCTET, False, fork_stream="src", fork_offset=0, fork_sub=2, content_type_given=False),
    )
    assert [o.code for o in out] == [Code.CREATED, Code.CREATED]
    assert h.text("f") == b"he"


# Determinism and durability


def scenario(h: H) -> list[Outcome]:
    """A mixed workload, in several batches with advancing time."""
    out: list[Outcome] = []
    t = T0
    steps: list[tuple[int, list[Command]]] = [
        (0, [CreateBucket("x"), CreateStream(B, "a", TEXT, False, body=b"hello")]),
        (10, [Append(B, "a", TEXT, b" world", producer=P(0, 0)), Append(B, "a", TEXT, b"!", stream_seq="1")]),
        (20, [CreateStream(B, "j", JSON, True, body=jrec({"k": 1}, [2], "3"))]),
        (
            30,
            [CreateStream(B, "fa", OCTET, False, fork_stream="a", fork_offset=5, fork_sub=3, content_type_given=False)],
        ),
        (40, [Append(B, "fa", TEXT, b"fork"), CreateStream(B, "fj", JSON, True, fork_stream="j", fork_sub=0)]),
        (50, [CreateStream(B, "ttl", TEXT, False, ttl=1, body=b"short")]),
        (60, [Append(B, "j", JSON, jrec(4, 5), producer=P(1, 0, "q")), DeleteStream(B, "a")]),
        (70, [CreateStream("x", "s", TEXT, False, closed=True), Append(B, "fa", None, b"", close=True)]),
        (2000, [Append(B, "ttl", TEXT, b"late"), Touch(B, "j"), CollectExpired([1, 2, 3, 4, 5, 6])]),
        (2010, [DeleteStream(B, "fa"), CreateStream(B, "ttl", JSON, True, body=jrec(1))]),
        (2020, [Append(B, "j", JSON, jrec(6), producer=P(1, 1, "q")), DeleteStream(B, "fj")]),
    ]
    for dt, cmds in steps:
        out += h.batch(*cmds, now=t + dt)
    return out


def test_same_entries_same_state_on_two_memory_kvs() -> None:
    a, b = H(), H()
    out_a, out_b = scenario(a), scenario(b)
    assert out_a == out_b
    assert dump(a.kv) == dump(b.kv)
    assert a.sm.applied_index == b.sm.applied_index
    assert a.sm.streams == b.sm.streams and a.sm.names == b.sm.names and a.sm.buckets == b.sm.buckets


def test_same_entries_same_state_on_rocks_and_memory(tmp_path: Path) -> None:
    rocks = RocksKV(tmp_path / "db", r.COLUMN_FAMILIES)
    try:
        a, b = H(rocks), H()
        assert scenario(a) == scenario(b)
        assert dump(a.kv) == dump(b.kv)
        assert a.sm.streams == b.sm.streams
        for name in ("j", "ttl"):
            assert a.parts(name, max_bytes=3) == b.parts(name, max_bytes=3)
    finally:
        rocks.close()


def test_scenario_outcomes_and_content(h: H) -> None:
    out = scenario(h)
    assert Code.GONE not in [o.code for o in out]
    assert h.json("j") == [{"k": 1}, [2], "3", 4, 5, 6]
    assert h.meta("a") is None and h.meta("fa") is None
    assert h.json("ttl") == [1]
    assert h.sm.lookup("x", "s").closed


def test_batch_grouping_does_not_change_outcomes_or_state() -> None:
    """Replicas may group committed entries into apply batches differently; they must converge.

    Fails because of the two batch bugs above (producer state and range deletes).
    """
    ref = H()
    outcomes = scenario(ref)
    entries = [e for batch in ref.batches[1:] for e in batch]  # all but the bucket creation

    whole = H()
    whole_out = whole.sm.apply(entries)
    single = H()
    single_out = [single.sm.apply([e])[0] for e in entries]
    assert whole_out == single_out == outcomes
    assert dump(single.kv) == dump(ref.kv)
    assert dump(whole.kv) == dump(ref.kv)


def test_restart_on_rocks(tmp_path: Path) -> None:
    path = tmp_path / "db"
    kv = RocksKV(path, r.COLUMN_FAMILIES)
    h = H(kv)
    scenario(h)
    h.create("keep", body=b"data")
    h.append("keep", b"1", producer=P(0, 0))
    h.create("src", body=b"shared")
    h.fork("child", "src")
    applied, next_sid = h.sm.applied_index, h.sm.next_sid
    streams, names, buckets = dict(h.sm.streams), dict(h.sm.names), dict(h.sm.buckets)
    texts = {n: h.text(n) for n in ("keep", "child", "src")}
    h.sm.make_durable()
    before = dump(kv)
    kv.close()

    kv2 = RocksKV(path, r.COLUMN_FAMILIES)
    try:
        h2 = H(kv2, bucket=None)
        assert h2.sm.applied_index == applied and h2.index == applied
        assert h2.sm.next_sid == next_sid
        assert h2.sm.streams == streams and h2.sm.names == names and h2.sm.buckets == buckets
        assert dump(kv2) == before
        assert {n: h2.text(n) for n in texts} == texts
        # Producer state, fork references and sid allocation survive too.
        assert h2.append("keep", b"1", producer=P(0, 0)).code is Code.DUPLICATE
        assert h2.append("keep", b"2", producer=P(0, 1)).code is Code.APPENDED
        assert h2.text("keep") == b"data12"
        assert h2.delete("src").code is Code.DELETED and h2.meta("src").deleted
        assert h2.create("new").sid == next_sid
        assert h2.delete("child").code is Code.DELETED
        assert h2.meta("src") is None
    finally:
        kv2.close()


def test_restart_on_memory_kv_rebuilds_the_same_view(h: H) -> None:
    scenario(h)
    again = StateMachine(h.kv)
    assert again.applied_index == h.sm.applied_index
    assert again.streams == h.sm.streams and again.names == h.sm.names and again.buckets == h.sm.buckets
