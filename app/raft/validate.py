"""Peer input the core refuses: messages that no correct node could send, given what this node holds.

A signed message comes from a node with the cluster secret, but that node may be buggy, compromised
or restored from an old disk. Nothing it sends may make this node contradict what it has committed
(overwrite a committed entry), corrupt its log (entries out of order), or believe a follower holds
entries this leader never had. Such a message is refused whole, before it changes any state; the
driver logs and counts it, and the node keeps running.
"""

from __future__ import annotations

import msgspec

from app.raft.core_state import CoreState
from app.raft.messages import (
    MEMBERSHIP,
    NORMAL,
    AppendEntries,
    AppendResponse,
    Message,
    ReadIndexResponse,
    decode_membership,
)
from app.raft.ready import Role

# Why a message was refused: the label /metrics counts it under.
NEGATIVE = "negative_number"
MISADDRESSED = "misaddressed"
ENTRIES_OUT_OF_ORDER = "entries_out_of_order"
ENTRY_TERM_AHEAD = "entry_term_ahead"
BAD_ENTRY = "bad_entry"
OVERWRITES_COMMITTED = "overwrites_committed"
MATCH_BEYOND_LOG = "match_beyond_log"
STALE_TERM = "stale_term"  # answered as Raft says (a refusal), and counted
STALE_CHECKPOINT = "stale_checkpoint"  # counted by the driver: checkpoints do not pass through the core


def refusal(core: CoreState, msg: Message) -> str | None:
    """Why `msg` must be refused, or None. Costs at most one look per entry the message carries."""
    if msg.dst != core.id or msg.src == core.id:
        return MISADDRESSED
    if msg.term < 0 or any(value < 0 for value in _numbers(msg)):
        return NEGATIVE
    if isinstance(msg, AppendEntries):
        return _append_refusal(core, msg)
    # A follower acknowledges only entries this leader sent it: none past the leader's log.
    leading = core.role is Role.LEADER and msg.term == core.term
    if isinstance(msg, AppendResponse) and msg.success and leading and msg.match_index > core.log.last_index():
        return MATCH_BEYOND_LOG
    return None


def _append_refusal(core: CoreState, msg: AppendEntries) -> str | None:
    if msg.prev_term > msg.term:
        return ENTRY_TERM_AHEAD
    previous = msg.prev_term
    for offset, entry in enumerate(msg.entries):
        if entry.index != msg.prev_index + 1 + offset:
            return ENTRIES_OUT_OF_ORDER
        if entry.term > msg.term or entry.term < previous:
            return ENTRY_TERM_AHEAD
        if entry.kind != NORMAL and (entry.kind != MEMBERSHIP or not _is_membership(entry.data)):
            return BAD_ENTRY
        previous = entry.term
    if msg.term < core.term:
        return None  # answered with a refusal by the core, as Raft says
    # Committed entries are never replaced: any leader of a later term holds them (Leader Completeness).
    log = core.log
    for entry in msg.entries:
        if entry.index > core.commit:
            break
        existing = log.term_at(entry.index)
        if existing is not None and existing != entry.term:
            return OVERWRITES_COMMITTED
    return None


def _is_membership(data: bytes) -> bool:
    try:
        decode_membership(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return False
    return True


def _numbers(msg: Message) -> tuple[int, ...]:
    if isinstance(msg, AppendEntries):
        return (msg.prev_index, msg.prev_term, msg.commit)
    if isinstance(msg, AppendResponse):
        return (msg.match_index,)
    if isinstance(msg, ReadIndexResponse):
        return (msg.index,)
    return ()
