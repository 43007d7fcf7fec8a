"""Reads: chunking by `max_bytes`, whole JSON records, and reads across fork boundaries."""

from __future__ import annotations

from app.state_machine.commands import Code, CreateStream
from tests.state_machine.helpers import JSON, OCTET, TEXT, B, H, jrec


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
