"""Pure Raft: messages and ticks in, a Ready (what to persist, send and apply) out.

With pre-vote, a node that lost touch first asks whether it could win before it bumps its
term, so a partitioned node rejoining does not depose a healthy leader. With check-quorum, a
leader that has not heard from a majority for an election timeout steps down, and followers
that heard from a leader within that time ignore vote requests (the leader's lease).

Learners receive the log but neither vote nor count toward commits. Membership entries replace
the whole configuration when they commit, one node at a time.

Linearizable reads use ReadIndex: the leader notes its commit index and confirms it still leads
by hearing from a majority in a heartbeat round started no earlier than the request; the reader
then waits until it has applied that index. A leader whose majority confirmed it within the last
election timeout (minus a tick of slack for clock drift) answers at once: no follower that heard
it then will vote for another leader before that lease runs out. A follower that needs entries
the leader has compacted away gets a snapshot instead: the core names the peer in
`Ready.snapshots`, the driver streams the state machine's store to it, and the follower's driver
calls `install` once the store is in place.

No I/O, no clock, no asyncio. The driver owns disk and network: for every
Ready it persists the hard state and entries (synced), then sends the
messages, then applies the committed entries and reports back with
`on_persisted` and `on_applied`. Randomness (election jitter) comes from a
seeded generator, so a simulation replays exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from enum import Enum

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

MAX_ENTRIES_PER_MESSAGE = 256


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
    snapshots: list[int] = field(default_factory=list)  # peers to stream a snapshot to
    reads: list[tuple[int, int]] = field(default_factory=list)  # (ctx, read index; 0 when refused)

    def __bool__(self) -> bool:
        return bool(self.hard_state or self.entries or self.messages or self.committed or self.snapshots or self.reads)


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
        self.voters = sorted(voters)
        self.learners = sorted(learners or [])
        self.term = hard_state.term
        self.vote = hard_state.vote
        self.commit = max(hard_state.commit, compacted_index)
        self.log = list(entries)
        self.offset = compacted_index
        self.offset_term = compacted_term
        self.applied = max(applied, compacted_index)
        self.stable = self.last_index()
        self.unstable_from = self.stable + 1
        self.role = Role.FOLLOWER
        self.leader = 0
        self.rng = random.Random(seed * 7919 + node_id)
        self.election_ticks = election_ticks
        self.heartbeat_ticks = heartbeat_ticks
        self.elapsed = 0
        self.timeout = self._random_timeout()
        self.votes: set[int] = set()
        self.pre_vote = pre_vote
        self.check_quorum = check_quorum
        self.active: set[int] = set()  # peers heard from since the leader's last quorum check
        self.quorum_elapsed = 0
        self._replicate = False
        self.transferee = 0  # the peer a leader is handing over to; it takes no proposals meanwhile
        self.transfer_elapsed = 0
        self.next: dict[int, int] = {}
        self.match: dict[int, int] = {}
        self.snapshotting: set[int] = set()  # peers a snapshot is being streamed to
        self._snapshot_requests: list[int] = []
        self.pending_membership = 0  # index of the last membership entry a leader proposed
        self.clock = 0  # ticks since start: the leader's lease is measured in them
        self.round = 0  # the leader's heartbeat round
        self.round_ticks: dict[int, int] = {}  # round -> clock when it began
        self.acked: dict[int, int] = {}  # voter -> latest round it answered
        self.pending_reads: list[tuple[int, int, int]] = []  # (round, ctx, requester)
        self._reads: list[tuple[int, int]] = []
        self.outbox: list[Message] = []
        self._emitted = HardState(self.term, self.vote, self.commit)

    # Log access

    def last_index(self) -> int:
        return self.offset + len(self.log)

    def last_term(self) -> int:
        return self.log[-1].term if self.log else self.offset_term

    def term_at(self, index: int) -> int | None:
        if index == self.offset:
            return self.offset_term
        if self.offset < index <= self.last_index():
            return self.log[index - self.offset - 1].term
        return None

    def slice(self, lo: int, hi: int) -> list[Entry]:
        """Entries with lo <= index < hi."""
        return self.log[lo - self.offset - 1 : hi - self.offset - 1]

    def quorum(self) -> int:
        return len(self.voters) // 2 + 1

    # Inputs

    def tick(self) -> None:
        self.clock += 1
        self.elapsed += 1
        if self.role is Role.LEADER:
            if self.transferee:
                self.transfer_elapsed += 1
                if self.transfer_elapsed >= self.election_ticks:
                    self.transferee = 0  # the hand-over stalled: keep leading
            self.quorum_elapsed += 1
            if self.check_quorum and self.quorum_elapsed >= self.election_ticks:
                self.quorum_elapsed = 0
                if len(self.active) + 1 < self.quorum():
                    self._become_follower(self.term, 0)  # cut off from a majority: stop accepting writes
                    return
                self.active = set()
            if self.elapsed >= self.heartbeat_ticks:
                self.elapsed = 0
                self._new_round()
                self._broadcast_append()
        elif self.elapsed >= self.timeout and self.id in self.voters:
            self.start_election()

    def start_election(self) -> None:
        """Campaigns, after a pre-vote round when pre-vote is on."""
        if not self.pre_vote or self._solicit_votes(Role.PRE_CANDIDATE, self.term + 1, pre_vote=True):
            self.campaign()

    def transfer_leadership(self) -> int:
        """Hands leadership to the most caught-up voter; returns it (0 when there is none)."""
        candidates = [p for p in self.match if p in self.voters]
        if self.role is not Role.LEADER or not candidates:
            return 0
        target = max(candidates, key=lambda peer: (self.match[peer], -peer))
        self.transferee, self.transfer_elapsed = target, 0
        if self.match[target] == self.last_index():
            self.outbox.append(TimeoutNow(self.term, self.id, target))
        else:
            self._send_append(target)
        return target

    def campaign(self, transfer: bool = False) -> None:
        self.term += 1
        self.vote = self.id
        if self._solicit_votes(Role.CANDIDATE, self.term, transfer=transfer):
            self._become_leader()

    def _solicit_votes(self, role: Role, term: int, pre_vote: bool = False, transfer: bool = False) -> bool:
        """Starts a (pre-)vote round for `term`; True when this node alone is a quorum."""
        self.role = role
        self.leader = 0
        self.votes = {self.id}
        self.elapsed = 0
        self.timeout = self._random_timeout()
        if len(self.votes) >= self.quorum():
            return True
        last_index, last_term = self.last_index(), self.last_term()
        for peer in self._voting_peers():
            self.outbox.append(RequestVote(term, self.id, peer, last_index, last_term, pre_vote, transfer))
        return False

    def propose(self, data: bytes) -> int | None:
        """Appends `data` to the leader's log; returns its index, or None when not leader."""
        if self.role is not Role.LEADER or self.transferee:
            return None
        index = self.last_index() + 1
        self.log.append(Entry(self.term, index, data))
        self._replicate = True  # sent once per Ready, so proposals made together travel together
        return index

    def membership_error(self, new: Membership) -> str | None:
        """Why `new` cannot be proposed now; None when it can."""
        if self.role is not Role.LEADER or self.transferee:
            return "not the leader"
        if self.pending_membership > self.applied:
            return "another membership change is still in progress"
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

    def propose_membership(self, new: Membership, data: bytes) -> int | None:
        """Appends a membership entry (`data` encodes `new`); None when `membership_error` objects."""
        if self.membership_error(new) is not None:
            return None
        index = self.last_index() + 1
        self.log.append(Entry(self.term, index, data, MEMBERSHIP))
        self.pending_membership = index
        self._replicate = True
        return index

    def step(self, msg: Message) -> None:
        if self.role is Role.LEADER and msg.src in self.voters:
            self.active.add(msg.src)
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
            if isinstance(msg, AppendEntries):
                self.outbox.append(AppendResponse(self.term, self.id, msg.src, False, self.last_index()))
            elif isinstance(msg, RequestVote):
                self.outbox.append(VoteResponse(self.term, self.id, msg.src, False))
            elif isinstance(msg, ReadIndex):
                self.outbox.append(ReadIndexResponse(self.term, self.id, msg.src, msg.ctx, 0))
            return
        if isinstance(msg, RequestVote):
            self._on_request_vote(msg)
        elif isinstance(msg, VoteResponse):
            self._on_vote_response(msg)
        elif isinstance(msg, AppendEntries):
            self._on_append(msg)
        elif isinstance(msg, AppendResponse):
            self._on_append_response(msg)
        elif isinstance(msg, TimeoutNow) and self.id in self.voters and self.role is not Role.LEADER:
            self.campaign(transfer=True)
        elif isinstance(msg, ReadIndex):
            if self.role is Role.LEADER:
                self._serve_read(msg.ctx, msg.src)
            else:
                self.outbox.append(ReadIndexResponse(self.term, self.id, msg.src, msg.ctx, 0))
        elif isinstance(msg, ReadIndexResponse):
            self._reads.append((msg.ctx, msg.index))

    def on_persisted(self, index: int, term: int) -> None:
        """The driver synced entries up to `index`; counts toward the leader's own match."""
        if self.term_at(index) == term and index > self.stable:
            self.stable = index
            if self.role is Role.LEADER:
                self._maybe_commit()

    def on_applied(self, index: int) -> None:
        self.applied = max(self.applied, index)

    def read_index(self, ctx: int) -> bool:
        """Asks for a read index; it comes back as (ctx, index) in `Ready.reads`. False: no leader."""
        if self.role is Role.LEADER:
            self._serve_read(ctx, self.id)
        elif self.leader:
            self.outbox.append(ReadIndex(self.term, self.id, self.leader, ctx))
        else:
            return False
        return True

    def snapshot_finished(self, peer: int) -> None:
        """The driver's transfer to `peer` ended, installed or not; if the peer still needs
        compacted entries, the next probe asks for another."""
        self.snapshotting.discard(peer)

    def can_install(self, term: int, index: int) -> bool:
        """Whether a snapshot at `index` from a leader of `term` would move this node forward."""
        return term >= self.term and index > max(self.commit, self.applied)

    def install(self, term: int, leader: int, index: int, snap_term: int, membership: Membership) -> None:
        """The driver has replaced the state machine's store with a snapshot at `index`."""
        if term > self.term or self.role is not Role.FOLLOWER:
            self._become_follower(term, leader)
        self.leader, self.elapsed = leader, 0
        if self.term_at(index) == snap_term:
            self.log = self.log[index - self.offset :]  # entries past the snapshot still match
        else:
            self.log = []
            self.stable = index
            self.unstable_from = index + 1
        self.offset, self.offset_term = index, snap_term
        self.commit = self.applied = index
        self.stable = max(self.stable, index)
        self.unstable_from = max(self.unstable_from, index + 1)
        self._set_membership(membership)
        self.outbox.append(AppendResponse(self.term, self.id, leader, True, index))

    def compact(self, index: int) -> None:
        """Forgets entries up to `index` (already applied and covered by durable state)."""
        index = min(index, self.applied, self.stable)
        if index <= self.offset:
            return
        self.offset_term = self.term_at(index) or self.offset_term
        self.log = self.log[index - self.offset :]
        self.offset = index

    # Output

    def ready(self) -> Ready:
        if self._replicate:
            self._replicate = False
            if self.role is Role.LEADER:
                self._send_appends()
        rd = Ready()
        # Term and vote must be durable before we act on them; the commit index may lag on disk
        # (it is recovered from the leader), so it rides along but never forces a sync.
        if (self.term, self.vote) != (self._emitted.term, self._emitted.vote):
            rd.hard_state = self._emitted = HardState(self.term, self.vote, self.commit)
        if self.unstable_from <= self.last_index():
            rd.entries = self.slice(self.unstable_from, self.last_index() + 1)
            self._emitted = HardState(self.term, self.vote, self.commit)
            rd.hard_state = self._emitted
            self.unstable_from = self.last_index() + 1
        rd.messages, self.outbox = self.outbox, []
        rd.snapshots, self._snapshot_requests = self._snapshot_requests, []
        rd.reads, self._reads = self._reads, []
        upto = min(self.commit, self.stable, self.last_index())
        if upto > self.applied:
            rd.committed = self.slice(self.applied + 1, upto + 1)
            for entry in rd.committed:
                if entry.kind == MEMBERSHIP:
                    self._set_membership(decode_membership(entry.data))
        return rd

    # Role changes

    def _peers(self) -> list[int]:
        """Every node the leader replicates to: voters and learners but itself."""
        return [n for n in (*self.voters, *self.learners) if n != self.id]

    def _voting_peers(self) -> list[int]:
        return [v for v in self.voters if v != self.id]

    def _set_membership(self, membership: Membership) -> None:
        self.voters, self.learners = sorted(membership.voters), sorted(membership.learners)
        if self.role is not Role.LEADER:
            return
        peers = set(self._peers())
        for peer in peers - set(self.next):
            self.next[peer], self.match[peer] = self.last_index() + 1, 0
        for peer in set(self.next) - peers:
            del self.next[peer], self.match[peer]
            self.snapshotting.discard(peer)
        if self.id not in self.voters:
            self._become_follower(self.term, 0)  # removed: a voter of the new configuration will lead
        else:
            self._maybe_commit()

    def _random_timeout(self) -> int:
        return self.election_ticks + self.rng.randrange(self.election_ticks)

    def _become_follower(self, term: int, leader: int) -> None:
        self.transferee = 0
        self.snapshotting, self._snapshot_requests = set(), []
        for _, ctx, requester in self.pending_reads:
            self._answer_read(ctx, requester, 0)
        self.pending_reads = []
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
        self.active = set()
        self.next = {p: self.last_index() + 1 for p in self._peers()}
        self.match = {p: 0 for p in self._peers()}
        self.snapshotting = set()
        self.acked, self.round_ticks = {}, {}
        self._new_round()
        # A no-op in the new term lets entries from earlier terms commit. Membership changes wait
        # until it is applied: a configuration change from an earlier term may still be in flight.
        self.propose(b"")
        self.pending_membership = self.last_index()
        self._maybe_commit()

    # Handlers

    def _on_request_vote(self, msg: RequestVote) -> None:
        up_to_date = (msg.last_term, msg.last_index) >= (self.last_term(), self.last_index())
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
            self.votes.add(msg.src)
            if len(self.votes) >= self.quorum():
                self.campaign()
        elif not msg.pre_vote and self.role is Role.CANDIDATE:
            self.votes.add(msg.src)
            if len(self.votes) >= self.quorum():
                self._become_leader()

    def _in_lease(self) -> bool:
        """A follower that heard from its leader within an election timeout."""
        return self.check_quorum and self.leader != 0 and self.elapsed < self.election_ticks

    def _on_append(self, msg: AppendEntries) -> None:
        if self.role is not Role.FOLLOWER or self.leader != msg.src:
            self._become_follower(msg.term, msg.src)
        self.elapsed = 0
        if msg.prev_index < self.offset:
            # Already compacted here, so already committed; skip what we have.
            skip = self.offset - msg.prev_index
            entries, prev_index, prev_term = msg.entries[skip:], self.offset, self.offset_term
        else:
            entries, prev_index, prev_term = msg.entries, msg.prev_index, msg.prev_term
        if self.term_at(prev_index) != prev_term:
            hint = min(prev_index - 1, self.last_index())
            self.outbox.append(AppendResponse(self.term, self.id, msg.src, False, max(hint, self.offset), msg.round))
            return
        for i, entry in enumerate(entries):
            existing = self.term_at(entry.index)
            if existing == entry.term:
                continue
            if existing is not None:
                if entry.index <= self.commit:
                    raise AssertionError("leader asked to overwrite a committed entry")
                self.log = self.log[: entry.index - self.offset - 1]
                self.stable = min(self.stable, entry.index - 1)
            self.log.extend(entries[i:])
            self.unstable_from = min(self.unstable_from, entry.index)
            break
        match = prev_index + len(entries)
        self.commit = max(self.commit, min(msg.commit, match))
        self.outbox.append(AppendResponse(self.term, self.id, msg.src, True, match, msg.round))

    def _on_append_response(self, msg: AppendResponse) -> None:
        if self.role is not Role.LEADER or msg.src not in self.next:
            return
        if msg.round > self.acked.get(msg.src, 0):
            self.acked[msg.src] = msg.round
            if self.pending_reads:
                self._release_reads()
        if msg.success:
            if msg.match_index > self.match[msg.src]:
                self.match[msg.src] = msg.match_index
                self._maybe_commit()
            if msg.src == self.transferee and msg.match_index == self.last_index():
                self.outbox.append(TimeoutNow(self.term, self.id, msg.src))
            self.next[msg.src] = max(self.next[msg.src], msg.match_index + 1)
            if self.next[msg.src] > self.offset:
                self.snapshotting.discard(msg.src)  # caught up from a snapshot: back to the log
            if self.next[msg.src] <= self.last_index() and msg.src not in self.snapshotting:
                self._send_append(msg.src)
        elif msg.src not in self.snapshotting:
            self.next[msg.src] = max(1, min(self.next[msg.src] - 1, msg.match_index + 1))
            self._send_append(msg.src)

    # Replication

    def _send_appends(self) -> None:
        for peer in self._peers():
            if self.next[peer] <= self.last_index():
                self._send_append(peer)

    def _broadcast_append(self) -> None:
        for peer in self._peers():
            self._send_append(peer)

    def _send_append(self, peer: int) -> None:
        nxt = self.next[peer]
        if nxt <= self.offset and peer not in self.snapshotting:
            self.snapshotting.add(peer)  # what it needs is compacted away: ship a snapshot instead
            self._snapshot_requests.append(peer)
        if peer in self.snapshotting:
            # A probe keeps its election timer quiet and reports where it stands once installed.
            probe = AppendEntries(self.term, self.id, peer, self.offset, self.offset_term, [], self.commit, self.round)
            self.outbox.append(probe)
            return
        prev = nxt - 1
        entries = self.slice(nxt, min(self.last_index() + 1, nxt + MAX_ENTRIES_PER_MESSAGE))
        prev_term = self.term_at(prev) or 0
        self.outbox.append(AppendEntries(self.term, self.id, peer, prev, prev_term, entries, self.commit, self.round))
        # Optimistic: pipeline the next batch without waiting for this one's answer.
        self.next[peer] = nxt + len(entries)

    def _maybe_commit(self) -> None:
        matches = [self.match[v] for v in self.voters if v in self.match]
        if self.id in self.voters:
            matches.append(self.stable)
        if len(matches) < self.quorum():
            return
        candidate = sorted(matches, reverse=True)[self.quorum() - 1]
        # Only entries of the current term commit by counting replicas.
        if candidate > self.commit and self.term_at(candidate) == self.term:
            self.commit = candidate
            if self.pending_reads:
                self._release_reads()

    # Reads

    def _new_round(self) -> None:
        self.round += 1
        self.round_ticks[self.round] = self.clock

    def _confirmed_round(self) -> int:
        """The latest round a majority of voters (this leader included) has answered."""
        rounds = [self.acked.get(v, 0) for v in self.voters if v != self.id]
        if self.id in self.voters:
            rounds.append(self.round)
        if len(rounds) < self.quorum():
            return 0
        return sorted(rounds, reverse=True)[self.quorum() - 1]

    def _serve_read(self, ctx: int, requester: int) -> None:
        confirmed = self._confirmed_round()
        lease = self.clock - self.round_ticks.get(confirmed, -(10**9)) < self.election_ticks - 1
        if lease and self.term_at(self.commit) == self.term:
            self._answer_read(ctx, requester, self.commit)
            return
        if not self.pending_reads or self.pending_reads[-1][0] != self.round + 1:
            self._new_round()  # a round that starts after the request
            self._broadcast_append()
        self.pending_reads.append((self.round, ctx, requester))

    def _release_reads(self) -> None:
        if self.term_at(self.commit) != self.term:
            return  # a new leader knows its commit index once an entry of its term commits
        confirmed = self._confirmed_round()
        waiting = []
        for read in self.pending_reads:
            if read[0] <= confirmed:
                self._answer_read(read[1], read[2], self.commit)
            else:
                waiting.append(read)
        self.pending_reads = waiting
        for old in [r for r in self.round_ticks if r < confirmed]:
            del self.round_ticks[old]

    def _answer_read(self, ctx: int, requester: int, index: int) -> None:
        if requester == self.id:
            self._reads.append((ctx, index))
        else:
            self.outbox.append(ReadIndexResponse(self.term, self.id, requester, ctx, index))
