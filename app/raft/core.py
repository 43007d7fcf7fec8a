"""Pure Raft: messages and ticks in, a Ready (what to persist, send and apply) out.

With pre-vote, a node that lost touch first asks whether it could win before it bumps its term, so
a partitioned node rejoining does not depose a healthy leader. With check-quorum, a leader that has
not heard from a majority for an election timeout steps down, and followers that heard from a
leader within that time ignore vote requests (the leader's lease).

Learners receive the log but neither vote nor count toward commits. Membership entries replace the
whole configuration when they commit, one node at a time (app/raft/progress.py). The leader's half
(replication, commits, reads) is in app/raft/leader.py; linearizable reads use ReadIndex with a
lease (app/raft/read_only.py). A follower that needs entries the leader has compacted away gets a
checkpoint instead: the core names the peer in `Ready.checkpoints`, the driver streams the state
machine's store to it, and the follower's driver calls `install_checkpoint` once the store is in
place.

No I/O, no clock, no asyncio. The driver owns disk and network: for every Ready it persists the
hard state and entries (synced), then sends the messages, then applies the committed entries and
reports back with `on_persisted` and `on_applied`. Randomness (election jitter) comes from a seeded
generator, so a simulation replays exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from app.raft.leader import (
    answer_read,
    broadcast_append,
    maybe_commit,
    send_appends,
    serve_read,
    start_transfer,
    step_leader,
)
from app.raft.messages import (
    MEMBERSHIP,
    AppendEntries,
    AppendResponse,
    Entry,
    HardState,
    Membership,
    Message,
    ReadIndex,
    ReadIndexResponse,
    RequestVote,
    TimeoutNow,
    VoteResponse,
    decode_membership,
)
from app.raft.progress import ProgressTracker
from app.raft.raft_log import RaftLog
from app.raft.read_only import ReadOnly
from app.raft.ready import Ready, Role
from app.raft.validate import STALE_TERM, refusal

# Why a membership change must wait: the last one (or one a new leader inherited) is not applied yet.
CHANGE_IN_PROGRESS = "another membership change is still in progress"


class RaftCore:
    def __init__(
        self,
        node_id: int,
        voters: list[int],
        hard_state: HardState,
        entries: list[Entry],
        *,
        learners: list[int] | None = None,
        compacted_index: int = 0,
        compacted_term: int = 0,
        applied: int = 0,
        seed: int = 0,
        election_ticks: int = 10,
        heartbeat_ticks: int = 1,
        pre_vote: bool = True,
        check_quorum: bool = True,
    ) -> None:
        self.id = node_id
        self.tracker = ProgressTracker(node_id, voters, learners or [])
        self.log = RaftLog(entries, compacted_index, compacted_term)
        self.read_only = ReadOnly()
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.commit = max(hard_state.commit, compacted_index)
        self.applied = max(applied, compacted_index)
        self.role = Role.FOLLOWER
        self.leader = 0
        self.rng = random.Random(seed * 7919 + node_id)
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.elapsed = 0
        self.timeout = self._random_timeout()
        self.pre_vote = pre_vote
        self.check_quorum = check_quorum
        # TEST ONLY (`rill bench chaos --broken commit-alone`): a leader commits what its own disk
        # holds, without a majority, so the chaos checker can show it catches the loss this causes.
        self.commit_alone = False
        self.quorum_elapsed = 0
        self.clock = 0  # ticks since start: the leader's lease is measured in them
        self.transferee = 0  # the peer a leader is handing over to; it takes no proposals meanwhile
        self.transfer_elapsed = 0
        self.pending_membership = 0  # index of the last membership entry a leader proposed
        self._replicate = False
        # What the next Ready hands out: messages to send, peers to stream a checkpoint to, answered reads.
        self.outbox: list[Message] = []
        self.checkpoint_requests: list[int] = []
        self.read_states: list[tuple[int, int]] = []  # (ctx, read index; 0 when refused)
        self.refused: list[tuple[int, str]] = []  # (peer, why) for each message refused (app/raft/validate.py)
        self._emitted = HardState(self.term, self.vote, self.commit)

    @property
    def voters(self) -> list[int]:
        return self.tracker.voters

    @property
    def learners(self) -> list[int]:
        return self.tracker.learners

    # Inputs

    def tick(self) -> None:
        self.clock += 1
        self.elapsed += 1
        if self.role is Role.LEADER:
            if self.transferee:
                self.transfer_elapsed += 1
                if self.transfer_elapsed >= self.election_ticks or self._transferee_silent():
                    self.transferee = 0  # the hand-over stalled: keep leading
            self.quorum_elapsed += 1
            if self.check_quorum and self.quorum_elapsed >= self.election_ticks:
                self.quorum_elapsed = 0
                if not self.tracker.quorum_active():
                    self._become_follower(self.term, 0)  # cut off from a majority: stop accepting writes
                    return
            if self.elapsed >= self.heartbeat_ticks:
                self.elapsed = 0
                self.read_only.new_round(self.clock, self.election_ticks)
                broadcast_append(self)
        elif self.elapsed >= self.timeout and self.id in self.voters:
            self.start_election()

    def _transferee_silent(self) -> bool:
        """The peer being handed over to answered none of the heartbeats of half an election timeout
        (three at least): it has stopped (a node going away just before this one), and would never
        campaign. A live one answers each, and asks for votes as soon as it is told to."""
        target = self.tracker.progress.get(self.transferee)
        window = max(3 * self.heartbeat_ticks, self.election_ticks // 2)
        return target is None or (self.transfer_elapsed > window and self.clock - target.heard > window)

    def start_election(self) -> None:
        """Campaigns, after a pre-vote round when pre-vote is on."""
        if not self.pre_vote or self._solicit_votes(Role.PRE_CANDIDATE, self.term + 1, pre_vote=True):
            self.campaign()

    def campaign(self, transfer: bool = False) -> None:
        self.term += 1
        self.vote = self.id
        if self._solicit_votes(Role.CANDIDATE, self.term, transfer=transfer):
            self._become_leader()

    def _solicit_votes(self, role: Role, term: int, pre_vote: bool = False, transfer: bool = False) -> bool:
        """Starts a (pre-)vote round for `term`; True when this node alone is a quorum."""
        self.role = role
        self.leader = 0
        self.tracker.reset_votes()
        self.elapsed = 0
        self.timeout = self._random_timeout()
        if self.tracker.won():
            return True
        last_index, last_term = self.log.last_index(), self.log.last_term()
        for peer in self.tracker.voting_peers():
            self.outbox.append(RequestVote(term, self.id, peer, last_index, last_term, pre_vote, transfer))
        return False

    def propose(self, data: bytes) -> int | None:
        """Appends `data` to the leader's log; returns its index, or None when not leader."""
        if self.role is not Role.LEADER or self.transferee:
            return None
        self._replicate = True  # sent once per Ready, so proposals made together travel together
        return self.log.append(self.term, data)

    def membership_error(self, new: Membership) -> str | None:
        """Why `new` cannot be proposed now; None when it can."""
        if self.role is not Role.LEADER or self.transferee:
            return "not the leader"
        if self.pending_membership > self.applied:
            return CHANGE_IN_PROGRESS
        return self.tracker.change_error(new)

    def propose_membership(self, new: Membership, data: bytes) -> int | None:
        """Appends a membership entry (`data` encodes `new`); None when `membership_error` objects."""
        if self.membership_error(new) is not None:
            return None
        self.pending_membership = self.log.append(self.term, data, MEMBERSHIP)
        self._replicate = True
        return self.pending_membership

    def transfer_leadership(self) -> int:
        """Hands leadership to the most caught-up voter; returns it (0 when there is none)."""
        return start_transfer(self)

    def read_index(self, ctx: int) -> bool:
        """Asks for a read index; it comes back as (ctx, index) in `Ready.reads`. False: no leader."""
        if self.role is Role.LEADER:
            serve_read(self, ctx, self.id)
        elif self.leader:
            self.outbox.append(ReadIndex(self.term, self.id, self.leader, ctx))
        else:
            return False
        return True

    def step(self, msg: Message) -> None:
        reason = refusal(self, msg)
        if reason is not None:
            self.refused.append((msg.src, reason))
            return
        if self.role is Role.LEADER and msg.src in self.voters:
            self.tracker.active.add(msg.src)
            heard = self.tracker.progress.get(msg.src)
            if heard is not None:
                heard.heard = self.clock
        if isinstance(msg, RequestVote) and not msg.transfer and self._in_lease():
            return  # a leader is alive as far as we know: do not help depose it
        if msg.term > self.term:
            if isinstance(msg, RequestVote) and msg.pre_vote:
                pass  # a pre-vote asks a question; it changes no term
            elif isinstance(msg, VoteResponse) and msg.pre_vote and msg.granted:
                pass
            else:
                leader = msg.src if isinstance(msg, AppendEntries) else 0
                self._become_follower(msg.term, leader)
        if msg.term < self.term:
            self.refused.append((msg.src, STALE_TERM))
            if isinstance(msg, AppendEntries):
                self.outbox.append(AppendResponse(self.term, self.id, msg.src, False, self.log.last_index()))
            elif isinstance(msg, RequestVote):
                self.outbox.append(VoteResponse(self.term, self.id, msg.src, False))
            elif isinstance(msg, ReadIndex):
                self.outbox.append(ReadIndexResponse(self.term, self.id, msg.src, msg.ctx, 0))
            return
        if isinstance(msg, RequestVote):
            self._on_request_vote(msg)
        elif isinstance(msg, AppendEntries):
            self._on_append(msg)  # any role: a current-term append names the leader
        elif isinstance(msg, ReadIndexResponse):
            self.read_states.append((msg.ctx, msg.index))
        else:
            STEPS[self.role](self, msg)

    def on_persisted(self, index: int, term: int) -> None:
        """The driver synced entries up to `index`; counts toward the leader's own match."""
        if self.log.persisted(index, term) and self.role is Role.LEADER:
            maybe_commit(self)

    def on_applied(self, index: int) -> None:
        self.applied = max(self.applied, index)

    def checkpoint_finished(self, peer: int) -> None:
        """The driver's transfer to `peer` ended, installed or not; if the peer still needs
        compacted entries, the next probe asks for another."""
        progress = self.tracker.progress.get(peer)
        if progress is not None:
            progress.checkpointing = False

    def can_install_checkpoint(self, term: int, index: int) -> bool:
        """Whether a checkpoint at `index` from a leader of `term` would move this node forward."""
        return term >= self.term and index > max(self.commit, self.applied)

    def install_checkpoint(self, term: int, leader: int, index: int, index_term: int, membership: Membership) -> None:
        """The driver has replaced the state machine's store with a checkpoint at (index, index_term)."""
        if term > self.term or self.role is not Role.FOLLOWER:
            self._become_follower(term, leader)
        self.leader, self.elapsed = leader, 0
        self.log.restore(index, index_term)
        self.commit = self.applied = index
        self._set_membership(membership)
        self.outbox.append(AppendResponse(self.term, self.id, leader, True, index))

    def compact(self, index: int) -> None:
        """Forgets entries up to `index` (already applied and covered by durable state)."""
        self.log.compact(min(index, self.applied))

    # Output

    def ready(self) -> Ready:
        if self._replicate:
            self._replicate = False
            if self.role is Role.LEADER:
                send_appends(self)
        rd = Ready()
        # Term and vote must be durable before we act on them; the commit index may lag on disk
        # (it is recovered from the leader), so it rides along but never forces a sync.
        if (self.term, self.vote) != (self._emitted.term, self._emitted.vote):
            rd.hard_state = self._emitted = HardState(self.term, self.vote, self.commit)
        rd.entries = self.log.take_unstable()
        if rd.entries:
            rd.hard_state = self._emitted = HardState(self.term, self.vote, self.commit)
        rd.messages, self.outbox = self.outbox, []
        rd.checkpoints, self.checkpoint_requests = self.checkpoint_requests, []
        rd.reads, self.read_states = self.read_states, []
        rd.refused, self.refused = self.refused, []
        upto = min(self.commit, self.log.stable, self.log.last_index())
        if upto > self.applied:
            rd.committed = self.log.slice(self.applied + 1, upto + 1)
            for entry in rd.committed:
                if entry.kind == MEMBERSHIP:
                    self._set_membership(decode_membership(entry.data))
        return rd

    # Role changes

    def _set_membership(self, membership: Membership) -> None:
        leading = self.role is Role.LEADER
        self.tracker.set_config(list(membership.voters), list(membership.learners), self.log.last_index() + 1, leading)
        if not leading:
            return
        if self.id not in self.voters:
            self._become_follower(self.term, 0)  # removed: a voter of the new configuration will lead
        else:
            maybe_commit(self)

    def _random_timeout(self) -> int:
        return self.election_ticks + self.rng.randrange(self.election_ticks)

    def _become_follower(self, term: int, leader: int) -> None:
        self.transferee = 0
        self.tracker.progress = {}
        self.checkpoint_requests = []
        for ctx, requester in self.read_only.drop():
            answer_read(self, ctx, requester, 0)
        if term != self.term:
            self.term = term
            self.vote = 0
        self.role = Role.FOLLOWER
        self.leader = leader
        self.elapsed = 0
        self.timeout = self._random_timeout()

    def _become_leader(self) -> None:
        self.role = Role.LEADER
        self.leader = self.id
        self.elapsed = 0
        self.quorum_elapsed = 0
        self.tracker.lead(self.log.last_index() + 1)
        self.read_only.lead()
        self.read_only.new_round(self.clock, self.election_ticks)
        # A no-op in the new term lets entries from earlier terms commit. Membership changes wait
        # until it is applied: a configuration change from an earlier term may still be in flight.
        self.propose(b"")
        self.pending_membership = self.log.last_index()
        maybe_commit(self)

    # Steps by role (RequestVote, AppendEntries and ReadIndexResponse are the same for every role;
    # the leader's is app/raft/leader.py's step_leader)

    def _step_candidate(self, msg: Message) -> None:
        if isinstance(msg, VoteResponse):
            self._on_vote_response(msg)
        else:
            self._step_follower(msg)

    def _step_follower(self, msg: Message) -> None:
        if isinstance(msg, TimeoutNow) and self.id in self.voters:
            self.campaign(transfer=True)
        elif isinstance(msg, ReadIndex):
            self.outbox.append(ReadIndexResponse(self.term, self.id, msg.src, msg.ctx, 0))

    # Handlers

    def _on_request_vote(self, msg: RequestVote) -> None:
        up_to_date = (msg.last_term, msg.last_index) >= (self.log.last_term(), self.log.last_index())
        if msg.pre_vote:
            granted = up_to_date and msg.term > self.term
            self.outbox.append(VoteResponse(msg.term if granted else self.term, self.id, msg.src, granted, True))
            return
        granted = self.vote in (0, msg.src) and up_to_date and self.role is not Role.LEADER
        if granted:
            self.vote = msg.src
            self.elapsed = 0
        self.outbox.append(VoteResponse(self.term, self.id, msg.src, granted))

    def _on_vote_response(self, msg: VoteResponse) -> None:
        if not msg.granted or msg.src not in self.voters:
            return
        if msg.pre_vote and self.role is Role.PRE_CANDIDATE:
            if self.tracker.record_vote(msg.src):
                self.campaign()
        elif not msg.pre_vote and self.role is Role.CANDIDATE and self.tracker.record_vote(msg.src):
            self._become_leader()

    def _in_lease(self) -> bool:
        """A follower that heard from its leader within an election timeout, or that started less
        than one ago: before a restart it may have confirmed a leader's round, and that leader may
        still be answering reads from the lease the round gave it."""
        if not self.check_quorum:
            return False
        return (self.leader != 0 and self.elapsed < self.election_ticks) or self.clock < self.election_ticks

    def _on_append(self, msg: AppendEntries) -> None:
        if self.role is not Role.FOLLOWER or self.leader != msg.src:
            self._become_follower(msg.term, msg.src)
        self.elapsed = 0
        match = self.log.maybe_append(msg.prev_index, msg.prev_term, msg.entries, self.commit)
        if match is None:
            hint = max(min(msg.prev_index - 1, self.log.last_index()), self.log.checkpoint_index)
            self.outbox.append(AppendResponse(self.term, self.id, msg.src, False, hint, msg.round))
            return
        self.commit = max(self.commit, min(msg.commit, match))
        self.outbox.append(AppendResponse(self.term, self.id, msg.src, True, match, msg.round))


# Messages whose handling depends on the role go to that role's step, as in etcd.
STEPS: dict[Role, Callable[[RaftCore, Message], None]] = {
    Role.FOLLOWER: RaftCore._step_follower,
    Role.PRE_CANDIDATE: RaftCore._step_candidate,
    Role.CANDIDATE: RaftCore._step_candidate,
    Role.LEADER: step_leader,
}
