"""Cluster mode in the server: three SeppServer instances in one process sharing
an in-memory log and lease (the lease and the nodes' timers on a manual clock).
One serves; the others answer hello / health / server_info with their role and
refuse everything else `unavailable` / `not_leader` with the leader's address;
a planned stop hands over; a leader whose append is refused answers the request
in flight `not_leader` and steps down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from sepp.client._convert import server_info_from_wire
from sepp.cluster.logengine import state_hash
from sepp.cluster.node import LEASE_RENEW_MS, LEASE_TTL_MS
from sepp.cluster.replog import MemoryLease, MemoryLog
from sepp.protocol import errors as perr
from sepp.server.cli import build_parser
from sepp.server.cli import main as cli_main
from sepp.server.cluster_mode import ClusterBackend
from sepp.server.config import ConfigError
from sepp.server.operator import _render_info
from sepp.server.server import EXIT_STORAGE_FAILED, SeppServer
from tests.cluster.test_node_roles import ManualClock, settle
from tests.inprocess import address_of, in_process_config
from tests.server.conftest import RawClient, connect, job

pytestmark = pytest.mark.usefixtures("in_process_env")


class Trio:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.log = MemoryLog()
        self.lease = MemoryLease(LEASE_TTL_MS, self.clock)
        self.servers: list[SeppServer] = []
        self.clients: list[RawClient] = []

    async def start_node(self, node_id: str) -> SeppServer:
        config = in_process_config(cluster__node_id=node_id, cluster__advertise_addr="127.0.0.1:0")
        backend = ClusterBackend(self.log, self.lease, sleep=self.clock.sleep)
        server = SeppServer(config, cluster_backend=backend)
        await server.start()
        self.servers.append(server)
        return server

    def serving(self) -> list[SeppServer]:
        return [s for s in self.servers if s.cluster is not None and s.cluster.serving]

    async def wait_leader(self, within_ms: int = 3 * LEASE_TTL_MS) -> SeppServer:
        for _ in range(within_ms // 100):
            serving = self.serving()
            if serving:
                assert len(serving) == 1
                return serving[0]
            await self.clock.advance(100)
        raise AssertionError("no node serves")

    async def client(self, server: SeppServer) -> RawClient:
        client = await connect(address_of(server))
        self.clients.append(client)
        return client

    async def close(self) -> None:
        for client in self.clients:
            with contextlib.suppress(Exception):
                await client.close()
        for server in self.servers:
            if not server.stopping:
                await server.shutdown()
            await server.wait_stopped()


@contextlib.asynccontextmanager
async def trio() -> AsyncIterator[Trio]:
    cluster = Trio()
    try:
        for node_id in ("n1", "n2", "n3"):
            await cluster.start_node(node_id)
        yield cluster
    finally:
        await cluster.close()


def advertised(server: SeppServer) -> str:
    assert server.cluster is not None
    return server.cluster.node.address


async def test_one_node_serves_and_the_others_redirect_to_it() -> None:
    async with trio() as cluster:
        leader = await cluster.wait_leader()
        followers = [s for s in cluster.servers if s is not leader]
        await cluster.clock.advance(LEASE_RENEW_MS + 100)  # followers read the lease

        lead = await cluster.client(leader)
        hello = await lead.hello()
        assert hello["cluster"]["role"] == "leader"
        assert hello["cluster"]["leader"] == advertised(leader)
        assert hello["cluster"]["epoch"] == 1
        ids = await lead.enqueue_ids(job("q"), job("q"))
        info = await lead.ok("server_info")
        assert info["cluster"]["role"] == "leader" and "persist_mode" in info

        for follower in followers:
            client = await cluster.client(follower)
            hello = await client.hello()
            assert hello["cluster"] == {
                "role": "follower",
                "node_id": follower.cluster.node.node_id if follower.cluster else None,
                "epoch": 1,
                "leader": advertised(leader),
            }
            assert (await client.ok("health"))["status"] == "serving"
            info = await client.ok("server_info")
            assert info["cluster"]["leader"] == advertised(leader)
            refused = await client.call("enqueue", {"jobs": [job("q")]})
            assert refused.status == perr.UNAVAILABLE
            assert refused.body["reason"] == perr.REASON_NOT_LEADER
            assert refused.body["leader"] == advertised(leader)
            refused = await client.call("queue_stats", {"queues": ["q"]})
            assert refused.status == perr.UNAVAILABLE

        # The followers applied the leader's log: the same state.
        for _ in range(50):
            await settle()
        nodes = [s.cluster.node for s in cluster.servers if s.cluster is not None]
        assert len({node.log_seq for node in nodes}) == 1
        assert len({state_hash(node.engine.state) for node in nodes}) == 1
        assert all(job_id in nodes[1].engine.state.jobs for job_id in ids)


async def test_a_planned_stop_of_the_leader_hands_over_within_half_a_renewal() -> None:
    async with trio() as cluster:
        first = await cluster.wait_leader()
        client = await cluster.client(first)
        ids = await client.enqueue_ids(job("q"))
        await client.close()
        await first.shutdown()
        await first.wait_stopped()

        second = await cluster.wait_leader(within_ms=LEASE_RENEW_MS // 2)

        assert second is not first
        client = await cluster.client(second)
        hello = await client.hello()
        assert hello["cluster"]["epoch"] == 2 and hello["cluster"]["role"] == "leader"
        stats = await client.stats("q")
        assert stats["ready"] == len(ids)


async def test_a_killed_leader_is_replaced_after_the_lease_lapses() -> None:
    async with trio() as cluster:
        first = await cluster.wait_leader()
        client = await cluster.client(first)
        await client.enqueue_ids(job("q"), job("q"), job("q"))
        assert first.cluster is not None
        await first.cluster.node.kill()  # as a crash: the lease is left to lapse
        first.cluster.serving = False

        second = await cluster.wait_leader(within_ms=LEASE_TTL_MS + 2 * LEASE_RENEW_MS + 500)

        assert second is not first
        client = await cluster.client(second)
        assert (await client.stats("q"))["ready"] == 3


async def test_a_leader_whose_append_is_refused_answers_not_leader_and_steps_down() -> None:
    async with trio() as cluster:
        leader = await cluster.wait_leader()
        client = await cluster.client(leader)
        cluster.log.fail_next.append("refuse")

        answer = await client.call("enqueue", {"jobs": [job("q")]})

        assert answer.status == perr.UNAVAILABLE, answer
        assert answer.body["reason"] == perr.REASON_NOT_LEADER
        assert answer.body["outcome_unknown"] is False  # refused: nothing appended
        await settle()
        assert leader.cluster is not None and not leader.cluster.serving
        assert leader.cluster.node.step_downs == 1
        # The admin and gRPC fronts see no engine: "not ready", never a stale state.
        assert leader.service.engine is None and leader.service.pipeline is None
        refused = await client.call("enqueue", {"jobs": [job("q")]})
        assert refused.status == perr.UNAVAILABLE
        # Someone leads again (possibly the same node, rebuilt from the log).
        again = await cluster.wait_leader()
        client = await cluster.client(again)
        assert (await client.stats("q"))["ready"] == 0


async def test_a_log_the_followers_cannot_apply_stops_them_with_exit_code_3() -> None:
    async with trio() as cluster:
        leader = await cluster.wait_leader()
        # A message appended behind the leader's back (an engine fault).
        seq = await cluster.log.last()
        await cluster.log.append_if(seq, b"\x00\x00\x00\x00not a batch")
        followers = [s for s in cluster.servers if s is not leader]

        for server in followers:
            assert await asyncio.wait_for(server.wait_stopped(), 10) == EXIT_STORAGE_FAILED
            assert server.storage_failure is not None
            assert f"message {seq + 1}" in str(server.storage_failure)


async def test_a_followers_server_info_is_whole_and_sepp_info_prints_its_role(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with trio() as cluster:
        leader = await cluster.wait_leader()
        await cluster.clock.advance(LEASE_RENEW_MS + 100)
        follower = next(s for s in cluster.servers if s is not leader)
        client = await cluster.client(follower)

        info = server_info_from_wire(await client.ok("server_info"))
        _render_info(info)

        assert info.cluster is not None and info.cluster.role == "follower"
        assert info.cluster.leader == advertised(leader)
        printed = capsys.readouterr().out.splitlines()
        assert "role                             follower" in printed
        assert "epoch                            1" in printed
        assert f"leader                           {advertised(leader)}" in printed


async def test_sepp_info_pointed_at_a_follower_prints_the_followers_role(
    capsys: pytest.CaptureFixture[str],
) -> None:
    async with trio() as cluster:
        leader = await cluster.wait_leader()
        await cluster.clock.advance(LEASE_RENEW_MS + 100)
        follower = next(s for s in cluster.servers if s is not leader)

        code = await asyncio.to_thread(cli_main, ["info", "--addr", address_of(follower)])

        assert code == 0
        printed = capsys.readouterr().out.splitlines()
        assert "role                             follower" in printed
        assert f"leader                           {advertised(leader)}" in printed


def test_cluster_settings_come_from_the_cluster_table_and_the_serve_flags() -> None:
    args = build_parser().parse_args(
        ["serve", "--cluster", "nats://a:4222, nats://b:4222", "--node-id", "n7"]
    )
    config = in_process_config(cluster__nats_urls=args.cluster, cluster__node_id=args.node_id)
    settings = config.cluster
    assert settings is not None
    assert settings.nats_urls == ["nats://a:4222", "nats://b:4222"]
    assert settings.node_id == "n7" and settings.advertise_addr == "127.0.0.1:0"
    assert (settings.lease_ttl_ms, settings.lease_renew_ms) == (LEASE_TTL_MS, LEASE_RENEW_MS)
    assert in_process_config().cluster is None
    with pytest.raises(ConfigError, match=r"cluster\.node_id"):
        _ = in_process_config(cluster__nats_urls="nats://a:4222").cluster


async def test_server_info_carries_each_nodes_log_seq_and_state_hash_equal_once_quiet() -> None:
    async with trio() as cluster:
        leader = await cluster.wait_leader()
        lead = await cluster.client(leader)
        await lead.enqueue_ids(job("q"), job("q"))
        for _ in range(50):
            await settle()

        views = []
        for server in cluster.servers:
            client = await cluster.client(server)
            raw = (await client.ok("server_info"))["cluster"]
            info = server_info_from_wire(await client.ok("server_info")).cluster
            assert info is not None
            assert (info.log_seq, info.state_hash) == (raw["log_seq"], raw["state_hash"])
            assert server.cluster is not None
            node = server.cluster.node
            assert raw["state_hash"] == state_hash(node.engine.state)
            views.append((raw["log_seq"], raw["state_hash"]))
        assert len(set(views)) == 1
        assert views[0][0] >= 2  # the leader change and the enqueue
