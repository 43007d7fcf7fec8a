"""Idempotent producer validation: Kafka-style epochs and per-request sequence numbers."""

from __future__ import annotations

from enum import Enum

from app.state_machine.commands import Producer
from app.state_machine.records import ProducerState


class Verdict(Enum):
    ACCEPT = "accept"
    DUPLICATE = "duplicate"
    STALE_EPOCH = "stale_epoch"
    BAD_EPOCH_SEQ = "bad_epoch_seq"
    GAP = "gap"


def judge(state: ProducerState | None, producer: Producer) -> Verdict:
    """Decides what an append from `producer` means given the stored state.

    Only the last accepted seq per producer is kept: a retry of it or of any
    earlier seq in the same epoch is a duplicate (answered with the last seq),
    so the window is unbounded by construction and costs one small record.
    """
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


def expected_seq(state: ProducerState | None, producer: Producer) -> int:
    if state is None or producer.epoch != state.epoch:
        return 0
    return state.seq + 1
