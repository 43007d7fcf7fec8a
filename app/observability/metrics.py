"""`/metrics`: the node's state and counters in Prometheus's text format, built when scraped.

Nothing is registered with prometheus_client's global registry and nothing on the request path
calls it: one collector reads the plain counters (app/counters/) and the node's
Raft, tiering and cache state at scrape time.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from app.cluster.driver import RaftNode
from app.counters.counts import RequestCounters
from app.counters.histogram import Histogram
from app.raft.ready import Role
from app.service.engine import Engine
from app.tiering.backups import StateBackups
from app.tiering.cache import SegmentCache
from app.tiering.worker import TieringWorker

# Every metric this node exports (the Grafana dashboard and its test hold to these names).
METRIC_NAMES = (
    "rill_http_requests_total",
    "rill_http_request_duration_seconds",
    "rill_live_subscribers",
    "rill_appends_total",
    "rill_appended_bytes_total",
    "rill_read_bytes_total",
    "rill_raft_term",
    "rill_raft_role",
    "rill_raft_leader_id",
    "rill_raft_commit_index",
    "rill_raft_applied_index",
    "rill_raft_last_index",
    "rill_raft_leader_changes_total",
    "rill_raft_fsync_duration_seconds",
    "rill_raft_replication_lag_entries",
    "rill_raft_snapshot_installs_total",
    "rill_raft_refused_messages_total",
    "rill_tiering_untiered_bytes",
    "rill_tiering_local_bytes",
    "rill_tiering_upload_duration_seconds",
    "rill_tiering_upload_errors_total",
    "rill_tiering_segments_uploaded_total",
    "rill_tiering_store_available",
    "rill_cold_cache_hits_total",
    "rill_cold_cache_misses_total",
    "rill_deletion_queue_length",
    "rill_unprotected_bytes",
    "rill_recovery_point_age_seconds",
    "rill_state_backups_total",
    "rill_state_backup_errors_total",
    "rill_state_backup_index",
)


def _histogram(name: str, doc: str, labels: list[str], series: Iterable[tuple[tuple[str, ...], Histogram]]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for values, histogram in sorted(series, key=lambda item: item[0]):
        family.add_metric(list(values), histogram.cumulative(), histogram.total)
    return family


def _gauge(name: str, doc: str, value: float) -> Metric:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> Metric:
    return CounterMetricFamily(name, doc, value=value)


@dataclass(eq=False)
class NodeCollector(Collector):
    engine: Engine
    requests: RequestCounters
    tiering: TieringWorker
    backups: StateBackups

    def collect(self) -> Iterator[Metric]:
        yield from self._http()
        yield from self._raft(self.engine.node)
        yield from self._tiering()
        yield from self._recovery_point()

    def _http(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "rill_http_requests_total", "HTTP requests answered, by route family, method and status",
            labels=["family", "method", "status"],
        )  # fmt: skip
        for (family, method, status), n in sorted(self.requests.requests.items()):
            requests.add_metric([family, method, str(status)], n)
        yield requests
        yield _histogram(
            "rill_http_request_duration_seconds", "Time to answer a request (live reads excluded)",
            ["family", "method"], list(self.requests.latency.items()),
        )  # fmt: skip
        live = GaugeMetricFamily("rill_live_subscribers", "Live reads open now, by mode", labels=["mode"])
        for mode, n in sorted(self.requests.live.items()):
            live.add_metric([mode], n)
        yield live
        counters = self.engine.counters
        yield _counter("rill_appends_total", "Appends acknowledged by this node", counters.appends)
        yield _counter("rill_appended_bytes_total", "Bytes those appends carried", counters.appended_bytes)
        yield _counter("rill_read_bytes_total", "Stream bytes this node read for catch-up reads", counters.read_bytes)

    def _raft(self, node: RaftNode) -> Iterator[Metric]:
        status = node.status()
        yield _gauge("rill_raft_term", "Current Raft term", status.term)
        role = GaugeMetricFamily("rill_raft_role", "1 for this node's Raft role", labels=["role"])
        learner = status.id in status.learners  # a learner steps as a follower: it is one or the other here
        for each in Role:
            role.add_metric([each.value], 1 if each is status.role and not learner else 0)
        role.add_metric(["learner"], 1 if learner else 0)
        yield role
        yield _gauge("rill_raft_leader_id", "The leader this node knows of (0: none)", status.leader)
        yield _gauge("rill_raft_commit_index", "Highest log index known committed", status.commit)
        yield _gauge("rill_raft_applied_index", "Highest log index applied to the state machine", status.applied)
        yield _gauge("rill_raft_last_index", "Highest index in this node's log", status.last_index)
        yield _counter("rill_raft_leader_changes_total", "Times this node saw the leader change", node.leader_changes)
        yield _histogram(
            "rill_raft_fsync_duration_seconds", "Time to write and sync a batch of log entries", [], [((), node.fsync)]
        )
        lag = GaugeMetricFamily(
            "rill_raft_replication_lag_entries", "On the leader: entries a peer lacks of the leader's log",
            labels=["peer"],
        )  # fmt: skip
        for peer, match in sorted(status.match.items()):
            if peer != status.id:
                lag.add_metric([str(peer)], max(0, status.last_index - match))
        yield lag
        yield _counter("rill_raft_snapshot_installs_total", "Checkpoints taken from a leader", node.checkpoint_installs)
        refused = CounterMetricFamily(
            "rill_raft_refused_messages", "Peer messages refused as impossible or stale", labels=["peer", "reason"]
        )
        for (peer, reason), count in sorted(node.refused.items()):
            refused.add_metric([str(peer), reason], count)
        yield refused

    def _tiering(self) -> Iterator[Metric]:
        worker, machine = self.tiering, self.engine.machine
        yield _gauge("rill_tiering_untiered_bytes", "Bytes not yet in the object store", machine.untiered_bytes)
        yield _gauge("rill_tiering_local_bytes", "Bytes of records on local disk", machine.local_bytes)
        yield _histogram(
            "rill_tiering_upload_duration_seconds", "Time to upload one segment", [], [((), worker.upload_seconds)]
        )
        yield _counter("rill_tiering_upload_errors_total", "Segment uploads that failed", worker.upload_errors)
        uploaded = worker.uploaded + worker.packer.packed + worker.packer.merged  # as the two above count
        yield _counter(
            "rill_tiering_segments_uploaded_total", "Objects uploaded and recorded: segments, packs, merges", uploaded
        )
        yield _gauge("rill_tiering_store_available", "1 while the object store answers", 1 if worker.available else 0)
        cache = self.engine.cold
        hits, misses = (cache.hits, cache.misses) if isinstance(cache, SegmentCache) else (0, 0)
        yield _counter("rill_cold_cache_hits_total", "Reads of evicted ranges found in memory", hits)
        yield _counter("rill_cold_cache_misses_total", "Reads of evicted ranges that had to fetch a segment", misses)
        yield _gauge("rill_deletion_queue_length", "Objects queued for deletion", worker.deletion_queue())

    def _recovery_point(self) -> Iterator[Metric]:
        backups = self.backups
        yield _gauge(
            "rill_unprotected_bytes", "Acknowledged record bytes not yet in a sealed segment in the object store",
            self.engine.machine.untiered_bytes,
        )  # fmt: skip
        age = backups.recovery_point_age(self.engine.now_ms(), self.tiering.oldest_unsealed)
        recovery = GaugeMetricFamily(
            "rill_recovery_point_age_seconds",
            "On the leader: how far back a restore from the object store would go, the older of the last state "
            "backup (if the state changed since) and the oldest record not yet sealed; no sample elsewhere",
        )
        if age is not None:
            recovery.add_metric([], age)
        yield recovery
        yield _counter("rill_state_backups_total", "State backups this node wrote to the object store", backups.written)
        yield _counter("rill_state_backup_errors_total", "State backups that failed", backups.errors)
        index = GaugeMetricFamily("rill_state_backup_index", "Raft index of this leader's last state backup")
        if backups.last is not None:
            index.add_metric([], backups.last.index)
        yield index
