"""A bucket's usage (what its bytes quota measures) counts its streams' published snapshots, as they
are published and deleted and their streams removed, and the same after a reload."""

from __future__ import annotations

from app.state_machine.commands import Code, CreateStream, DeleteSnapshot, DeleteStream, PublishSnapshot
from app.state_machine.machine import StateMachine
from tests.state_machine.helpers import TEXT, B, H


def _publish(h: H, stream: str, pos: int, size: int) -> None:
    digest = f"{pos:064x}"
    assert h.one(PublishSnapshot(B, stream, pos, TEXT, digest, size, inline=b"x" * size)).code is Code.CREATED


def test_snapshots_count_in_their_buckets_usage() -> None:
    h = H()
    assert h.one(CreateStream(B, "s", TEXT, False, body=b"0123456789")).code is Code.CREATED
    assert h.one(CreateStream(B, "t", TEXT, False, body=b"abc")).code is Code.CREATED
    _publish(h, "s", 0, 100)
    _publish(h, "s", 10, 1000)
    _publish(h, "t", 3, 7)
    assert h.sm.bucket_usage(B) == (2, 13 + 1107)
    assert StateMachine(h.kv).bucket_usage(B) == (2, 1120)  # derived again on load
    assert h.one(DeleteSnapshot(B, "s", 0)).code is Code.DELETED
    assert h.sm.bucket_usage(B) == (2, 13 + 1007)
    assert h.one(DeleteStream(B, "s")).code is Code.DELETED
    assert h.sm.bucket_usage(B) == (1, 3 + 7)
    assert StateMachine(h.kv).bucket_usage(B) == (1, 10)
