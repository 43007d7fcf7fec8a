"""Append: records, content types, Stream-Seq, and closing."""

from __future__ import annotations

from app.state_machine.commands import Code
from tests.state_machine.helpers import JSON, OCTET, TEXT, H, P


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
