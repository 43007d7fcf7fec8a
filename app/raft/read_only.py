"""A leader's linearizable reads (ReadIndex), with a lease.

The leader notes its commit index and confirms it still leads by hearing from a majority in a
heartbeat round started no earlier than the request; the reader then waits until it has applied
that index. A leader whose majority confirmed it within the last election timeout (minus a tick of
slack for clock drift) answers at once: no follower that heard it then will vote for another leader
before that lease runs out.
"""

from __future__ import annotations

from app.raft.progress import ProgressTracker


class ReadOnly:
    """Heartbeat rounds, the latest round each voter answered, and the reads waiting on a round."""

    def __init__(self) -> None:
        self.round = 0  # the leader's heartbeat round
        self.round_ticks: dict[int, int] = {}  # round -> clock when it began
        self.acked: dict[int, int] = {}  # voter -> latest round it answered
        self.pending: list[tuple[int, int, int]] = []  # (round, ctx, requester)
        self.lease_from = 0  # only rounds begun at or after this clock give a lease (see `fence`)

    def lead(self) -> None:
        """A new leader counts answers afresh."""
        self.acked, self.round_ticks = {}, {}

    def new_round(self, clock: int, election_ticks: int) -> None:
        self.round += 1
        self.round_ticks[self.round] = clock
        # Rounds begun an election timeout ago give no lease any more: forget them (oldest first).
        while (oldest := next(iter(self.round_ticks))) != self.round:
            if clock - self.round_ticks[oldest] < election_ticks:
                break
            del self.round_ticks[oldest]

    def fence(self, clock: int) -> None:
        """No lease from a round begun before `clock`: another node may be elected until then."""
        self.lease_from = max(self.lease_from, clock)

    def ack(self, peer: int, round: int) -> bool:
        """Records that `peer` answered `round`; True when that may release waiting reads."""
        if round <= self.acked.get(peer, 0):
            return False
        self.acked[peer] = round
        return bool(self.pending)

    def confirmed(self, tracker: ProgressTracker) -> int:
        """The latest round a majority of voters (this leader included) has answered."""
        return tracker.majority(lambda v: self.round if v == tracker.id else self.acked.get(v, 0))

    def leased(self, tracker: ProgressTracker, clock: int, election_ticks: int) -> bool:
        began = self.round_ticks.get(self.confirmed(tracker), -(10**9))
        return began >= self.lease_from and clock - began < election_ticks - 1

    def needs_round(self) -> bool:
        """Whether a read asked now needs a round that starts after it."""
        return not self.pending or self.pending[-1][0] != self.round + 1

    def wait(self, ctx: int, requester: int) -> None:
        self.pending.append((self.round, ctx, requester))

    def release(self, tracker: ProgressTracker) -> list[tuple[int, int]]:
        """Takes the (ctx, requester) of the reads a majority has confirmed since they were asked."""
        confirmed = self.confirmed(tracker)
        released = [(ctx, requester) for round, ctx, requester in self.pending if round <= confirmed]
        self.pending = [read for read in self.pending if read[0] > confirmed]
        return released

    def drop(self) -> list[tuple[int, int]]:
        """Takes every waiting read: a leader stepping down refuses them."""
        dropped = [(ctx, requester) for _, ctx, requester in self.pending]
        self.pending = []
        return dropped
