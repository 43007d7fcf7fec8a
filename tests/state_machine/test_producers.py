"""Idempotent producers: epochs, sequence numbers, duplicates and gaps."""

from __future__ import annotations

import pytest

from app.state_machine import records as r
from app.state_machine.commands import Append, Code
from tests.state_machine.helpers import JSON, TEXT, B, H, P


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
