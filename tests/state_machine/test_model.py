"""Stateful model test: the real StateMachine on MemoryKV against a tiny model of the protocol.

The model (tests/state_machine/model.py) knows streams as lists of records (bytes, or JSON
messages), a closed flag, the last Stream-Seq, producer states, sliding TTL / absolute expiry,
and fork links. It does not compute offsets: it learns them from the outcomes (`next_pos`) and
only forks at boundaries it has learned. Streams with a TTL or expiry are never forked.

Here: the rules (one command each), the invariants, the teardown checks, and the settings.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, rule

from app.domain.media import media_type
from app.state_machine import records as r
from app.state_machine.commands import Append, Code, CreateStream, DeleteStream, Touch
from app.state_machine.machine import StateMachine
from app.storage.kv import MemoryKV
from tests.state_machine.helpers import B, dump
from tests.state_machine.model import (
    JSON_MT,
    JSON_TYPES,
    NAMES,
    STREAM_SEQS,
    TEXT_TYPES,
    ModelBase,
    Record,
    encode_message,
    json_values,
    new_names,
    producers,
    targets,
    units,
)


class StreamsModel(ModelBase):
    """Applies each command as its own entry, checks the outcome, then the invariants."""

    # Rules

    @initialize(text=st.binary(max_size=6), values=st.lists(json_values, max_size=3))
    def start_with_two_streams(self, text, values) -> None:
        self.create("s0", False, 0, None, 1, False, text, [])
        self.create("s1", True, 0, None, 1, False, b"", values)

    @rule(
        name=new_names,
        is_json=st.booleans(),
        ct_index=st.integers(0, 1),
        expiry=st.sampled_from([None, None, None, "ttl", "expires_at"]),
        seconds=st.integers(1, 3),
        closed=st.sampled_from([False, False, False, True]),
        body_bytes=st.binary(max_size=6),
        body_values=st.lists(json_values, max_size=3),
    )
    def create(self, name, is_json, ct_index, expiry, seconds, closed, body_bytes, body_values) -> None:
        name = self.pick(name)
        ct = (JSON_TYPES if is_json else TEXT_TYPES)[ct_index]
        record: Record = [encode_message(v) for v in body_values] if is_json else body_bytes
        body = b",".join(record) if is_json else record  # type: ignore[arg-type]
        ttl = seconds if expiry == "ttl" else None
        expires_at = self.now + seconds * 1000 if expiry == "expires_at" else None
        s = self.resolve(name)
        out = self.apply(CreateStream(B, name, ct, is_json, ttl=ttl, expires_at=expires_at, closed=closed, body=body))
        if s is not None:
            if s.deleted:
                assert out.code is Code.CONFIG_MISMATCH
                return
            config = (media_type(s.content_type), s.ttl, s.expires_at, s.closed, s.fork_of)
            same = config == (media_type(ct), ttl, expires_at, closed, None)
            if same:
                self.expect(out, Code.EXISTS, s)
            else:
                assert out.code is Code.CONFIG_MISMATCH
            return
        assert out.code is Code.CREATED and out.closed == closed
        assert out.sid not in {m.sid for m in self.model.values()}
        records = [record] if body else []
        bounds: list[int | None] = [0] + [None] * len(records)
        bounds[-1] = out.next_pos
        if body:
            assert out.next_pos > 0
        else:
            assert out.next_pos == 0
        self.model[name] = self.new_stream(
            out,
            content_type=ct,
            json=is_json,
            records=records,
            bounds=bounds,
            closed=closed,
            ttl=ttl,
            expires_at=expires_at,
        )

    @rule(
        name=targets,
        body_bytes=st.binary(min_size=1, max_size=6),
        body_values=st.lists(json_values, min_size=1, max_size=3),
        ct_choice=st.sampled_from(["match", "match", "match", "variant", "other", None]),
        stream_seq=st.one_of(st.none(), st.sampled_from(STREAM_SEQS)),
        producer=producers,
        close=st.sampled_from([False, False, False, False, True]),
    )
    def append(self, name, body_bytes, body_values, ct_choice, stream_seq, producer, close) -> None:
        name = self.pick(name)
        s = self.resolve(name)
        is_json = s is not None and s.json
        record: Record = [encode_message(v) for v in body_values] if is_json else body_bytes
        body = b",".join(record) if is_json else record  # type: ignore[arg-type]
        types, others = (JSON_TYPES, TEXT_TYPES) if is_json else (TEXT_TYPES, JSON_TYPES)
        ct = {"match": types[0], "variant": types[1], "other": others[0], None: None}[ct_choice]
        producer = self.producer(s, producer)
        out = self.apply(Append(B, name, ct, body, stream_seq, producer, close))
        self.check_append(s, out, record, ct, stream_seq, producer, close)

    @rule(name=targets, producer=producers, ct=st.sampled_from([None, "text/plain", JSON_MT]))
    def close_only(self, name, producer, ct) -> None:
        name = self.pick(name)
        s = self.resolve(name)
        producer = self.producer(s, producer)
        out = self.apply(Append(B, name, ct, b"", None, producer, True))
        self.check_append(s, out, None, ct, None, producer, True)

    @rule(name=targets)
    def delete(self, name) -> None:
        name = self.pick(name)
        s = self.resolve(name)
        out = self.apply(DeleteStream(B, name))
        if s is None:
            assert out.code is Code.NOT_FOUND
        elif s.deleted:
            assert out.code is Code.GONE
        else:
            assert out.code is Code.DELETED and out.sid == s.sid
            self.remove(name)

    @rule(
        name=new_names,
        source=targets,
        where=st.one_of(st.integers(0, 20), st.sampled_from(["tail", "beyond"])),
        sub=st.sampled_from([0, 0, 1, 2, 3, 5]),
        ct_choice=st.sampled_from([None, None, "match", "other"]),
        body_bytes=st.binary(max_size=4),
        body_values=st.lists(json_values, max_size=2),
    )
    def fork(self, name, source, where, sub, ct_choice, body_bytes, body_values) -> None:
        name = self.pick(name)
        source = self.pick(source)
        src = self.model.get(source)
        if src is not None and (src.ttl is not None or src.expires_at is not None):
            return  # streams that expire are not forked in this model
        target = self.resolve(name)
        src = self.resolve(source)
        is_json = src is not None and src.json
        record: Record = [encode_message(v) for v in body_values] if is_json else body_bytes
        body = b",".join(record) if is_json else record  # type: ignore[arg-type]
        types, others = (JSON_TYPES, TEXT_TYPES) if is_json else (TEXT_TYPES, JSON_TYPES)
        ct = {"match": types[1], "other": others[0], None: None}[ct_choice]
        # Where to fork: a learned boundary, the default (the tail), or past the tail.
        k: int | None = None
        offset: int | None = None
        if src is not None and where == "beyond":
            offset = src.tail + 1000
        elif src is not None and isinstance(where, int):
            known = [i for i, b in enumerate(src.bounds) if b is not None]
            k = known[where % len(known)]
            offset = src.bounds[k]
        elif src is not None:
            k = len(src.records)
        cmd = CreateStream(
            B,
            name,
            ct or "application/octet-stream",
            ct is not None and media_type(ct) == JSON_MT,
            body=body,
            fork_stream=source,
            fork_offset=offset,
            fork_sub=sub,
            content_type_given=ct is not None,
        )
        out = self.apply(cmd)
        if src is None:
            assert out.code is Code.NOT_FOUND
            return
        if src.deleted:
            assert out.code is Code.SOURCE_DELETED
            return
        if ct is not None and media_type(ct) != media_type(src.content_type):
            assert out.code is Code.CONTENT_TYPE_MISMATCH
            return
        if k is None:
            assert out.code is Code.BAD_FORK_OFFSET
            return
        fork_offset = src.bounds[k]
        prefix: Record | None = None
        if sub:
            if k == len(src.records) or sub > units(src.records[k]):
                assert out.code is Code.BAD_SUB_OFFSET
                return
            prefix = src.records[k][:sub]
        content_type = ct if ct is not None else src.content_type
        if target is not None:
            if target.deleted:
                assert out.code is Code.CONFIG_MISMATCH
                return
            same = (
                media_type(target.content_type) == media_type(content_type)
                and (target.ttl, target.expires_at, target.closed) == (None, None, False)
                and target.fork_of == src.uid
                and (target.fork_offset, target.fork_sub) == (fork_offset, sub)
            )
            if same:
                self.expect(out, Code.EXISTS, target)
            else:
                assert out.code is Code.CONFIG_MISMATCH
            return
        assert out.code is Code.CREATED and not out.closed
        records = list(src.records[:k])
        bounds = list(src.bounds[: k + 1])
        for rec in (prefix, record if body else None):
            if rec:
                records.append(rec)
                bounds.append(None)
        if len(records) == k:
            assert out.next_pos == fork_offset
        else:
            assert out.next_pos > fork_offset  # type: ignore[operator]
        bounds[-1] = out.next_pos
        src.forks += 1
        self.model[name] = self.new_stream(
            out,
            content_type=content_type,
            json=src.json,
            records=records,
            bounds=bounds,
            fork_of=src.uid,
            fork_offset=fork_offset,
            fork_sub=sub,
        )

    @rule(name=targets)
    def touch(self, name) -> None:
        name = self.pick(name)
        s = self.model.get(name)
        if s is not None and not s.deleted and s.ttl is not None:
            s.touched_at = max(s.touched_at, self.now)  # a Touch stands for a read of the live stream
        s = self.resolve(name)
        out = self.apply(Touch(B, name))
        if s is None or s.deleted:
            assert out.code is Code.NOT_FOUND
        else:
            assert out.code is Code.OK
            s.touched_at = max(s.touched_at, self.now)

    @rule(ms=st.sampled_from([1, 250, 999, 1000, 1500, 2500, 4000]))
    def advance_time(self, ms) -> None:
        self.now += ms

    # Invariants

    @invariant()
    def streams_match_the_model(self) -> None:
        for name in NAMES:
            s = self.model.get(name)
            meta = self.sm.lookup(B, name)
            if s is None:
                assert meta is None, f"{name} should not exist"
                continue
            if s.expired(self.now):
                continue  # expiry is collected lazily; the next command on the name decides
            assert meta is not None, f"{name} is missing"
            assert meta.sid == s.sid
            assert meta.deleted == s.deleted
            assert meta.closed == s.closed
            assert meta.tail == s.tail
            assert meta.forks == s.forks
            assert meta.json == s.json
            assert media_type(meta.content_type) == media_type(s.content_type)
            assert meta.stream_seq == s.stream_seq
            assert (meta.ttl, meta.expires_at) == (s.ttl, s.expires_at)
            self.check_content(name, s, meta)

    @invariant()
    def no_orphan_records(self) -> None:
        sids = set(self.sm.streams)
        for cf in (r.DATA, r.PRODUCERS):
            for key, _ in self.kv.scan(cf, b""):
                assert r.U64.unpack(key[:8])[0] in sids, f"orphan {cf} record {key!r}"

    @invariant()
    def producer_state_matches(self) -> None:
        for name, s in self.model.items():
            for pid, (epoch, seq, next_pos) in s.producers.items():
                raw = self.kv.get(r.PRODUCERS, r.producer_key(s.sid, pid))
                stored = r.decode_producer(raw) if raw is not None else None
                expected = r.ProducerState(epoch, seq, next_pos)
                assert stored == expected, f"producer {pid} on {name}: stored {stored}, expected {expected}"

    def teardown(self) -> None:
        # A restart rebuilds the same view from the KV alone.
        again = StateMachine(self.kv)
        assert again.applied_index == self.index
        assert (again.streams, again.names, again.buckets) == (self.sm.streams, self.sm.names, self.sm.buckets)
        # Determinism: another replica fed the same entries in the same batches ends identical.
        replica = MemoryKV(r.COLUMN_FAMILIES)
        sm = StateMachine(replica)
        assert [sm.apply([e])[0] for e in self.log] == self.outcomes
        assert dump(replica) == dump(self.kv)


class BatchedReplay(StreamsModel):
    """As StreamsModel, and a replica that applies the whole log in one batch must converge too.

    Raft replicas group committed entries into apply batches as commits arrive, so the
    grouping differs between nodes; outcomes and the store must not depend on it.
    """

    def teardown(self) -> None:
        super().teardown()
        replica = MemoryKV(r.COLUMN_FAMILIES)
        sm = StateMachine(replica)
        assert sm.apply(self.log) == self.outcomes
        assert dump(replica) == dump(self.kv)


SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestStreamsModel = StreamsModel.TestCase
TestStreamsModel.settings = SETTINGS
TestBatchedReplay = BatchedReplay.TestCase
# This one fails on the first example that deletes a stream (see the report): keep shrinking to one bug.
TestBatchedReplay.settings = settings(SETTINGS, max_examples=100, report_multiple_bugs=False)
