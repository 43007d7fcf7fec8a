"""RaftCore's leader half: replication to each peer, counting commits, and ReadIndex reads.

Written as a mixin so RaftCore stays one object (as etcd's raft is one struct across files); it
reads the core's state and keeps its own in the progress tracker and the read-only state.
"""

from __future__ import annotations

from app.raft.messages import AppendEntries, AppendResponse, Message, ReadIndex, ReadIndexResponse, TimeoutNow
from app.raft.progress import ProgressTracker
from app.raft.raft_log import RaftLog
from app.raft.read_only import ReadOnly
from app.raft.ready import Role

MAX_ENTRIES_PER_MESSAGE = 256


class Leading:
    # The core's state this half works on; RaftCore sets it.
    id: int
    role: Role
    term: int
    leader: int
    commit: int
    clock: int
    election_ticks: int
    transferee: int
    transfer_elapsed: int
    log: RaftLog
    tracker: ProgressTracker
    read_only: ReadOnly
    outbox: list[Message]
    _checkpoint_requests: list[int]
    _reads: list[tuple[int, int]]

    def transfer_leadership(self) -> int:
        """Hands leadership to the most caught-up voter; returns it (0 when there is none)."""
        progress = self.tracker.progress
        candidates = [p for p in progress if p in self.tracker.voters]
        if self.role is not Role.LEADER or not candidates:
            return 0
        target = max(candidates, key=lambda peer: (progress[peer].match, -peer))
        self.transferee, self.transfer_elapsed = target, 0
        if progress[target].match == self.log.last_index():
            self.outbox.append(TimeoutNow(self.term, self.id, target))
        else:
            self._send_append(target)
        return target

    def read_index(self, ctx: int) -> bool:
        """Asks for a read index; it comes back as (ctx, index) in `Ready.reads`. False: no leader."""
        if self.role is Role.LEADER:
            self._serve_read(ctx, self.id)
        elif self.leader:
            self.outbox.append(ReadIndex(self.term, self.id, self.leader, ctx))
        else:
            return False
        return True

    def _step_leader(self, msg: Message) -> None:
        if isinstance(msg, AppendResponse):
            self._on_append_response(msg)
        elif isinstance(msg, ReadIndex):
            self._serve_read(msg.ctx, msg.src)

    def _on_append_response(self, msg: AppendResponse) -> None:
        progress = self.tracker.progress.get(msg.src)
        if progress is None:
            return
        if self.read_only.ack(msg.src, msg.round):
            self._release_reads()
        if not msg.success:
            if progress.rejected(msg.match_index):
                self._send_append(msg.src)
            return
        if progress.acked(msg.match_index, self.log.checkpoint_index):
            self._maybe_commit()
        if msg.src == self.transferee and msg.match_index == self.log.last_index():
            self.outbox.append(TimeoutNow(self.term, self.id, msg.src))
        if progress.next <= self.log.last_index() and not progress.checkpointing:
            self._send_append(msg.src)

    def _send_appends(self) -> None:
        for peer in self.tracker.peers():
            if self.tracker.progress[peer].next <= self.log.last_index():
                self._send_append(peer)

    def _broadcast_append(self) -> None:
        for peer in self.tracker.peers():
            self._send_append(peer)

    def _send_append(self, peer: int) -> None:
        progress, log, rnd = self.tracker.progress[peer], self.log, self.read_only.round
        if progress.needs_checkpoint(log.checkpoint_index):
            self._checkpoint_requests.append(peer)
        if progress.checkpointing:
            # A probe keeps its election timer quiet and reports where it stands once installed.
            probe = AppendEntries(
                self.term, self.id, peer, log.checkpoint_index, log.checkpoint_term, [], self.commit, rnd
            )
            self.outbox.append(probe)
            return
        nxt = progress.next
        entries = log.slice(nxt, min(log.last_index() + 1, nxt + MAX_ENTRIES_PER_MESSAGE))
        prev_term = log.term_at(nxt - 1) or 0
        self.outbox.append(AppendEntries(self.term, self.id, peer, nxt - 1, prev_term, entries, self.commit, rnd))
        # Optimistic: pipeline the next batch without waiting for this one's answer.
        progress.next = nxt + len(entries)

    def _maybe_commit(self) -> None:
        matches = self.tracker.match_indexes()
        candidate = self.tracker.majority(lambda v: self.log.stable if v == self.id else matches.get(v, 0))
        # Only entries of the current term commit by counting replicas.
        if candidate > self.commit and self.log.term_at(candidate) == self.term:
            self.commit = candidate
            if self.read_only.pending:
                self._release_reads()

    def _serve_read(self, ctx: int, requester: int) -> None:
        leased = self.read_only.leased(self.tracker, self.clock, self.election_ticks)
        if leased and self.log.term_at(self.commit) == self.term:
            self._answer_read(ctx, requester, self.commit)
            return
        if self.read_only.needs_round():
            self.read_only.new_round(self.clock)  # a round that starts after the request
            self._broadcast_append()
        self.read_only.wait(ctx, requester)

    def _release_reads(self) -> None:
        if self.log.term_at(self.commit) != self.term:
            return  # a new leader knows its commit index once an entry of its term commits
        for ctx, requester in self.read_only.release(self.tracker):
            self._answer_read(ctx, requester, self.commit)

    def _answer_read(self, ctx: int, requester: int, index: int) -> None:
        if requester == self.id:
            self._reads.append((ctx, index))
        else:
            self.outbox.append(ReadIndexResponse(self.term, self.id, requester, ctx, index))
