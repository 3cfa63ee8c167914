"""The Worker keeps reserves outstanding for its free slots while handlers run
(issue 14, item 4): `max_jobs=1` means one job per reserve with as many reserves
in flight as there are free slots, never one round trip per job; a reserve never
asks for more jobs than there are free slots; a handler's slot is free when it
returns, so the next reserve leaves while its ack is still on the wire; shutdown
withdraws every parked reserve and drains the running handlers; one lost lease
among many running jobs stays a quiet warning.

Against the fake server, or (where only the server's own state shows it) a real
server in this test's event loop. Nothing sleeps to wait."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from typing import Any

import pytest

from sepp.client import (
    EnqueueRequest,
    JobCtx,
    Payload,
    ReserveOptions,
    SeppClient,
    Worker,
    WorkerMetrics,
)
from sepp.protocol import Request, decode_request, encode_frame, encode_response
from sepp.server.server import SeppServer
from tests.client.fakeserver import (
    SILENT,
    FakeConnection,
    FakeServer,
    eventually,
    make_job,
    now_ms,
)
from tests.inprocess import address_of, in_process, in_process_config
from tests.support import record_client_writes

LEASE = timedelta(seconds=30)
# Long enough that no parked reserve ends on its own during a test: an old-style
# worker (one reserve at a time) never gets to send a second one.
LONG_WAIT = timedelta(seconds=60)


def parked_count(server: SeppServer) -> int:
    return sum(len(conn.parked) for conn in server.connections)


async def test_with_max_jobs_1_every_free_slot_has_its_own_parked_reserve(
    in_process_env: None,
) -> None:
    slots = 6
    gate = asyncio.Event()
    running = 0
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        worker = Worker(
            client, ["q"], LEASE, wait_timeout=LONG_WAIT, max_jobs=1, max_in_flight=slots
        )

        @worker.handler("t")
        async def blocked(payload: Payload | None, ctx: JobCtx) -> None:
            nonlocal running
            running += 1
            await gate.wait()

        task = asyncio.ensure_future(worker.run())
        # An empty queue: one reserve of one job per free slot, all parked at once.
        await eventually(lambda: parked_count(server) == slots)
        producer = await SeppClient.connect(address_of(server))
        await producer.enqueue_batch([EnqueueRequest("q", "t") for _ in range(slots)])
        # Each parked reserve takes one job: every slot runs without another round trip.
        await eventually(lambda: running == slots)
        assert worker.in_flight == slots
        assert parked_count(server) == 0  # no slot is free, so nothing else is asked
        gate.set()
        # The freed slots park their reserves again.
        await eventually(lambda: parked_count(server) == slots)
        worker.stop()
        await task
        stats = (await producer.queue_stats(["q"]))[0]
        assert (stats.ready, stats.in_flight) == (0, 0)
        await producer.close()
        await client.close()


async def test_with_max_jobs_1_the_reserves_one_turn_launches_leave_in_one_write(
    fake: FakeServer,
) -> None:
    # Slots freed in one loop turn (the jobs of one read, their handlers done)
    # are asked for in one write: one system call and one wake-up of the server
    # instead of one per job.
    slots = 3
    held: list[Request] = []
    done = 0
    async with fake:

        def park(conn: FakeConnection, request: Request) -> Any:
            held.append(request)
            return SILENT

        fake.on("reserve", park)
        fake.on("ack", lambda conn, request: ("ok", {"job_id": request.body["job_id"]}))
        client = await SeppClient.connect(fake.address)
        recorded = record_client_writes(client)
        worker = Worker(
            client, ["q"], LEASE, wait_timeout=LONG_WAIT, max_jobs=1, max_in_flight=slots
        )

        @worker.handler("t")
        async def no_op(payload: Payload | None, ctx: JobCtx) -> None:
            nonlocal done
            done += 1

        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(held) == slots)
        # One job for each parked reserve, all in one write: the worker reads them together.
        answers = []
        for request in held:
            job = make_job("t")
            job["attempt"] = 1
            job["lease_expires_at_ms"] = now_ms() + 30_000
            answers.append(encode_frame(encode_response(request.id, "ok", {"jobs": [job]})))
        fake.connections[0].send_raw(b"".join(answers))
        await fake.wait_until(lambda: len(held) == 2 * slots and len(fake.ops("ack")) == slots)
        assert done == slots
        reserves_per_write = [
            ids
            for ids in (
                [r.id for r in map(decode_request, frames) if r.op == "reserve"]
                for frames in recorded.frames()
            )
            if ids
        ]
        assert (
            reserves_per_write
            == [
                [r.id for r in held[:slots]],  # the first reserves, one per free slot
                [r.id for r in held[slots:]],  # the three slots freed in one turn
            ]
        )
        worker.stop()
        empty = [encode_frame(encode_response(r.id, "ok", {"jobs": []})) for r in held[slots:]]
        fake.connections[0].send_raw(b"".join(empty))
        await task
        await client.close()


async def test_a_reserve_never_asks_for_more_jobs_than_there_are_free_slots(
    fake: FakeServer,
) -> None:
    limit = 5
    running = 0
    gates: list[asyncio.Event] = []
    # At each reserve's arrival: the handlers running plus the jobs every reserve
    # still unanswered asked for, this one included.
    promised: list[int] = []
    outstanding: dict[int, int] = {}
    async with fake:
        real_reserve = fake.handlers["reserve"]

        async def watched(conn: FakeConnection, request: Request) -> Any:
            outstanding[request.id] = request.body["max_jobs"]
            promised.append(running + sum(outstanding.values()))
            try:
                return await real_reserve(conn, request)
            finally:
                del outstanding[request.id]

        fake.on("reserve", watched)
        client = await SeppClient.connect(fake.address)
        worker = Worker(
            client, ["q"], LEASE, wait_timeout=LONG_WAIT, max_jobs=2, max_in_flight=limit
        )

        @worker.handler("t")
        async def blocked(payload: Payload | None, ctx: JobCtx) -> None:
            nonlocal running
            running += 1
            gate = asyncio.Event()
            gates.append(gate)
            await gate.wait()
            running -= 1

        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(outstanding) == 3)  # 2 + 2 + 1 slots
        assert sorted(outstanding.values()) == [1, 2, 2]
        fake.queue.push(*(make_job("t") for _ in range(4)))
        await eventually(lambda: running == 4)
        # One slot left: the reserve parked for it asks for one job.
        await fake.wait_until(lambda: list(outstanding.values()) == [1])
        gates[0].set()
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        await fake.wait_until(lambda: sum(outstanding.values()) == 2)
        for gate in gates[1:]:
            gate.set()
        await fake.wait_until(lambda: len(fake.queue.acked) == 4)
        await fake.wait_until(lambda: sum(outstanding.values()) == limit)
        worker.stop()
        await task
        assert max(promised) <= limit, promised
        assert {r["max_jobs"] for r in fake.queue.reserves} <= {1, 2}
        await client.close()


async def test_without_max_jobs_the_slots_are_reserved_in_two_waves_that_take_turns(
    fake: FakeServer,
) -> None:
    # max_jobs unset, 4 slots: each reserve asks for half of them (a wave), and
    # the reserve for a wave's freed slots leaves from the handler that freed
    # the last of them -- before the handlers of the other wave, answered in the
    # same moment, run. The old worker asked for all 4 slots in one reserve and
    # sent the next one only after every handler of the answer had run, so the
    # server idled while this process worked and the other way round.
    slots = 4
    events: list[str] = []
    async with fake:
        client = await SeppClient.connect(fake.address)
        reserve_now = client._reserve_now

        def spy(opts: ReserveOptions, order: str) -> Any:
            events.append(f"reserve {opts.max_jobs}")
            return reserve_now(opts, order)

        client._reserve_now = spy  # type: ignore[method-assign]
        worker = Worker(client, ["q"], LEASE, wait_timeout=LONG_WAIT, max_in_flight=slots)

        @worker.handler("t")
        async def note(payload: Payload | None, ctx: JobCtx) -> None:
            events.append("ran")

        task = asyncio.ensure_future(worker.run())
        # Idle: two waves parked, together asking for every slot and no more.
        await fake.wait_until(lambda: len(fake.queue.reserves) == 2)
        assert [r["max_jobs"] for r in fake.queue.reserves] == [2, 2]
        # Both parked reserves are answered in the same moment.
        fake.queue.push(*(make_job("t") for _ in range(slots)))
        await fake.wait_until(lambda: len(fake.queue.acked) == slots)
        await fake.wait_until(lambda: len(fake.queue.reserves) == 4)
        worker.stop()
        await task
        ran = [i for i, event in enumerate(events) if event == "ran"]
        relaunched = [i for i, event in enumerate(events) if event.startswith("reserve")][2:]
        assert len(ran) == slots and relaunched, events
        # The first wave's next reserve left before the other wave's last handler ran.
        assert relaunched[0] < ran[-1], events
        assert {r["max_jobs"] for r in fake.queue.reserves} == {2}, fake.queue.reserves
        await client.close()


async def test_the_next_reserve_leaves_while_the_last_ack_is_on_the_wire(
    fake: FakeServer,
) -> None:
    # One slot: the old worker held it until the ack was answered, so a slow ack
    # delayed the next reserve by a round trip. Now the slot is free when the
    # handler returns, and the ack travels on its own.
    ack_gate = asyncio.Event()
    async with fake:
        real_ack = fake.handlers["ack"]

        async def slow_ack(conn: FakeConnection, request: Request) -> Any:
            await ack_gate.wait()
            return real_ack(conn, request)

        fake.on("ack", slow_ack)
        client = await SeppClient.connect(fake.address)
        worker = Worker(client, ["q"], LEASE, wait_timeout=LONG_WAIT, max_in_flight=1)

        @worker.handler("t")
        async def fast(payload: Payload | None, ctx: JobCtx) -> None:
            return None

        fake.queue.push(make_job("t"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.ops("ack")) == 1 and len(fake.queue.reserves) == 2)
        assert fake.queue.acked == []  # the ack is still unanswered...
        assert fake.queue.reserves[1]["max_jobs"] == 1  # ...and the next reserve is parked
        # An ack sent while a reserve long-polls is answered at once.
        ack_gate.set()
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        fake.queue.push(make_job("t"))
        await fake.wait_until(lambda: len(fake.queue.acked) == 2)
        worker.stop()
        await task
        await client.close()


async def test_shutdown_withdraws_every_parked_reserve_and_drains_running_handlers(
    in_process_env: None,
) -> None:
    started = asyncio.Event()
    gate = asyncio.Event()
    finished: list[str] = []
    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        producer = await SeppClient.connect(address_of(server))
        worker = Worker(client, ["q"], LEASE, wait_timeout=LONG_WAIT, max_jobs=1, max_in_flight=4)

        @worker.handler("t")
        async def slow(payload: Payload | None, ctx: JobCtx) -> None:
            started.set()
            await gate.wait()
            finished.append(ctx.id)

        first = await producer.enqueue(EnqueueRequest("q", "t"))
        task = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        await eventually(lambda: parked_count(server) == 3)  # one per free slot
        worker.stop()
        await eventually(lambda: parked_count(server) == 0)
        assert not task.done() and finished == []
        # Nothing is leased to the stopping worker: a job enqueued now stays
        # ready, its only attempt unspent.
        later = await producer.enqueue(EnqueueRequest("q", "t", max_attempts=1))
        stats = (await producer.queue_stats(["q"]))[0]
        assert (stats.ready, stats.in_flight) == (1, 1)
        gate.set()
        await task
        assert finished == [first.job_id]
        stats = (await producer.queue_stats(["q"]))[0]
        assert (stats.ready, stats.in_flight, stats.dead_lettered) == (1, 0, 0)
        jobs = await producer.reserve(ReserveOptions(["q"], LEASE, timedelta(seconds=5)))
        assert jobs is not None and (jobs[0].ctx.id, jobs[0].ctx.attempt) == (later.job_id, 1)
        await producer.ack(jobs[0].ctx)
        await producer.close()
        await client.close()


async def test_one_lost_lease_among_running_jobs_is_a_quiet_warning(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    gate = asyncio.Event()
    cancelled: list[str] = []
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = Worker(
            client,
            ["q"],
            LEASE,
            wait_timeout=LONG_WAIT,
            max_in_flight=4,
            auto_extend_interval=timedelta(milliseconds=5),
        )

        @worker.handler("t")
        async def long(payload: Payload | None, ctx: JobCtx) -> None:
            try:
                await gate.wait()
            except asyncio.CancelledError:
                cancelled.append(ctx.id)
                raise

        jobs = [make_job("t") for _ in range(3)]
        lost = jobs[1]["id"]
        fake.queue.fail_extend[lost] = "not_found"
        fake.queue.push(*jobs)
        task = asyncio.ensure_future(worker.run())
        await eventually(lambda: cancelled == [lost])
        # The others keep their leases, renewed by the same timer.
        kept = {j["id"] for j in jobs} - {lost}
        await fake.wait_until(lambda: kept <= set(fake.queue.extended))
        gate.set()
        await fake.wait_until(lambda: set(fake.queue.acked) == kept)
        worker.stop()
        await task
        assert lost not in {r.body["job_id"] for r in fake.ops("ack") + fake.ops("nack")}
        assert worker.in_flight == 0
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
        assert lost in warnings[0].getMessage() and "lease lost" in warnings[0].getMessage()
        assert warnings[0].exc_info is None
        await client.close()


async def test_acks_sent_without_waiting_are_answered_before_run_returns_and_fencing_stays_quiet(
    in_process_env: None, caplog: pytest.LogCaptureFixture
) -> None:
    # Against a server with `settle`, an ack joins the coalesced settle without
    # a task waiting for it: run() must still wait for every answer, count each
    # acked job, and turn a fencing refusal into the usual quiet warning.
    jobs = 20
    processed: list[None] = []

    class Count(WorkerMetrics):
        def record_processed(self) -> None:
            processed.append(None)

    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        producer = await SeppClient.connect(address_of(server))
        worker = Worker(
            client, ["q"], LEASE, wait_timeout=LONG_WAIT, max_in_flight=8, metrics=Count()
        )
        fenced: list[str] = []

        @worker.handler("t")
        async def work(payload: Payload | None, ctx: JobCtx) -> None:
            if not fenced:
                # Someone else takes the job back meanwhile: this ack is refused.
                fenced.append(ctx.id)
                await producer.release(ctx)

        sent_without_waiting: list[str] = []
        settle_nowait = client._settle_nowait

        def spy(op: str, body: dict[str, Any], outcome: Any) -> bool:
            taken = settle_nowait(op, body, outcome)
            if taken:
                sent_without_waiting.append(op)
            return taken

        client._settle_nowait = spy  # type: ignore[method-assign]
        await producer.enqueue_batch([EnqueueRequest("q", "t") for _ in range(jobs)])
        task = asyncio.ensure_future(worker.run())
        # The released job comes back (same attempt) and is acked the second time.
        await eventually(lambda: len(processed) == jobs)
        worker.stop()
        await task
        stats = (await producer.queue_stats(["q"]))[0]
        assert (stats.ready, stats.in_flight) == (0, 0)
        assert sent_without_waiting == ["ack"] * (jobs + 1)
        warnings = [
            r
            for r in caplog.records
            if r.levelno >= logging.WARNING and r.name.startswith("sepp.client")
        ]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        message = warnings[0].getMessage()
        assert warnings[0].levelno == logging.WARNING and fenced[0] in message
        assert "lease lost before its ack" in message
        await producer.close()
        await client.close()


async def test_run_returns_only_once_every_ack_is_answered(in_process_env: None) -> None:
    jobs = 50
    processed: list[None] = []
    started = asyncio.Event()
    gate = asyncio.Event()

    class Count(WorkerMetrics):
        def record_processed(self) -> None:
            processed.append(None)

    async with in_process(in_process_config()) as server:
        client = await SeppClient.connect(address_of(server))
        producer = await SeppClient.connect(address_of(server))
        worker = Worker(
            client, ["q"], LEASE, wait_timeout=LONG_WAIT, max_in_flight=jobs, metrics=Count()
        )

        @worker.handler("t")
        async def held(payload: Payload | None, ctx: JobCtx) -> None:
            started.set()
            await gate.wait()

        await producer.enqueue_batch([EnqueueRequest("q", "t") for _ in range(jobs)])
        task = asyncio.ensure_future(worker.run())
        await eventually(lambda: worker.in_flight == jobs)
        worker.stop()
        gate.set()  # every handler returns at once; their acks leave together
        await task
        assert len(processed) == jobs  # each ack was answered before run returned
        stats = (await producer.queue_stats(["q"]))[0]
        assert (stats.ready, stats.in_flight) == (0, 0)
        await producer.close()
        await client.close()
