"""Fencing across an operator requeue, end to end over the native protocol.

The bug: a requeue of a dead letter restarts the job at attempt 1, so fencing by
(job_id, attempt) alone let a worker whose lease of attempt 1 had lapsed ack,
nack or extend the job's *new* delivery at attempt 1, stealing it from its
rightful holder. The sepp client now sends the delivery's enqueued_at_ms with
every ack, nack and extend (PROTOCOL.md 5.3); the requeue moves enqueued_at
forward, so the stale call is refused with attempt_mismatch and changes nothing.

The repro, as the colleague found it: a job with max_attempts=1 is reserved by
worker A, A's lease lapses (the job is dead-lettered, cause lease_expired), an
operator requeues it, worker B reserves it (attempt 1), then A's call arrives.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from typing import Any

import pytest

from sepp.client import (
    AttemptMismatchError,
    EnqueueRequest,
    Job,
    JobCtx,
    Payload,
    ReserveOptions,
    RetryDirective,
    SeppClient,
    SyncSeppClient,
    Worker,
)
from sepp.client._convert import datetime_to_ms
from tests.client.fakeserver import FakeServer, make_job
from tests.inprocess import address_of, in_process, in_process_config

pytestmark = pytest.mark.usefixtures("in_process_env")

LEASE = timedelta(seconds=60)
LAPSING_LEASE = timedelta(milliseconds=30)
WAIT_S = 30  # a deadline for what must happen, never a measured bound
RETAIN = {"storage__dead_letter_retention_ms": "3600000"}


async def until(predicate: Any, what: str) -> None:
    """Poll an async predicate until it holds (a deadline, not a timing bound)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while not await predicate():
        assert loop.time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


async def reserve_one(client: SeppClient, opts: ReserveOptions) -> Job:
    jobs = await client.reserve(opts)
    assert jobs is not None and len(jobs) == 1
    return jobs[0]


async def stolen_delivery(a: SeppClient, b: SeppClient) -> tuple[JobCtx, JobCtx]:
    """Run the repro up to A's late call: A's lapsed ctx and B's current one."""
    ack = await a.enqueue(EnqueueRequest(queue="q", job_type="t", max_attempts=1))
    first = await reserve_one(a, ReserveOptions(["q"], LAPSING_LEASE, worker_id="A"))
    assert first.ctx.id == ack.job_id

    async def dead_lettered() -> bool:
        info = await b.get_job(ack.job_id)
        return info is not None and info.state == "dead_letter"

    await until(dead_lettered, "the lapsed lease dead-lettered the job")
    info = await b.get_job(ack.job_id)
    assert info is not None and info.dead_letter_cause == "lease_expired"
    assert (await b.requeue_dead_letters([ack.job_id])).done == [ack.job_id]
    second = await reserve_one(b, ReserveOptions(["q"], LEASE, worker_id="B"))
    assert second.ctx.id == ack.job_id
    assert (first.ctx.attempt, second.ctx.attempt) == (1, 1)
    assert second.ctx.enqueued_at > first.ctx.enqueued_at
    return first.ctx, second.ctx


async def assert_still_held_by_b(client: SeppClient, ctx_b: JobCtx) -> None:
    info = await client.get_job(ctx_b.id)
    assert info is not None
    assert (info.state, info.attempt, info.worker_id) == ("inflight", 1, "B")
    assert info.lease_expires_at == ctx_b.lease_expires_at


async def stale_call(client: SeppClient, op: str, ctx: JobCtx) -> None:
    if op == "ack":
        await client.ack(ctx)
    elif op == "nack":
        await client.nack(ctx, RetryDirective.DEAD_LETTER, "A's late failure")
    elif op == "extend":
        await client.extend(ctx, timedelta(seconds=5))
    else:
        await ctx.extend(timedelta(seconds=5))  # the lease's own extend (the Worker's)


@pytest.mark.parametrize("op", ["ack", "nack", "extend", "lease_extend"])
async def test_a_lapsed_lease_cannot_settle_the_delivery_after_a_requeue(op: str) -> None:
    async with in_process(in_process_config(**RETAIN)) as server:
        a = await SeppClient.connect(address_of(server))
        b = await SeppClient.connect(address_of(server))
        ctx_a, ctx_b = await stolen_delivery(a, b)

        with pytest.raises(AttemptMismatchError) as caught:
            await stale_call(a, op, ctx_a)

        assert caught.value.current_attempt == 1
        await assert_still_held_by_b(b, ctx_b)
        await b.ack(ctx_b)  # B's work is B's
        assert await b.get_job(ctx_b.id) is None
        await a.close()
        await b.close()


async def test_a_lapsed_lease_is_fenced_inside_a_coalesced_settle_beside_the_rightful_ack(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A's and B's acks made in the same moment travel as one `settle`: A's item
    is refused, B's applies."""
    async with in_process(in_process_config(**RETAIN)) as server:
        a = await SeppClient.connect(address_of(server))
        b = await SeppClient.connect(address_of(server))
        ctx_a, ctx_b = await stolen_delivery(a, b)
        connection = b._connection
        assert connection is not None
        sent: list[tuple[str, Any]] = []
        send_to = connection.send_to

        def spy(op: str, body: Any, **kwargs: Any) -> Any:
            sent.append((op, body))
            return send_to(op, body, **kwargs)

        monkeypatch.setattr(connection, "send_to", spy)

        stale, rightful = await asyncio.gather(b.ack(ctx_a), b.ack(ctx_b), return_exceptions=True)

        assert [op for op, _ in sent] == ["settle"]
        tokens = [item["enqueued_at_ms"] for item in sent[0][1]["items"]]
        assert tokens == [datetime_to_ms(ctx_a.enqueued_at), datetime_to_ms(ctx_b.enqueued_at)]
        assert isinstance(stale, AttemptMismatchError)
        assert rightful is None
        assert await b.get_job(ctx_b.id) is None
        await a.close()
        await b.close()


async def test_the_sync_client_sends_the_token_and_is_fenced_too() -> None:
    async with in_process(in_process_config(**RETAIN)) as server:
        a = await SeppClient.connect(address_of(server))
        b = await SeppClient.connect(address_of(server))
        ctx_a, ctx_b = await stolen_delivery(a, b)
        address = address_of(server)
        outcomes: dict[str, BaseException | None] = {}

        def run() -> None:
            with SyncSeppClient.connect(address) as client:
                for name, call in (
                    ("ack", lambda: client.ack(ctx_a)),
                    ("nack", lambda: client.nack(ctx_a)),
                    ("extend", lambda: client.extend(ctx_a, timedelta(seconds=5))),
                ):
                    try:
                        call()
                        outcomes[name] = None
                    except AttemptMismatchError as exc:
                        outcomes[name] = exc

        thread = threading.Thread(target=run)
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.01)
        thread.join()

        assert {name: type(outcome) for name, outcome in outcomes.items()} == {
            "ack": AttemptMismatchError,
            "nack": AttemptMismatchError,
            "extend": AttemptMismatchError,
        }
        await assert_still_held_by_b(b, ctx_b)
        await a.close()
        await b.close()


# -- what the client puts on the wire (against the fake server) --------------------


async def test_every_ack_nack_and_extend_carries_the_delivery_token_and_a_release_does_not(
    fake: FakeServer,
) -> None:
    token = 1_764_500_000_123
    async with fake:
        client = await SeppClient.connect(fake.address)
        jobs: list[Job] = []
        for _ in range(5):
            fake.queue.push(make_job(enqueued_at_ms=token))
            jobs.append(await reserve_one(client, ReserveOptions(["q"], LEASE, worker_id="w")))
        await client.ack(jobs[0].ctx)
        await client.nack(jobs[1].ctx)
        await client.extend(jobs[2].ctx, LEASE)
        await jobs[3].ctx.extend(LEASE)
        await client.release(jobs[4].ctx)
        for op, count in (("ack", 1), ("nack", 1), ("extend", 2)):
            bodies = [request.body for request in fake.ops(op)]
            assert [body["enqueued_at_ms"] for body in bodies] == [token] * count, op
        assert "enqueued_at_ms" not in fake.ops("release")[0].body
        await client.close()


async def test_a_hand_built_ctx_sends_its_enqueued_at(fake: FakeServer) -> None:
    """A JobCtx built by hand (no lease) fences with its own enqueued_at."""
    async with fake:
        client = await SeppClient.connect(fake.address)
        fake.queue.push(make_job(enqueued_at_ms=1_764_500_000_123))
        leased = await reserve_one(client, ReserveOptions(["q"], LEASE))
        rebuilt = JobCtx(**{**leased.ctx.__dict__, "_lease": None})
        await client.ack(rebuilt)
        assert fake.ops("ack")[0].body["enqueued_at_ms"] == 1_764_500_000_123
        await client.close()


async def test_the_worker_sends_the_token_with_its_acks_nacks_and_extends(
    fake: FakeServer,
) -> None:
    token = 1_764_500_000_123
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = Worker(
            client,
            ["q"],
            timedelta(seconds=20),
            wait_timeout=timedelta(milliseconds=50),
            auto_extend_interval=timedelta(milliseconds=5),
        )

        @worker.handler("slow")
        async def slow(payload: Payload | None, ctx: JobCtx) -> None:
            await fake.wait_until(lambda: len(fake.queue.extended) >= 2)

        @worker.handler("failing")
        async def failing(payload: Payload | None, ctx: JobCtx) -> None:
            raise RuntimeError("boom")

        fake.queue.push(make_job("slow", enqueued_at_ms=token))
        fake.queue.push(make_job("failing", enqueued_at_ms=token))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 1 and len(fake.queue.nacked) == 1)
        worker.shutdown_handle().shutdown()
        await task
        bodies = [r.body for op in ("ack", "nack", "extend") for r in fake.ops(op)]
        bodies += [
            item for r in fake.ops("settle") for item in r.body["items"]
        ]  # coalesced ones, if any
        assert len(bodies) >= 4
        assert {body["enqueued_at_ms"] for body in bodies} == {token}
        await client.close()
