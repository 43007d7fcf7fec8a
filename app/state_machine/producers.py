"""Idempotent producers: Kafka-style epochs and per-request sequence numbers.

Only the last accepted seq per producer is kept: a retry of it or of any earlier seq in the same
epoch is a duplicate (answered with the last seq), so the window is unbounded by construction and
costs one small record per producer.
"""

from __future__ import annotations

from enum import Enum

from app.state_machine import records as r
from app.state_machine.commands import Code, Outcome, Producer
from app.state_machine.outcomes import stream_outcome
from app.state_machine.table import StreamTable


class Verdict(Enum):
    ACCEPT = "accept"
    DUPLICATE = "duplicate"
    STALE_EPOCH = "stale_epoch"
    BAD_EPOCH_SEQ = "bad_epoch_seq"
    GAP = "gap"


def judge(state: r.ProducerState | None, producer: Producer) -> Verdict:
    """Decides what an append from `producer` means given the stored state."""
    if state is None:
        return Verdict.ACCEPT if producer.seq == 0 else Verdict.GAP
    if producer.epoch < state.epoch:
        return Verdict.STALE_EPOCH
    if producer.epoch > state.epoch:
        return Verdict.ACCEPT if producer.seq == 0 else Verdict.BAD_EPOCH_SEQ
    if producer.seq <= state.seq:
        return Verdict.DUPLICATE
    if producer.seq == state.seq + 1:
        return Verdict.ACCEPT
    return Verdict.GAP


def expected_seq(state: r.ProducerState | None, producer: Producer) -> int:
    if state is None or producer.epoch != state.epoch:
        return 0
    return state.seq + 1


def refusal(table: StreamTable, meta: r.StreamMeta, producer: Producer) -> Outcome | None:
    """The outcome that refuses an append from `producer` to `meta`, or None to accept it."""
    raw = table.get(r.PRODUCERS, r.producer_key(meta.sid, producer.id))
    state = r.decode_producer(raw) if raw else None
    verdict = judge(state, producer)
    if verdict is Verdict.ACCEPT:
        return None
    if verdict is Verdict.DUPLICATE:
        assert state is not None
        out = stream_outcome(Code.DUPLICATE, meta)
        out.next_pos = state.next_pos
        out.producer_epoch, out.producer_seq = state.epoch, state.seq
        return out
    if verdict is Verdict.STALE_EPOCH:
        assert state is not None
        out = stream_outcome(Code.STALE_EPOCH, meta, "producer epoch is stale")
        out.producer_epoch = state.epoch
        return out
    if verdict is Verdict.BAD_EPOCH_SEQ:
        return stream_outcome(Code.BAD_EPOCH_SEQ, meta, "a new producer epoch must start at seq 0")
    out = stream_outcome(Code.SEQ_GAP, meta, "producer sequence gap")
    out.expected_seq, out.received_seq = expected_seq(state, producer), producer.seq
    return out


def remember(table: StreamTable, producer: Producer | None, meta: r.StreamMeta, outcome: Outcome) -> Outcome:
    """Stores the producer's accepted seq (with the tail after it) and echoes it in `outcome`."""
    if producer is not None:
        state = r.ProducerState(producer.epoch, producer.seq, meta.tail)
        table.stage(r.PRODUCERS, r.producer_key(meta.sid, producer.id), r.encode(state))
        outcome.producer_epoch, outcome.producer_seq = producer.epoch, producer.seq
    return outcome
