"""The configuration and what a leader knows of each peer (etcd's tracker): votes, progress, quorums.

Replication to a peer is pipelined: `next` moves past what was sent without waiting for the answer,
and a rejection moves it back one probe at a time until the logs agree. At most MAX_INFLIGHT messages
with entries go unanswered: under load the entries proposed meanwhile wait and go in one message, so a
busy leader sends fewer, larger ones (a heartbeat still goes; it follows them, as a peer's messages
keep their order, and a lost one is found when the peer rejects the heartbeat). A peer that needs entries
the leader has compacted away gets a checkpoint (the state machine's store) instead: until it has
installed it, the peer gets only empty probes at the leader's checkpoint index, and rejections of
those leave `next` alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from app.raft.messages import Membership

MAX_INFLIGHT = 2  # AppendEntries with entries a peer may leave unanswered; newer entries wait and go together


@dataclass
class Progress:
    next: int  # the next index to send
    match: int = 0  # the highest index known to be replicated
    checkpointing: bool = False  # a checkpoint is being streamed to the peer
    heard: int = -1  # the leader's clock (ticks) when this peer last sent it anything
    inflight: deque[int] = field(default_factory=deque)  # the last index of each unanswered AppendEntries

    @property
    def full(self) -> bool:
        return len(self.inflight) >= MAX_INFLIGHT

    def sent(self, last: int) -> None:
        self.inflight.append(last)
        self.next = last + 1

    def acked(self, match: int, checkpoint_index: int) -> bool:
        """Takes a successful reply up to `match`; True when it moved `match` forward."""
        updated = match > self.match
        if updated:
            self.match = match
        while self.inflight and self.inflight[0] <= match:
            self.inflight.popleft()
        self.next = max(self.next, match + 1)
        if self.next > checkpoint_index:
            self.checkpointing = False  # caught up from a checkpoint: back to the log
        return updated

    def rejected(self, hint: int) -> bool:
        """Backs `next` off after a rejection; False (nothing to resend) while a checkpoint is in flight."""
        if self.checkpointing:
            return False
        self.next = max(1, min(self.next - 1, hint + 1))
        self.inflight.clear()
        return True

    def needs_checkpoint(self, checkpoint_index: int) -> bool:
        """True once when what the peer needs is compacted away: the caller ships a checkpoint."""
        if self.next > checkpoint_index or self.checkpointing:
            return False
        self.checkpointing = True
        self.inflight.clear()
        return True


class ProgressTracker:
    """Voters and learners; the votes of the current election; on a leader, each peer's progress."""

    def __init__(self, node_id: int, voters: list[int], learners: list[int]) -> None:
        self.id = node_id
        self.voters = sorted(voters)
        self.learners = sorted(learners)
        self.progress: dict[int, Progress] = {}  # a leader's peers only
        self.votes: set[int] = set()
        self.active: set[int] = set()  # voters heard from since the leader's last quorum check

    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    def peers(self) -> list[int]:
        """Every node a leader replicates to: voters and learners but this one."""
        return [n for n in (*self.voters, *self.learners) if n != self.id]

    def voting_peers(self) -> list[int]:
        return [v for v in self.voters if v != self.id]

    def majority(self, value: Callable[[int], int]) -> int:
        """The highest `value` a majority of the voters has reached."""
        if not self.voters:
            return 0
        return sorted((value(v) for v in self.voters), reverse=True)[self.quorum() - 1]

    def match_indexes(self) -> dict[int, int]:
        return {peer: pr.match for peer, pr in self.progress.items()}

    # Elections

    def reset_votes(self) -> None:
        self.votes = {self.id}

    def record_vote(self, voter: int) -> bool:
        """Counts a granted vote; True once the votes make a quorum."""
        self.votes.add(voter)
        return self.won()

    def won(self) -> bool:
        return len(self.votes) >= self.quorum()

    # Leading

    def lead(self, next_index: int) -> None:
        """A new leader starts every peer just past its own log and counts check-quorum afresh."""
        self.active = set()
        self.progress = {p: Progress(next_index) for p in self.peers()}

    def quorum_active(self) -> bool:
        """Check-quorum: whether a majority was heard from since the last check, which starts a new one."""
        active = len(self.active) + 1 >= self.quorum()
        self.active = set()
        return active

    def set_config(self, voters: list[int], learners: list[int], next_index: int, leading: bool) -> None:
        """Adopts a committed configuration; a leader starts tracking new peers and forgets removed ones."""
        self.voters, self.learners = sorted(voters), sorted(learners)
        if not leading:
            return
        peers = set(self.peers())
        for peer in peers - set(self.progress):
            self.progress[peer] = Progress(next_index)
        for peer in set(self.progress) - peers:
            del self.progress[peer]

    def change_error(self, new: Membership) -> str | None:
        """Why `new` is not a one-node change of this configuration; None when it is."""
        old_voters, old_learners = set(self.voters), set(self.learners)
        voters, learners = set(new.voters), set(new.learners)
        if not voters or voters & learners:
            return "a configuration needs voters, and no node can be both voter and learner"
        added, removed = (
            (voters | learners) - (old_voters | old_learners),
            (old_voters | old_learners) - (voters | learners),
        )
        promoted = voters & old_learners
        if len(added) + len(removed) + len(promoted) != 1 or (added & voters) or (voters - old_voters - promoted):
            return "change one node at a time: add a learner, promote a learner, or remove a node"
        return None
