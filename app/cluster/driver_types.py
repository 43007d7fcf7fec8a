"""What the Raft driver works with: the state machine and checkpoint link it is given, the Status
it reports, and the Readys it merges while a sync is in flight."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.raft.messages import Entry, HardState, Membership, Message
from app.raft.ready import Ready, Role
from app.storage.kv import KV


class StateMachine(Protocol):
    applied_index: int
    applied_term: int
    membership: Membership | None

    @property
    def kv(self) -> KV: ...

    def apply(self, entries: list[Entry], known: dict[int, Any] | None = None) -> list[Any]: ...

    def make_durable(self) -> None: ...

    def reload(self, kv: KV) -> None: ...


class CheckpointLink(Protocol):
    async def send(self, peer: int, term: int) -> bool: ...

    def install(self) -> None: ...


@dataclass(frozen=True)
class Status:
    """The node's Raft state at one moment, by value (etcd's `Status`)."""

    id: int
    role: Role
    term: int
    leader: int  # 0 when unknown
    commit: int
    applied: int
    last_index: int
    checkpoint_index: int  # the log is compacted up to here: earlier entries live only in the state store
    voters: tuple[int, ...]
    learners: tuple[int, ...]
    match: dict[int, int]  # on a leader, the highest index each peer is known to hold; empty otherwise


Send = Callable[[list[Message]], Awaitable[None]]


@dataclass
class Unsaved:
    """Readys waiting for the next sync, merged: latest hard state, entries in log order, messages."""

    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)

    def add(self, rd: Ready) -> None:
        if rd.hard_state is not None:
            self.hard_state = rd.hard_state
        if rd.entries:
            first = rd.entries[0].index
            # A later Ready may replace a suffix (a follower truncating a divergent tail).
            self.entries = [e for e in self.entries if e.index < first] + rd.entries
        self.messages += rd.messages

    def __bool__(self) -> bool:
        return self.hard_state is not None or bool(self.entries) or bool(self.messages)
