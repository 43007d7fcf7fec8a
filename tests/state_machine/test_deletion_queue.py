"""The count of objects queued for deletion is kept as entries queue and forget them (metrics and
/healthz read it on every scrape): it matches the queue after every batch, and after a reload."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import ForgetObjects, TierSegment
from app.state_machine.machine import StateMachine
from tests.state_machine.helpers import H

NO_SUCH_STREAM = 999
SEGMENT = r.SegmentInfo(0, 10, "b/s/segments/00000000000000000000.parquet", 100, "0" * 64, 0, 0, b"")


def _stale() -> TierSegment:
    """An upload for a stream that is gone: its object is queued for deletion."""
    return TierSegment(NO_SUCH_STREAM, SEGMENT)


def _queued(h: H) -> int:
    assert h.sm.queued_objects == len(list(h.sm.deletion_queue()))
    return h.sm.queued_objects


def test_the_count_follows_the_queue_through_repeats_in_and_across_batches() -> None:
    h = H()
    assert _queued(h) == 0
    h.batch(_stale(), _stale())  # the same key twice in one batch
    assert _queued(h) == 1
    h.one(_stale())  # and again later
    assert _queued(h) == 1
    h.one(ForgetObjects([SEGMENT.key, "b/never-queued"]))
    assert _queued(h) == 0
    h.batch(_stale(), ForgetObjects([SEGMENT.key]), ForgetObjects([SEGMENT.key]), _stale())
    assert _queued(h) == 1
    assert StateMachine(h.kv).queued_objects == 1  # counted again on load
