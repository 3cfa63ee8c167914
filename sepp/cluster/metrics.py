"""A cluster node's figures for /metrics (cluster mode, issue 19).

Owns: `NodeMetrics` (what the node and its committer count as they go) and
`ClusterMetricsView` (one scrape's reading: role, epoch, log sequence, appends
in flight, and the counts).

Promises: nothing here is per job. The node observes once per log message it
applies (a follower's apply lag and replication lag) and the committer once per
append (its latency); a scrape reads plain numbers on the loop thread.

Must not import: sepp.server, prometheus_client.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sepp.storage.histogram import Histogram

# Upper bounds (seconds) of the buckets of the follower's apply lag: from the
# batch's decided time (the leader's clock) to its apply here (this node's).
APPLY_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Upper bounds (seconds) of the buckets of the leader's append latency: from the
# append's request to JetStream's acknowledgement.
APPEND_DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


@dataclass
class NodeMetrics:
    """Counted by the node since its start."""

    # Times the node's epoch advanced: a new leader's record applied, or this
    # node taking over (the first epoch it learns, at boot, is not counted).
    leader_changes: int = 0
    apply_lag: Histogram = field(default_factory=lambda: Histogram(APPLY_LAG_BUCKETS))
    # From the log storing a message (JetStream's stream leader, before it
    # acknowledges the append) to its apply here: replication and apply alone.
    replication_lag: Histogram = field(default_factory=lambda: Histogram(APPLY_LAG_BUCKETS))
    append_duration: Histogram = field(default_factory=lambda: Histogram(APPEND_DURATION_BUCKETS))


@dataclass(frozen=True)
class ClusterMetricsView:
    """One scrape's reading of a node (`ClusterMode.metrics_view`)."""

    # "leader", "follower" or "candidate" (as hello's cluster.role says it).
    role: str
    epoch: int
    # The last log message this node applied or appended.
    log_seq: int
    # The leader's appends sent and not yet answered (0 on a follower).
    appends_in_flight: int
    counts: NodeMetrics


ROLES = ("leader", "follower", "candidate")
