"""Raft log entries and the messages peers exchange (msgspec structs, msgpack on the wire)."""

from __future__ import annotations

import msgspec

NORMAL, MEMBERSHIP = 0, 1  # entry kinds


class Entry(msgspec.Struct, array_like=True, frozen=True):
    term: int
    index: int
    data: bytes  # empty for the no-op a new leader appends
    kind: int = NORMAL  # MEMBERSHIP entries carry an encoded Membership


MAX_NODE_ID = (1 << 63) - 1  # ids travel as msgpack integers; no cluster needs more


def parse_node_id(text: str) -> int | None:
    """A node id written in ASCII digits (`str.isdigit` takes any script's), within MAX_NODE_ID; else None."""
    if not text or len(text) > 19 or not text.isascii() or not text.isdigit():
        return None
    value = int(text)
    return value if 1 <= value <= MAX_NODE_ID else None


class Membership(msgspec.Struct, array_like=True, frozen=True):
    """The whole configuration after a change: node id -> advertised URL, for voters and learners.

    A membership entry takes effect when it commits, and a leader proposes one only when the
    previous one has been applied, so configurations change one node at a time.
    """

    voters: dict[int, str]
    learners: dict[int, str] = {}


class HardState(msgspec.Struct, array_like=True):
    term: int = 0
    vote: int = 0  # 0 means no vote this term
    commit: int = 0


class RequestVote(msgspec.Struct, tag=True, array_like=True):
    term: int  # for a pre-vote: the term the candidate would campaign in
    src: int
    dst: int
    last_index: int
    last_term: int
    pre_vote: bool = False
    transfer: bool = False  # campaigning because the leader handed over: leases do not apply


class VoteResponse(msgspec.Struct, tag=True, array_like=True):
    term: int
    src: int
    dst: int
    granted: bool
    pre_vote: bool = False


class AppendEntries(msgspec.Struct, tag=True, array_like=True):
    term: int
    src: int
    dst: int
    prev_index: int
    prev_term: int
    entries: list[Entry]
    commit: int
    round: int = 0  # the leader's heartbeat round, echoed back: it confirms leadership for reads


class AppendResponse(msgspec.Struct, tag=True, array_like=True):
    term: int
    src: int
    dst: int
    success: bool
    match_index: int  # on success: last index the follower holds; on reject: a hint to back off to
    round: int = 0


class TimeoutNow(msgspec.Struct, tag=True, array_like=True):
    """From a leader handing over: campaign now, without waiting for a timeout."""

    term: int
    src: int
    dst: int


class ReadIndex(msgspec.Struct, tag=True, array_like=True):
    """From a follower: what must I have applied to answer a read linearizably?"""

    term: int
    src: int
    dst: int
    ctx: int


class ReadIndexResponse(msgspec.Struct, tag=True, array_like=True):
    term: int
    src: int
    dst: int
    ctx: int
    index: int  # 0: refused (no longer the leader)


Message = RequestVote | VoteResponse | AppendEntries | AppendResponse | TimeoutNow | ReadIndex | ReadIndexResponse

_encoder = msgspec.msgpack.Encoder()
_message_decoder = msgspec.msgpack.Decoder(Message)
_entry_decoder = msgspec.msgpack.Decoder(Entry)
_hard_state_decoder = msgspec.msgpack.Decoder(HardState)
_membership_decoder = msgspec.msgpack.Decoder(Membership)


def encode(obj: msgspec.Struct) -> bytes:
    return _encoder.encode(obj)


def decode_message(raw: bytes) -> Message:
    return _message_decoder.decode(raw)


def decode_entry(raw: bytes) -> Entry:
    return _entry_decoder.decode(raw)


def decode_hard_state(raw: bytes) -> HardState:
    return _hard_state_decoder.decode(raw)


def decode_membership(raw: bytes) -> Membership:
    return _membership_decoder.decode(raw)
