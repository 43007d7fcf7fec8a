"""What the Raft driver works with: the state machine and checkpoint link it is given, and the Status
it reports."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from app.raft.messages import Entry, Membership, Message
from app.raft.ready import Role
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
