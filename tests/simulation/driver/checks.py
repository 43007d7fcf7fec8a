"""The invariants. While running: at most one leader per term; every replica applies a prefix of the
same log, without gaps (so compaction never outruns durable state); a read barrier never returns
below an append acknowledged before it was asked; acknowledgements and votes never outrun the disk
(what they promise is synced). At the end, after healing: every acknowledged append is in its stream
exactly once, in order, and the members' state stores are identical."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.cluster.log_store import LogStore
from app.raft.messages import AppendResponse, Entry, Message, VoteResponse
from app.state_machine import records as r
from app.state_machine import subscriptions as rules
from app.state_machine.commands import Outcome
from app.state_machine.export import applied_point, export
from app.state_machine.glob import matches
from app.state_machine.machine import COMPAT_BUCKET, StateMachine
from tests.simulation.driver.disk import DiskKV

if TYPE_CHECKING:
    from tests.simulation.driver.clients import Client
    from tests.simulation.driver.process import Member
    from tests.simulation.driver.world import Simulation


class Machine(StateMachine):
    """The state machine, checking that a replica applies the one log in order, without gaps."""

    def __init__(self, kv: DiskKV, sim: Simulation, node_id: int) -> None:
        super().__init__(kv)
        self.sim = sim
        self.node_id = node_id
        self.acked: dict[tuple[bytes, str], int] = {}  # what this incarnation has applied

    def apply(self, entries: list[Entry], known: dict[int, Any] | None = None) -> list[Outcome | None]:
        if entries[0].index != self.applied_index + 1:
            self.sim.fail(f"node {self.node_id} applies {entries[0].index} after {self.applied_index}")
        for entry in entries:
            seen = self.sim.log.setdefault(entry.index, entry)
            if seen != entry:
                self.sim.fail(f"node {self.node_id} applies {entry} where another applied {seen}")
        results = super().apply(entries, known)
        self._check_subscriptions()
        return results

    def check_coverage(self) -> None:
        """The coverage index names what a plain match of every pattern over every stream names."""
        table = self.table
        for _, raw in self.kv.scan(r.SUBSCRIPTIONS, b""):
            sub = r.decode_subscription(raw)
            expected = {path: "explicit" for path in sub.explicit}
            for (bucket, name), sid in table.names.items():
                meta = table.streams[sid]
                wake = table.coverage.is_wake_stream(bucket, name)
                if (
                    bucket == sub.bucket
                    and sub.pattern
                    and not meta.deleted
                    and not wake
                    and matches(sub.pattern, name)
                ):
                    expected.setdefault(name, "glob")
            if rules.linked(table, sub) != expected:
                self.sim.fail(f"node {self.node_id}: {sub.id} covers {rules.linked(table, sub)}, not {expected}")

    def _check_subscriptions(self) -> None:
        """Acknowledged positions never move backwards; one generation has one holder."""
        for key, raw in self.kv.scan(r.SUBSCRIPTIONS, b""):
            sub = r.decode_subscription(raw)
            for path, pos in sub.acked.items():
                before = self.acked.get((key, path), -1)
                if pos < before:
                    self.sim.fail(f"node {self.node_id}: {sub.id} acknowledged {path} at {pos} after {before}")
                self.acked[(key, path)] = pos
            if sub.holder is not None:
                holder = self.sim.holders.setdefault((key, sub.generation), sub.holder)
                if holder != sub.holder:
                    self.sim.fail(f"{sub.id} generation {sub.generation} held by {holder} and {sub.holder}")


def check_durable(sim: Simulation, member: Member, msg: Message) -> None:
    """Acknowledgements and votes never outrun the disk: what they promise is synced."""
    if isinstance(msg, AppendResponse) and msg.success:
        disk = LogStore(member.raft_kv.durable)
        if msg.match_index > disk.compacted_index and disk.term_at(msg.match_index) is None:
            sim.fail(f"node {msg.src} acknowledges {msg.match_index}, but its disk ends at {disk.last_index}")
    elif isinstance(msg, VoteResponse) and msg.granted and not msg.pre_vote:
        hard_state = LogStore(member.raft_kv.durable).hard_state()
        if hard_state.term < msg.term or (hard_state.term == msg.term and hard_state.vote != msg.dst):
            sim.fail(f"node {msg.src} votes for {msg.dst} in term {msg.term}, but its disk has {hard_state}")


def check_read(sim: Simulation, node: int, machine: StateMachine, asked: dict[int, int]) -> None:
    """A read barrier returned on `node`: every append acknowledged before it was asked is there."""
    sim.stats["reads"] += 1
    contents: dict[str, bytes] = {}
    for client in sim.clients:
        expected = [a.rstrip(b";") for a in client.acked[: asked[client.id]]]
        if client.stream not in contents:
            contents[client.stream] = stream_content(machine, client.stream)
        mine = records(contents[client.stream], client)[: len(expected)]
        if mine != expected:
            sim.fail(
                f"a read barrier on node {node} returned without client {client.id}'s acknowledged"
                f" appends: it has {len(mine)} of {len(expected)}"
            )


def stream_content(machine: StateMachine, stream: str) -> bytes:
    meta = machine.lookup(COMPAT_BUCKET, stream)
    return b"".join(bytes(p) for p in machine.read(meta, 0, 1 << 30).payloads) if meta is not None else b""


def records(content: bytes, client: Client) -> list[bytes]:
    return [p for p in content.split(b";") if p.startswith(b"c%d-" % client.id)]


def members_now(sim: Simulation) -> list[Member]:
    """The members of the configuration the most advanced replica has applied."""
    up = [m for m in sim.members.values() if m.current is not None]
    ahead = max(up, key=lambda m: m.current.raft.status().applied)  # type: ignore[union-attr]
    assert ahead.current is not None
    membership = ahead.current.raft.machine.membership
    ids = {*membership.voters, *membership.learners} if membership else {1, 2, 3}
    return [sim.members[i] for i in sorted(ids)]


def settled(sim: Simulation) -> bool:
    """Every client is done and every member has applied all the leader has committed."""
    leader = sim.leader()
    if leader is None or not sim.reconfigured or not all(c.done for c in sim.clients):
        return False
    from tests.simulation.driver.consumers import WORKERS  # consumers -> process -> checks: imported when used

    if sim.consumers_done < len(WORKERS):
        return False
    assert leader.current is not None
    commit = leader.current.raft.status().commit
    members = members_now(sim)
    if not all(m.current is not None and m.current.raft.status().applied == commit for m in members):
        return False
    from tests.simulation.driver.webhooks import delivered_all

    machine = leader.current.raft.machine
    return delivered_all(sim, {c.stream: machine.lookup(COMPAT_BUCKET, c.stream).tail for c in sim.clients})  # type: ignore[union-attr]


def check(sim: Simulation) -> None:
    """The final checks on a settled cluster; records its applied index and state in the trace."""
    for term, leaders in sim.leaders.items():
        assert len(leaders) == 1, f"two leaders in term {term}: {leaders}"
    members = members_now(sim)
    if sim.join:
        assert 4 in {m.id for m in members} and sim.removed not in {m.id for m in members}, "reconfiguration"
    dumps = []
    for member in members:
        assert member.current is not None
        dumps.append([pair for batch in export(member.current.raft.machine.kv) for pair in batch])  # type: ignore[attr-defined]
    for member, dump in zip(members, dumps, strict=True):
        assert dump == dumps[0], f"node {member.id}'s state store differs from node {members[0].id}'s"
    for member in members:
        member.current.raft.machine.check_coverage()  # type: ignore[union-attr]
    for member in sim.up():  # no proposal a node has applied past is left waiting
        raft = member.current.raft  # type: ignore[union-attr]
        stuck = [i for i, (_, fut) in raft._proposals.waiting.items() if i <= raft.status().applied and not fut.done()]
        assert not stuck, f"node {member.id} has proposals {stuck[:5]} waiting below its applied index"
    machine = members[0].current.raft.machine  # type: ignore[union-attr]
    for client in sim.clients:
        mine = records(stream_content(machine, client.stream), client)  # type: ignore[arg-type]
        expected = [a.rstrip(b";") for a in client.acked]
        if mine != expected:
            at = next((i for i, (a, b) in enumerate(zip(mine, expected, strict=False)) if a != b), None)
            at = min(len(mine), len(expected)) if at is None else at
            raise AssertionError(
                f"client {client.id}: from position {at} the stream has {mine[at : at + 3]},"
                f" but the acknowledged appends were {expected[at : at + 3]}"
                f" ({len(mine)} in the stream, {len(expected)} acknowledged)"
            )
    from tests.simulation.driver.consumers import consumed

    if not consumed(sim):  # every message reached a consumer at least once
        raise AssertionError("the subscription still has messages no consumer acknowledged")
    from tests.simulation.driver.webhooks import check_delivered

    check_delivered(sim, {c.stream: machine.lookup(COMPAT_BUCKET, c.stream).tail for c in sim.clients})  # type: ignore[union-attr]
    sim.applied = applied_point(members[0].current.raft.machine.kv)[0]  # type: ignore[union-attr]
    sim.trace.update(repr(dumps[0]).encode())
