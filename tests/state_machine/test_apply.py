"""Applying entries: one outcome per entry, the applied index, and sid allocation."""

from __future__ import annotations

from app.raft.messages import Entry
from app.state_machine import records as r
from app.state_machine.commands import Append, Code, CreateStream
from tests.state_machine.helpers import TEXT, B, H


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
