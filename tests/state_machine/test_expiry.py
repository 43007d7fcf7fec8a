"""Sliding TTLs and absolute expiry, judged by the envelope's `now`; Touch and CollectExpired."""

from __future__ import annotations

import pytest

from app.state_machine import records as r
from app.state_machine.commands import Append, Code, CollectExpired, Touch
from tests.state_machine.helpers import JSON, T0, TEXT, B, H, P, dump


def test_sliding_ttl_expiry_uses_the_envelope_time(h: H) -> None:
    h.create("s", ttl=2)
    assert h.append("s", b"a", now=T0 + 1999).code is Code.APPENDED  # renews to T0+3999
    assert h.append("s", b"b", now=T0 + 3998).code is Code.APPENDED  # renews to T0+5998
    assert h.meta("s").touched_at == T0 + 3998
    assert h.append("s", b"c", now=T0 + 5998).code is Code.NOT_FOUND
    assert h.meta("s") is None


@pytest.mark.parametrize("cmd", ["append", "close", "delete", "producer"])
def test_expired_stream_is_absent(h: H, cmd: str) -> None:
    h.create("s", ttl=1, body=b"old")
    h.now = T0 + 1000
    if cmd == "append":
        out = h.append("s", b"x")
    elif cmd == "close":
        out = h.close("s")
    elif cmd == "producer":
        out = h.append("s", b"x", producer=P(0, 0))
    else:
        out = h.delete("s")
    assert out.code is Code.NOT_FOUND
    assert h.meta("s") is None
    kv = dump(h.kv)
    assert kv[r.DATA] == [] and kv[r.STREAMS] == [] and kv[r.NAMES] == []


def test_expired_stream_can_be_recreated_with_any_config(h: H) -> None:
    old = h.create("s", ttl=1, body=b"old")
    h.append("s", b"x", producer=P(0, 0))
    new = h.create("s", JSON, now=T0 + 1000)
    assert new.code is Code.CREATED and new.sid != old.sid
    assert h.json("s") == []
    assert h.meta("s").ttl is None
    assert h.append("s", b"1", JSON, producer=P(0, 0)).code is Code.APPENDED  # no producer state left


def test_expires_at_is_absolute(h: H) -> None:
    h.create("s", expires_at=T0 + 3000)
    assert h.append("s", b"a", now=T0 + 2999).code is Code.APPENDED
    assert h.one(Touch(B, "s"), now=T0 + 2999).code is Code.OK
    assert h.append("s", b"b", now=T0 + 3000).code is Code.NOT_FOUND


def test_touch_renews_sliding_ttl(h: H) -> None:
    h.create("s", ttl=2)
    assert h.one(Touch(B, "s"), now=T0 + 1500).code is Code.OK
    assert h.append("s", b"a", now=T0 + 3000).code is Code.APPENDED
    # A Touch stands for a read the leader served (its local renewal may be newer than the log's).
    assert h.one(Touch(B, "s"), now=T0 + 5000).code is Code.OK
    assert h.append("s", b"b", now=T0 + 6999).code is Code.APPENDED
    assert h.append("s", b"c", now=T0 + 9000).code is Code.NOT_FOUND
    assert h.one(Touch(B, "nope")).code is Code.NOT_FOUND


def test_touched_in_command_counts_for_expiry(h: H) -> None:
    h.create("s", ttl=1)
    out = h.one(Append(B, "s", TEXT, b"a", touched=T0 + 900), now=T0 + 1500)
    assert out.code is Code.APPENDED


def test_close_only_renews_ttl(h: H) -> None:
    h.create("s", ttl=2)
    assert h.one(Append(B, "s", None, b"", close=True), now=T0 + 1500).code is Code.APPENDED
    assert h.meta("s").touched_at == T0 + 1500
    assert h.one(Touch(B, "s"), now=T0 + 3000).code is Code.OK


@pytest.mark.parametrize("close", [False, True])
def test_an_earlier_stamp_does_not_shorten_a_renewal(h: H, close: bool) -> None:
    """An append (or close) stamped by a leader whose clock is behind the last one's set the renewal
    back, as a Touch never did: the stream was collected before the deadline its renewal had set."""
    h.create("s", ttl=60)
    assert h.one(Touch(B, "s"), now=T0 + 30_000).code is Code.OK
    assert h.one(Append(B, "s", TEXT, b"" if close else b"x", close=close), now=T0 + 20_000).code is Code.APPENDED
    assert h.meta("s").touched_at == T0 + 30_000
    h.one(CollectExpired([h.meta("s").sid]), now=T0 + 85_000)
    assert h.meta("s") is not None
    if close:  # closing a closed stream renews too
        assert h.one(Append(B, "s", None, b"", close=True), now=T0 + 25_000).code is Code.APPENDED
        assert h.meta("s").touched_at == T0 + 30_000


def test_the_machine_keeps_the_latest_stamp_it_applied(h: H) -> None:
    h.create("s", now=T0 + 500)
    h.append("s", b"a", now=T0 + 200)
    assert h.sm.latest_now == T0 + 500


def test_producer_close_only_renews_ttl(h: H) -> None:
    h.create("s", ttl=2)
    out = h.one(Append(B, "s", None, b"", producer=P(0, 0), close=True), now=T0 + 1500)
    assert out.code is Code.APPENDED
    assert h.one(Touch(B, "s"), now=T0 + 3000).code is Code.OK


def test_collect_expired(h: H) -> None:
    a = h.create("a", ttl=1).sid
    b = h.create("b", ttl=10).sid
    c = h.create("c").sid
    assert h.one(CollectExpired([a, b, c, 999]), now=T0 + 5000).code is Code.OK
    assert h.meta("a") is None
    assert h.meta("b") is not None and h.meta("c") is not None


def test_expired_stream_does_not_block_its_name(h: H) -> None:
    old = h.create("a", ttl=1, body=b"x")
    h.create("b", now=T0 + 5000)
    new = h.create("a", now=T0 + 5000)
    assert new.code is Code.CREATED and new.sid != old.sid
    assert h.text("a") == b""
