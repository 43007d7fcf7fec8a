"""The many-groups CPU model's arithmetic (app/bench/scaling_model.py, docs/scaling.md) on cases worked by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.bench.scaling_model import (
    CLUSTER_FOLLOWER_US,
    CLUSTER_LEADER_US,
    SINGLE_NODE_HIGH_US,
    SINGLE_NODE_LOW_US,
    Cluster,
    Costs,
    capacity,
    cpu_per_append,
    fanout,
    group_machines,
    main,
    placement,
    spread_fraction,
    syncs,
    table,
)

# The meta group's small fixed load is left out where a case is worked exactly.
BIG = Cluster(machines=3, cores=16, meta_changes_per_second=0)


@pytest.mark.parametrize("us", [SINGLE_NODE_LOW_US, SINGLE_NODE_HIGH_US])
def test_one_group_on_one_core_is_the_single_node_figure(us: float) -> None:
    one = Cluster(machines=1, cores=1, groups=1, replication=1, costs=Costs(leader_us=us), meta_changes_per_second=0)
    assert capacity(one).appends_per_second == pytest.approx(1_000_000 / us)


def test_one_group_is_bound_by_its_leader_however_many_cores() -> None:
    for cores in (1, 4, 16):
        at = capacity(replace(BIG, cores=cores, groups=1))
        assert at.appends_per_second == pytest.approx(1_000_000 / CLUSTER_LEADER_US)
        assert at.busiest.leads == (0,)
        # Each follower uses follower/leader of its core at that rate.
        follower = [p for p in placement(replace(BIG, cores=cores)) if p.follows]
        assert len(follower) == 2
        for p in follower:
            assert at.utilization[(p.machine, p.slot)] == pytest.approx(CLUSTER_FOLLOWER_US / CLUSTER_LEADER_US)


@pytest.mark.parametrize("groups", [1, 2, 3, 5, 16, 47, 48, 49, 96, 100])
def test_never_more_than_min_groups_processes_worth_of_leaders(groups: int) -> None:
    cluster = replace(BIG, groups=groups)
    bound = min(groups, cluster.processes) * 1_000_000 / CLUSTER_LEADER_US
    assert capacity(cluster).appends_per_second <= bound * (1 + 1e-9)
    # Nor more than the whole cluster's CPU allows.
    total = cluster.processes * 1_000_000 / cpu_per_append(cluster)
    assert capacity(cluster).appends_per_second <= total * (1 + 1e-9)


def test_groups_up_to_the_cores_add_leaders() -> None:
    # Up to one group per slot, each group adds a leader's worth: G leaders at 235 us.
    for groups in (1, 3, 16):
        rate = capacity(replace(BIG, groups=groups)).appends_per_second
        assert rate == pytest.approx(groups * 1_000_000 / CLUSTER_LEADER_US)
    # At one group per process every process leads one and follows two: the cluster's CPU is the limit.
    rate = capacity(replace(BIG, groups=48)).appends_per_second
    assert rate == pytest.approx(48 * 1_000_000 / (CLUSTER_LEADER_US + 2 * CLUSTER_FOLLOWER_US))


@pytest.mark.parametrize("groups", [49, 50, 64, 72, 95, 96, 144, 480])
def test_more_groups_than_cores_give_no_more(groups: int) -> None:
    at_cores = capacity(replace(BIG, groups=BIG.processes)).appends_per_second
    assert capacity(replace(BIG, groups=groups)).appends_per_second <= at_cores * (1 + 1e-9)


def test_a_multiple_of_the_processes_gives_the_same() -> None:
    at_cores = capacity(replace(BIG, groups=48)).appends_per_second
    assert capacity(replace(BIG, groups=96)).appends_per_second == pytest.approx(at_cores)


@pytest.mark.parametrize("fraction", [0.0, 0.25, 0.5, 1.0])
def test_forwarding_costs_reduce_throughput_by_the_stated_fraction(fraction: float) -> None:
    plain = capacity(replace(BIG, groups=48)).appends_per_second
    forwarded = capacity(replace(BIG, groups=48, forward_fraction=fraction)).appends_per_second
    work = CLUSTER_LEADER_US + 2 * CLUSTER_FOLLOWER_US
    forward = fraction * BIG.costs.forward_us
    assert forwarded / plain == pytest.approx(work / (work + forward))
    assert cpu_per_append(replace(BIG, forward_fraction=fraction)) == pytest.approx(work + forward)


def test_forwarding_on_one_leader_per_process() -> None:
    # 16 groups: the leader processes carry 235/16 us per cluster append, plus their share of the forwarding.
    fraction = spread_fraction(BIG)
    assert fraction == pytest.approx(47 / 48)
    rate = capacity(replace(BIG, groups=16, forward_fraction=fraction)).appends_per_second
    assert rate == pytest.approx(1_000_000 / (CLUSTER_LEADER_US / 16 + fraction * BIG.costs.forward_us / 48))


def test_utilization_scales_the_rate() -> None:
    full = capacity(replace(BIG, groups=16)).appends_per_second
    assert capacity(replace(BIG, groups=16, utilization=0.7)).appends_per_second == pytest.approx(0.7 * full)


def test_placement_spreads_replicas_and_leaders() -> None:
    for groups in (1, 3, 16, 48, 96):
        cluster = replace(BIG, groups=groups)
        processes = placement(cluster)
        assert len(processes) == 48
        led = sorted(g for p in processes for g in p.leads)
        assert led == list(range(groups))  # every group has one leader
        for g in range(groups):
            machines = group_machines(cluster, g)
            assert len(set(machines)) == 3  # replicas on distinct machines
            holders = [p for p in processes if g in p.leads or g in p.follows]
            assert {p.slot for p in holders} == {g % 16}  # the same slot everywhere
            assert sorted(p.machine for p in holders) == sorted(machines)
        leaders_per_machine = [sum(len(p.leads) for p in processes if p.machine == m) for m in range(3)]
        assert max(leaders_per_machine) - min(leaders_per_machine) <= 1


def test_the_meta_group_is_negligible() -> None:
    with_meta = capacity(replace(BIG, groups=48, meta_changes_per_second=10)).appends_per_second
    without = capacity(replace(BIG, groups=48)).appends_per_second
    assert with_meta < without
    assert with_meta / without > 0.99


def test_syncs_one_log_per_process_cover_its_groups() -> None:
    cluster = replace(BIG, groups=48)
    rate = 48 * 1_000.0  # 1,000 appends/s per group: each process holds 3 replicas, 3,000 entries/s
    at = syncs(cluster, rate)
    most = 1000 / cluster.fsync_ms  # one sync in flight per log
    assert at.per_machine == pytest.approx(16 * min(3_000, most))
    assert at.per_machine_group_logs == pytest.approx(16 * 3 * 1_000)
    assert at.entries_per_sync == pytest.approx(3_000 / min(3_000, most))
    slow = syncs(replace(cluster, fsync_ms=1.0), rate)  # 1,000 syncs/s at most: 3 entries each
    assert slow.per_machine == pytest.approx(16 * 1_000)
    assert slow.entries_per_sync == pytest.approx(3.0)


def test_fanout_uses_the_replicas_spare_cpu() -> None:
    one = replace(BIG, groups=1)
    per_core = 1_000_000 / one.costs.sse_event_us
    assert fanout(one).events_per_second == pytest.approx(3 * per_core)  # only the three replicas serve
    assert fanout(one).per_group == pytest.approx(3 * per_core)
    all_cores = replace(BIG, groups=48)
    assert fanout(all_cores).events_per_second == pytest.approx(48 * per_core)
    assert fanout(all_cores).per_group == pytest.approx(3 * per_core)
    # At capacity nothing is left for subscribers.
    full = capacity(all_cores).appends_per_second
    assert fanout(all_cores, full).events_per_second == pytest.approx(0.0, abs=1e-6)
    half = fanout(all_cores, full / 2).events_per_second
    assert half == pytest.approx(24 * per_core)


def test_bad_clusters_are_refused() -> None:
    with pytest.raises(ValueError):
        Cluster(machines=2, replication=3)
    with pytest.raises(ValueError):
        Cluster(forward_fraction=1.5)
    with pytest.raises(ValueError):
        Cluster(groups=0)
    with pytest.raises(ValueError):
        Cluster(utilization=0)


def test_bottleneck_names_the_full_processes() -> None:
    assert capacity(replace(BIG, groups=16)).bottleneck.startswith("16 processes (leads 1, follows 0)")
    assert capacity(replace(BIG, groups=1)).bottleneck.startswith("1 process (leads 1, follows 0)")
    assert capacity(replace(BIG, groups=48)).bottleneck.startswith("all 48 processes")


def test_table_and_main(capsys: pytest.CaptureFixture[str]) -> None:
    lines = table(Cluster(), [1, 3, 16, 48])
    rows = [line for line in lines if line.startswith("| 16 ")]
    assert len(rows) == 2 and "68,028" in rows[0]
    main()
    out = capsys.readouterr().out
    assert "| 48 | 110,253 |" in out
