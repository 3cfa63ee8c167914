"""A cluster node's /metrics (sepp/admin/metrics.py, sepp/cluster/metrics.py):
three SeppServers in one process on an in-memory log and lease, every node's
clock the same manual clock (the followers' 250 ms ahead, so a batch's apply lag
is exactly that). The leader and the followers each expose their role, epoch,
log sequence, leader changes, apply and replication lag (followers), append
latency (leader) and appends in flight; a planned handover counts one leader change."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sepp.cluster.node import LEASE_RENEW_MS
from sepp.cluster.replog import MemoryLog
from sepp.server.cluster_mode import ClusterBackend
from sepp.server.server import SeppServer
from tests.cluster.test_node_roles import settle
from tests.cluster.test_node_server import Trio
from tests.inprocess import in_process_config
from tests.server.conftest import job

pytestmark = pytest.mark.usefixtures("in_process_env")

# The followers' clocks run this far ahead of the leader's.
SKEW_MS = 250

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class MetricsTrio(Trio):
    def __init__(self) -> None:
        super().__init__()
        # The log stamps each message with the leader's clock when it stores it.
        self.log = MemoryLog(self.clock)

    async def start_node(self, node_id: str, skew_ms: int = 0) -> SeppServer:
        config = in_process_config(
            cluster__node_id=node_id,
            cluster__advertise_addr="127.0.0.1:0",
            admin__listen_addr="127.0.0.1:0",
        )
        backend = ClusterBackend(self.log, self.lease, sleep=self.clock.sleep)
        clock = self.clock
        server = SeppServer(config, clock=lambda: clock.now_ms + skew_ms, cluster_backend=backend)
        await server.start()
        self.servers.append(server)
        return server


@contextlib.asynccontextmanager
async def metrics_trio() -> AsyncIterator[MetricsTrio]:
    cluster = MetricsTrio()
    try:
        yield cluster
    finally:
        await cluster.close()


async def scrape(server: SeppServer) -> Samples:
    assert server.admin_address is not None
    host, port = server.admin_address
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{host}:{port}/metrics") as response,
    ):
        assert response.status == 200
        text = await response.text()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def role_of(samples: Samples) -> str:
    (role,) = [
        dict(labels)["role"]
        for (name, labels), v in samples.items()
        if name == "sepp_cluster_role" and v == 1
    ]
    return role


async def test_every_node_exposes_its_role_epoch_log_seq_and_lags() -> None:
    async with metrics_trio() as cluster:
        # n1 alone first: it leads; the others join as followers, 250 ms ahead.
        first = await cluster.start_node("n1")
        leader = await cluster.wait_leader()
        assert leader is first
        followers = [await cluster.start_node(n, skew_ms=SKEW_MS) for n in ("n2", "n3")]
        await cluster.clock.advance(LEASE_RENEW_MS + 100)
        client = await cluster.client(leader)
        await client.enqueue_ids(job("q"), job("q"))
        for _ in range(20):
            await settle()
        before = {id(f): await scrape(f) for f in followers}

        await client.enqueue_ids(job("q"))  # one more group commit: one log message
        for _ in range(20):
            await settle()

        lead = await scrape(leader)
        assert role_of(lead) == "leader"
        assert value(lead, "sepp_cluster_epoch") == 1
        assert leader.cluster is not None
        node = leader.cluster.node
        assert value(lead, "sepp_cluster_log_seq") == node.log_seq >= 3
        assert value(lead, "sepp_cluster_leader_changes_total") == 0
        assert value(lead, "sepp_cluster_appends_in_flight") == 0
        assert node.committer is not None
        appends = value(lead, "sepp_cluster_append_duration_seconds_count")
        assert appends == node.committer.appends >= 2
        assert value(lead, "sepp_cluster_append_duration_seconds_bucket", le="+Inf") == appends
        assert value(lead, "sepp_cluster_apply_lag_seconds_count") == 0  # it applies nothing
        assert value(lead, "sepp_cluster_replication_lag_seconds_count") == 0

        for follower in followers:
            samples = await scrape(follower)
            assert role_of(samples) == "follower"
            assert value(samples, "sepp_cluster_epoch") == 1
            assert value(samples, "sepp_cluster_log_seq") == node.log_seq
            assert value(samples, "sepp_cluster_appends_in_flight") == 0
            assert value(samples, "sepp_cluster_append_duration_seconds_count") == 0
            assert value(samples, "sepp_ready") == 0
            # Every message it applied was timed; the last one exactly SKEW_MS late.
            old = before[id(follower)]
            count = value(samples, "sepp_cluster_apply_lag_seconds_count")
            assert count == value(old, "sepp_cluster_apply_lag_seconds_count") + 1
            assert count == node.log_seq
            lag = value(samples, "sepp_cluster_apply_lag_seconds_sum") - value(
                old, "sepp_cluster_apply_lag_seconds_sum"
            )
            assert lag == pytest.approx(SKEW_MS / 1000)
            in_bucket = value(samples, "sepp_cluster_apply_lag_seconds_bucket", le="0.25") - value(
                old, "sepp_cluster_apply_lag_seconds_bucket", le="0.25"
            )
            assert in_bucket == 1
            assert value(samples, "sepp_cluster_apply_lag_seconds_bucket", le="0.1") == 0
            # Stored by the log on the leader's clock, so the same 250 ms.
            stored = value(samples, "sepp_cluster_replication_lag_seconds_count")
            assert stored == value(old, "sepp_cluster_replication_lag_seconds_count") + 1
            assert stored == count
            lag = value(samples, "sepp_cluster_replication_lag_seconds_sum") - value(
                old, "sepp_cluster_replication_lag_seconds_sum"
            )
            assert lag == pytest.approx(SKEW_MS / 1000)

        # A planned handover: the new leader counts one leader change, epoch 2.
        await leader.shutdown()
        await leader.wait_stopped()
        second = await cluster.wait_leader(within_ms=LEASE_RENEW_MS)
        for _ in range(20):
            await settle()
        samples = await scrape(second)
        assert role_of(samples) == "leader"
        assert value(samples, "sepp_cluster_epoch") == 2
        assert value(samples, "sepp_cluster_leader_changes_total") == 1
        assert value(samples, "sepp_cluster_append_duration_seconds_count") >= 1
        (other,) = [f for f in followers if f is not second]
        await cluster.clock.advance(LEASE_RENEW_MS + 100)
        samples = await scrape(other)
        assert role_of(samples) == "follower"
        assert value(samples, "sepp_cluster_epoch") == 2
        assert value(samples, "sepp_cluster_leader_changes_total") == 1
