"""/metrics: the service's counters and the state's gauges in Prometheus' text format.

Owns: `SeppCollector`, a prometheus_client collector that reads everything at
scrape time (the counters the live path keeps in `ServerMetrics`, the queue
gauges from the state, the log and snapshot figures from the engine), and
`render_metrics`, which adds the process metrics (ProcessCollector).

In cluster mode (`service.cluster_metrics`) the node's figures too, leader or
follower: `sepp_cluster_role`, `_epoch`, `_log_seq`, `_leader_changes_total`,
`_apply_lag_seconds`, `_replication_lag_seconds`, `_append_duration_seconds`,
`_appends_in_flight`.

Promises: nothing here runs on the request path; a scrape reads plain numbers on
the loop thread, O(queues) work, and never waits for storage. Labels are bounded:
`queue` by `ServerMetrics.queue_label` (the first QUEUE_LABELS_MAX queues, then
"_other"), `cause`, `reason`, `state` and `type` by the code's own names.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.registry import Collector

from sepp.server.metrics import RequestMetrics
from sepp.server.service import SeppService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
QUEUE_STATES = ("ready", "scheduled", "inflight", "dead_letter")


def _counter(name: str, doc: str, value: int) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


class Histogram(Protocol):
    """Plain counts of a histogram (sepp.storage.histogram.Histogram)."""

    @property
    def bounds(self) -> Sequence[float]: ...
    @property
    def counts(self) -> Sequence[int]: ...
    @property
    def commits(self) -> int: ...
    @property
    def total(self) -> float: ...


def _buckets(histogram: Histogram, count: int | None = None) -> list[tuple[str, float]]:
    """Prometheus' cumulative buckets of a Histogram's plain counts
    (`count`: the observations, when `commits` does not keep them)."""
    buckets: list[tuple[str, float]] = []
    cumulative = 0
    for bound, in_bucket in zip(histogram.bounds, histogram.counts):
        cumulative += in_bucket
        buckets.append((str(bound), cumulative))
    buckets.append(("+Inf", histogram.commits if count is None else count))
    return buckets


def _histogram(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=_buckets(histogram), sum_value=histogram.total)


def _requests(requests: RequestMetrics) -> Iterator[CounterMetricFamily | HistogramMetricFamily]:
    """The native front's requests (RequestMetrics), by method and outcome."""
    total = CounterMetricFamily(
        "sepp_requests",
        "Native protocol requests since start, by method (the op) and outcome "
        "(ok or the answer's error code).",
        labels=["method", "outcome"],
    )
    for method, by_outcome in sorted(requests.outcomes().items()):
        for outcome, count in sorted(by_outcome.items()):
            total.add_metric([method, outcome], count)
    yield total
    durations = HistogramMetricFamily(
        "sepp_request_duration_seconds",
        "Native requests' handling on the loop, from the frame read to the answer "
        "decided (written, or queued behind its group commit, or a reserve parked); "
        "one request in 8 is timed (a sample: its count is the timed requests).",
        labels=["method"],
    )
    for method, histogram in sorted(requests.durations.items()):
        durations.add_metric([method], _buckets(histogram), sum_value=histogram.total)
    yield durations


class SeppCollector(Collector):
    def __init__(self, service: SeppService) -> None:
        self.service = service

    def collect(
        self,
    ) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
        service = self.service
        m = service.metrics
        enqueued = CounterMetricFamily(
            "sepp_jobs_enqueued", "Jobs stored by enqueues since start.", labels=["queue"]
        )
        for queue, count in sorted(m.enqueued.items()):
            enqueued.add_metric([queue], count)
        yield enqueued
        yield _counter("sepp_jobs_reserved", "Jobs leased by reserves since start.", m.reserved)
        yield _counter("sepp_jobs_acked", "Jobs acknowledged since start.", m.acked)
        yield _counter(
            "sepp_jobs_nacked",
            "Nacks that returned the job for a retry (one that ended it: dead_lettered).",
            m.nacked,
        )
        dead = CounterMetricFamily(
            "sepp_jobs_dead_lettered",
            "Jobs dead-lettered since start, by cause.",
            labels=["queue", "cause"],
        )
        for (queue, cause), count in sorted(m.dead_lettered.items()):
            dead.add_metric([queue, cause], count)
        yield dead
        yield _counter(
            "sepp_jobs_deduplicated",
            "Enqueued jobs answered with an earlier job of the same idempotency key.",
            m.deduplicated,
        )
        rejected = CounterMetricFamily(
            "sepp_jobs_rejected",
            "Jobs of enqueues refused by the core, by reason.",
            labels=["queue", "reason"],
        )
        for (queue, reason), count in sorted(m.rejected.items()):
            rejected.add_metric([queue, reason], count)
        yield rejected
        yield _counter("sepp_reserve_empty", "Reserve commands that found no job.", m.reserve_empty)
        yield _counter(
            "sepp_jobs_promoted", "Scheduled jobs the sweep made ready since start.", m.promoted
        )
        yield _counter(
            "sepp_lease_expirations",
            "Leases that expired (the job redelivered or dead-lettered) since start.",
            m.lease_expired,
        )
        yield _counter(
            "sepp_dedup_expirations", "Idempotency keys whose window ended.", m.dedup_expired
        )
        yield _counter(
            "sepp_dead_letters_expired",
            "Dead letters removed by dead_letter_retention_ms.",
            m.dead_letters_expired,
        )
        yield _counter(
            "sepp_dead_letters_drained", "Dead letters removed by drains.", m.dead_letters_drained
        )
        events = CounterMetricFamily(
            "sepp_log_events", "Events logged since start, by type.", labels=["type"]
        )
        for kind, count in sorted(m.events.items()):
            events.add_metric([kind], count)
        yield events
        if m.requests is not None:
            yield from _requests(m.requests)

        ready = GaugeMetricFamily(
            "sepp_ready", "1 while the server serves (recovery done, not stopping, storage ok)."
        )
        ready.add_metric([], 1 if service.engine is not None and service.health().serving else 0)
        yield ready
        if service.cluster_metrics is not None:
            yield from _cluster(service)
        engine = service.engine
        if engine is None:
            return
        yield from self._queues(service)
        pipeline = service.pipeline
        depth = GaugeMetricFamily(
            "sepp_command_queue_depth", "Commands waiting for their record to be durable."
        )
        depth.add_metric([], pipeline.backlog if pipeline is not None else 0)
        yield depth
        if pipeline is not None:
            yield _histogram(
                "sepp_group_commit_records",
                "Records per group commit made durable since start.",
                pipeline.group_commit_records,
            )
            yield _histogram(
                "sepp_commit_duration_seconds",
                "From a group commit's start (its first waiting command, or the previous "
                "commit's end) until it was durable; commits nobody waited for are not timed.",
                pipeline.commit_duration,
            )
        segments = engine.segments
        wal_bytes = GaugeMetricFamily("sepp_wal_bytes", "Bytes of the log's segment files.")
        wal_bytes.add_metric([], sum(segment.size for segment in segments))
        yield wal_bytes
        wal_segments = GaugeMetricFamily("sepp_wal_segments", "Log segment files.")
        wal_segments.add_metric([], len(segments))
        yield wal_segments
        stats = engine.stats
        yield _counter("sepp_log_records", "Log records written since start.", stats["records"])
        yield _counter(
            "sepp_log_group_commits",
            "Group commits (log writes) since start; records / commits is the batch size.",
            stats["flushes"],
        )
        yield _counter("sepp_log_written_bytes", "Log bytes written since start.", stats["bytes"])
        seq = GaugeMetricFamily(
            "sepp_snapshot_last_seq", "Sequence number of the newest snapshot (0: none)."
        )
        seq.add_metric([], engine.snapshot_seq)
        yield seq
        duration = GaugeMetricFamily(
            "sepp_snapshot_last_duration_seconds",
            "How long the last snapshot published since start took (0: none yet).",
        )
        duration.add_metric([], engine.snapshot_duration_s)
        yield duration

    def _queues(self, service: SeppService) -> Iterator[GaugeMetricFamily]:
        engine = service.engine
        assert engine is not None
        state = engine.state
        label = service.metrics.queue_label
        now = service.now_ms()
        counts: dict[str, list[int]] = {}
        oldest: dict[str, int] = {}
        for name, q in state.queues.items():
            key = label(name)
            row = counts.get(key)
            if row is None:
                row = counts[key] = [0, 0, 0, 0]
            row[0] += q.ready_count
            row[1] += q.scheduled_count
            row[2] += q.in_flight_count
            row[3] += len(q.dead)
            enqueued_at = state.oldest_ready_enqueued_at(name)
            age = 0 if enqueued_at is None else max(0, now - enqueued_at)
            if age >= oldest.get(key, 0):
                oldest[key] = age
        jobs = GaugeMetricFamily(
            "sepp_queue_jobs", "Jobs of a queue by state.", labels=["queue", "state"]
        )
        ages = GaugeMetricFamily(
            "sepp_queue_oldest_ready_age_seconds",
            "Age of the queue's oldest ready job (0 when none is ready).",
            labels=["queue"],
        )
        for key in sorted(counts):
            for state_name, value in zip(QUEUE_STATES, counts[key]):
                jobs.add_metric([key, state_name], value)
            ages.add_metric([key], oldest[key] / 1000)
        yield jobs
        yield ages


CLUSTER_ROLES = ("leader", "follower", "candidate")


def _cluster(
    service: SeppService,
) -> Iterator[CounterMetricFamily | GaugeMetricFamily | HistogramMetricFamily]:
    """A cluster node's figures (sepp/cluster/metrics.py), on every node."""
    assert service.cluster_metrics is not None
    view = service.cluster_metrics()
    role = GaugeMetricFamily(
        "sepp_cluster_role",
        "1 for this node's role in the cluster (leader, follower or candidate), 0 for the others.",
        labels=["role"],
    )
    for name in CLUSTER_ROLES:
        role.add_metric([name], 1 if view.role == name else 0)
    yield role
    epoch = GaugeMetricFamily(
        "sepp_cluster_epoch", "The leader's epoch this node knows (0: none yet)."
    )
    epoch.add_metric([], view.epoch)
    yield epoch
    seq = GaugeMetricFamily(
        "sepp_cluster_log_seq",
        "The last message of the replicated log this node applied (a follower) or "
        "appended (the leader).",
    )
    seq.add_metric([], view.log_seq)
    yield seq
    counts = view.counts
    yield _counter(
        "sepp_cluster_leader_changes",
        "Times this node's epoch advanced since start: a new leader's record applied, or "
        "this node taking over (the first epoch it learns is not counted).",
        counts.leader_changes,
    )
    yield _histogram(
        "sepp_cluster_apply_lag_seconds",
        "Per log message a follower applied: from the batch's decided time (the leader's "
        "clock) to its apply here (this node's clock; clock skew between machines "
        "included; a node catching up counts its backlog).",
        counts.apply_lag,
    )
    yield _histogram(
        "sepp_cluster_replication_lag_seconds",
        "Per log message a follower applied: from JetStream storing it (the stream "
        "leader's clock, before it acknowledged the append) to its apply here (this "
        "node's clock): replication and apply without the leader's group commit.",
        counts.replication_lag,
    )
    yield _histogram(
        "sepp_cluster_append_duration_seconds",
        "Per append the leader made: from its request to JetStream's acknowledgement.",
        counts.append_duration,
    )
    in_flight = GaugeMetricFamily(
        "sepp_cluster_appends_in_flight",
        "The leader's appends sent and not yet answered (0 on a follower).",
    )
    in_flight.add_metric([], view.appends_in_flight)
    yield in_flight


def metrics_registry(service: SeppService) -> CollectorRegistry:
    """A registry of its own (not the process-global one): sepp's collector and
    the process metrics (process_cpu_seconds_total, process_resident_memory_bytes,
    open fds...)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SeppCollector(service))
    ProcessCollector(registry=registry)
    return registry


def render_metrics(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
