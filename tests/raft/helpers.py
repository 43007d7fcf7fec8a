"""Helpers shared by the Raft core tests."""

from __future__ import annotations

from app.raft.core import RaftCore
from app.raft.ready import Ready


def drain(core: RaftCore) -> Ready:
    """Runs one Ready as a driver would: persist, then report it."""
    rd = core.ready()
    if rd.entries:
        core.on_persisted(rd.entries[-1].index, rd.entries[-1].term)
    if rd.committed:
        core.on_applied(rd.committed[-1].index)
    return rd
