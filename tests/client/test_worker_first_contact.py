"""The Worker and the client as a new user meets them (issue 12, section 5): plain
``def`` handlers, a queue name given as a string, lease renewal by default, job
types without a handler, arguments of the wrong type, and a graceful stop on
SIGINT / SIGTERM. Against the fake server; nothing sleeps to wait."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
from datetime import datetime, timedelta
from typing import Any

import pytest

from sepp.client import (
    EnqueueRequest,
    JobCtx,
    Payload,
    ReserveOptions,
    RetryDirective,
    SeppClient,
    Worker,
)
from sepp.client.worker import NO_HANDLER_DELAY, NO_HANDLER_REASON
from tests.client.fakeserver import FakeServer, eventually, make_job, now_ms

LEASE = timedelta(seconds=30)
WAIT = timedelta(seconds=5)


def new_worker(client: SeppClient, **kwargs: Any) -> Worker:
    kwargs.setdefault("wait_timeout", WAIT)
    return Worker(client, ["q"], kwargs.pop("lease", LEASE), **kwargs)


async def stop(worker: Worker, task: asyncio.Future[None]) -> None:
    worker.stop()
    await task


# -- plain def handlers -------------------------------------------------------------------------


async def test_a_plain_def_handler_runs_once_in_a_worker_thread_and_its_job_is_acked(
    fake: FakeServer,
) -> None:
    calls: list[tuple[str, bytes | None, str]] = []
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)

        @worker.handler("work")
        def work(payload: Payload | None, ctx: JobCtx) -> None:
            calls.append(
                (ctx.id, payload.data if payload else None, threading.current_thread().name)
            )

        job = make_job("work", payload=b'{"n": 1}')
        fake.queue.push(job)
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        await stop(worker, task)
        assert [(c[0], c[1]) for c in calls] == [(job["id"], b'{"n": 1}')]
        assert calls[0][2].startswith("sepp-worker")
        assert fake.queue.acked == [job["id"]] and fake.queue.nacked == []
        await client.close()


async def test_a_plain_def_handler_that_raises_nacks_its_job_once(fake: FakeServer) -> None:
    calls = 0
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)

        @worker.handler("work")
        def work(payload: Payload | None, ctx: JobCtx) -> None:
            nonlocal calls
            calls += 1
            raise ValueError("bad input")

        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.nacked) == 1)
        await stop(worker, task)
        assert calls == 1
        assert "ValueError: bad input" in fake.queue.nacked[0]["reason"]
        await client.close()


async def test_a_blocking_plain_handler_does_not_hold_up_the_event_loop(fake: FakeServer) -> None:
    release = threading.Event()
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client, max_in_flight=2)

        @worker.handler("block")
        def block(payload: Payload | None, ctx: JobCtx) -> None:
            release.wait(10)

        @worker.handler("quick")
        def quick(payload: Payload | None, ctx: JobCtx) -> None:
            return None

        blocked, fast = make_job("block"), make_job("quick")
        fake.queue.push(blocked, fast)
        task = asyncio.ensure_future(worker.run())
        # The quick job is acked while the other handler still blocks its thread.
        await fake.wait_until(lambda: fake.queue.acked == [fast["id"]])
        release.set()
        await fake.wait_until(lambda: len(fake.queue.acked) == 2)
        await stop(worker, task)
        await client.close()


def test_what_cannot_be_a_handler_is_refused_when_registered() -> None:
    worker = Worker(SeppClient("127.0.0.1:1"), ["q"], LEASE)

    def generator(payload: Any, ctx: Any) -> Any:
        yield None

    for bad in ("not callable", 42, generator):
        with pytest.raises(TypeError, match="handler"):
            worker.handle("t", bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="handler"):
            worker.catch_all(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="job_type"):
        worker.handle(b"t", lambda p, c: None)  # type: ignore[arg-type]


# -- arguments of the wrong type ------------------------------------------------------------------

CLIENT = SeppClient("127.0.0.1:1")
WRONG_TYPES = [
    ("queue-string", lambda: Worker(CLIENT, "emails", LEASE), r"\['emails'\]"),
    ("lease-int", lambda: Worker(CLIENT, ["q"], 30), r"lease_duration.*timedelta\(seconds=30\)"),
    ("wait-int", lambda: Worker(CLIENT, ["q"], LEASE, wait_timeout=5), "wait_timeout"),
    ("queue-int", lambda: Worker(CLIENT, [1], LEASE), "queue names"),
    ("max-in-flight", lambda: Worker(CLIENT, ["q"], LEASE, max_in_flight="8"), "max_in_flight"),
    ("client", lambda: Worker("127.0.0.1:7463", ["q"], LEASE), "SeppClient"),
    ("payload-bytes", lambda: EnqueueRequest("q", "t", payload=b"{}"), "Payload"),
    ("payload-text", lambda: Payload("text", "text/plain"), "bytes"),
    ("payload-encoding", lambda: Payload(b"{}", None), "encoding"),
    ("scheduled-float", lambda: EnqueueRequest("q", "t", scheduled_at=1.5e9), "datetime"),
    ("queue-none", lambda: EnqueueRequest(None, "t"), "queue"),
    ("max-attempts", lambda: EnqueueRequest("q", "t", max_attempts="3"), "max_attempts"),
    ("options-string", lambda: ReserveOptions("q", LEASE), r"\['q'\]"),
    ("options-lease", lambda: ReserveOptions(["q"], 30), "lease_duration"),
]


@pytest.mark.parametrize(
    ("call", "expected"), [case[1:] for case in WRONG_TYPES], ids=[case[0] for case in WRONG_TYPES]
)
def test_an_argument_of_the_wrong_type_is_a_type_error_saying_what_is_expected(
    call: Any, expected: str
) -> None:
    with pytest.raises(TypeError, match=expected):
        call()


def test_a_payload_accepts_bytes_like_data_as_bytes() -> None:
    assert Payload(bytearray(b"ab"), "application/octet-stream").data == b"ab"
    assert Payload(memoryview(b"cd"), "application/octet-stream").data == b"cd"


async def test_client_calls_refuse_wrongly_typed_arguments_before_sending(
    fake: FakeServer,
) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        with pytest.raises(TypeError, match="EnqueueRequest"):
            await client.enqueue(("q", "t"))  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="EnqueueRequest"):
            await client.enqueue_batch([EnqueueRequest("q", "t"), {"queue": "q"}])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="ReserveOptions"):
            await client.reserve(["q"])  # type: ignore[arg-type]
        fake.queue.push(make_job("t"))
        jobs = await client.reserve(ReserveOptions(["q"], LEASE, wait_timeout=WAIT))
        assert jobs is not None
        ctx = jobs[0].ctx
        with pytest.raises(TypeError, match="RetryDirective"):
            await client.nack(ctx, "default")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="timedelta"):
            await client.extend(ctx, 30)  # type: ignore[arg-type]
        # The reserved Job itself instead of its ctx: the easy slip, named.
        with pytest.raises(TypeError, match=r"got Job \(pass job\.ctx\)"):
            await client.ack(jobs[0])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"got Job \(pass job\.ctx\)"):
            await client.nack(jobs[0], RetryDirective.DEFAULT)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"got Job \(pass job\.ctx\)"):
            await client.extend(jobs[0], LEASE)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"got Job \(pass job\.ctx\)"):
            await client.release(jobs[0])  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"JobCtx .* got NoneType$"):
            await client.ack(None)  # type: ignore[arg-type]
        assert fake.ops("enqueue") == [] and fake.ops("nack") == [] and fake.ops("extend") == []
        assert fake.ops("ack") == [] and fake.ops("settle") == [] and fake.ops("release") == []
        await client.nack(ctx, RetryDirective.DEFAULT)
        await client.close()


# -- lease renewal ----------------------------------------------------------------------------------


def clamp_leases(fake: FakeServer, granted_ms: int) -> None:
    """Make the fake grant `granted_ms` whatever a reserve or extend asks for, as
    a server does that clamps to its maximum without a word."""
    real_reserve, real_extend = fake.handlers["reserve"], fake.handlers["extend"]

    async def reserve(conn: Any, request: Any) -> Any:
        status, body = await real_reserve(conn, request)
        for job in body.get("jobs", []):
            job["lease_expires_at_ms"] = now_ms() + granted_ms
        return status, body

    def extend(conn: Any, request: Any) -> Any:
        status, body = real_extend(conn, request)
        if status == "ok":
            body["lease_expires_at_ms"] = now_ms() + granted_ms
            fake.queue.in_flight[body["job_id"]]["lease_expires_at_ms"] = body[
                "lease_expires_at_ms"
            ]
        return status, body

    fake.on("reserve", reserve)
    fake.on("extend", extend)


async def test_leases_are_renewed_by_default_within_what_the_server_granted(
    fake: FakeServer,
) -> None:
    async with fake:
        clamp_leases(fake, granted_ms=300)
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)  # no auto_extend argument: renewal is the default

        @worker.handler("work")
        async def long(payload: Payload | None, ctx: JobCtx) -> None:
            # Runs past several granted leases; every renewal must come in time.
            await fake.wait_until(lambda: len(fake.queue.extended) >= 3)
            job = fake.queue.in_flight[ctx.id]
            assert job["lease_expires_at_ms"] > now_ms()

        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        await stop(worker, task)
        # It asks for its whole lease each time; the server decides what it grants.
        assert {e.body["lease_ms"] for e in fake.ops("extend")} == {30_000}
        assert fake.queue.nacked == []
        await client.close()


async def test_renewal_can_be_turned_off(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client, auto_extend=False)
        gate = asyncio.Event()

        @worker.handler("work")
        async def waits(payload: Payload | None, ctx: JobCtx) -> None:
            await gate.wait()

        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run())
        await eventually(lambda: worker.in_flight == 1)
        gate.set()
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        await stop(worker, task)
        assert fake.ops("extend") == []
        await client.close()


@pytest.mark.parametrize("refusal", ["not_found", "attempt_mismatch"])
async def test_a_lease_lost_while_renewing_is_a_warning_with_the_job_id(
    fake: FakeServer, caplog: pytest.LogCaptureFixture, refusal: str
) -> None:
    async with fake:
        clamp_leases(fake, granted_ms=150)
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)

        @worker.handler("work")
        async def hangs(payload: Payload | None, ctx: JobCtx) -> None:
            await asyncio.Event().wait()

        job = make_job("work")
        fake.queue.fail_extend[job["id"]] = refusal
        fake.queue.push(job)
        task = asyncio.ensure_future(worker.run())
        await eventually(
            lambda: any(
                r.levelno == logging.WARNING
                and job["id"] in r.getMessage()
                and "lease lost" in r.getMessage()
                for r in caplog.records
            )
        )
        await stop(worker, task)
        assert fake.ops("ack") == [] and fake.ops("nack") == []
        await client.close()


# -- job types without a handler --------------------------------------------------------------------


async def test_jobs_without_a_handler_are_backed_off_per_attempt_and_warned_once_per_type(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)
        first = make_job("new_type")
        second = make_job("new_type", attempt=1)  # delivered as its second attempt
        fake.queue.push(first, second)
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.nacked) == 2)
        await stop(worker, task)
        delays = {n["job_id"]: (n["retry"], n["delay_ms"], n["reason"]) for n in fake.queue.nacked}
        base = int(NO_HANDLER_DELAY.total_seconds() * 1000)
        assert delays == {
            first["id"]: ("delay", base, NO_HANDLER_REASON),
            second["id"]: ("delay", 2 * base, NO_HANDLER_REASON),
        }
        warned = [
            r
            for r in caplog.records
            if r.levelno == logging.WARNING
            and "no handler for job_type 'new_type'" in r.getMessage()
        ]
        assert len(warned) == 1
        await client.close()


# -- a graceful stop on SIGINT / SIGTERM ------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_a_signal_stops_reserving_and_lets_the_running_handler_finish(
    fake: FakeServer, signum: int
) -> None:
    started = asyncio.Event()
    gate = asyncio.Event()
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)

        @worker.handler("work")
        async def slow(payload: Payload | None, ctx: JobCtx) -> None:
            started.set()
            await gate.wait()

        fake.queue.push(make_job("work"))
        before = signal.getsignal(signum)
        task = asyncio.ensure_future(worker.run(handle_signals=True))
        await asyncio.wait_for(started.wait(), 5)
        await fake.wait_until(lambda: len(fake.queue.reserves) == 2)  # parked for more
        os.kill(os.getpid(), signum)
        await eventually(lambda: worker.shutdown_handle().is_shutdown)
        reserves = len(fake.queue.reserves)
        assert not task.done()
        gate.set()
        await task  # returns normally: no KeyboardInterrupt, no traceback
        assert len(fake.queue.acked) == 1
        assert len(fake.queue.reserves) == reserves
        assert signal.getsignal(signum) == before  # put back when run returned
        await client.close()


async def test_a_second_signal_cancels_running_handlers_and_run_returns(
    fake: FakeServer,
) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)

        @worker.handler("work")
        async def hangs(payload: Payload | None, ctx: JobCtx) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run(handle_signals=True))
        await asyncio.wait_for(started.wait(), 5)
        os.kill(os.getpid(), signal.SIGINT)
        await eventually(lambda: worker.shutdown_handle().is_shutdown)
        os.kill(os.getpid(), signal.SIGINT)
        await task
        assert cancelled.is_set()
        assert fake.ops("ack") == []
        await client.close()


def test_scheduled_at_takes_a_datetime() -> None:
    when = datetime(2030, 1, 1)
    assert EnqueueRequest("q", "t", scheduled_at=when).scheduled_at == when
