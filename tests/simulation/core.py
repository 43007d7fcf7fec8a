"""Deterministic simulation of a Rill cluster: the real Raft core, log store and state machine, on
in-memory stores, over a seeded network that drops, delays, duplicates and reorders messages, with
partitions, crashes and restarts, on a fake clock of ticks. Logs are compacted often, so lagging
and restarted nodes catch up from snapshots (shipped whole after a random delay, or lost); midway
a fourth node joins as a learner, is promoted, and one of the original nodes is removed.

    python -m tests.simulation.core --seeds 10000       # run many seeds
    python -m tests.simulation.core --seed 4242 -v      # replay one exactly

Checks: one leader per term; every replica applies a prefix of the same log; every acknowledged
append is in its stream exactly once, in order (clients retry with idempotent producers across
leader changes and crashes); a read index is never below an append acknowledged before the read
was asked (linearizable reads); after healing, the stores of all members are byte-identical.
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass, field

from app.cluster import log_store
from app.cluster.log_store import LogStore
from app.raft.core import RaftCore
from app.raft.messages import Membership, Message, encode
from app.raft.ready import Role
from app.state_machine import records
from app.state_machine.commands import Append, Code, CreateStream, Producer, encode_envelope
from app.state_machine.export import Pair, applied_point, export, load
from app.state_machine.machine import COMPAT_BUCKET, StateMachine
from app.storage.kv import MemoryKV

STREAMS = 2
COMPACT_EVERY = 40  # applied entries between compactions
COMPACT_KEEP = 10  # entries kept behind the applied index


@dataclass
class Snapshot:
    term: int
    src: int
    dst: int
    index: int
    snap_term: int
    pairs: list[Pair]


@dataclass
class Node:
    id: int
    voters: list[int]
    seed: int
    raft_kv: MemoryKV = field(default_factory=lambda: MemoryKV(log_store.COLUMN_FAMILIES))
    state_kv: MemoryKV = field(default_factory=lambda: MemoryKV(records.COLUMN_FAMILIES))
    up: bool = True

    def __post_init__(self) -> None:
        self.boot()

    def boot(self) -> None:
        """(Re)starts from what is on 'disk': the log store and the state machine's store."""
        self.log = LogStore(self.raft_kv)
        self.machine = StateMachine(self.state_kv)
        membership = self.machine.membership
        self.core = RaftCore(
            self.id,
            sorted(membership.voters) if membership else self.voters,
            self.log.hard_state(),
            self.log.entries(),
            compacted_index=self.log.compacted_index,
            compacted_term=self.log.compacted_term,
            learners=sorted(membership.learners) if membership else [],
            applied=self.machine.applied_index,
            seed=self.seed,
        )
        self.compacted = self.log.compacted_index
        self.waiting: dict[int, tuple[int, int, int]] = {}  # log index -> (term, client id, seq)
        self.up = True


@dataclass
class Client:
    id: int
    stream: str
    seq: int = 0
    pending: bytes | None = None
    acked: list[bytes] = field(default_factory=list)
    wait: int = 0  # steps until it gives up on an outstanding proposal and retries


class Simulation:
    def __init__(self, seed: int, size: int = 3, verbose: bool = False) -> None:
        self.rng = random.Random(seed)
        self.verbose = verbose
        ids = list(range(1, size + 1))
        self.nodes = {i: Node(i, ids, seed) for i in ids}
        self.clients = [Client(c, f"s{c % STREAMS}") for c in range(4)]
        self.network: list[tuple[int, Message | Snapshot]] = []  # (deliver at step, message)
        self.removing = False
        self.acked_index = 0  # the highest log index of an acknowledged append
        self.reads: dict[tuple[int, int], int] = {}  # (node, ctx) -> acked_index when asked
        self.read_ctx = 0
        self.reads_answered = 0
        self.step_no = 0
        self.cut: set[int] = set()
        self.leaders: dict[int, set[int]] = {}
        self.drop = 0.05
        self.create_wait = 0

    def log(self, text: str) -> None:
        if self.verbose:
            print(f"[{self.step_no}] {text}")

    def leader(self) -> Node | None:
        live = [n for n in self.nodes.values() if n.up and n.core.role is Role.LEADER and n.id not in self.cut]
        return max(live, key=lambda n: n.core.term) if live else None

    def run(self, steps: int = 1500) -> None:
        for _ in range(steps):
            self.step()
            self.faults()
        # Heal everything and let the cluster settle and every client finish.
        self.cut, self.drop = set(), 0.0
        for node in self.nodes.values():
            if not node.up:
                node.boot()
        for _ in range(3000):
            self.step()
            if self.step_no % 50 == 0 and self.quiet():
                break
        self.check()

    def members(self) -> list[Node]:
        """The nodes of the configuration the most advanced replica has applied."""
        ahead = max(self.nodes.values(), key=lambda n: n.core.applied).machine.membership
        ids = {*ahead.voters, *ahead.learners} if ahead else {1, 2, 3}
        return [n for n in self.nodes.values() if n.id in ids]

    def quiet(self) -> bool:
        applied = {n.core.applied for n in self.members()}
        return all(c.pending is None for c in self.clients) and len(applied) == 1 and not self.network

    def faults(self) -> None:
        roll = self.rng.random()
        if roll < 0.004:
            victim = self.rng.choice(list(self.nodes))
            self.cut = {victim} if not self.cut else set()
            self.log(f"partition {self.cut}")
        elif roll < 0.008:
            node = self.nodes[self.rng.choice(list(self.nodes))]
            if node.up and sum(n.up for n in self.nodes.values()) > 1:
                node.up = False  # crash: memory is gone, the stores stay
                self.log(f"crash {node.id}")
        elif roll < 0.012:
            for node in self.nodes.values():
                if not node.up:
                    node.boot()
                    self.log(f"restart {node.id}")
                    break

    def step(self) -> None:
        self.step_no += 1
        due = [m for at, m in self.network if at <= self.step_no]
        self.network = [(at, m) for at, m in self.network if at > self.step_no]
        self.rng.shuffle(due)
        for msg in due:
            dst = self.nodes[msg.dst]
            delivered = dst.up and msg.src not in self.cut and msg.dst not in self.cut
            if isinstance(msg, Snapshot):
                self.deliver_snapshot(msg, dst if delivered else None)
            elif delivered:
                dst.core.step(msg)
        for node in self.nodes.values():
            if node.up:
                node.core.tick()
        self.drive_clients()
        self.change_membership()
        self.drive_reads()
        for node in self.nodes.values():
            if node.up:
                self.process(node)

    def process(self, node: Node) -> None:
        rd = node.core.ready()
        if rd.hard_state is not None or rd.entries:
            node.log.save(rd.hard_state, rd.entries)  # synced before anything is sent or applied
            if rd.entries:
                node.core.on_persisted(rd.entries[-1].index, rd.entries[-1].term)
        for msg in rd.messages:
            if self.rng.random() < self.drop:
                continue
            copies = 2 if self.rng.random() < 0.02 else 1  # the network may duplicate
            for _ in range(copies):
                self.network.append((self.step_no + self.rng.randint(1, 4), msg))
        for ctx, index in rd.reads:
            required = self.reads.pop((node.id, ctx), None)
            if required is not None and index:
                assert index >= required, f"read index {index} on node {node.id} misses acknowledged {required}"
                self.reads_answered += 1
        for peer in rd.checkpoints:
            index, snap_term = applied_point(node.state_kv)
            pairs = [pair for batch in export(node.state_kv) for pair in batch]
            snapshot = Snapshot(node.core.term, node.id, peer, index, snap_term, pairs)
            self.network.append((self.step_no + self.rng.randint(1, 20), snapshot))
        if rd.committed:
            outcomes = node.machine.apply(rd.committed)
            node.core.on_applied(rd.committed[-1].index)
            if node.core.applied - node.compacted >= COMPACT_EVERY:
                index = node.core.applied - COMPACT_KEEP
                term = node.core.log.term_at(index)
                assert term is not None
                node.core.compact(index)
                node.log.compact(index, term)
                node.compacted = index
            for entry, outcome in zip(rd.committed, outcomes, strict=True):
                waiter = node.waiting.pop(entry.index, None)
                if waiter is not None and waiter[0] == entry.term and outcome is not None:
                    self.acknowledge(self.clients[waiter[1]], waiter[2], outcome.code)
                    self.acked_index = max(self.acked_index, entry.index)
        if node.core.role is Role.LEADER:
            self.leaders.setdefault(node.core.term, set()).add(node.id)

    def drive_reads(self) -> None:
        """Now and then a node is asked for a read index (ReadIndex), as a follower's reader would."""
        if self.rng.random() < 0.1:
            node = self.nodes[self.rng.choice(list(self.nodes))]
            self.read_ctx += 1
            if node.up and node.core.read_index(self.read_ctx):
                self.reads[(node.id, self.read_ctx)] = self.acked_index

    def deliver_snapshot(self, snap: Snapshot, dst: Node | None) -> None:
        """Installs a shipped snapshot as the driver would, or reports the transfer failed."""
        src = self.nodes[snap.src]
        if dst is None or self.rng.random() < self.drop or not dst.core.can_install_checkpoint(snap.term, snap.index):
            if src.up:
                src.core.checkpoint_finished(snap.dst)
            return
        dst.state_kv = MemoryKV(records.COLUMN_FAMILIES)
        load(dst.state_kv, snap.pairs)
        dst.machine = StateMachine(dst.state_kv)
        dst.log.restore(snap.index, snap.snap_term)
        dst.compacted = snap.index
        membership = dst.machine.membership or Membership(dict.fromkeys(dst.core.voters, ""))
        dst.core.install_checkpoint(snap.term, snap.src, snap.index, snap.snap_term, membership)
        if src.up:
            src.core.checkpoint_finished(snap.dst)
        self.log(f"node {dst.id} installed a snapshot at {snap.index}")

    def change_membership(self) -> None:
        """Node 4 joins as a learner, is promoted once caught up, then the lowest original voter leaves."""
        leader = self.leader()
        if leader is None or self.step_no < 300:
            return
        current = leader.machine.membership or Membership({v: "" for v in leader.core.voters})
        if 4 not in self.nodes:
            self.nodes[4] = Node(4, [1, 2, 3], leader.seed)
        if 4 not in current.voters and 4 not in current.learners:
            new = Membership(current.voters, {**current.learners, 4: ""})
        elif 4 in current.learners and leader.core.tracker.match_indexes().get(4, 0) >= leader.core.commit:
            new = Membership({**current.voters, 4: ""})
        elif 4 in current.voters and not self.removing and self.step_no >= 700:
            victim = min(v for v in current.voters if v != leader.id)
            new = Membership({v: u for v, u in current.voters.items() if v != victim})
            if leader.core.propose_membership(new, encode(new)) is not None:
                self.removing = True
                self.log(f"removing node {victim}")
            return
        else:
            return
        if leader.core.propose_membership(new, encode(new)) is not None:
            self.log(f"proposed {new}")

    def acknowledge(self, client: Client, seq: int, code: Code) -> None:
        if client.pending is None or seq != client.seq:
            return  # the outcome of an earlier attempt the client already has an answer for
        if code in (Code.APPENDED, Code.DUPLICATE):
            client.acked.append(client.pending)
            client.pending, client.seq = None, client.seq + 1
        else:
            raise AssertionError(f"client {client.id}: unexpected outcome {code}")

    def drive_clients(self) -> None:
        leader = self.leader()
        if leader is None:
            return
        names = sorted({c.stream for c in self.clients})
        missing = [n for n in names if leader.machine.lookup(COMPAT_BUCKET, n) is None]
        if missing:
            # Creating is idempotent: propose again until the streams exist (a leader may die first).
            if self.create_wait <= 0:
                for name in missing:
                    leader.core.propose(encode_envelope(0, CreateStream(COMPAT_BUCKET, name, "text/plain", False)))
                self.create_wait = 40
            self.create_wait -= 1
            return
        for client in self.clients:
            if client.pending is None and client.seq < 40 and self.rng.random() < 0.3:
                client.pending = b"c%d-%d;" % (client.id, client.seq)
                client.wait = 0
            if client.pending is None:
                continue
            if client.wait > 0:
                client.wait -= 1
                continue
            # (Re)send the same seq: the producer makes a retry after any failure safe.
            producer = Producer(f"client-{client.id}", 0, client.seq)
            command = Append(COMPAT_BUCKET, client.stream, "text/plain", client.pending, producer=producer)
            index = leader.core.propose(encode_envelope(0, command))
            if index is not None:
                leader.waiting[index] = (leader.core.term, client.id, client.seq)
            client.wait = 40

    def check(self) -> None:
        for term, leaders in self.leaders.items():
            assert len(leaders) == 1, f"two leaders in term {term}: {leaders}"
        assert all(c.pending is None for c in self.clients), "a client never got its append acknowledged"
        members = self.members()
        dumps = [_dump(n.state_kv) for n in members]
        assert all(d == dumps[0] for d in dumps), "replicas differ after healing"
        assert 4 in members[0].core.voters, "the new node never became a voter"
        machine = members[0].machine
        for name in sorted({c.stream for c in self.clients}):
            meta = machine.lookup(COMPAT_BUCKET, name)
            assert meta is not None
            content = b"".join(bytes(p) for p in machine.read(meta, 0, 1 << 30).payloads)
            for client in (c for c in self.clients if c.stream == name):
                mine = [p for p in content.split(b";") if p.startswith(b"c%d-" % client.id)]
                expected = [a.rstrip(b";") for a in client.acked]
                if mine != expected:
                    at = next(
                        (i for i, (a, b) in enumerate(zip(mine, expected, strict=False)) if a != b),
                        min(len(mine), len(expected)),
                    )
                    raise AssertionError(
                        f"client {client.id}: from position {at} the stream has {mine[at : at + 3]},"
                        f" but the acknowledged appends were {expected[at : at + 3]}"
                        f" ({len(mine)} in the stream, {len(expected)} acknowledged)"
                    )


def _dump(kv: MemoryKV) -> dict[str, list[tuple[bytes, bytes]]]:
    return {cf: list(kv.scan(cf, b"")) for cf in records.COLUMN_FAMILIES if cf != records.SM_META}


def run_seed(seed: int, verbose: bool = False) -> None:
    Simulation(seed, verbose=verbose).run()


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.simulation.core",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--seeds", type=int, default=1000, help="run seeds 0..N-1")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, help="replay this one seed")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    failed = []
    for seed in seeds:
        try:
            run_seed(seed, args.verbose)
        except AssertionError as exc:
            failed.append(seed)
            print(f"seed {seed} failed: {exc}  (replay: python -m tests.simulation.core --seed {seed} -v)")
    print(f"{len(seeds) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
