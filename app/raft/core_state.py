"""The core's state as its helper modules see it: a Protocol, so they need not import the core."""

from __future__ import annotations

from typing import Protocol

from app.raft.messages import Message
from app.raft.progress import ProgressTracker
from app.raft.raft_log import RaftLog
from app.raft.read_only import ReadOnly
from app.raft.ready import Role


class CoreState(Protocol):
    """What the leader's functions and the validator read and write of the Raft core (app/raft/core.py satisfies it), so
    the modules the core calls (leader.py, validate.py) do not import the core that imports them."""

    id: int
    term: int
    commit: int
    role: Role
    clock: int
    election_ticks: int
    heartbeat_ticks: int
    commit_alone: bool
    transferee: int
    transfer_elapsed: int
    tracker: ProgressTracker
    log: RaftLog
    read_only: ReadOnly
    outbox: list[Message]
    checkpoint_requests: list[int]
    read_states: list[tuple[int, int]]
