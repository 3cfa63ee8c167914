"""End to end: the client and the Worker against a real `sepp serve` process.

The server runs as a child process on 127.0.0.1:0 (the `server_factory` fixture
of tests/conftest.py reads its port from the first stdout line); each test stops
its server by PID with SIGTERM and expects a clean exit. The fake-server tests
cover the edge cases; these check that both ends agree on the protocol.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from sepp.client import (
    AttemptMismatchError,
    BatchValidationError,
    DeadLetterCause,
    EnqueueAck,
    EnqueueRequest,
    HandlerError,
    InvalidRequest,
    JobCtx,
    JobNotFoundError,
    Payload,
    PayloadTooLarge,
    Priority,
    QueueNameTooLong,
    ReserveOptions,
    RetryDirective,
    SeppClient,
    SyncSeppClient,
    TraceContext,
    UnauthenticatedError,
    UnsupportedProtocolError,
    Worker,
)
from tests.client.fakeserver import eventually

LEASE = timedelta(seconds=30)
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
RETAIN_DEAD = {"SEPP_STORAGE__DEAD_LETTER_RETENTION_MS": "86400000"}

ServerFactory = Callable[..., Any]


def stop(server: Any) -> None:
    assert server.stop() == 0, server.log()


async def test_enqueue_reserve_extend_ack_round_trip(server_factory: ServerFactory) -> None:
    server = server_factory()
    client = await SeppClient.connect(server.address)
    later = datetime.now(UTC) + timedelta(days=1)
    await client.enqueue(
        EnqueueRequest(
            "e2e",
            "scheduled",
            scheduled_at=later,
            priority=9,
        )
    )
    ack = await client.enqueue(
        EnqueueRequest(
            "e2e",
            "send",
            payload=Payload(b'{"to": 42}', "application/json"),
            priority=Priority.P7,
            max_attempts=5,
            custom={"user": 42, "vip": True, "ratio": 0.25, "name": "x"},
            trace_context=TraceContext(TRACEPARENT, "k=v"),
        )
    )
    jobs = await client.reserve(ReserveOptions(["e2e"], LEASE, max_jobs=10, worker_id="w1"))
    assert jobs is not None and len(jobs) == 1  # the scheduled one is not ready
    job = jobs[0]
    assert job.ctx.id == ack.job_id
    assert job.payload == Payload(b'{"to": 42}', "application/json")
    assert (job.ctx.priority, job.ctx.attempt, job.ctx.max_attempts) == (Priority.P7, 1, 5)
    assert job.ctx.custom == {"user": 42, "vip": True, "ratio": 0.25, "name": "x"}
    assert job.ctx.trace_context == TraceContext(TRACEPARENT, "k=v")
    now = datetime.now(UTC)
    assert abs(job.ctx.enqueued_at - now) < timedelta(seconds=10)
    assert timedelta(seconds=20) < job.ctx.lease_expires_at - now <= LEASE
    new_expiry = await job.ctx.extend(timedelta(minutes=2))
    assert new_expiry > job.ctx.lease_expires_at
    await client.ack(job.ctx)
    with pytest.raises(JobNotFoundError):
        await client.ack(job.ctx)
    stats = {s.name: s for s in await client.queue_stats(["e2e", "never"])}
    assert (stats["e2e"].ready, stats["e2e"].scheduled, stats["e2e"].in_flight) == (0, 1, 0)
    assert stats["never"].ready == 0
    assert await client.reserve(ReserveOptions(["e2e"], LEASE, wait_timeout=timedelta(0))) is None
    await client.close()
    stop(server)


async def test_batches_rejections_dedup_and_fencing(server_factory: ServerFactory) -> None:
    server = server_factory()
    client = await SeppClient.connect(server.address)
    info = await client.get_server_info()
    results = await client.enqueue_batch(
        [
            EnqueueRequest("b", "t", idempotency_key="once"),
            EnqueueRequest("b", "t", idempotency_key="once"),
            EnqueueRequest("b", "t", payload=Payload(b"x" * (info.max_payload_bytes + 1), "bin")),
        ]
    )
    assert isinstance(results[0], EnqueueAck) and isinstance(results[1], EnqueueAck)
    assert results[1].deduplicated and results[1].job_id == results[0].job_id
    assert results[2] == PayloadTooLarge(info.max_payload_bytes, info.max_payload_bytes + 1)
    with pytest.raises(BatchValidationError) as caught:
        await client.enqueue_atomic(
            [
                EnqueueRequest("b", "t"),
                EnqueueRequest("b", "t", payload=Payload(b"", "bin")),
                EnqueueRequest("b" * (info.max_queue_name_bytes + 1), "t"),
            ]
        )
    assert [e.index for e in caught.value.errors] == [1, 2]
    assert isinstance(caught.value.errors[0].rejection, InvalidRequest)
    assert isinstance(caught.value.errors[1].rejection, QueueNameTooLong)
    assert (await client.queue_stats(["b"]))[0].ready == 1  # the atomic batch stored nothing

    jobs = await client.reserve(ReserveOptions(["b"], LEASE))
    assert jobs is not None
    stale = jobs[0].ctx
    stale_copy = JobCtx(**{**stale.__dict__, "attempt": stale.attempt + 1})
    with pytest.raises(AttemptMismatchError):
        await client.nack(stale_copy)
    assert await client.nack(stale, RetryDirective.after(timedelta(0)), "again") is False
    again = await client.reserve(ReserveOptions(["b"], LEASE))
    assert again is not None and again[0].ctx.attempt == 2
    await client.close()
    stop(server)


async def test_a_pending_long_poll_does_not_hold_up_an_ack(server_factory: ServerFactory) -> None:
    server = server_factory()
    client = await SeppClient.connect(server.address)
    await client.enqueue(EnqueueRequest("p", "first"))
    first = await client.reserve(ReserveOptions(["p"], LEASE))
    assert first is not None
    parked = asyncio.ensure_future(
        client.reserve(ReserveOptions(["p"], LEASE, wait_timeout=timedelta(seconds=20)))
    )
    await client.ack(first[0].ctx)  # on the same connection, while the reserve waits
    assert not parked.done()
    await client.enqueue(EnqueueRequest("p", "second"))
    second = await asyncio.wait_for(parked, 10)
    assert second is not None and second[0].ctx.job_type == "second"
    await client.close()
    stop(server)


async def test_the_worker_acks_retries_and_dead_letters(server_factory: ServerFactory) -> None:
    server = server_factory(env=RETAIN_DEAD)
    client = await SeppClient.connect(server.address)
    worker = Worker(
        client, ["w"], LEASE, wait_timeout=timedelta(seconds=5), auto_extend=True, max_in_flight=4
    )
    attempts: dict[str, list[int]] = {}

    @worker.handler("ok")
    async def fine(payload: Payload | None, ctx: JobCtx) -> None:
        attempts.setdefault(ctx.job_type, []).append(ctx.attempt)

    @worker.handler("flaky")
    async def flaky(payload: Payload | None, ctx: JobCtx) -> None:
        attempts.setdefault(ctx.job_type, []).append(ctx.attempt)
        raise RuntimeError("always fails")

    @worker.handler("poison")
    async def poison(payload: Payload | None, ctx: JobCtx) -> None:
        attempts.setdefault(ctx.job_type, []).append(ctx.attempt)
        raise HandlerError.permanent("cannot parse")

    await client.enqueue_batch(
        [
            *(EnqueueRequest("w", "ok") for _ in range(5)),
            EnqueueRequest("w", "flaky", max_attempts=2),
            EnqueueRequest("w", "poison"),
        ]
    )
    task = asyncio.ensure_future(worker.run())
    dead: list[Any] = []

    async def drained_two() -> bool:
        dead.extend(await client.drain_dead_letters("w", max_records=10))
        return len(dead) == 2

    async with asyncio.timeout(20):
        while not await drained_two():
            await asyncio.sleep(0.02)
    worker.shutdown_handle().shutdown()
    await task
    assert attempts["ok"] == [1] * 5
    assert attempts["flaky"] == [1, 2]
    assert attempts["poison"] == [1]
    causes = {r.job_type: (r.cause, r.final_attempt, r.last_reason) for r in dead}
    assert causes["poison"] == (DeadLetterCause.REJECTED, 1, "cannot parse")
    assert causes["flaky"][:2] == (DeadLetterCause.ATTEMPTS_EXHAUSTED, 2)
    assert "always fails" in (causes["flaky"][2] or "")
    stats = (await client.queue_stats(["w"]))[0]
    assert (stats.ready, stats.in_flight) == (0, 0)
    await client.close()
    stop(server)


async def test_a_shut_down_worker_leaves_no_parked_reserve_behind(
    server_factory: ServerFactory,
) -> None:
    server = server_factory()
    client = await SeppClient.connect(server.address)
    worker = Worker(client, ["r"], LEASE, wait_timeout=timedelta(seconds=20))
    worker.handle("t", _noop)
    task = asyncio.ensure_future(worker.run())
    # Wait until the worker's reserve is on the wire; the health answer then
    # proves the server has read it (one connection, read in order).
    await eventually(lambda: client._connection is not None and client._connection.in_flight > 0)
    await client.health()
    worker.shutdown_handle().shutdown()
    await task
    # The abandoned long poll was withdrawn (the health answer proves the server
    # read the withdraw): the next job goes to the next reserve, its first
    # attempt unspent -- with max_attempts = 1 it would be gone otherwise.
    await client.health()
    await client.enqueue(EnqueueRequest("r", "t", max_attempts=1))
    jobs = await client.reserve(ReserveOptions(["r"], LEASE, wait_timeout=timedelta(seconds=5)))
    assert jobs is not None and jobs[0].ctx.attempt == 1
    await client.ack(jobs[0].ctx)
    await client.close()
    stop(server)


async def _noop(payload: Payload | None, ctx: JobCtx) -> None:
    return None


async def test_auth_and_reconnect_after_a_restart(server_factory: ServerFactory, tmp_path) -> None:
    keys = {"SEPP_AUTH__API_KEYS": '[{name="a", key="s3cret"}]'}
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data = tmp_path / "data"
    listen = ["--listen", f"127.0.0.1:{port}"]
    first = server_factory(args=listen, env=keys, data_dir=data)
    with pytest.raises(UnauthenticatedError):
        await SeppClient.connect(first.address, api_key="wrong")
    client = await SeppClient.connect(first.address, api_key="s3cret")
    ack = await client.enqueue(EnqueueRequest("durable", "t"))
    stop(first)
    # The client notices the close; it reconnects only when next used.
    await eventually(lambda: client._connection is None or client._connection.closed)
    second = server_factory(args=listen, env=keys, data_dir=data)
    # The same client reconnects (same hello, same key) on its next call.
    jobs = await client.reserve(ReserveOptions(["durable"], LEASE))
    assert jobs is not None and jobs[0].ctx.id == ack.job_id
    assert client.connections_opened == 2
    await client.ack(jobs[0].ctx)
    await client.close()
    stop(second)


def test_the_sync_client_from_several_threads(server_factory: ServerFactory) -> None:
    server = server_factory()
    with SyncSeppClient.connect(server.address) as client:
        ids: list[str] = []
        lock = threading.Lock()

        def produce(n: int) -> None:
            for i in range(20):
                job_id = client.enqueue(EnqueueRequest("sync", f"t{n}-{i}")).job_id
                with lock:
                    ids.append(job_id)

        threads = [threading.Thread(target=produce, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(ids)) == 120
        taken = 0
        while taken < 120:
            jobs = client.reserve(ReserveOptions(["sync"], LEASE, max_jobs=50))
            assert jobs is not None
            for job in jobs:
                client.ack(job.ctx)
            taken += len(jobs)
        assert client.queue_stats(["sync"])[0].ready == 0
    stop(server)


async def test_the_real_server_refuses_another_protocol_version(server_factory) -> None:
    server = server_factory()
    client = SeppClient(server.address)
    client._hello["protocol"] = 99  # as a future client would send
    with pytest.raises(UnsupportedProtocolError) as caught:
        await client.health()
    assert 1 in caught.value.supported_protocol_versions
    await client.close()
    stop(server)
