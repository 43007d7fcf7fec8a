"""Forks: fork offsets and sub-offsets, reads through the chain, and soft delete while forks remain."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import Code, CollectExpired
from tests.state_machine.helpers import JSON, T0, TEXT, H, P, dump, jrec


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
