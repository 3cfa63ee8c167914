"""The RPCs' semantics through the gRPC front: field fidelity (custom values of
each kind, timestamps, durations, trace context never invented), long polls woken
by an enqueue, a cancelled long poll leasing nothing, answers kept within the
client's 4 MiB receive limit (the rest stays Ready), dead letters drained, and one
job crossing fronts (enqueued natively, acked over gRPC, and the reverse).
"""

from __future__ import annotations

import asyncio
import math
import time
from datetime import timedelta

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from sepp.client import EnqueueRequest, ReserveOptions, SeppClient
from sepp.grpc.front import CLIENT_RECEIVE_BYTES_DEFAULT, QueueServiceFront
from sepp.grpc.v1 import queue_pb2 as pb
from tests.grpc.conftest import (
    enqueue_one,
    grpc_address,
    grpc_server,
    job,
    lease,
    reserve,
    status_of_call,
    stub_for,
)
from tests.inprocess import address_of
from tests.support import wait_until

pytestmark = pytest.mark.usefixtures("in_process_env")

CUSTOM = {
    "text": pb.PrimitiveValue(string_value="héllo ✓"),
    "empty": pb.PrimitiveValue(string_value=""),
    "one_point_zero": pb.PrimitiveValue(double_value=1.0),
    "tenth": pb.PrimitiveValue(double_value=0.1),
    "tiny": pb.PrimitiveValue(double_value=5e-324),
    "negative_zero": pb.PrimitiveValue(double_value=-0.0),
    "int_max": pb.PrimitiveValue(int_value=2**63 - 1),
    "int_min": pb.PrimitiveValue(int_value=-(2**63)),
    "int_one": pb.PrimitiveValue(int_value=1),
    "above_2_53": pb.PrimitiveValue(int_value=2**53 + 1),
    "true": pb.PrimitiveValue(bool_value=True),
    "false": pb.PrimitiveValue(bool_value=False),
}


def kind_and_value(v: pb.PrimitiveValue):
    which = v.WhichOneof("value")
    return which, getattr(v, which)


async def test_custom_values_of_every_kind_round_trip_exactly():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        await enqueue_one(stub, job("q", custom=CUSTOM))
        [delivered] = await reserve(stub, "q")
    got = {key: kind_and_value(value) for key, value in delivered.custom.items()}
    want = {key: kind_and_value(value) for key, value in CUSTOM.items()}
    assert got == want
    # Exact: a 1.0 stays a double, a 1 an int, True a bool; -0.0 keeps its sign.
    assert got["one_point_zero"] == ("double_value", 1.0)
    assert got["int_one"] == ("int_value", 1) and got["true"] == ("bool_value", True)
    assert math.copysign(1.0, got["negative_zero"][1]) == -1.0


async def test_an_unset_custom_value_rejects_that_job_only():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        response = await stub.EnqueueBatch(
            pb.EnqueueBatchRequest(jobs=[job("q", custom={"k": pb.PrimitiveValue()}), job("q")])
        )
    bad, good = response.results
    assert bad.rejection.WhichOneof("reason") == "invalid_request"
    assert "'k'" in bad.rejection.invalid_request.message
    assert good.WhichOneof("outcome") == "success"


async def test_times_and_durations_keep_their_millisecond():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        before_ms = time.time_ns() // 1_000_000
        await enqueue_one(stub, job("q", max_attempts=7, priority=9))
        [delivered] = await reserve(stub, "q", lease_s=61.25)
        after_ms = time.time_ns() // 1_000_000
        assert before_ms - 1 <= delivered.enqueued_at.ToMilliseconds() <= after_ms + 1
        lease_ms = delivered.lease_expires_at.ToMilliseconds()
        assert before_ms + 61_250 <= lease_ms <= after_ms + 61_250
        assert (delivered.attempt, delivered.max_attempts, delivered.priority) == (1, 7, 9)
        extended = await stub.Extend(
            pb.ExtendRequest(job_id=delivered.id, attempt=1, lease_duration=lease(90.5))
        )
        now_ms = time.time_ns() // 1_000_000
        assert after_ms + 90_500 <= extended.lease_expires_at.ToMilliseconds() <= now_ms + 90_500
        info = await stub.GetServerInfo(pb.GetServerInfoRequest())
    assert info.max_lease_duration.ToMilliseconds() == 300_000
    assert info.max_schedule_horizon.ToMilliseconds() == 2_592_000_000
    assert info.supported_protocol_versions == ["v1"]
    assert info.server_version


async def test_a_future_scheduled_at_is_delivered_with_it_to_the_ms_and_not_before():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        due = Timestamp()
        due.FromMilliseconds(time.time_ns() // 1_000_000 + 300)
        sent = Timestamp(seconds=due.seconds, nanos=due.nanos + 123_456)
        await enqueue_one(stub, job("q", scheduled_at=sent))
        jobs = await reserve(stub, "q", wait_s=10)
        assert time.time_ns() // 1_000_000 >= due.ToMilliseconds()
    # Kept to the millisecond (the sub-millisecond part is truncated).
    assert jobs[0].scheduled_at == due


async def test_no_trace_context_is_invented_and_a_given_one_is_kept():
    traced = pb.TraceContext(
        traceparent="00-0123456789abcdef0123456789abcdef-0123456789abcdef-01", tracestate="k=v"
    )
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        await enqueue_one(stub, job("plain"))
        await enqueue_one(stub, job("traced", trace_context=traced))
        [plain] = await reserve(stub, "plain")
        [with_trace] = await reserve(stub, "traced")
    assert not plain.HasField("trace_context")
    assert not plain.HasField("payload") and not plain.HasField("scheduled_at")
    assert with_trace.trace_context == traced


async def test_a_long_poll_is_woken_by_an_enqueue():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        waiting = asyncio.ensure_future(reserve(stub, "q", wait_s=60))
        await wait_until(lambda: server.service._parked.get("q"), what="the reserve to park")
        job_id = await enqueue_one(stub, job("q"))
        [delivered] = await asyncio.wait_for(waiting, 15)
    assert delivered.id == job_id


async def test_a_cancelled_long_poll_leases_nothing():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        call = stub.Reserve(
            pb.ReserveRequest(queues=["q"], lease_duration=lease(), wait_timeout=lease(60))
        )
        waiting = asyncio.ensure_future(call)
        await wait_until(lambda: server.service._parked.get("q"), what="the reserve to park")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await wait_until(lambda: not server.service._parked.get("q"), what="the unpark")
        await enqueue_one(stub, job("q"))
        stats = server.service.queue_stats(["q"])[1][0]
        assert (stats.ready, stats.in_flight) == (1, 0)
        [delivered] = await reserve(stub, "q")
    assert delivered.attempt == 1


async def test_a_deadline_on_a_long_poll_leases_nothing():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        request = pb.ReserveRequest(queues=["q"], lease_duration=lease(), wait_timeout=lease(60))
        code, _ = await status_of_call(stub.Reserve(request, timeout=0.3))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        await wait_until(lambda: not server.service._parked.get("q"), what="the unpark")
        await enqueue_one(stub, job("q"))
        stats = server.service.queue_stats(["q"])[1][0]
    assert (stats.ready, stats.in_flight) == (1, 0)


async def test_a_reserve_answer_stays_within_the_clients_4_mib_and_the_rest_stays_ready():
    payload = pb.Payload(data=b"x" * 900_000, encoding="application/octet-stream")
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        await stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job("q", payload=payload)] * 10))
        # A default client channel: the 4 MiB receive limit of the official clients.
        jobs = await reserve(stub, "q", max_jobs=10)
        answer = pb.ReserveResponse(jobs=jobs).ByteSize()
        stats = server.service.queue_stats(["q"])[1][0]
    assert 1 <= len(jobs) < 10
    assert answer <= CLIENT_RECEIVE_BYTES_DEFAULT
    assert (stats.in_flight, stats.ready) == (len(jobs), 10 - len(jobs))


async def test_a_drain_answer_stays_within_the_clients_4_mib_and_the_rest_stays_stored():
    payload = pb.Payload(data=b"x" * 900_000, encoding="application/octet-stream")
    async with (
        grpc_server(storage__dead_letter_retention_ms="600000") as server,
        stub_for(grpc_address(server)) as stub,
    ):
        await stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job("q", payload=payload)] * 10))
        for delivered in await reserve(stub, "q", max_jobs=10):
            await stub.Nack(
                pb.NackRequest(job_id=delivered.id, attempt=1, retry=pb.NackRetry(dead_letter={}))
            )
        while server.service.queue_stats(["q"])[1][0].ready:
            for delivered in await reserve(stub, "q", max_jobs=10):
                await stub.Nack(
                    pb.NackRequest(
                        job_id=delivered.id, attempt=1, retry=pb.NackRetry(dead_letter={})
                    )
                )
        drained = await stub.DrainDeadLetters(pb.DrainDeadLettersRequest(queue="q", max=10))
        left = server.service.queue_stats(["q"])[1][0].dead_lettered
    assert 1 <= len(drained.records) < 10
    assert drained.ByteSize() <= CLIENT_RECEIVE_BYTES_DEFAULT
    assert left == 10 - len(drained.records)


async def test_a_request_up_to_16_mib_is_received_and_a_larger_one_refused():
    payload = pb.Payload(data=b"x" * 1_000_000, encoding="application/octet-stream")
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        # ~6 MB: over gRPC's default 4 MiB receive limit, within max_message_bytes.
        big = await stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=[job("q", payload=payload)] * 6))
        assert [r.WhichOneof("outcome") for r in big.results] == ["success"] * 6
        too_big = pb.EnqueueBatchRequest(jobs=[job("q", payload=payload)] * 17)
        assert too_big.ByteSize() > 16 * 1024 * 1024
        code, _ = await status_of_call(stub.EnqueueBatch(too_big))
        stats = server.service.queue_stats(["q"])[1][0]
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert stats.ready == 6


async def test_dead_letters_are_drained_with_their_cause_and_reason():
    async with (
        grpc_server(storage__dead_letter_retention_ms="60000") as server,
        stub_for(grpc_address(server)) as stub,
    ):
        job_id = await enqueue_one(stub, job("q", custom=CUSTOM))
        [delivered] = await reserve(stub, "q")
        dead = await stub.Nack(
            pb.NackRequest(
                job_id=job_id,
                attempt=1,
                reason="broken for good",
                retry=pb.NackRetry(dead_letter={}),
            )
        )
        assert dead.dead_lettered
        drained = await stub.DrainDeadLetters(pb.DrainDeadLettersRequest(queue="q", max=5))
        again = await stub.DrainDeadLetters(pb.DrainDeadLettersRequest(queue="q", max=5))
    [record] = drained.records
    assert record.job.id == job_id and record.final_attempt == 1
    assert record.cause == pb.DEAD_LETTER_CAUSE_REJECTED
    assert record.last_reason == "broken for good"
    assert record.job.custom == delivered.custom
    assert list(again.records) == []


async def test_a_nack_with_a_delay_schedules_the_retry():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        job_id = await enqueue_one(stub, job("q"))
        await reserve(stub, "q")
        answer = await stub.Nack(
            pb.NackRequest(job_id=job_id, attempt=1, retry=pb.NackRetry(delay=lease(3600)))
        )
        stats = server.service.queue_stats(["q"])[1][0]
    assert not answer.dead_lettered
    assert (stats.scheduled, stats.ready) == (1, 0)


async def test_a_job_enqueued_natively_is_acked_over_grpc_and_the_reverse():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        native = await SeppClient.connect(address_of(server))
        try:
            ack = await native.enqueue(EnqueueRequest("cross", "native-made", custom={"n": 7}))
            [from_native] = await reserve(stub, "cross")
            assert from_native.id == ack.job_id
            assert dict(from_native.custom)["n"].int_value == 7
            await stub.Ack(pb.AckRequest(job_id=from_native.id, attempt=from_native.attempt))

            job_id = await enqueue_one(
                stub, job("cross", "grpc-made", custom={"f": pb.PrimitiveValue(double_value=2.0)})
            )
            jobs = await native.reserve(
                ReserveOptions(["cross"], timedelta(seconds=30), wait_timeout=timedelta(0))
            )
            assert jobs is not None and [j.ctx.id for j in jobs] == [job_id]
            assert jobs[0].ctx.custom == {"f": 2.0}
            assert isinstance(jobs[0].ctx.custom["f"], float)
            await native.ack(jobs[0].ctx)
        finally:
            await native.close()
        stats = server.service.queue_stats(["cross"])[1][0]
    assert (stats.ready, stats.in_flight) == (0, 0)


async def test_job_ids_compare_case_insensitively_and_come_back_canonical():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        job_id = await enqueue_one(stub, job("q"))
        [delivered] = await reserve(stub, "q")
        extended = await stub.Extend(
            pb.ExtendRequest(job_id=job_id.upper(), attempt=1, lease_duration=lease(30))
        )
        acked = await stub.Ack(pb.AckRequest(job_id=job_id.upper(), attempt=1))
    assert delivered.id == job_id == job_id.lower()
    assert extended.job_id == acked.job_id == job_id


class _EndedCall:
    """A ServicerContext whose call has ended (the client cancelled it, or its
    deadline passed) by the time the reserve's jobs are durable."""

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def cancelled(self) -> bool:
        return True


async def test_jobs_leased_for_a_call_that_ended_meanwhile_are_released_uncounted():
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        job_id = await enqueue_one(stub, job("q"))
        front = QueueServiceFront(server.service)
        request = pb.ReserveRequest(queues=["q"], lease_duration=lease())
        answer = await front.reserve(request, _EndedCall())
        assert list(answer.jobs) == []

        def released():
            stats = server.service.queue_stats(["q"])[1][0]
            return (stats.ready, stats.in_flight) == (1, 0)

        await wait_until(released, what="the release")
        [delivered] = await reserve(stub, "q")
    # Ready again at once, and the attempt nobody made is not counted.
    assert (delivered.id, delivered.attempt) == (job_id, 1)


async def test_a_large_batch_is_stored_in_parts_and_answered_in_order():
    # sepp/server/parts.py: over 1 MiB, one record per part, one answer.
    datas = [bytes([i]) * (700 * 1024) for i in range(3)]
    async with grpc_server() as server, stub_for(grpc_address(server)) as stub:
        engine = server.service.engine
        assert engine is not None
        before = engine.stats["records"]
        jobs = [job("big", payload=pb.Payload(data=d, encoding="b")) for d in datas]
        response = await stub.EnqueueBatch(pb.EnqueueBatchRequest(jobs=jobs))
        ids = [r.success.job_id for r in response.results]
        assert len(set(ids)) == 3 and all(ids)
        assert engine.stats["records"] - before == 3
        delivered = await reserve(stub, "big", max_jobs=3)
        assert [j.id for j in delivered] == ids
        assert [j.payload.data for j in delivered] == datas
