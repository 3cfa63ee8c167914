"""Cluster mode end to end on JetStream: three SeppServers in one process, each
with its own NATS connection to the local three-server JetStream cluster (the
session's, tests/cluster/conftest.py). One serves, the followers apply its log to
the same state, a planned stop of the leader hands over and nothing acknowledged
is lost. Skipped where nats-server is not installed (a failure in CI)."""

from __future__ import annotations

import contextlib

import pytest

from sepp.cluster import jetstream
from sepp.cluster.logengine import state_hash
from sepp.protocol import errors as perr
from sepp.server.cluster_mode import connect_backend
from sepp.server.config import ClusterSettings
from sepp.server.server import SeppServer
from tests.cluster.conftest import unique_name
from tests.inprocess import address_of, in_process_config
from tests.server.conftest import RawClient, connect, job
from tests.support import wait_until
from tools.cluster import JetStreamCluster

pytestmark = pytest.mark.usefixtures("in_process_env")

# A takeover needs the lease to lapse (3 s) or be released, then one renewal
# period; a shared machine may be slow.
LEADER_DEADLINE_S = 20.0


def serving(servers: list[SeppServer]) -> list[SeppServer]:
    return [s for s in servers if s.cluster is not None and s.cluster.serving]


async def test_three_nodes_on_jetstream_serve_replicate_and_hand_over(
    jetstream_cluster: JetStreamCluster,
) -> None:
    names = jetstream.ClusterNames(
        stream=unique_name("log"),
        lease_bucket=unique_name("lease"),
        blob_bucket=unique_name("blobs"),
    )
    settings = ClusterSettings(
        nats_urls=jetstream_cluster.urls(),
        monitor_urls=jetstream_cluster.monitor_urls(),
        node_id="unused",
        advertise_addr="unused",
        lease_ttl_ms=3_000,
        lease_renew_ms=1_000,
    )
    servers: list[SeppServer] = []
    clients: list[RawClient] = []
    try:
        for node_id in ("n1", "n2", "n3"):
            config = in_process_config(
                cluster__node_id=node_id, cluster__advertise_addr="127.0.0.1:0"
            )
            backend = await connect_backend(settings, names)
            server = SeppServer(config, cluster_backend=backend)
            await server.start()
            servers.append(server)

        (leader,) = await wait_until(lambda: serving(servers), LEADER_DEADLINE_S, "a node serving")
        client = await connect(address_of(leader))
        clients.append(client)
        ids = await client.enqueue_ids(*(job("q") for _ in range(5)))
        assert len(ids) == 5
        follower = next(s for s in servers if s is not leader)
        other = await connect(address_of(follower))
        clients.append(other)
        refused = await other.call("enqueue", {"jobs": [job("q")]})
        assert refused.status == perr.UNAVAILABLE
        assert refused.body["reason"] == perr.REASON_NOT_LEADER

        nodes = [s.cluster.node for s in servers if s.cluster is not None]
        await wait_until(
            lambda: len({n.log_seq for n in nodes}) == 1, LEADER_DEADLINE_S, "followers"
        )
        assert len({state_hash(n.engine.state) for n in nodes}) == 1

        await leader.shutdown()
        await leader.wait_stopped()
        rest = [s for s in servers if s is not leader]
        (second,) = await wait_until(lambda: serving(rest), LEADER_DEADLINE_S, "a takeover")
        client = await connect(address_of(second))
        clients.append(client)
        hello = await client.hello()
        assert hello["cluster"]["epoch"] == 2
        assert (await client.stats("q"))["ready"] == 5
    finally:
        for c in clients:
            with contextlib.suppress(Exception):
                await c.close()
        for server in servers:
            if not server.stopping:
                await server.shutdown()
            await server.wait_stopped()
