"""CreateStream: a new stream, idempotent re-create, and configuration conflicts."""

from __future__ import annotations

import pytest

from app.state_machine import records as r
from app.state_machine.commands import Code
from tests.state_machine.helpers import JSON, T0, TEXT, B, H, jrec


def test_create_stream(h: H) -> None:
    out = h.create("s")
    assert out.code is Code.CREATED and out.sid > 0 and out.next_pos == 0 and not out.closed
    meta = h.meta("s")
    assert (meta.content_type, meta.json, meta.created_at, meta.tail, meta.closed) == (TEXT, False, T0, 0, False)
    assert h.text("s") == b""
    assert h.kv.get(r.NAMES, r.name_key(B, "s")) == r.sid_key(out.sid)
    assert r.decode_meta(h.kv.get(r.STREAMS, r.sid_key(out.sid))) == meta


def test_create_with_body(h: H) -> None:
    out = h.create("s", body=b"hello")
    assert out.code is Code.CREATED and out.next_pos > 0
    assert h.text("s") == b"hello"
    out = h.create("j", JSON, body=jrec({"a": 1}, [1, 2], "x,y"))
    assert out.code is Code.CREATED
    assert h.json("j") == [{"a": 1}, [1, 2], "x,y"]


def test_create_is_idempotent(h: H) -> None:
    first = h.create("s", ttl=60)
    a = h.append("s", b"abc")
    again = h.create("s", ttl=60)
    assert again.code is Code.EXISTS
    assert again.sid == first.sid and again.next_pos == a.next_pos and not again.closed


def test_idempotent_create_does_not_append_its_body(h: H) -> None:
    h.create("s", body=b"one")
    assert h.create("s", body=b"one").code is Code.EXISTS
    assert h.text("s") == b"one"


def test_create_compares_normalised_content_types(h: H) -> None:
    h.create("s", "application/json")
    assert h.create("s", "APPLICATION/JSON").code is Code.EXISTS
    assert h.create("s", "application/json; charset=utf-8").code is Code.EXISTS
    assert h.meta("s").content_type == "application/json"


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ({"ct": TEXT}, {"ct": JSON}),
        ({"ttl": 3600}, {"ttl": 7200}),
        ({"ttl": 3600}, {}),
        ({}, {"ttl": 3600}),
        ({"expires_at": T0 + 10_000}, {"expires_at": T0 + 20_000}),
        ({"expires_at": T0 + 10_000}, {"ttl": 10}),
        ({"closed": True}, {}),
        ({}, {"closed": True}),
    ],
)
def test_create_with_a_different_config_conflicts(h: H, first: dict, second: dict) -> None:
    assert h.create("s", **first).code is Code.CREATED
    assert h.create("s", **second).code is Code.CONFIG_MISMATCH
    assert h.create("s", **first).code is Code.EXISTS


def test_create_closed_and_idempotency_follows_the_closed_status(h: H) -> None:
    out = h.create("s", body=b"initial content", closed=True)
    assert out.code is Code.CREATED and out.closed and out.next_pos == len(b"initial content")
    assert h.text("s") == b"initial content"
    assert h.create("s", closed=True).code is Code.EXISTS
    assert h.create("s").code is Code.CONFIG_MISMATCH
    # A stream closed by an append now has closed status too.
    h.create("t")
    h.close("t")
    assert h.create("t").code is Code.CONFIG_MISMATCH
    again = h.create("t", closed=True)
    assert again.code is Code.EXISTS and again.closed


def test_plain_create_over_a_fork_conflicts(h: H) -> None:
    h.create("src", body=b"x")
    h.fork("f", "src", ct=TEXT)
    assert h.create("f").code is Code.CONFIG_MISMATCH
