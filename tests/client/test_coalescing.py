"""Coalescing: concurrent single calls made in the same event-loop moment travel as
one request -- enqueues as one ``enqueue`` batch, acks/nacks/extends as one
``settle`` (PROTOCOL.md 5.13) -- and every caller still gets its own result or its
own typed error, exactly as if it had called alone.

Frames are counted at the client's connection (`count_frames`) or, against the
fake server, from the requests it recorded. The real server runs in process
(tests/inprocess.py) where its answers matter (idempotency, fencing).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from datetime import timedelta
from typing import Any

import pytest

from sepp.client import (
    AttemptMismatchError,
    ClientClosedError,
    EnqueueAck,
    EnqueueRequest,
    InvalidRequest,
    JobNotFoundError,
    JobRejectedError,
    MalformedResponseError,
    MessageTooLargeError,
    Payload,
    ReserveOptions,
    RetryDirective,
    RetryPolicy,
    SeppClient,
    SyncSeppClient,
    TransportError,
)
from sepp.client._coalesce import (
    EAGER_CALLS,
    ENQUEUE_EAGER_CALLS,
    ENQUEUE_FRAMES_AHEAD,
    Call,
    Coalescer,
)
from sepp.client.client import ENQUEUE_LINGER_MAX
from sepp.protocol import Request
from tests.client.fakeserver import DROP, FakeConnection, FakeServer, make_job
from tests.inprocess import address_of, in_process, in_process_config

LIMITS = {"max_enqueue_batch": 256, "max_settle_batch": 256}
LEASE = timedelta(seconds=60)


def count_frames(client: SeppClient) -> list[tuple[str, dict[str, Any]]]:
    """Record every request the client's current connection sends, as (op, body)."""
    connection = client._connection
    assert connection is not None
    sent: list[tuple[str, dict[str, Any]]] = []
    send = connection._send  # every request, awaited or coalesced, goes through it

    def counting(op: str, body: dict[str, Any], *args: Any) -> Any:
        sent.append((op, body))
        return send(op, body, *args)

    connection._send = counting  # type: ignore[method-assign]
    return sent


def answer_enqueue(conn: FakeConnection, request: Request) -> Any:
    """Accept every job but those of job type 'bad' (rejected invalid_request)."""
    results: list[dict[str, Any]] = []
    for index, job in enumerate(request.body["jobs"]):
        if job["job_type"] == "bad":
            results.append({"rejection": {"reason": "invalid_request", "message": f"bad {index}"}})
        else:
            results.append({"job_id": f"id-{job['job_type']}", "deduplicated": False})
    return "ok", {"results": results}


async def fake_with_limits(fake: FakeServer, **limits: Any) -> SeppClient:
    fake.hello_extra = {**LIMITS, **limits}
    fake.on("enqueue", answer_enqueue)
    return await SeppClient.connect(fake.address)


# -- enqueue --------------------------------------------------------------------------


async def test_concurrent_enqueues_go_to_the_server_as_one_frame_with_results_in_order(
    fake: FakeServer,
) -> None:
    async with fake:
        client = await fake_with_limits(fake)
        count = ENQUEUE_EAGER_CALLS
        acks = await asyncio.gather(
            *(client.enqueue(EnqueueRequest("q", f"t{i}")) for i in range(count))
        )
        assert [a.job_id for a in acks] == [f"id-t{i}" for i in range(count)]
        (frame,) = fake.ops("enqueue")
        assert [j["job_type"] for j in frame.body["jobs"]] == [f"t{i}" for i in range(count)]
        assert "atomic" not in frame.body  # best effort, never all-or-nothing
        await client.close()


async def test_a_batch_leaves_as_soon_as_it_holds_eager_calls_and_the_next_one_starts(
    fake: FakeServer,
) -> None:
    # The server starts on the first part while the rest are still being made.
    async with fake:
        client = await fake_with_limits(fake)
        count = 2 * ENQUEUE_EAGER_CALLS + 10
        acks = await asyncio.gather(
            *(client.enqueue(EnqueueRequest("q", f"t{i}")) for i in range(count))
        )
        assert [a.job_id for a in acks] == [f"id-t{i}" for i in range(count)]
        frames = fake.ops("enqueue")
        sizes = [len(f.body["jobs"]) for f in frames]
        assert sizes == [ENQUEUE_EAGER_CALLS, ENQUEUE_EAGER_CALLS, 10]
        sent = [j["job_type"] for f in frames for j in f.body["jobs"]]
        assert sent == [f"t{i}" for i in range(count)]
        await client.close()


async def test_a_coalescer_cuts_at_its_eager_size_or_at_full_whichever_is_smaller() -> None:
    loop = asyncio.get_running_loop()
    sent: list[list[int]] = []

    def calls(n: int) -> list[Call]:
        return [Call("ack", {"n": i}, True, 8, loop.create_future()) for i in range(n)]

    def record(batch: list[Call]) -> None:
        sent.append([c.wire["n"] for c in batch])

    eager = Coalescer(loop, record, full=256, eager=3)
    for call in calls(7):
        eager.submit(call)
    assert sent == [[0, 1, 2], [3, 4, 5]] and len(eager) == 1
    await asyncio.sleep(0)  # the loop's next turn sends the rest
    assert sent[2:] == [[6]] and len(eager) == 0

    sent.clear()
    eager.full = 2  # the server's batch limit, when it is below the eager size
    for call in calls(5):
        eager.submit(call)
    assert sent == [[0, 1], [2, 3]]
    eager.flush()
    assert sent[2:] == [[4]]

    sent.clear()
    lingering = Coalescer(loop, record, linger_s=60.0, full=5, eager=2)
    for call in calls(6):
        lingering.submit(call)
    assert sent == [[0, 1, 2, 3, 4]]  # a linger fills batches up to full
    lingering.flush()
    assert sent[1:] == [[5]]

    with pytest.raises(ValueError, match="eager"):
        Coalescer(loop, record, eager=0)


async def test_a_busy_coalescer_holds_its_calls_until_flushed_full_or_idle() -> None:
    loop = asyncio.get_running_loop()
    sent: list[list[int]] = []
    busy = [True]
    made = iter(range(100))

    def calls(n: int) -> list[Call]:
        return [Call("enqueue", {"n": next(made)}, True, 8, loop.create_future()) for _ in range(n)]

    def record(batch: list[Call]) -> None:
        sent.append([c.wire["n"] for c in batch])

    held = Coalescer(loop, record, full=5, eager=2, busy=lambda: busy[0])
    for call in calls(3):
        held.submit(call)  # the eager cut comes and goes: busy
    await asyncio.sleep(0)  # and the loop's next turn
    assert sent == [] and held.held and len(held) == 3
    for call in calls(2):
        held.submit(call)
    assert sent == [[0, 1, 2, 3, 4]] and not held.held  # a full batch leaves all the same
    held.submit(calls(1)[0])
    await asyncio.sleep(0)
    assert held.held and len(held) == 1
    busy[0] = False  # an answer came: the owner flushes
    held.flush()
    assert sent[1:] == [[5]] and not held.held
    busy[0] = True
    held.submit(calls(1)[0])
    await asyncio.sleep(0)
    assert held.held
    busy[0] = False  # idle without the owner's flush: the next call's turn sends both
    held.submit(calls(1)[0])
    await asyncio.sleep(0)
    assert sent[2:] == [[6, 7]] and not held.held
    busy[0] = True
    held.submit(calls(1)[0])
    held.flush(force=True)  # closing: sent whatever the answers
    assert sent[3:] == [[8]]

    # A linger already batches: `busy` is not consulted.
    lingering = Coalescer(loop, record, linger_s=60.0, full=2, busy=lambda: True)
    for call in calls(2):
        lingering.submit(call)
    assert sent[4:] == [[9, 10]]


def gated_enqueues(fake: FakeServer) -> asyncio.Event:
    """Enqueue answers wait for the returned event (each request in a task of its own)."""
    gate = asyncio.Event()

    async def answer(conn: FakeConnection, request: Request) -> Any:
        await gate.wait()
        return answer_enqueue(conn, request)

    fake.on("enqueue", answer)
    return gate


async def test_enqueues_wait_for_an_answer_while_two_requests_are_in_flight(
    fake: FakeServer,
) -> None:
    assert ENQUEUE_FRAMES_AHEAD == 2
    async with fake:
        client = await fake_with_limits(fake)
        gate = gated_enqueues(fake)
        eager = ENQUEUE_EAGER_CALLS
        tasks = [
            asyncio.ensure_future(client.enqueue(EnqueueRequest("q", f"t{i}")))
            for i in range(2 * eager + 5)
        ]
        await fake.wait_until(lambda: len(fake.ops("enqueue")) == 2)
        # The health call leaves after the loop turn that would have sent the
        # last five: once it is answered, the fake has read all that was sent.
        await client.health()
        assert len(fake.ops("enqueue")) == 2
        later = [
            asyncio.ensure_future(client.enqueue(EnqueueRequest("q", f"t{i}")))
            for i in range(2 * eager + 5, 2 * eager + 8)
        ]
        await client.health()
        assert len(fake.ops("enqueue")) == 2  # they join the held ones
        gate.set()
        acks = await asyncio.gather(*tasks, *later)
        assert [a.job_id for a in acks] == [f"id-t{i}" for i in range(2 * eager + 8)]
        sizes = [len(f.body["jobs"]) for f in fake.ops("enqueue")]
        assert sizes == [eager, eager, 8]  # the held ones left together, at the first answer
        await client.close()


async def test_enqueues_held_for_an_answer_fail_at_close_instead_of_waiting(
    fake: FakeServer,
) -> None:
    async with fake:
        client = await fake_with_limits(fake)
        gated_enqueues(fake)  # never opened: no enqueue is answered
        tasks = [
            asyncio.ensure_future(client.enqueue(EnqueueRequest("q", f"t{i}")))
            for i in range(2 * ENQUEUE_EAGER_CALLS + 3)
        ]
        await fake.wait_until(lambda: len(fake.ops("enqueue")) == 2)
        await client.health()
        await client.close()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, ClientClosedError) for o in outcomes), outcomes
        assert len(fake.ops("enqueue")) == 2  # the held ones never left


async def test_a_rejected_job_raises_for_its_own_caller_only(fake: FakeServer) -> None:
    async with fake:
        client = await fake_with_limits(fake)
        kinds = ["ok1", "bad", "ok2", "bad", "ok3"]
        outcomes = await asyncio.gather(
            *(client.enqueue(EnqueueRequest("q", k)) for k in kinds), return_exceptions=True
        )
        assert len(fake.ops("enqueue")) == 1
        assert outcomes[0] == EnqueueAck("id-ok1", False)
        assert outcomes[2] == EnqueueAck("id-ok2", False)
        assert outcomes[4] == EnqueueAck("id-ok3", False)
        for index in (1, 3):
            failure = outcomes[index]
            assert isinstance(failure, JobRejectedError)
            assert isinstance(failure.rejection, InvalidRequest)
            assert f"bad {index}" in str(failure.rejection)
        await client.close()


async def test_each_callers_result_map_is_read_alone_and_a_malformed_one_fails_only_its_caller(
    fake: FakeServer,
) -> None:
    # One coalesced frame, one answer; every result map is checked on its own.
    shapes: list[Any] = [
        {"job_id": "id-0", "deduplicated": False},
        {"job_id": "id-1", "deduplicated": True},
        {"job_id": "id-2"},  # `deduplicated` left out: not a repeat
        {"job_id": 3, "deduplicated": False},
        {"job_id": "id-4", "deduplicated": "no"},
        {"deduplicated": False},
        "id-6",
        None,
        {"rejection": {"reason": "invalid_request", "message": "bad 8"}},
    ]

    def answer(conn: FakeConnection, request: Request) -> Any:
        assert len(request.body["jobs"]) == len(shapes)
        return "ok", {"results": shapes}

    async with fake:
        fake.hello_extra = dict(LIMITS)
        fake.on("enqueue", answer)
        client = await SeppClient.connect(fake.address)
        outcomes = await asyncio.gather(
            *(client.enqueue(EnqueueRequest("q", f"t{i}")) for i in range(len(shapes))),
            return_exceptions=True,
        )
        assert len(fake.ops("enqueue")) == 1
        assert outcomes[:3] == [
            EnqueueAck("id-0", False),
            EnqueueAck("id-1", True),
            EnqueueAck("id-2", False),
        ]
        for index in range(3, 8):
            assert isinstance(outcomes[index], MalformedResponseError), (index, outcomes[index])
        rejected = outcomes[8]
        assert isinstance(rejected, JobRejectedError)
        assert isinstance(rejected.rejection, InvalidRequest)
        await client.close()


async def test_a_batch_is_cut_at_the_servers_max_enqueue_batch(fake: FakeServer) -> None:
    async with fake:
        client = await fake_with_limits(fake, max_enqueue_batch=3)
        acks = await asyncio.gather(
            *(client.enqueue(EnqueueRequest("q", f"t{i}")) for i in range(7))
        )
        assert [a.job_id for a in acks] == [f"id-t{i}" for i in range(7)]
        assert [len(r.body["jobs"]) for r in fake.ops("enqueue")] == [3, 3, 1]
        await client.close()


async def test_a_batch_is_cut_at_the_frame_limit_and_only_a_job_too_large_alone_fails() -> None:
    fake = FakeServer(max_message_bytes=8192)
    async with fake:
        client = await fake_with_limits(fake)
        jobs = [EnqueueRequest("q", f"t{i}", Payload(b"x" * 1500, "raw")) for i in range(10)]
        jobs.insert(4, EnqueueRequest("q", "huge", Payload(b"x" * 9000, "raw")))
        outcomes = await asyncio.gather(*(client.enqueue(j) for j in jobs), return_exceptions=True)
        assert isinstance(outcomes[4], MessageTooLargeError)
        others = outcomes[:4] + outcomes[5:]
        assert [o.job_id for o in others] == [f"id-t{i}" for i in range(10)]  # type: ignore[union-attr]
        frames = fake.ops("enqueue")
        assert 1 < len(frames) < 10  # cut, but still batched
        assert sorted(j["job_type"] for f in frames for j in f.body["jobs"]) == sorted(
            f"t{i}" for i in range(10)
        )
        await client.close()


async def test_a_transport_failure_of_the_batch_reaches_every_caller(fake: FakeServer) -> None:
    async with fake:
        client = await fake_with_limits(fake)
        fake.on("enqueue", lambda conn, req: DROP)
        outcomes = await asyncio.gather(
            *(client.enqueue(EnqueueRequest("q", f"t{i}")) for i in range(5)),
            return_exceptions=True,
        )
        assert len(fake.ops("enqueue")) == 1
        assert all(isinstance(o, TransportError) for o in outcomes), outcomes
        await client.close()


async def test_a_whole_request_error_reaches_every_caller_with_the_single_calls_type(
    fake: FakeServer,
) -> None:
    async with fake:
        client = await fake_with_limits(fake)
        fake.reply("enqueue", "invalid_argument", {"message": "no"})
        outcomes = await asyncio.gather(
            *(client.enqueue(EnqueueRequest("q", f"t{i}")) for i in range(3)),
            return_exceptions=True,
        )
        alone = await asyncio.gather(
            client.enqueue(EnqueueRequest("q", "x")), return_exceptions=True
        )
        assert [type(o) for o in outcomes] == [type(alone[0])] * 3
        await client.close()


async def test_after_a_failed_batch_only_jobs_with_idempotency_keys_are_retried(
    fake: FakeServer,
) -> None:
    async with fake:
        fake.hello_extra = LIMITS
        tries = 0

        def drop_the_first(conn: FakeConnection, request: Request) -> Any:
            nonlocal tries
            tries += 1
            return DROP if tries == 1 else answer_enqueue(conn, request)

        fake.on("enqueue", drop_the_first)
        client = await SeppClient.connect(
            fake.address,
            retry_policy=RetryPolicy(max_attempts=3, initial_backoff=timedelta(milliseconds=1)),
        )
        keyed = EnqueueRequest("q", "keyed", idempotency_key="k1")
        plain = EnqueueRequest("q", "plain")
        outcomes = await asyncio.gather(
            client.enqueue(keyed), client.enqueue(plain), return_exceptions=True
        )
        assert outcomes[0] == EnqueueAck("id-keyed", False)
        assert isinstance(outcomes[1], TransportError)
        first, *again = fake.ops("enqueue")
        assert [j["job_type"] for j in first.body["jobs"]] == ["keyed", "plain"]
        assert [[j["job_type"] for j in r.body["jobs"]] for r in again] == [["keyed"]]
        await client.close()


async def test_a_caller_cancelled_before_its_batch_left_is_left_out(fake: FakeServer) -> None:
    async with fake:
        client = await fake_with_limits(fake)
        kept = asyncio.ensure_future(client.enqueue(EnqueueRequest("q", "kept")))
        gone = asyncio.ensure_future(client.enqueue(EnqueueRequest("q", "gone")))
        await asyncio.sleep(0)  # both are waiting in the coalescer
        gone.cancel()
        assert await kept == EnqueueAck("id-kept", False)
        (frame,) = fake.ops("enqueue")
        assert [j["job_type"] for j in frame.body["jobs"]] == ["kept"]
        await client.close()


async def test_without_a_linger_a_lone_enqueue_leaves_at_the_next_loop_turn(
    fake: FakeServer,
) -> None:
    async with fake:
        client = await fake_with_limits(fake)
        connection = client._connection
        assert connection is not None
        task = asyncio.ensure_future(client.enqueue(EnqueueRequest("q", "alone")))
        await asyncio.sleep(0)  # the caller runs up to its wait
        await asyncio.sleep(0)  # the next turn: the batch is written, no timer involved
        assert connection.in_flight == 1
        assert (await task).job_id == "id-alone"
        await client.close()


async def test_an_opt_in_linger_gathers_enqueues_from_separate_moments(fake: FakeServer) -> None:
    async with fake:
        fake.hello_extra = LIMITS
        fake.on("enqueue", answer_enqueue)
        client = await SeppClient.connect(fake.address, enqueue_linger=timedelta(milliseconds=50))
        connection = client._connection
        assert connection is not None
        first = asyncio.ensure_future(client.enqueue(EnqueueRequest("q", "a")))
        for _ in range(3):
            await asyncio.sleep(0)
        assert connection.in_flight == 0  # still lingering
        second = asyncio.ensure_future(client.enqueue(EnqueueRequest("q", "b")))
        assert [a.job_id for a in await asyncio.gather(first, second)] == ["id-a", "id-b"]
        (frame,) = fake.ops("enqueue")
        assert [j["job_type"] for j in frame.body["jobs"]] == ["a", "b"]
        await client.close()


async def test_a_lingering_batch_that_fills_up_leaves_at_once(fake: FakeServer) -> None:
    async with fake:
        fake.hello_extra = {**LIMITS, "max_enqueue_batch": 4}
        fake.on("enqueue", answer_enqueue)
        client = await SeppClient.connect(fake.address, enqueue_linger=ENQUEUE_LINGER_MAX)
        connection = client._connection
        assert connection is not None
        tasks = [
            asyncio.ensure_future(client.enqueue(EnqueueRequest("q", f"t{i}"))) for i in range(4)
        ]
        for _ in range(3):
            await asyncio.sleep(0)
        assert connection.in_flight == 1  # sent without waiting out the linger
        await asyncio.gather(*tasks)
        await client.close()


@pytest.mark.parametrize("linger", [timedelta(milliseconds=-1), ENQUEUE_LINGER_MAX * 2])
def test_a_linger_out_of_bounds_is_refused(linger: timedelta) -> None:
    with pytest.raises(ValueError, match="enqueue_linger"):
        SeppClient("127.0.0.1:1", enqueue_linger=linger)


async def test_a_server_without_batch_limits_gets_single_calls(fake: FakeServer) -> None:
    async with fake:
        fake.on("enqueue", answer_enqueue)  # no hello_extra: an older server
        client = await SeppClient.connect(fake.address)
        await asyncio.gather(*(client.enqueue(EnqueueRequest("q", f"t{i}")) for i in range(3)))
        assert [len(r.body["jobs"]) for r in fake.ops("enqueue")] == [1, 1, 1]
        for i in range(3):
            fake.queue.push(_job(f"j{i}"))
        jobs = await client.reserve(ReserveOptions(["q"], LEASE, max_jobs=3))
        assert jobs is not None and len(jobs) == 3
        await asyncio.gather(*(client.ack(j.ctx) for j in jobs))
        assert len(fake.ops("ack")) == 3 and not fake.ops("settle")
        await client.close()


def _job(job_type: str) -> dict[str, Any]:
    return make_job(job_type)


# -- against the real server ----------------------------------------------------------------


pytestmark_real = pytest.mark.usefixtures("in_process_env")


@pytestmark_real
async def test_the_same_idempotency_key_twice_in_one_batch_answers_as_two_calls_in_a_row() -> None:
    async with in_process(in_process_config()) as server:
        address = address_of(server)
        together = await SeppClient.connect(address)
        sent = count_frames(together)
        job = EnqueueRequest("q", "t", idempotency_key="same")
        first, second = await asyncio.gather(together.enqueue(job), together.enqueue(job))
        assert [op for op, _ in sent] == ["enqueue"]
        in_a_row = await SeppClient.connect(address)
        other = EnqueueRequest("q", "t", idempotency_key="other")
        one = await in_a_row.enqueue(other)
        two = await in_a_row.enqueue(other)
        assert (first.deduplicated, second.deduplicated) == (one.deduplicated, two.deduplicated)
        assert (first.deduplicated, second.deduplicated) == (False, True)
        assert first.job_id == second.job_id and one.job_id == two.job_id
        await together.close()
        await in_a_row.close()


@pytestmark_real
async def test_acks_nacks_and_extends_made_together_are_one_settle_with_per_caller_results() -> (
    None
):
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        for i in range(6):
            await client.enqueue(EnqueueRequest("q", f"t{i}"))
        jobs = await client.reserve(ReserveOptions(["q"], LEASE, max_jobs=6))
        assert jobs is not None and len(jobs) == 6
        a, b, c, d, e, f = (j.ctx for j in jobs)
        await client.ack(f)
        sent = count_frames(client)
        outcomes = await asyncio.gather(
            client.ack(a),
            client.nack(b, RetryDirective.DEAD_LETTER, "done with it"),
            client.extend(c, timedelta(minutes=5)),
            client.nack(d),
            client.ack(f),  # already acked: not found
            client.ack(e),
            return_exceptions=True,
        )
        assert [op for op, _ in sent] == ["settle"]
        assert [i["kind"] for i in sent[0][1]["items"]] == [
            "ack", "nack", "extend", "nack", "ack", "ack"
        ]  # fmt: skip
        assert outcomes[0] is None and outcomes[5] is None
        assert outcomes[1] is True and outcomes[3] is False
        assert outcomes[2] > c.lease_expires_at  # type: ignore[operator]
        assert isinstance(outcomes[4], JobNotFoundError)
        await client.close()


@pytestmark_real
async def test_a_fenced_ack_in_a_settle_raises_the_single_acks_error_type() -> None:
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        await client.enqueue(EnqueueRequest("q", "t"))
        await client.enqueue(EnqueueRequest("q", "u"))
        jobs = await client.reserve(ReserveOptions(["q"], LEASE, max_jobs=2))
        assert jobs is not None
        stale = jobs[0].ctx
        # Fence the first: a newer attempt holds its lease now.
        await client.nack(stale, RetryDirective.after(timedelta(0)))
        again = await client.reserve(ReserveOptions(["q"], LEASE, max_jobs=1))
        assert again is not None and again[0].ctx.id == stale.id
        sent = count_frames(client)
        fenced, fine = await asyncio.gather(
            client.ack(stale), client.ack(jobs[1].ctx), return_exceptions=True
        )
        assert [op for op, _ in sent] == ["settle"]
        assert isinstance(fenced, AttemptMismatchError)
        assert fenced.current_attempt == again[0].ctx.attempt
        assert fine is None
        with pytest.raises(AttemptMismatchError):
            await client.ack(stale)  # alone: the same type
        await client.close()


@pytestmark_real
async def test_a_call_that_cannot_be_encoded_fails_alone_and_its_batch_mates_go_through() -> None:
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        await client.enqueue(EnqueueRequest("q", "t"))
        jobs = await client.reserve(ReserveOptions(["q"], LEASE))
        assert jobs is not None
        good = jobs[0].ctx
        bad = dataclasses.replace(good, id=object())  # type: ignore[arg-type]
        outcomes = await asyncio.gather(client.ack(bad), client.ack(good), return_exceptions=True)
        assert isinstance(outcomes[0], TypeError)
        assert outcomes[1] is None
        await client.close()


@pytestmark_real
async def test_many_acks_at_once_are_cut_into_settles_within_the_limits() -> None:
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        await client.enqueue_batch([EnqueueRequest("q", "t")] * 200)
        await client.enqueue_batch([EnqueueRequest("q", "t")] * 100)
        jobs = []
        while len(jobs) < 300:
            got = await client.reserve(ReserveOptions(["q"], LEASE, max_jobs=256))
            assert got is not None
            jobs += got
        sent = count_frames(client)
        await asyncio.gather(*(client.ack(j.ctx) for j in jobs))
        # Cut at EAGER_CALLS, below max_settle_batch (256): never one past it.
        sizes = [len(body["items"]) for op, body in sent if op == "settle"]
        assert sizes == [EAGER_CALLS] * (300 // EAGER_CALLS) + (
            [300 % EAGER_CALLS] if 300 % EAGER_CALLS else []
        )
        stats = await client.queue_stats(["q"])
        assert stats[0].in_flight == 0 and stats[0].ready == 0
        await client.close()


@pytestmark_real
async def test_the_sync_client_from_many_threads_gets_every_result() -> None:
    async with in_process(in_process_config()) as server:
        address = address_of(server)

        def work() -> list[str]:
            client = SyncSeppClient.connect(address)
            results: list[list[str]] = [[] for _ in range(8)]

            def one(k: int) -> None:
                for i in range(25):
                    results[k].append(client.enqueue(EnqueueRequest("s", f"{k}-{i}")).job_id)

            threads = [threading.Thread(target=one, args=(k,)) for k in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            jobs = client.reserve(ReserveOptions(["s"], LEASE, max_jobs=200)) or []
            acked = [0]

            def ack(part: list[Any]) -> None:
                for j in part:
                    client.ack(j.ctx)
                    acked[0] += 1

            ackers = [threading.Thread(target=ack, args=(jobs[k::4],)) for k in range(4)]
            for t in ackers:
                t.start()
            for t in ackers:
                t.join()
            left = client.queue_stats(["s"])[0]
            client.close()
            assert acked[0] == 200 and left.in_flight == 0 and left.ready == 0
            return [job_id for r in results for job_id in r]

        ids = await asyncio.to_thread(work)
        assert len(set(ids)) == 200
