"""Cluster mode in the client (issue 19 item 5): several addresses, finding the
leader, following ``not_leader`` refusals, and sending again after a failover
only what is safe to repeat.

The cluster is `tests.client.clusterfake`: three fake nodes on 127.0.0.1:0 with
roles in their hello answers, in front of one real sepp server run in process
(what the nodes share, as they would share the replicated log), so "lands
exactly once" is checked on a real server's dedup and fencing. Failovers are
scripted (`FakeNode.fault`, `FakeCluster.elect`); nothing sleeps to wait. The
last test runs the client against three real cluster nodes in process (the
server's own test trio: an in-memory log and lease on a manual clock).
"""

from __future__ import annotations

import asyncio
import logging
import random
from datetime import timedelta
from typing import Any

import pytest

from sepp.client import (
    ConnectError,
    EnqueueRequest,
    JobNotFoundError,
    NotLeaderError,
    Payload,
    ReserveOptions,
    SeppClient,
    SyncSeppClient,
    TransportError,
    Worker,
)
from sepp.client.errors import error_from_response
from sepp.cluster.node import LEASE_RENEW_MS
from sepp.protocol import Request
from tests.client.clusterfake import FakeCluster, closed_port_address, fake_cluster
from tests.client.fakeserver import CLOSE, SILENT, FakeConnection, FakeServer
from tests.cluster.test_node_server import trio
from tests.inprocess import address_of
from tests.support import wait_until

pytestmark = pytest.mark.usefixtures("in_process_env")

LEASE = timedelta(seconds=30)
# A deadline these tests reach on purpose: short, yet long enough for a few
# round trips on a loaded machine (every node asked, a leader found after it).
QUICK = timedelta(milliseconds=300)
DEADLINE = timedelta(seconds=2)
log = logging.getLogger(__name__)


def job(key: str | None = None, job_type: str = "work") -> EnqueueRequest:
    return EnqueueRequest("q", job_type, Payload(b"{}", "application/json"), idempotency_key=key)


def reserve_opts(wait: timedelta = timedelta(0), max_jobs: int = 1) -> ReserveOptions:
    return ReserveOptions(["q"], LEASE, wait_timeout=wait, max_jobs=max_jobs)


async def counts(cluster: FakeCluster) -> tuple[int, int]:
    """(ready, in flight) of queue q on the shared server, asked directly."""
    async with SeppClient(cluster.backend_address) as direct:
        (stats,) = await direct.queue_stats(["q"])
    return stats.ready, stats.in_flight


def shuffled_addresses(cluster: FakeCluster, rng: random.Random) -> list[str]:
    addresses = cluster.addresses
    rng.shuffle(addresses)
    log.info("addresses in the order given: %s", addresses)
    return addresses


# -- connecting ------------------------------------------------------------------------------


async def test_connect_to_a_follower_moves_to_the_leader_it_names() -> None:
    async with fake_cluster() as cluster:
        a, b, c = cluster.nodes
        cluster.elect(c)
        client = await SeppClient.connect(f"{a.address}, {b.address},{c.address}")
        try:
            assert client.address == c.address
            assert client.addresses == (a.address, b.address, c.address)
            assert client.cluster is not None and client.cluster.role == "leader"
            # a named c: b was never asked.
            assert (a.hellos, b.hellos, c.hellos) == (1, 0, 1)
            await client.enqueue(job())
            assert c.forwarded == ["enqueue"]
        finally:
            await client.close()
        assert await counts(cluster) == (1, 0)


async def test_connect_takes_a_list_and_skips_an_address_nobody_listens_on() -> None:
    async with fake_cluster() as cluster:
        dead = await closed_port_address()
        client = await SeppClient.connect([dead, cluster.nodes[0].address])
        try:
            assert client.address == cluster.nodes[0].address
        finally:
            await client.close()


async def test_a_leader_named_but_unreachable_is_skipped_for_the_next_address() -> None:
    async with fake_cluster() as cluster:
        a, b, c = cluster.nodes
        cluster.elect(b)
        dead = await closed_port_address()
        a.set_role("follower", dead)  # a still names the leader that died
        client = await SeppClient.connect([a.address, c.address, b.address])
        try:
            assert client.address == b.address
            assert (a.hellos, c.hellos, b.hellos) == (1, 1, 1)
        finally:
            await client.close()


async def test_connect_asks_again_with_backoff_until_a_leader_is_elected() -> None:
    async with fake_cluster() as cluster:
        a, b, _ = cluster.nodes
        cluster.elect(None)
        connecting = asyncio.create_task(
            SeppClient.connect(cluster.addresses, connect_timeout=timedelta(seconds=10))
        )
        # Every node asked twice: the client went round, waited, went round again.
        await a.server.wait_until(lambda: min(n.hellos for n in cluster.nodes) >= 2)
        assert not connecting.done()
        cluster.elect(b)
        client = await connecting
        try:
            assert client.address == b.address
        finally:
            await client.close()


async def test_connect_raises_not_leader_error_when_no_node_leads_before_the_timeout() -> None:
    async with fake_cluster() as cluster:
        cluster.elect(None)
        with pytest.raises(NotLeaderError) as raised:
            await SeppClient.connect(cluster.addresses, connect_timeout=DEADLINE)
        assert raised.value.leader is None
        assert raised.value.code == "unavailable" and raised.value.reason == "not_leader"
        assert isinstance(raised.value, TransportError)
        assert all(node.hellos >= 1 for node in cluster.nodes)


async def test_connect_raises_connect_error_when_no_address_answers() -> None:
    addresses = [await closed_port_address(), await closed_port_address()]
    with pytest.raises(ConnectError) as raised:
        await SeppClient.connect(addresses, connect_timeout=QUICK)
    assert not isinstance(raised.value, NotLeaderError)
    assert addresses[0] in str(raised.value) and addresses[1] in str(raised.value)


async def test_one_address_of_a_single_node_costs_one_connection_and_no_extra_round_trip(
    fake: FakeServer,
) -> None:
    async with fake:
        fake.reply("queue_stats", "ok", {"server_time_ms": 0, "queues": []})
        client = await SeppClient.connect(fake.address)
        try:
            assert client.cluster is None
            await client.queue_stats()
        finally:
            await client.close()
        assert [r.op for r in fake.requests] == ["hello", "queue_stats"]
        assert client.connections_opened == 1


async def test_one_address_that_fails_the_handshake_is_tried_once_as_always() -> None:
    accepted: list[int] = []

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(1)
        writer.close()

    listener = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ConnectError):
            await SeppClient.connect(f"127.0.0.1:{port}", connect_timeout=timedelta(seconds=30))
        # No search for a leader with backoff: the one failure is the answer.
        assert accepted == [1]
    finally:
        listener.close()
        await listener.wait_closed()


async def test_follow_leader_false_stays_on_a_follower_and_reports_its_role() -> None:
    async with fake_cluster() as cluster:
        a, _, c = cluster.nodes
        cluster.elect(c)
        client = await SeppClient.connect(a.address, follow_leader=False)
        try:
            info = await client.get_server_info()
            assert info.cluster is not None
            assert (info.cluster.role, info.cluster.node_id, info.cluster.leader) == (
                "follower",
                "a",
                c.address,
            )
            with pytest.raises(NotLeaderError) as raised:
                await client.enqueue(job())
            assert raised.value.leader == c.address
            assert client.address == a.address and c.hellos == 0
        finally:
            await client.close()


# -- not_leader refusals: nothing was done, every operation goes to the leader ---------------


@pytest.mark.parametrize("batches", [True, False], ids=["coalesced", "alone"])
async def test_every_operation_refused_as_not_leader_is_sent_again_at_the_new_leader(
    batches: bool,
) -> None:
    async with fake_cluster(batches=batches) as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(cluster.addresses)
        try:
            await client.enqueue(job())
            await client.enqueue(job())
            await client.enqueue(job())
            cluster.elect(b)  # a's connection stays open: a now refuses
            ack = await client.enqueue(job())  # no idempotency key: refused, so sent again
            assert not ack.deduplicated
            assert client.address == b.address
            (first,) = await client.reserve(reserve_opts()) or []
            cluster.elect(a)
            (second,) = await client.reserve(reserve_opts()) or []
            cluster.elect(b)
            await client.ack(first.ctx)
            cluster.elect(a)
            assert await client.nack(second.ctx) is False
            (third,) = await client.reserve(reserve_opts()) or []
            cluster.elect(b)
            await client.extend(third.ctx, LEASE)
            cluster.elect(a)
            await client.release(third.ctx)
            cluster.elect(b)
            await client.get_server_info()
            (stats,) = await client.queue_stats(["q"])
            assert (stats.ready, stats.in_flight) == (3, 0)
        finally:
            await client.close()
        assert {"enqueue", "reserve", "ack", "nack", "extend", "release"} <= {
            *a.refused,
            *b.refused,
        }
        assert await counts(cluster) == (3, 0)


async def test_a_long_poll_refused_as_not_leader_waits_at_the_leader() -> None:
    async with fake_cluster() as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(cluster.addresses)
        try:
            cluster.elect(b)
            polling = asyncio.create_task(client.reserve(reserve_opts(wait=timedelta(seconds=20))))
            await b.server.wait_until(lambda: "reserve" in b.forwarded)
            assert a.refused == ["reserve"]
            await client.enqueue(job())
            jobs = await polling
            assert jobs is not None and len(jobs) == 1
        finally:
            await client.close()


async def test_no_leader_before_the_call_deadline_raises_not_leader_error() -> None:
    async with fake_cluster() as cluster:
        client = await SeppClient.connect(cluster.addresses, rpc_timeout=DEADLINE)
        try:
            cluster.elect(None)
            with pytest.raises(NotLeaderError) as raised:
                await client.enqueue(job())
            assert not raised.value.outcome_unknown
            # Nothing was done anywhere.
            assert all(node.forwarded == [] for node in cluster.nodes)
        finally:
            await client.close()


def test_a_not_leader_answer_maps_to_not_leader_error_with_the_leader_named() -> None:
    body: dict[str, Any] = {"message": "m", "reason": "not_leader", "leader": "h2:7463"}
    error = error_from_response("ack", "unavailable", body)
    assert isinstance(error, NotLeaderError) and isinstance(error, TransportError)
    assert (error.leader, error.outcome_unknown, error.code) == ("h2:7463", False, "unavailable")
    unknown = error_from_response("enqueue", "unavailable", {**body, "outcome_unknown": True})
    assert isinstance(unknown, NotLeaderError) and unknown.outcome_unknown
    shutting = error_from_response("ack", "unavailable", {"reason": "shutting_down"})
    assert type(shutting) is TransportError


# -- failover with an unknown outcome: only what is safe is sent again ------------------------


@pytest.mark.parametrize("kind", ["drop_after", "unknown_after"])
@pytest.mark.parametrize("batches", [True, False], ids=["coalesced", "alone"])
async def test_an_enqueue_with_an_idempotency_key_is_sent_again_and_lands_exactly_once(
    kind: str, batches: bool
) -> None:
    async with fake_cluster(batches=batches) as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(cluster.addresses)
        try:
            a.fault("enqueue", kind, then=lambda: cluster.elect(b))
            ack = await client.enqueue(job(key="order-1"))
            # Done by a, sent again at b: the shared log's dedup answered it.
            assert ack.deduplicated
            assert (a.forwarded, b.forwarded) == (["enqueue"], ["enqueue"])
            assert client.address == b.address
        finally:
            await client.close()
        assert await counts(cluster) == (1, 0)


@pytest.mark.parametrize("kind", ["drop_after", "unknown_after"])
@pytest.mark.parametrize("batches", [True, False], ids=["coalesced", "alone"])
async def test_an_enqueue_without_an_idempotency_key_is_not_sent_again(
    kind: str, batches: bool
) -> None:
    async with fake_cluster(batches=batches) as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(cluster.addresses)
        try:
            a.fault("enqueue", kind, then=lambda: cluster.elect(b))
            with pytest.raises(TransportError) as raised:
                await client.enqueue(job())
            if kind == "unknown_after":
                assert isinstance(raised.value, NotLeaderError) and raised.value.outcome_unknown
            assert b.forwarded == []
            # The next call finds the new leader without user code.
            await client.enqueue(job())
            assert b.forwarded == ["enqueue"]
        finally:
            await client.close()
        # The first one was done (by a) once, and never repeated.
        assert await counts(cluster) == (2, 0)


@pytest.mark.parametrize("kind", ["drop_after", "unknown_after"])
async def test_a_reserve_whose_outcome_is_unknown_is_not_sent_again(kind: str) -> None:
    async with fake_cluster() as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(cluster.addresses)
        try:
            await client.enqueue(job())
            await client.enqueue(job())
            a.fault("reserve", kind, then=lambda: cluster.elect(b))
            with pytest.raises(TransportError):
                await client.reserve(reserve_opts())
            assert "reserve" not in b.forwarded
            # Its job stays leased until the lease expires (at-least-once); the
            # next reserve, at the new leader, gets the other one.
            assert await counts(cluster) == (1, 1)
            jobs = await client.reserve(reserve_opts())
            assert jobs is not None and len(jobs) == 1
            assert b.forwarded.count("reserve") == 1
        finally:
            await client.close()


@pytest.mark.parametrize("batches", [True, False], ids=["coalesced", "alone"])
async def test_an_ack_on_a_dropped_connection_is_sent_again_at_the_new_leader(
    batches: bool,
) -> None:
    async with fake_cluster(batches=batches) as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(cluster.addresses)
        try:
            await client.enqueue(job())
            (reserved,) = await client.reserve(reserve_opts()) or []
            # Coalesced or not, a single ack goes as an ack.
            a.fault("ack", "drop_before", then=lambda: cluster.elect(b))
            await client.ack(reserved.ctx)
            assert "ack" not in a.forwarded and b.forwarded == ["ack"]
        finally:
            await client.close()
        assert await counts(cluster) == (0, 0)


@pytest.mark.parametrize("kind", ["drop_after", "unknown_after"])
async def test_a_repeated_ack_that_was_done_before_the_failover_surfaces_not_found(
    kind: str,
) -> None:
    async with fake_cluster(batches=False) as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(cluster.addresses)
        try:
            await client.enqueue(job())
            (reserved,) = await client.reserve(reserve_opts()) or []
            a.fault("ack", kind, then=lambda: cluster.elect(b))
            with pytest.raises(JobNotFoundError):
                await client.ack(reserved.ctx)
            assert (a.forwarded[-1], b.forwarded) == ("ack", ["ack"])
        finally:
            await client.close()
        assert await counts(cluster) == (0, 0)


async def test_a_nack_and_an_extend_on_a_dropped_connection_are_sent_again() -> None:
    async with fake_cluster(batches=False) as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(cluster.addresses)
        try:
            await client.enqueue(job())
            await client.enqueue(job())
            first, second = await client.reserve(reserve_opts(max_jobs=2)) or []
            a.fault("extend", "drop_before", then=lambda: cluster.elect(b))
            await client.extend(first.ctx, LEASE)
            b.fault("nack", "drop_before", then=lambda: cluster.elect(a))
            assert await client.nack(second.ctx) is False
            assert (a.forwarded[-1], b.forwarded) == ("nack", ["extend"])
        finally:
            await client.close()
        assert await counts(cluster) == (1, 1)


async def test_a_not_leader_farewell_frame_leaves_the_pending_requests_outcome_unknown() -> None:
    async with fake_cluster(batches=False) as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(cluster.addresses)

        def step_down_and_close(conn: FakeConnection, request: Request) -> object:
            # A connection-level error frame (request id 0), then the close:
            # the enqueue pending on it was not refused on its own.
            cluster.elect(b)
            conn.send(0, "unavailable", {"message": "bye", "reason": "not_leader"})
            return CLOSE

        a.server.on("enqueue", step_down_and_close)
        try:
            with pytest.raises(NotLeaderError) as raised:
                await client.enqueue(job())
            assert raised.value.outcome_unknown
            assert b.forwarded == []  # a keyless enqueue is not sent again
        finally:
            await client.close()


async def test_a_leader_that_stops_answering_is_left_after_the_call_deadline() -> None:
    async with fake_cluster() as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(cluster.addresses, rpc_timeout=DEADLINE)

        def stopped(conn: FakeConnection, request: Request) -> object:
            cluster.elect(b)  # as if a were SIGSTOPped and b took over
            return SILENT

        a.server.on("queue_stats", stopped)
        try:
            with pytest.raises(TransportError) as raised:
                await client.queue_stats(["q"])
            assert raised.value.code == "deadline_exceeded"
            # The connection to a stays open, but the next call looks for the leader.
            await client.queue_stats(["q"])
            assert client.address == b.address and b.forwarded == ["queue_stats"]
        finally:
            await client.close()


# -- the blocking client and the Worker across a failover -------------------------------------


async def test_the_sync_client_follows_a_failover(rng: random.Random) -> None:
    async with fake_cluster() as cluster:
        addresses = shuffled_addresses(cluster, rng)
        a, b, c = cluster.nodes

        def produce_and_consume() -> list[str]:
            with SyncSeppClient.connect(",".join(addresses)) as client:
                client.enqueue(job(key="k1"))
                a.fault("enqueue", "drop_after", then=lambda: cluster.elect(c))
                client.enqueue(job(key="k2"))
                cluster.elect(b)
                reserved = client.reserve(reserve_opts(max_jobs=2)) or []
                for item in reserved:
                    client.ack(item.ctx)
                return [item.ctx.id for item in reserved]

        # The cluster runs on this loop; the blocking client in a thread.
        acked = await asyncio.to_thread(produce_and_consume)
        assert len(set(acked)) == 2
        assert await counts(cluster) == (0, 0)
        assert c.forwarded[:1] == ["enqueue"] and "reserve" in b.forwarded


def start_recording_worker(
    client: SeppClient, reserve_error_backoff: timedelta
) -> tuple[Worker, asyncio.Task[None], list[str]]:
    """A Worker on queue q, running, whose handler records the ids it ran."""
    done: list[str] = []

    async def handler(payload: Any, ctx: Any) -> None:
        done.append(ctx.id)

    worker = Worker(
        client,
        ["q"],
        LEASE,
        wait_timeout=timedelta(seconds=20),
        reserve_error_backoff=reserve_error_backoff,
    )
    worker.handle("work", handler)
    return worker, asyncio.create_task(worker.run()), done


async def test_a_worker_keeps_working_across_a_failover(rng: random.Random) -> None:
    async with fake_cluster() as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(shuffled_addresses(cluster, rng))
        worker, running, done = start_recording_worker(client, timedelta(milliseconds=20))
        try:
            for n in range(3):
                await client.enqueue(job(key=f"before-{n}"))
            await wait_until(lambda: len(done) == 3, what="three jobs before the failover")
            # The leader goes away with the worker's long poll parked on it.
            await a.server.wait_until(lambda: "reserve" in a.forwarded)
            cluster.elect(b)
            a.server.drop_all()
            for n in range(3):
                await client.enqueue(job(key=f"after-{n}"))
            await wait_until(lambda: len(done) == 6, what="three jobs after the failover")
            assert client.address == b.address
        finally:
            worker.shutdown_handle().shutdown()
            await asyncio.wait_for(running, 20)
            await client.close()
        assert len(set(done)) == 6
        assert await counts(cluster) == (0, 0)


async def test_a_workers_reserve_refused_as_not_the_leader_goes_to_the_leader(
    rng: random.Random, caplog: pytest.LogCaptureFixture
) -> None:
    # The Worker sends its reserves on the connection it has, during the call
    # that frees the slots (SeppClient._reserve_now). A node that stopped
    # leading refuses the next one with not_leader (nothing was done): it goes
    # to the leader like any reserve, without a failed reserve or a backoff.
    async with fake_cluster() as cluster:
        a, b, _ = cluster.nodes
        client = await SeppClient.connect(a.address)
        worker, running, done = start_recording_worker(client, timedelta(seconds=60))
        try:
            await a.server.wait_until(lambda: a.forwarded.count("reserve") == 2)
            # b leads: a withdraws the parked reserves (answered empty) and
            # refuses what comes next.
            cluster.elect(b)
            await wait_until(lambda: "reserve" in a.refused, what="a reserve refused by a")
            await b.server.wait_until(lambda: "reserve" in b.forwarded)
            producer = await SeppClient.connect(b.address)
            for n in range(3):
                await producer.enqueue(job(key=f"after-{n}"))
            await producer.close()
            await wait_until(lambda: len(done) == 3, what="three jobs through the leader")
            assert client.address == b.address
        finally:
            worker.shutdown_handle().shutdown()
            await asyncio.wait_for(running, 20)
            await client.close()
        failed = [r.getMessage() for r in caplog.records if "reserve failed" in r.getMessage()]
        assert failed == []
        assert await counts(cluster) == (0, 0)


# -- against real cluster nodes (three in-process SeppServers on one in-memory log) -----------


async def test_the_client_follows_real_cluster_nodes_through_a_planned_handover() -> None:
    async with trio() as nodes:
        leader = await nodes.wait_leader()
        await nodes.clock.advance(LEASE_RENEW_MS + 100)  # the followers know the leader
        addresses = [address_of(server) for server in nodes.servers]
        client = await SeppClient.connect(addresses)
        try:
            assert client.address == address_of(leader)
            first = await client.enqueue(job(key="k1"))
            second = await client.enqueue(job(key="k2"))
            (reserved,) = await client.reserve(reserve_opts()) or []
            assert reserved.ctx.id == first.job_id

            await leader.shutdown()
            await leader.wait_stopped()
            successor = await nodes.wait_leader(within_ms=LEASE_RENEW_MS + 300)

            # No user code: the client finds the new leader; the lease lived
            # through the failover (it is in the log), and the key still dedups.
            await client.ack(reserved.ctx)
            again = await client.enqueue(job(key="k2"))
            assert again.deduplicated and again.job_id == second.job_id
            assert client.address == address_of(successor)
            assert client.cluster is not None and client.cluster.epoch == 2
            (stats,) = await client.queue_stats(["q"])
            assert (stats.ready, stats.in_flight) == (1, 0)
        finally:
            await client.close()
