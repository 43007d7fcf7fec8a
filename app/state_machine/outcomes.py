"""Outcomes that report a stream's position: where the next append lands, and whether it is closed."""

from __future__ import annotations

from app.state_machine import records as r
from app.state_machine.commands import Code, Outcome


def stream_outcome(code: Code, meta: r.StreamMeta, message: str = "") -> Outcome:
    return Outcome(code, message, sid=meta.sid, next_pos=meta.tail, closed=meta.closed)


def history_outcome(code: Code, meta: r.StreamMeta, message: str = "") -> Outcome:
    """A stream outcome that also gives the earliest retained position."""
    return Outcome(code, message, sid=meta.sid, next_pos=meta.tail, closed=meta.closed, earliest=meta.earliest)
