"""What the core hands its driver: the node's role, and a Ready after each round of inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from app.raft.messages import Entry, HardState, Message


class Role(Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre-candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@dataclass
class Ready:
    hard_state: HardState | None = None
    entries: list[Entry] = field(default_factory=list)  # persist; may replace a suffix from entries[0].index
    messages: list[Message] = field(default_factory=list)  # send only after persisting
    committed: list[Entry] = field(default_factory=list)  # apply in order
    checkpoints: list[int] = field(default_factory=list)  # peers to stream a checkpoint to
    reads: list[tuple[int, int]] = field(default_factory=list)  # (ctx, read index; 0 when refused)
    refused: list[tuple[int, str]] = field(default_factory=list)  # (peer, why): peer input refused

    def __bool__(self) -> bool:
        parts = (self.hard_state, self.entries, self.messages, self.committed, self.checkpoints, self.reads)
        return any(parts) or bool(self.refused)
