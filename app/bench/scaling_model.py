"""A CPU model of Rill with many Raft groups (docs/scaling.md): appends/s, fsyncs and SSE fan-out.

Pure arithmetic over measured per-append CPU; nothing here runs a server. One process per core,
each hosting the replicas of some groups; a group's replicas sit on the same core slot of
`replication` different machines (the placement of docs/scaling.md), its leader on the first of
them. Load is spread evenly over groups (no hot bucket). An append costs `leader_us` on its
group's leader process and `follower_us` on each follower process; a request that arrives at a
process other than its group's leader (`forward_fraction` of them, spread evenly over every
process) also costs `forward_us` where it arrived. The cluster's rate is the one at which its
busiest process reaches `utilization` of its core.

    .venv/bin/python -m app.bench.scaling_model
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

US_PER_SECOND = 1_000_000.0

# Measured on the 2-core benchmark machine (docs/benchmarks.md).
SINGLE_NODE_LOW_US = 134.0  # a single node's server CPU per durable append, best of five runs
SINGLE_NODE_HIGH_US = 212.0  # and worst
CLUSTER_LEADER_US = 235.0  # a 3-node cluster's leader, per replicated append
CLUSTER_FOLLOWER_US = 100.0  # each follower, per replicated append
FORWARD_US = 70.0  # assumed: a forwarded write costs its first process about what a client request costs
SSE_EVENT_US = 12.5  # per event delivered to one of 1,000 SSE subscribers
FSYNC_MS = 0.3  # the data disk's fsync, p50 0.19-0.32 ms


@dataclass(frozen=True)
class Costs:
    """CPU per operation, in microseconds of one core."""

    leader_us: float = CLUSTER_LEADER_US
    follower_us: float = CLUSTER_FOLLOWER_US
    forward_us: float = FORWARD_US
    sse_event_us: float = SSE_EVENT_US


@dataclass(frozen=True)
class Cluster:
    machines: int = 3
    cores: int = 16  # per machine: one process per core
    groups: int = 1  # data groups; the meta group comes on top
    replication: int = 3
    forward_fraction: float = 0.0  # of client requests, the share arriving at a process that does not lead their group
    costs: Costs = field(default_factory=Costs)
    meta_changes_per_second: float = 1.0  # bucket creations, deletions and moves: the meta group's writes
    fsync_ms: float = FSYNC_MS
    utilization: float = 1.0  # the share of each core the model lets a process use

    def __post_init__(self) -> None:
        if self.machines < 1 or self.cores < 1 or self.groups < 1:
            raise ValueError("machines, cores and groups must be at least 1")
        if not 1 <= self.replication <= self.machines:
            raise ValueError("replication must be from 1 to the number of machines")
        if not 0.0 <= self.forward_fraction <= 1.0:
            raise ValueError("forward_fraction must be from 0 to 1")
        if not 0.0 < self.utilization <= 1.0:
            raise ValueError("utilization must be in (0, 1]")

    @property
    def processes(self) -> int:
        return self.machines * self.cores


@dataclass(frozen=True)
class Process:
    """One process (one core): the data groups it leads and follows, and the meta group's load on it."""

    machine: int
    slot: int
    leads: tuple[int, ...]
    follows: tuple[int, ...]
    fixed_us: float  # CPU per second that does not grow with appends (the meta group)

    @property
    def replicas(self) -> int:
        return len(self.leads) + len(self.follows)


@dataclass(frozen=True)
class Capacity:
    appends_per_second: float
    cpu_us_per_append: float  # over the whole cluster: leader, followers and the forwarding hop
    busiest: Process
    utilization: dict[tuple[int, int], float]  # (machine, slot) -> share of its core at that rate
    bottleneck: str


@dataclass(frozen=True)
class Syncs:
    """Log syncs at a given rate, with one log store per process (one fsync covers all its groups)
    and, for comparison, one per group replica."""

    per_machine: float  # the busiest machine's syncs/s, one log per process
    per_machine_group_logs: float  # the same with one log per group replica
    entries_per_sync: float  # Raft entries each sync carries, on the busiest process


@dataclass(frozen=True)
class Fanout:
    events_per_second: float  # SSE events the replicas' spare CPU can deliver
    per_group: float  # what one group's replicas can deliver if its streams had them to themselves


def group_machines(cluster: Cluster, group: int) -> list[int]:
    """The machines holding the group's replicas, its leader's first."""
    slot, layer = group % cluster.cores, group // cluster.cores
    leader = (slot + layer) % cluster.machines
    return [(leader + j) % cluster.machines for j in range(cluster.replication)]


def placement(cluster: Cluster) -> list[Process]:
    """Every process: group g on slot g % cores of `replication` machines, leaders rotated so they
    spread over machines and slots; the meta group on the last slot of the first machines."""
    leads: dict[tuple[int, int], list[int]] = {}
    follows: dict[tuple[int, int], list[int]] = {}
    for group in range(cluster.groups):
        slot = group % cluster.cores
        first, *rest = group_machines(cluster, group)
        leads.setdefault((first, slot), []).append(group)
        for machine in rest:
            follows.setdefault((machine, slot), []).append(group)
    meta_slot = cluster.cores - 1
    costs, rate = cluster.costs, cluster.meta_changes_per_second
    # The meta leader commits each change and pushes the new placement to every process.
    meta_leader = rate * (costs.leader_us + cluster.processes * costs.sse_event_us)
    meta = {(m, meta_slot): (meta_leader if m == 0 else rate * costs.follower_us) for m in range(cluster.replication)}
    return [
        Process(
            m,
            s,
            tuple(leads.get((m, s), ())),
            tuple(follows.get((m, s), ())),
            meta.get((m, s), 0.0),
        )
        for m in range(cluster.machines)
        for s in range(cluster.cores)
    ]


def _per_append_us(cluster: Cluster, process: Process) -> float:
    """The process's CPU per append made anywhere in the cluster (appends spread evenly over groups)."""
    costs = cluster.costs
    own = (len(process.leads) * costs.leader_us + len(process.follows) * costs.follower_us) / cluster.groups
    return own + cluster.forward_fraction * costs.forward_us / cluster.processes


def cpu_per_append(cluster: Cluster) -> float:
    costs = cluster.costs
    return costs.leader_us + (cluster.replication - 1) * costs.follower_us + cluster.forward_fraction * costs.forward_us


def capacity(cluster: Cluster) -> Capacity:
    """The appends/s at which the busiest process uses `utilization` of its core."""
    budget = cluster.utilization * US_PER_SECOND
    processes = placement(cluster)
    rates = [
        ((budget - p.fixed_us) / _per_append_us(cluster, p), p) for p in processes if _per_append_us(cluster, p) > 0
    ]
    rate, busiest = min(rates, key=lambda pair: pair[0])
    shares = {(p.machine, p.slot): (p.fixed_us + rate * _per_append_us(cluster, p)) / US_PER_SECOND for p in processes}
    return Capacity(rate, cpu_per_append(cluster), busiest, shares, _bottleneck(processes, shares))


def _bottleneck(processes: list[Process], shares: dict[tuple[int, int], float]) -> str:
    """Which processes are full at capacity (within a percent of a core), and how busy the others are."""
    top = max(shares.values())
    full = [p for p in processes if shares[(p.machine, p.slot)] >= top - 0.01]
    roles = sorted({(len(p.leads), len(p.follows)) for p in full})
    role = " or ".join(f"leads {lead}, follows {follow}" for lead, follow in roles)
    rest = [shares[(p.machine, p.slot)] for p in processes if p not in full]
    if not rest:
        return f"all {len(full)} processes ({role}): total CPU"
    low, high = min(rest), max(rest)
    others = f"{low:.0%}" if high - low < 0.01 else f"{low:.0%}-{high:.0%}"
    which = "1 process" if len(full) == 1 else f"{len(full)} processes"
    return f"{which} ({role}); the other {len(rest)} at {others}"


def syncs(cluster: Cluster, appends_per_second: float) -> Syncs:
    """fsyncs at `appends_per_second`: each log syncs with one sync in flight, so a log syncs at most
    once per `fsync_ms` and whatever arrives meanwhile rides on the next sync (group commit)."""
    most = 1000.0 / cluster.fsync_ms
    per_group = appends_per_second / cluster.groups
    machine_syncs = [0.0] * cluster.machines
    machine_group_syncs = [0.0] * cluster.machines
    batch = 0.0
    for process in placement(cluster):
        entries = per_group * process.replicas
        if entries <= 0:
            continue
        shared = min(entries, most)
        machine_syncs[process.machine] += shared
        machine_group_syncs[process.machine] += process.replicas * min(per_group, most)
        batch = max(batch, entries / shared)
    return Syncs(max(machine_syncs), max(machine_group_syncs), batch)


def fanout(cluster: Cluster, appends_per_second: float = 0.0) -> Fanout:
    """SSE events/s the spare CPU of processes holding replicas can deliver, with appends at the rate given.

    A subscriber is served by a process holding a replica of its stream's group (a process without
    one hands the connection over), so processes hosting no group add nothing.
    """
    budget = cluster.utilization * US_PER_SECOND
    spare: dict[tuple[int, int], float] = {}
    for p in placement(cluster):
        if p.replicas:
            used = p.fixed_us + appends_per_second * _per_append_us(cluster, p)
            spare[(p.machine, p.slot)] = max(0.0, budget - used)
    event = cluster.costs.sse_event_us
    one = min(sum(spare[(m, g % cluster.cores)] for m in group_machines(cluster, g)) for g in range(cluster.groups))
    return Fanout(sum(spare.values()) / event, one / event)


def spread_fraction(cluster: Cluster) -> float:
    """The forwarded share when clients land on any process at random (one leader process per group)."""
    return 1.0 - 1.0 / cluster.processes


def _n(value: float) -> str:
    if math.isinf(value):
        return "-"
    return f"{value:,.0f}"


def _mean(at: Capacity) -> float:
    return sum(at.utilization.values()) / len(at.utilization)


def table(base: Cluster, groups: list[int]) -> list[str]:
    """docs/scaling.md's tables, as Markdown lines."""
    spread = spread_fraction(base)
    lines = [
        f"{base.machines} machines x {base.cores} cores, replication {base.replication}, "
        f"leader {base.costs.leader_us:g} us, follower {base.costs.follower_us:g} us, "
        f"forward {base.costs.forward_us:g} us, SSE {base.costs.sse_event_us:g} us/event, "
        f"fsync {base.fsync_ms:g} ms, cores used to {base.utilization:.0%}",
        "",
        "| groups | appends/s, direct | appends/s, spread | mean core use | bottleneck (direct) |",
        "|---|---|---|---|---|",
    ]
    for g in groups:
        direct = capacity(replace(base, groups=g, forward_fraction=0.0))
        spreading = capacity(replace(base, groups=g, forward_fraction=spread))
        lines.append(
            f"| {g} | {_n(direct.appends_per_second)} | {_n(spreading.appends_per_second)} "
            f"| {_mean(direct):.0%} | {direct.bottleneck} |"
        )
    lines += [
        "",
        f"direct: clients reach their group's leader process ({cpu_per_append(base):g} us of CPU per append "
        f"in all); spread: requests land on any process, {spread:.1%} of them forwarded once "
        f"({cpu_per_append(replace(base, forward_fraction=spread)):.0f} us). Mean core use: at the direct rate.",
        "",
        "| groups | syncs/s per machine (log per process) | (log per group) | entries per sync "
        "| SSE events/s, idle | SSE events/s at half the direct rate | one group's SSE events/s, idle |",
        "|---|---|---|---|---|---|---|",
    ]
    for g in groups:
        cluster = replace(base, groups=g)
        rate = capacity(cluster).appends_per_second
        at = syncs(cluster, rate)
        idle, busy = fanout(cluster), fanout(cluster, rate / 2)
        lines.append(
            f"| {g} | {_n(at.per_machine)} | {_n(at.per_machine_group_logs)} | {at.entries_per_sync:.1f} "
            f"| {_n(idle.events_per_second)} | {_n(busy.events_per_second)} | {_n(idle.per_group)} |"
        )
    lines.append("")
    lines.append("syncs and entries per sync at the direct rate.")
    return lines


def calibration() -> list[str]:
    """The measured set-ups the model must reproduce."""
    single = [
        capacity(Cluster(machines=1, cores=1, replication=1, costs=Costs(leader_us=us), meta_changes_per_second=0))
        for us in (SINGLE_NODE_LOW_US, SINGLE_NODE_HIGH_US)
    ]
    three = capacity(Cluster(machines=3, cores=1, meta_changes_per_second=0))
    return [
        f"single node, one core: {_n(single[1].appends_per_second)}-{_n(single[0].appends_per_second)} appends/s "
        f"({SINGLE_NODE_HIGH_US:g}-{SINGLE_NODE_LOW_US:g} us per append)",
        f"3 nodes, one core each, one group: {_n(three.appends_per_second)} appends/s "
        f"(leader-bound; measured 3,437/s with the leader at 0.8 of its core)",
    ]


def main() -> None:
    for line in [*calibration(), "", *table(Cluster(), [1, 3, 16, 48, 96])]:
        print(line)


if __name__ == "__main__":
    main()
