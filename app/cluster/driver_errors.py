"""What the Raft driver raises to the callers of `propose`, `change_membership` and `read_barrier`."""

from __future__ import annotations


class NotLeader(Exception):
    def __init__(self, leader: int) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class ProposalDropped(Exception):
    """The entry was replaced by another leader's before it committed, or its outcome came back
    inside an installed checkpoint, where it cannot be read; either way the caller retries."""


class MembershipRefused(Exception):
    pass


class MembershipBusy(MembershipRefused):
    """The previous change (or one a new leader inherited) is not applied yet: the same request may
    go through in a moment."""
