"""Every client operation against the fake server: what goes on the wire, what
comes back, and which exception each error answer becomes."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from sepp.client import (
    AttemptMismatchError,
    BatchResultCountMismatchError,
    BatchValidationError,
    ClientClosedError,
    DeadLetterCause,
    EmptyBatchError,
    EnqueueAck,
    EnqueueRequest,
    InvalidRequestError,
    JobNotFoundError,
    JobRejectedError,
    MalformedResponseError,
    MalformedServerInfoError,
    OverloadedError,
    Payload,
    PayloadTooLarge,
    QueueFull,
    ReserveOptions,
    RetryDirective,
    SeppClient,
    ServerInternalError,
    TransportError,
    UnauthenticatedError,
    UndecodableJobError,
    UnknownQueue,
    UnknownQueuesError,
)
from tests.client.fakeserver import SERVER_INFO, SILENT, FakeServer, error, make_job, now_ms

LEASE = timedelta(seconds=30)
NO_WAIT = timedelta(0)


def ok_result(job_id: str, deduplicated: bool = False) -> dict:
    return {"job_id": job_id, "deduplicated": deduplicated}


# -- enqueue ------------------------------------------------------------------------------------


async def test_enqueue_returns_the_ack(fake: FakeServer) -> None:
    async with fake:
        fake.reply("enqueue", "ok", {"results": [ok_result("j1", deduplicated=True)]})
        client = await SeppClient.connect(fake.address)
        ack = await client.enqueue(
            EnqueueRequest("emails", "send", payload=Payload(b"hi", "text/plain"))
        )
        assert ack == EnqueueAck("j1", True)
        body = fake.ops("enqueue")[0].body
        assert body == {
            "jobs": [
                {
                    "queue": "emails",
                    "job_type": "send",
                    "payload": {"data": b"hi", "encoding": "text/plain"},
                }
            ]
        }
        await client.close()


async def test_enqueue_raises_job_rejected_with_the_rejection(fake: FakeServer) -> None:
    rejection = {
        "reason": "payload_too_large",
        "message": "too big",
        "limit": 10,
        "actual": 20,
        "transient": False,
    }
    async with fake:
        fake.reply("enqueue", "ok", {"results": [{"rejection": rejection}]})
        client = await SeppClient.connect(fake.address)
        with pytest.raises(JobRejectedError) as caught:
            await client.enqueue(EnqueueRequest("q", "t"))
        assert caught.value.rejection == PayloadTooLarge(limit=10, actual=20)
        await client.close()


async def test_enqueue_batch_returns_acks_and_rejections_in_order(fake: FakeServer) -> None:
    results = [
        ok_result("a"),
        {"rejection": {"reason": "unknown_queue", "message": "m", "queue": "nope"}},
        ok_result("c", deduplicated=True),
        {"rejection": {"reason": "queue_full", "message": "m", "queue": "q", "limit": 5}},
    ]
    async with fake:
        fake.reply("enqueue", "ok", {"results": results})
        client = await SeppClient.connect(fake.address)
        out = await client.enqueue_batch(EnqueueRequest("q", f"t{i}") for i in range(4))
        assert out == [
            EnqueueAck("a", False),
            UnknownQueue("nope"),
            EnqueueAck("c", True),
            QueueFull("q", 5),
        ]
        assert "atomic" not in fake.ops("enqueue")[0].body
        await client.close()


async def test_an_empty_batch_is_refused_locally(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        with pytest.raises(EmptyBatchError):
            await client.enqueue_batch([])
        with pytest.raises(EmptyBatchError):
            await client.enqueue_atomic([])
        assert fake.ops("enqueue") == []
        await client.close()


async def test_a_result_count_mismatch_is_a_protocol_error(fake: FakeServer) -> None:
    async with fake:
        fake.reply("enqueue", "ok", {"results": [ok_result("a")]})
        client = await SeppClient.connect(fake.address)
        with pytest.raises(BatchResultCountMismatchError):
            await client.enqueue_batch([EnqueueRequest("q", "t"), EnqueueRequest("q", "t")])
        await client.close()


async def test_enqueue_atomic_success_returns_every_ack(fake: FakeServer) -> None:
    async with fake:
        fake.reply("enqueue", "ok", {"results": [ok_result("a"), ok_result("b")]})
        client = await SeppClient.connect(fake.address)
        acks = await client.enqueue_atomic([EnqueueRequest("q", "t"), EnqueueRequest("q", "t")])
        assert [a.job_id for a in acks] == ["a", "b"]
        assert fake.ops("enqueue")[0].body["atomic"] is True
        await client.close()


async def test_enqueue_atomic_failure_lists_every_failing_index(fake: FakeServer) -> None:
    failures = [
        {"index": 0, "rejection": {"reason": "invalid_request", "message": "empty key"}},
        {"index": 2, "rejection": {"reason": "unknown_queue", "message": "m", "queue": "x"}},
        {
            "index": 3,
            "rejection": {"reason": "payload_too_large", "message": "m", "limit": 1, "actual": 2},
        },
    ]
    async with fake:
        fake.reply("enqueue", "ok", {"failures": failures})
        client = await SeppClient.connect(fake.address)
        with pytest.raises(BatchValidationError) as caught:
            await client.enqueue_atomic([EnqueueRequest("q", "t")] * 4)
        assert [(e.index, type(e.rejection).__name__) for e in caught.value.errors] == [
            (0, "InvalidRequest"),
            (2, "UnknownQueue"),
            (3, "PayloadTooLarge"),
        ]
        assert "0, 2, 3" in str(caught.value)
        await client.close()


# -- reserve ------------------------------------------------------------------------------------


async def test_reserve_returns_none_when_the_wait_ends_empty(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        assert await client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=NO_WAIT)) is None
        await client.close()


async def test_reserve_sends_milliseconds_and_returns_a_list_of_jobs(fake: FakeServer) -> None:
    async with fake:
        fake.queue.push(make_job("a"), make_job("b"))
        client = await SeppClient.connect(fake.address)
        before = datetime.now(UTC) - timedelta(milliseconds=1)
        jobs = await client.reserve(
            ReserveOptions(
                ["q", "r"],
                timedelta(seconds=20),
                wait_timeout=timedelta(seconds=2.5),
                max_jobs=5,
                worker_id="w-1",
            )
        )
        assert fake.queue.reserves[0] == {
            "queues": ["q", "r"],
            "lease_ms": 20_000,
            "wait_ms": 2_500,
            "max_jobs": 5,
            "worker_id": "w-1",
            "job_layout": "array",
        }
        assert jobs is not None and [j.ctx.job_type for j in jobs] == ["a", "b"]
        ctx = jobs[0].ctx
        assert ctx.attempt == 1
        # The fake leased it for 20 s at some moment during the call (its clock
        # counts whole milliseconds): bracketed, however long the call took.
        after = datetime.now(UTC)
        assert before + timedelta(seconds=20) <= ctx.lease_expires_at
        assert ctx.lease_expires_at <= after + timedelta(seconds=20)
        await client.close()


async def test_reserve_never_skips_a_job_it_cannot_decode(fake: FakeServer) -> None:
    good = make_job("good")
    good["lease_expires_at_ms"] = now_ms() + 1000
    bad = dict(good, id=None)
    async with fake:
        fake.reply("reserve", "ok", {"jobs": [bad, good]})
        client = await SeppClient.connect(fake.address)
        with pytest.raises(UndecodableJobError) as caught:
            await client.reserve(ReserveOptions(["q"], LEASE))
        assert [j.ctx.job_type for j in caught.value.jobs] == ["good"]
        assert [u.raw for u in caught.value.undecodable] == [bad]
        await client.close()


async def test_reserve_in_strict_mode_raises_unknown_queues(fake: FakeServer) -> None:
    async with fake:
        fake.reply(
            "reserve",
            "failed_precondition",
            {"message": "undeclared", "reason": "unknown_queue", "queues": ["ghost"]},
        )
        client = await SeppClient.connect(fake.address)
        with pytest.raises(UnknownQueuesError) as caught:
            await client.reserve(ReserveOptions(["ghost"], LEASE))
        assert caught.value.queues == ["ghost"]
        await client.close()


@pytest.mark.parametrize("rows", [False, True], ids=["maps", "rows"])
async def test_an_abandoned_reserve_is_withdrawn_and_its_late_jobs_released_not_nacked(
    fake: FakeServer, rows: bool
) -> None:
    fake.queue.rows = rows
    async with fake:
        client = await SeppClient.connect(fake.address)
        parked = asyncio.ensure_future(
            client.reserve(
                ReserveOptions(["q"], LEASE, wait_timeout=timedelta(seconds=30), worker_id="w")
            )
        )
        await fake.wait_until(lambda: len(fake.queue.reserves) == 1)
        (reserve,) = fake.ops("reserve")
        parked.cancel()
        with pytest.raises(asyncio.CancelledError):
            await parked
        # The client withdraws the parked reserve at once, naming its request id.
        await fake.wait_until(lambda: len(fake.ops("withdraw")) == 1)
        assert fake.ops("withdraw")[0].body == {"request_id": reserve.id}
        # This fake answers that the withdraw came too late and leases a job to
        # the abandoned reserve: the client hands it back without counting a
        # failure (release), never with a nack.
        job = make_job("late")
        fake.queue.push(job)
        await fake.wait_until(lambda: len(fake.queue.released) == 1)
        assert fake.queue.released[0] == {"job_id": job["id"], "attempt": 1, "worker_id": "w"}
        assert fake.ops("nack") == []
        await client.close()


async def test_release_hands_a_reserved_job_back_with_its_attempt(fake: FakeServer) -> None:
    async with fake:
        fake.queue.push(make_job("a"))
        client = await SeppClient.connect(fake.address)
        jobs = await client.reserve(ReserveOptions(["q"], LEASE, worker_id="w-1"))
        assert jobs is not None
        await client.release(jobs[0].ctx)
        assert fake.ops("release")[0].body == {
            "job_id": jobs[0].ctx.id,
            "attempt": 1,
            "worker_id": "w-1",
        }
        again = await client.reserve(ReserveOptions(["q"], LEASE))
        assert again is not None and again[0].ctx.attempt == 1
        await client.close()


async def test_release_of_a_lease_that_moved_on_raises_the_fencing_error(
    fake: FakeServer,
) -> None:
    async with fake:
        fake.queue.push(make_job("a"))
        client = await SeppClient.connect(fake.address)
        jobs = await client.reserve(ReserveOptions(["q"], LEASE))
        assert jobs is not None
        await client.release(jobs[0].ctx)
        with pytest.raises(JobNotFoundError):
            await client.release(jobs[0].ctx)
        await client.close()


async def test_close_withdraws_a_waiting_reserve_and_its_caller_sees_client_closed(
    fake: FakeServer,
) -> None:
    async with fake:
        fake.on("withdraw", _withdraw_answering_the_reserve_empty(fake))
        client = await SeppClient.connect(fake.address)
        parked = asyncio.ensure_future(
            client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=timedelta(seconds=30)))
        )
        await fake.wait_until(lambda: len(fake.queue.reserves) == 1)
        (reserve,) = fake.ops("reserve")
        await client.close()
        with pytest.raises(ClientClosedError):
            await parked
        assert [r.body for r in fake.ops("withdraw")] == [{"request_id": reserve.id}]


def _withdraw_answering_the_reserve_empty(fake: FakeServer):
    """A withdraw handler that, like the real server, answers the parked reserve
    (empty) before the withdraw itself."""

    def withdraw(conn, request):
        conn.send(request.body["request_id"], "ok", {"jobs": []})
        return "ok", {"withdrawn": True}

    return withdraw


# -- ack, nack, extend -------------------------------------------------------------------------


async def reserve_one(client: SeppClient, fake: FakeServer, **kwargs) -> object:
    fake.queue.push(make_job(**kwargs))
    jobs = await client.reserve(ReserveOptions(["q"], LEASE, worker_id="w-9"))
    assert jobs is not None
    return jobs[0]


async def test_ack_echoes_id_attempt_and_worker(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        job = await reserve_one(client, fake, enqueued_at_ms=1_764_500_000_123)
        await client.ack(job.ctx)  # type: ignore[attr-defined]
        assert fake.ops("ack")[0].body == {
            "job_id": job.ctx.id,  # type: ignore[attr-defined]
            "attempt": 1,
            "worker_id": "w-9",
            # The fencing token: the delivery's enqueued_at (PROTOCOL.md 5.3).
            "enqueued_at_ms": 1_764_500_000_123,
        }
        await client.close()


@pytest.mark.parametrize(
    ("directive", "expected"),
    [
        (RetryDirective.DEFAULT, {"retry": "default"}),
        (RetryDirective.DEAD_LETTER, {"retry": "dead_letter"}),
        (RetryDirective.after(timedelta(seconds=90)), {"retry": "delay", "delay_ms": 90_000}),
    ],
)
async def test_nack_sends_the_directive_and_returns_dead_lettered(
    fake: FakeServer, directive: RetryDirective, expected: dict
) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        job = await reserve_one(client, fake)
        dead = await client.nack(job.ctx, directive, "it broke")  # type: ignore[attr-defined]
        body = fake.ops("nack")[0].body
        assert {k: body[k] for k in expected} == expected
        assert body["reason"] == "it broke"
        assert dead is (directive == RetryDirective.DEAD_LETTER)
        await client.close()


async def test_nack_without_reason_leaves_it_off_the_wire(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        job = await reserve_one(client, fake)
        await client.nack(job.ctx)  # type: ignore[attr-defined]
        assert "reason" not in fake.ops("nack")[0].body
        await client.close()


async def test_extend_returns_the_new_deadline(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        job = await reserve_one(client, fake)
        before = now_ms()
        expiry = await job.ctx.extend(timedelta(minutes=2))  # type: ignore[attr-defined]
        assert fake.ops("extend")[0].body["lease_ms"] == 120_000
        assert before + 120_000 <= expiry.timestamp() * 1000 <= now_ms() + 120_000
        assert job.ctx._lease.known_expiry_ms == int(expiry.timestamp() * 1000)  # type: ignore[attr-defined]
        expiry2 = await client.extend(job.ctx, timedelta(seconds=1))  # type: ignore[attr-defined]
        assert expiry2 < expiry
        await client.close()


@pytest.mark.parametrize("op", ["ack", "nack", "extend"])
async def test_fencing_not_found_raises_job_not_found(fake: FakeServer, op: str) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        job = await reserve_one(client, fake)
        del fake.queue.in_flight[job.ctx.id]  # type: ignore[attr-defined]  # lease expired
        with pytest.raises(JobNotFoundError):
            await _lease_op(client, op, job.ctx)  # type: ignore[attr-defined]
        await client.close()


@pytest.mark.parametrize("op", ["ack", "nack", "extend"])
async def test_fencing_attempt_mismatch_raises_attempt_mismatch(fake: FakeServer, op: str) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        job = await reserve_one(client, fake)
        fake.queue.in_flight[job.ctx.id]["attempt"] = 2  # type: ignore[attr-defined]
        with pytest.raises(AttemptMismatchError) as caught:
            await _lease_op(client, op, job.ctx)  # type: ignore[attr-defined]
        assert caught.value.current_attempt == 2
        await client.close()


async def _lease_op(client: SeppClient, op: str, ctx) -> object:
    if op == "ack":
        return await client.ack(ctx)
    if op == "nack":
        return await client.nack(ctx)
    return await client.extend(ctx, LEASE)


# -- whole-request errors through the client -----------------------------------------------------


@pytest.mark.parametrize(
    ("code", "extra", "expected"),
    [
        ("invalid_argument", {}, InvalidRequestError),
        ("unauthenticated", {}, UnauthenticatedError),
        ("resource_exhausted", {"reason": "overloaded"}, OverloadedError),
        ("unavailable", {"reason": "shutting_down"}, TransportError),
        ("internal", {"reason": "storage_failed"}, ServerInternalError),
    ],
)
async def test_error_answers_raise_their_class_with_fields(
    fake: FakeServer, code: str, extra: dict, expected: type
) -> None:
    async with fake:
        fake.reply("enqueue", code, {"message": "nope", **extra})
        client = await SeppClient.connect(fake.address)
        with pytest.raises(expected) as caught:
            await client.enqueue(EnqueueRequest("q", "t"))
        assert caught.value.code == code
        assert caught.value.reason == extra.get("reason")
        await client.close()


# -- administration -------------------------------------------------------------------------------


async def test_get_server_info(fake: FakeServer) -> None:
    async with fake:
        fake.reply("server_info", "ok", SERVER_INFO)
        client = await SeppClient.connect(fake.address)
        info = await client.get_server_info()
        assert info.max_enqueue_batch == 256
        assert info.dead_letter_retention_enabled
        fake.reply("server_info", "ok", {"server_version": "x"})
        with pytest.raises(MalformedServerInfoError):
            await client.get_server_info()
        await client.close()


async def test_drain_dead_letters_sends_queue_and_max(fake: FakeServer) -> None:
    record = {
        "job": make_job("send"),
        "cause": "attempts_exhausted",
        "failed_at_ms": 1_000,
        "final_attempt": 3,
        "last_reason": None,
    }
    async with fake:
        fake.reply("drain_dead_letters", "ok", {"records": [record]})
        client = await SeppClient.connect(fake.address)
        records = await client.drain_dead_letters("emails", max_records=10)
        assert fake.ops("drain_dead_letters")[0].body == {"queue": "emails", "max": 10}
        assert records[0].cause is DeadLetterCause.ATTEMPTS_EXHAUSTED
        assert records[0].last_reason is None
        await client.drain_dead_letters(max_records=0)
        assert fake.ops("drain_dead_letters")[1].body == {"max": 1}
        await client.close()


async def test_queue_stats_and_health(fake: FakeServer) -> None:
    async with fake:
        fake.reply(
            "queue_stats",
            "ok",
            {
                "server_time_ms": 0,
                "queues": [
                    {
                        "name": "q",
                        "ready": 2,
                        "scheduled": 0,
                        "in_flight": 1,
                        "dead_lettered": 0,
                        "oldest_ready_age_ms": 250,
                    }
                ],
            },
        )
        client = await SeppClient.connect(fake.address)
        stats = await client.queue_stats(["q"])
        assert fake.ops("queue_stats")[0].body == {"queues": ["q"]}
        assert stats[0].name == "q" and stats[0].ready == 2
        assert stats[0].oldest_ready_age == timedelta(milliseconds=250)
        await client.queue_stats()
        assert fake.ops("queue_stats")[1].body == {}
        fake.reply("health", "ok", {"status": "not_serving", "reason": "storage_failed"})
        health = await client.health()
        assert (health.serving, health.reason) == (False, "storage_failed")
        assert health.damaged_history == ()
        damage = {
            "file": "wal/00000000000000000001.log",
            "offset": 96,
            "seq": 8,
            "reason": "crc_mismatch",
            "first_seq": 8,
            "last_seq": 10,
            "snapshot_seq": 111,
        }
        fake.reply("health", "ok", {"status": "serving", "damaged_history": [damage]})
        health = await client.health()
        assert health.serving and health.damaged_history == (damage,)
        fake.reply("health", "ok", {"status": "serving", "damaged_history": "junk"})
        with pytest.raises(MalformedResponseError):
            await client.health()
        await client.close()


async def test_async_context_manager_closes(fake: FakeServer) -> None:
    async with fake:
        async with await SeppClient.connect(fake.address) as client:
            assert (await client.health()).serving
        assert client.closed


async def test_a_lazily_constructed_client_connects_on_first_call(fake: FakeServer) -> None:
    async with fake:
        client = SeppClient(fake.address)
        assert fake.hellos == 0
        assert (await client.health()).serving
        assert fake.hellos == 1
        await client.close()


async def test_errors_of_one_call_do_not_disturb_others(fake: FakeServer) -> None:
    async with fake:
        fake.on("server_info", lambda conn, req: error("internal", "boom"))
        fake.on("queue_stats", lambda conn, req: SILENT)
        client = await SeppClient.connect(fake.address)
        with pytest.raises(ServerInternalError):
            await client.get_server_info()
        assert (await client.health()).serving
        await client.close()
