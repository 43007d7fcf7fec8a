"""The model behind tests/state_machine/test_model.py: a tiny reference of the protocol, and its plumbing.

The model knows streams as lists of records (bytes, or JSON messages), a closed
flag, the last Stream-Seq, producer states, sliding TTL / absolute expiry, and
fork links (a fork copies its source's records up to the fork point, plus an
optional sub-offset prefix). It does not compute offsets: it learns them from
the outcomes (`next_pos`) and only forks at boundaries it has learned.

Streams with a TTL or expiry are never forked in this model (forks never get
their own TTL either), so "expired" simply means "absent". Sliding TTLs are renewed
by accepted appends and closes of an open stream, and by Touch.

Here: the strategies, the model's stream (`MStream`), the producer rules (`judge`), and
`ModelBase`, the rule-less half of the stateful test (applying commands, picking names,
expected append outcomes, reading streams back). The rules and invariants are in test_model.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine

from app.domain.media import media_type
from app.raft.messages import Entry
from app.state_machine import records as r
from app.state_machine.commands import Code, Command, CreateBucket, Outcome, Producer, encode_envelope
from app.state_machine.machine import StateMachine
from app.storage.kv import MemoryKV
from tests.state_machine.helpers import T0, B

NAMES = ["s0", "s1", "s2", "s3", "s4"]
PIDS = ["pa", "pb"]
STREAM_SEQS = ["a", "b", "c", "d"]
TEXT_TYPES = ["text/plain", "Text/Plain; charset=utf-8"]
JSON_TYPES = ["application/json", "application/json; charset=utf-8"]
JSON_MT = "application/json"


def encode_message(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


json_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-1000, 1000),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=4),
    st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(st.text("ab,", max_size=2), st.integers(0, 9), max_size=2),
)
# A stream name, or (an int) a pick among the streams that currently exist.
targets = st.sampled_from([*NAMES, 0, 1, 2, 3, 4, 5, 6, 7])
# A stream name, or "free": a name that holds no stream (if there is one).
new_names = st.sampled_from([*NAMES, "free", "free"])
# A producer request: (id, epoch, how to pick the seq). "next" continues the producer's
# sequence in that epoch (0 in a new one), "dup" retries its last accepted request, an int is
# taken as is.
producers = st.one_of(
    st.none(),
    st.tuples(
        st.sampled_from(PIDS),
        st.sampled_from([0, 0, 1, 2]),
        st.sampled_from(["next", "next", "next", "dup", "dup", 0, 1, 3]),
    ),
)


# Records: bytes for byte streams, a list of encoded JSON messages for JSON streams.
Record = bytes | list[bytes]


@dataclass
class MStream:
    uid: int
    sid: int
    content_type: str
    json: bool
    records: list[Record]
    bounds: list[int | None]  # start of each record, then the tail; None where not learned
    closed: bool = False
    stream_seq: str | None = None
    producers: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # id -> (epoch, seq, next_pos)
    ttl: int | None = None
    expires_at: int | None = None
    touched_at: int = 0
    fork_of: int | None = None  # uid of the source
    fork_offset: int = 0
    fork_sub: int = 0
    forks: int = 0
    deleted: bool = False

    @property
    def tail(self) -> int:
        tail = self.bounds[-1]
        assert tail is not None
        return tail

    def expired(self, now: int) -> bool:
        if self.deleted:
            return False
        if self.ttl is not None and now >= self.touched_at + self.ttl * 1000:
            return True
        return self.expires_at is not None and now >= self.expires_at

    def content(self, start_record: int = 0) -> bytes:
        """What a full read from record `start_record` returns (JSON: messages joined by commas)."""
        if self.json:
            return b",".join(m for rec in self.records[start_record:] for m in rec)  # type: ignore[union-attr]
        return b"".join(self.records[start_record:])  # type: ignore[arg-type]


def units(record: Record) -> int:
    return len(record)


def judge(state: tuple[int, int, int] | None, p: Producer) -> str:
    """The protocol's producer rules (spec §12), written independently of app/state_machine/producers.py."""
    if state is None:
        return "accept" if p.seq == 0 else "gap"
    epoch, seq, _ = state
    if p.epoch < epoch:
        return "stale"
    if p.epoch > epoch:
        return "accept" if p.seq == 0 else "bad_epoch_seq"
    if p.seq <= seq:
        return "duplicate"
    return "accept" if p.seq == seq + 1 else "gap"


class ModelBase(RuleBasedStateMachine):
    """The plumbing of StreamsModel (test_model.py): a StateMachine on MemoryKV, the model, and the checks."""

    def __init__(self) -> None:
        super().__init__()
        self.kv = MemoryKV(r.COLUMN_FAMILIES)
        self.sm = StateMachine(self.kv)
        self.now = T0
        self.index = 0
        self.log: list[Entry] = []
        self.outcomes: list[Outcome | None] = []
        self.model: dict[str, MStream] = {}
        self.next_uid = 1
        out = self.apply(CreateBucket(B))
        assert out.code is Code.CREATED

    # Plumbing

    def apply(self, cmd: Command) -> Outcome:
        self.index += 1
        entry = Entry(1, self.index, encode_envelope(self.now, cmd))
        self.log.append(entry)
        (out,) = self.sm.apply([entry])
        self.outcomes.append(out)
        assert out is not None
        return out

    def pick(self, target: str | int) -> str:
        if target == "free":
            free = [n for n in NAMES if n not in self.model]
            return free[0] if free else NAMES[-1]
        if isinstance(target, str):
            return target
        present = sorted(self.model)
        return present[target % len(present)] if present else NAMES[target % len(NAMES)]

    def resolve(self, name: str) -> MStream | None:
        """The model's view of a name at `now`: an expired stream is collected (it never has forks)."""
        s = self.model.get(name)
        if s is not None and s.expired(self.now):
            assert s.forks == 0 and s.fork_of is None
            self.remove(name)
            return None
        return s

    def by_uid(self, uid: int) -> tuple[str, MStream]:
        for name, s in self.model.items():
            if s.uid == uid:
                return name, s
        raise AssertionError(f"source {uid} of a live fork is gone from the model")

    def remove(self, name: str) -> None:
        s = self.model[name]
        if s.forks > 0:
            s.deleted = True
            return
        del self.model[name]
        if s.fork_of is not None:
            src_name, src = self.by_uid(s.fork_of)
            src.forks -= 1
            if src.forks == 0 and src.deleted:
                self.remove(src_name)

    def new_stream(self, out: Outcome, **kw) -> MStream:
        s = MStream(uid=self.next_uid, sid=out.sid, touched_at=self.now, **kw)
        self.next_uid += 1
        return s

    def producer(self, s: MStream | None, spec: tuple[str, int, str | int] | None) -> Producer | None:
        if spec is None:
            return None
        pid, epoch, how = spec
        state = s.producers.get(pid) if s is not None else None
        if isinstance(how, int):
            seq = how
        elif how == "dup" and state is not None:
            epoch, seq = state[0], state[1]  # an exact retry of the last accepted request
        elif state is None or state[0] != epoch:
            seq = 0
        else:
            seq = state[1] + 1
        return Producer(pid, epoch, seq)

    def expect(self, out: Outcome, code: Code, s: MStream | None = None) -> None:
        assert out.code is code, (out, code)
        if s is not None and code not in (Code.DUPLICATE,):
            assert out.sid == s.sid
            assert out.closed == s.closed
            assert out.next_pos == s.tail

    # Expected outcomes

    def check_append(self, s, out, record, ct, stream_seq, producer, close) -> None:
        if s is None:
            assert out.code is Code.NOT_FOUND
            return
        if s.deleted:
            assert out.code is Code.GONE
            return
        state = s.producers.get(producer.id) if producer else None
        if producer is not None:
            verdict = judge(state, producer)
            if verdict == "duplicate":
                assert out.code is Code.DUPLICATE
                assert (out.next_pos, out.producer_epoch, out.producer_seq) == (state[2], state[0], state[1])
                assert out.closed == s.closed and not out.fresh_producer
                return
            if verdict == "stale":
                self.expect(out, Code.STALE_EPOCH, s)
                assert out.producer_epoch == state[0]
                return
            if verdict == "bad_epoch_seq":
                self.expect(out, Code.BAD_EPOCH_SEQ, s)
                return
            if verdict == "gap":
                self.expect(out, Code.SEQ_GAP, s)
                expected = 0 if state is None or state[0] != producer.epoch else state[1] + 1
                assert (out.expected_seq, out.received_seq) == (expected, producer.seq)
                return
        if s.closed:
            if record is not None:
                self.expect(out, Code.STREAM_CLOSED, s)
            else:
                # Closing a closed stream is idempotent. A producer's close-only is still an
                # accepted request: it is echoed and consumes the seq (spec: closure §1.7).
                # Like any close-only POST it is a write, so it renews a sliding TTL.
                s.touched_at = self.now
                self.expect(out, Code.APPENDED, s)
                assert not out.fresh_producer
                if producer is not None:
                    assert (out.producer_epoch, out.producer_seq) == (producer.epoch, producer.seq)
                    s.producers[producer.id] = (producer.epoch, producer.seq, s.tail)
            return
        old_tail = s.tail
        if record is not None:
            if ct is not None and media_type(ct) != media_type(s.content_type):
                self.expect(out, Code.CONTENT_TYPE_MISMATCH, s)
                return
            if stream_seq is not None:
                if s.stream_seq is not None and stream_seq <= s.stream_seq:
                    self.expect(out, Code.SEQ_CONFLICT, s)
                    return
                s.stream_seq = stream_seq
        assert out.code is Code.APPENDED, out
        if record is not None:
            s.records.append(record)
            s.bounds.append(None)
            assert out.next_pos > old_tail, "tails strictly increase on appends"
            s.bounds[-1] = out.next_pos
        else:
            assert out.next_pos == old_tail
        s.closed = s.closed or close
        s.touched_at = self.now
        if producer is not None:
            s.producers[producer.id] = (producer.epoch, producer.seq, s.tail)
            assert (out.producer_epoch, out.producer_seq) == (producer.epoch, producer.seq)
            assert out.fresh_producer == (record is not None)
        else:
            assert not out.fresh_producer
        self.expect(out, Code.APPENDED, s)

    # Reading back

    def check_content(self, name: str, s: MStream, meta: r.StreamMeta) -> None:
        for i, start in enumerate(s.bounds):
            if start is None:
                continue
            for max_bytes in (1 << 20, 5) if i == 0 else (1 << 20,):
                got = self.read_all(meta, start, max_bytes)
                assert got == s.content(i), (name, start, max_bytes)
        if s.json:
            full = json.loads(b"[" + self.read_all(meta, 0, 1 << 20) + b"]")
            assert full == [json.loads(m) for rec in s.records for m in rec]

    def read_all(self, meta: r.StreamMeta, pos: int, max_bytes: int) -> bytes:
        parts: list[bytes] = []
        while True:
            chunk = self.sm.read(meta, pos, max_bytes)
            parts += [bytes(p) for p in chunk.payloads]
            if chunk.next_pos == meta.tail:
                break
            assert pos < chunk.next_pos < meta.tail, "a read makes progress and stays below the tail"
            assert chunk.payloads
            pos = chunk.next_pos
        return b",".join(parts) if meta.json else b"".join(parts)
