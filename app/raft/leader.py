"""The leader's half of the Raft core: replication to each peer, counting commits, and ReadIndex reads.

Plain functions over the core, as etcd writes `stepLeader(r *raft, m pb.Message)`: each takes the
RaftCore first, reads its state, and keeps its own in the progress tracker and the read-only state.
The core calls them (its role dispatch sends a leader's messages to `step_leader`); they call back
into the core only through its attributes.
"""

from __future__ import annotations

from app.raft.core_state import CoreState
from app.raft.messages import AppendEntries, AppendResponse, Entry, Message, ReadIndex, ReadIndexResponse, TimeoutNow
from app.raft.ready import Role

MAX_ENTRIES_PER_MESSAGE = 256
MAX_BYTES_PER_MESSAGE = 4 << 20  # entries' data per AppendEntries; one bigger entry goes alone


def step_leader(core: CoreState, msg: Message) -> None:
    if isinstance(msg, AppendResponse):
        _on_append_response(core, msg)
    elif isinstance(msg, ReadIndex):
        serve_read(core, msg.ctx, msg.src)


def start_transfer(core: CoreState) -> int:
    """Hands leadership to the most caught-up of the voters heard from last; returns it (0 when there
    is none). A voter that stopped answering (a node stopped just before this one, in a rolling
    restart) may be as caught up as any, but would never campaign: the transfer would time out."""
    progress = core.tracker.progress
    candidates = [p for p in progress if p in core.tracker.voters]
    if core.role is not Role.LEADER or not candidates:
        return 0
    silent = core.clock - max(progress[p].heard for p in candidates)
    if silent > core.election_ticks:
        return 0  # no voter has answered for an election timeout: none would take over
    # Voters answer every heartbeat: one silent for longer than a heartbeat (or than the freshest,
    # if all are late) has most likely stopped.
    window = max(core.heartbeat_ticks, silent)
    candidates = [p for p in candidates if core.clock - progress[p].heard <= window]
    target = max(candidates, key=lambda peer: (progress[peer].match, -peer))
    core.transferee, core.transfer_elapsed = target, 0
    if progress[target].match == core.log.last_index():
        _timeout_now(core, target)
    else:
        send_append(core, target)
    return target


def _timeout_now(core: CoreState, target: int) -> None:
    """Tells `target` to campaign at once. Its voters grant a transfer's votes whatever lease they
    keep, so no round this leader confirmed before now proves it still leads: the lease waits for
    rounds begun after the target's election is over, won or timed out (two election timeouts)."""
    core.outbox.append(TimeoutNow(core.term, core.id, target))
    core.read_only.fence(core.clock + 2 * core.election_ticks)


# Replication


def _on_append_response(core: CoreState, msg: AppendResponse) -> None:
    progress = core.tracker.progress.get(msg.src)
    if progress is None:
        return
    if core.read_only.ack(msg.src, msg.round):
        _release_reads(core)
    if not msg.success:
        if progress.rejected(msg.match_index):
            send_append(core, msg.src)
        return
    if progress.acked(msg.match_index, core.log.checkpoint_index):
        maybe_commit(core)
    if msg.src == core.transferee and msg.match_index == core.log.last_index():
        _timeout_now(core, msg.src)
    send_entries(core, msg.src)


def send_appends(core: CoreState) -> None:
    """Sends each peer the entries it has not been sent yet (none to a peer that has them all)."""
    for peer in core.tracker.peers():
        send_entries(core, peer)


def send_entries(core: CoreState, peer: int) -> None:
    """Sends `peer` the entries it has not been sent, as far as its window of unanswered messages
    allows: the rest wait for an answer, and go together."""
    progress = core.tracker.progress[peer]
    while progress.next <= core.log.last_index() and not progress.full:
        send_append(core, peer)
        if progress.checkpointing:  # it got a probe: its entries come from the checkpoint
            return


def broadcast_append(core: CoreState) -> None:
    """Sends every peer an append (empty for one that was sent every entry): the heartbeat of a round."""
    for peer in core.tracker.peers():
        send_append(core, peer)


def send_append(core: CoreState, peer: int) -> None:
    progress, log, rnd = core.tracker.progress[peer], core.log, core.read_only.round
    if progress.needs_checkpoint(log.checkpoint_index):
        core.checkpoint_requests.append(peer)
    if progress.checkpointing:
        # A probe keeps its election timer quiet and reports where it stands once installed.
        probe = AppendEntries(core.term, core.id, peer, log.checkpoint_index, log.checkpoint_term, [], core.commit, rnd)
        core.outbox.append(probe)
        return
    nxt = progress.next
    prev_term = log.term_at(nxt - 1) or 0
    if progress.full:  # a heartbeat: it follows what is in flight (a peer's messages keep their order)
        core.outbox.append(AppendEntries(core.term, core.id, peer, nxt - 1, prev_term, [], core.commit, rnd))
        return
    entries = _within_budget(log.slice(nxt, min(log.last_index() + 1, nxt + MAX_ENTRIES_PER_MESSAGE)))
    core.outbox.append(AppendEntries(core.term, core.id, peer, nxt - 1, prev_term, entries, core.commit, rnd))
    if entries:  # pipelined: the next batch goes without waiting for this one's answer, within the window
        progress.sent(entries[-1].index)


def _within_budget(entries: list[Entry]) -> list[Entry]:
    """The longest prefix within MAX_BYTES_PER_MESSAGE, and at least one entry: peers cap a request's size."""
    size = 0
    for i, entry in enumerate(entries):
        size += len(entry.data)
        if size > MAX_BYTES_PER_MESSAGE and i > 0:
            return entries[:i]
    return entries


def maybe_commit(core: CoreState) -> None:
    matches = core.tracker.match_indexes()
    candidate = core.tracker.majority(lambda v: core.log.stable if v == core.id else matches.get(v, 0))
    if core.commit_alone:
        candidate = core.log.stable
    # Only entries of the current term commit by counting replicas.
    if candidate > core.commit and core.log.term_at(candidate) == core.term:
        core.commit = candidate
        if core.read_only.pending:
            _release_reads(core)


# Reads


def serve_read(core: CoreState, ctx: int, requester: int) -> None:
    leased = core.read_only.leased(core.tracker, core.clock, core.election_ticks)
    if leased and core.log.term_at(core.commit) == core.term:
        answer_read(core, ctx, requester, core.commit)
        return
    if core.read_only.needs_round():
        core.read_only.new_round(core.clock, core.election_ticks)  # a round that starts after the request
        broadcast_append(core)
    core.read_only.wait(ctx, requester)


def _release_reads(core: CoreState) -> None:
    if core.log.term_at(core.commit) != core.term:
        return  # a new leader knows its commit index once an entry of its term commits
    for ctx, requester in core.read_only.release(core.tracker):
        answer_read(core, ctx, requester, core.commit)


def answer_read(core: CoreState, ctx: int, requester: int, index: int) -> None:
    """Answers a read with `index` (0: refused): into the next Ready for this node, else to the requester."""
    if requester == core.id:
        core.read_states.append((ctx, index))
    else:
        core.outbox.append(ReadIndexResponse(core.term, core.id, requester, ctx, index))
