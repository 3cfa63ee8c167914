"""The Worker against the fake server's job queue: dispatch, outcomes, the
concurrency bound, lease auto-extension and loss, and graceful shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
from datetime import timedelta
from typing import Any

import pytest

from sepp.client import (
    ClientClosedError,
    DuplicateHandlerError,
    HandlerError,
    JobCtx,
    Payload,
    SeppClient,
    Worker,
    WorkerMetrics,
    _otel,
)
from sepp.client.worker import NO_HANDLER_DELAY, NO_HANDLER_REASON
from tests.client.fakeserver import FakeServer, error, eventually, make_job

LEASE = timedelta(seconds=30)
WAIT = timedelta(seconds=5)


class Recorder(WorkerMetrics):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, Any]] = []
        self.in_flight = 0

    def record_processed(self) -> None:
        self.events.append(("processed", None))

    def record_nacked(self, dead_lettered: bool) -> None:
        self.events.append(("nacked", dead_lettered))

    def record_in_flight_delta(self, delta: int) -> None:
        self.in_flight += delta

    def record_reserve_ok(self, empty: bool) -> None:
        self.events.append(("reserve_ok", empty))

    def record_reserve_failed(self) -> None:
        self.events.append(("reserve_failed", None))

    def record_lease_lost(self) -> None:
        self.events.append(("lease_lost", None))


def new_worker(client: SeppClient, **kwargs: Any) -> Worker:
    kwargs.setdefault("wait_timeout", WAIT)
    return Worker(client, ["q"], kwargs.pop("lease", LEASE), **kwargs)


async def stop(worker: Worker, task: asyncio.Future[None]) -> None:
    worker.shutdown_handle().shutdown()
    await task


# -- dispatch and outcomes --------------------------------------------------------------------


async def test_jobs_go_to_the_handler_of_their_type_and_are_acked(fake: FakeServer) -> None:
    seen: list[tuple[str, bytes | None, JobCtx]] = []
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)

        @worker.handler("resize")
        async def resize(payload: Payload | None, ctx: JobCtx) -> None:
            seen.append(("resize", payload.data if payload else None, ctx))

        @worker.handler("email")
        async def email(payload: Payload | None, ctx: JobCtx) -> None:
            seen.append(("email", payload.data if payload else None, ctx))

        jobs = [make_job("resize", payload=b"img"), make_job("email", payload=None)]
        fake.queue.push(*jobs)
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 2)
        await stop(worker, task)
        assert sorted((name, data) for name, data, _ in seen) == [
            ("email", None),
            ("resize", b"img"),
        ]
        assert sorted(fake.queue.acked) == sorted(j["id"] for j in jobs)
        assert fake.queue.nacked == []
        await client.close()


async def test_the_catch_all_takes_types_without_a_handler(fake: FakeServer) -> None:
    caught: list[str] = []
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)

        @worker.catch_all
        async def anything(payload: Payload | None, ctx: JobCtx) -> None:
            caught.append(ctx.job_type)

        fake.queue.push(make_job("mystery"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        await stop(worker, task)
        assert caught == ["mystery"]
        await client.close()


async def test_a_type_without_handler_is_nacked_for_a_delayed_retry(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)
        fake.queue.push(make_job("mystery"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.nacked) == 1)
        await stop(worker, task)
        nack = fake.queue.nacked[0]
        assert (nack["retry"], nack["reason"]) == ("delay", NO_HANDLER_REASON)
        assert nack["delay_ms"] == NO_HANDLER_DELAY.total_seconds() * 1000
        await client.close()


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (HandlerError.retry("try later"), {"retry": "default", "reason": "try later"}),
        (
            HandlerError.retry_after("rate limited", timedelta(seconds=42)),
            {"retry": "delay", "delay_ms": 42_000, "reason": "rate limited"},
        ),
        (HandlerError.permanent("bad input"), {"retry": "dead_letter", "reason": "bad input"}),
        (KeyError("missing"), {"retry": "default"}),
        (RuntimeError("kaput"), {"retry": "default"}),
    ],
    ids=["retry", "retry_after", "permanent", "keyerror", "runtimeerror"],
)
async def test_handler_exceptions_become_nacks(
    fake: FakeServer, raised: Exception, expected: dict[str, Any]
) -> None:
    metrics = Recorder()
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client, metrics=metrics)

        @worker.handler("work")
        async def fail(payload: Payload | None, ctx: JobCtx) -> None:
            raise raised

        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.nacked) == 1)
        await stop(worker, task)
        nack = fake.queue.nacked[0]
        assert {k: nack[k] for k in expected} == expected
        if not isinstance(raised, HandlerError):
            assert type(raised).__name__ in nack["reason"]
        assert fake.queue.acked == []
        dead = expected["retry"] == "dead_letter"
        assert ("nacked", dead) in metrics.events
        await client.close()


async def test_ids_and_attempts_are_echoed_with_the_worker_id(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client, worker_id="worker-7")
        worker.handle("work", _noop)
        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        await stop(worker, task)
        assert fake.queue.reserves[0]["worker_id"] == "worker-7"
        assert fake.ops("ack")[0].body["worker_id"] == "worker-7"
        assert fake.ops("ack")[0].body["attempt"] == 1
        await client.close()


async def _noop(payload: Payload | None, ctx: JobCtx) -> None:
    return None


def test_handler_registration_rules() -> None:
    client = SeppClient("127.0.0.1:1")
    worker = Worker(client, ["q"], LEASE)
    worker.handle("a", _noop)
    with pytest.raises(DuplicateHandlerError):
        worker.handle("a", _noop)
    with pytest.raises(DuplicateHandlerError):
        worker.handler("a")(_noop)
    assert worker.replace_handler("a", _noop) is worker
    assert worker.remove_handler("a").remove_handler("never") is worker
    worker.handle("a", _noop)  # free again after removal
    assert worker.catch_all(_noop) is _noop
    with pytest.raises(ValueError):
        Worker(client, ["q"], LEASE, wait_timeout=timedelta(0))
    with pytest.raises(ValueError):
        Worker(client, [], LEASE)


# -- concurrency ----------------------------------------------------------------------------------


async def test_max_in_flight_bounds_running_handlers_and_reserve_sizes(fake: FakeServer) -> None:
    limit = 3
    running = 0
    most = 0
    gate = asyncio.Event()
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client, max_in_flight=limit)

        @worker.handler("work")
        async def slow(payload: Payload | None, ctx: JobCtx) -> None:
            nonlocal running, most
            running += 1
            most = max(most, running)
            await gate.wait()
            running -= 1

        fake.queue.push(*(make_job("work") for _ in range(10)))
        task = asyncio.ensure_future(worker.run())
        await eventually(lambda: running == limit)
        assert worker.in_flight == limit
        assert len(fake.queue.in_flight) == limit  # nothing leased beyond the bound
        gate.set()
        await fake.wait_until(lambda: len(fake.queue.acked) == 10)
        await stop(worker, task)
        assert most == limit
        assert all(r["max_jobs"] <= limit for r in fake.queue.reserves)
        await client.close()


async def test_max_jobs_caps_each_reserve(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client, max_jobs=2, max_in_flight=8)
        worker.handle("work", _noop)
        fake.queue.push(*(make_job("work") for _ in range(5)))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 5)
        await stop(worker, task)
        # Each reserve asks for at most max_jobs, fewer when fewer slots are free.
        asked = [r["max_jobs"] for r in fake.queue.reserves]
        assert max(asked) == 2 and min(asked) >= 1, asked
        assert asked[:4] == [2, 2, 2, 2]  # the first four fill the 8 free slots
        await client.close()


# -- leases -----------------------------------------------------------------------------------------


async def test_auto_extend_renews_the_lease_while_the_handler_runs(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(
            client, lease=timedelta(seconds=20), auto_extend_interval=timedelta(milliseconds=5)
        )

        @worker.handler("work")
        async def long(payload: Payload | None, ctx: JobCtx) -> None:
            await fake.wait_until(lambda: len(fake.queue.extended) >= 2)

        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        await stop(worker, task)
        extends = fake.ops("extend")
        assert all(e.body["lease_ms"] == 20_000 for e in extends)
        await client.close()


async def test_the_default_heartbeat_comes_before_the_granted_lease_ends(
    fake: FakeServer,
) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        # The server grants 150 ms: the heartbeat must fire within a third of that.
        worker = new_worker(client, lease=timedelta(milliseconds=150), auto_extend=True)
        lease_ends: list[float] = []

        @worker.handler("work")
        async def long(payload: Payload | None, ctx: JobCtx) -> None:
            lease_ends.append(ctx.lease_expires_at.timestamp())
            await fake.wait_until(lambda: len(fake.queue.extended) >= 1)

        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        await stop(worker, task)
        assert fake.queue.acked and fake.queue.nacked == []
        await client.close()


@pytest.mark.parametrize("refusal", ["not_found", "attempt_mismatch"])
async def test_a_lost_lease_cancels_the_handler_and_the_job_is_never_reported(
    fake: FakeServer, refusal: str
) -> None:
    cancelled = asyncio.Event()
    metrics = Recorder()
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client, auto_extend_interval=timedelta(milliseconds=5), metrics=metrics)

        @worker.handler("work")
        async def hangs(payload: Payload | None, ctx: JobCtx) -> None:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise

        job = make_job("work")
        fake.queue.fail_extend[job["id"]] = refusal
        fake.queue.push(job)
        task = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(cancelled.wait(), 5)
        await eventually(lambda: ("lease_lost", None) in metrics.events)
        await stop(worker, task)
        assert fake.ops("ack") == [] and fake.ops("nack") == []
        assert metrics.in_flight == 0
        await client.close()


async def test_a_handler_that_ignores_cancellation_still_does_not_report(
    fake: FakeServer,
) -> None:
    finished = asyncio.Event()
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client, auto_extend_interval=timedelta(milliseconds=5))

        @worker.handler("work")
        async def stubborn(payload: Payload | None, ctx: JobCtx) -> None:
            # The cancellation is deliberately swallowed: the worker must not ack anyway.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
            finished.set()

        job = make_job("work")
        fake.queue.fail_extend[job["id"]] = "not_found"
        fake.queue.push(job)
        task = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(finished.wait(), 5)
        await stop(worker, task)
        assert fake.ops("ack") == [] and fake.ops("nack") == []
        await client.close()


async def test_a_transient_extend_failure_keeps_the_handler_running(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client, auto_extend_interval=timedelta(milliseconds=5))
        real_extend = fake.handlers["extend"]
        calls = 0

        def flaky(conn, request):
            nonlocal calls
            calls += 1
            if calls == 1:
                return error("resource_exhausted", "busy", reason="overloaded")
            return real_extend(conn, request)

        fake.on("extend", flaky)

        @worker.handler("work")
        async def long(payload: Payload | None, ctx: JobCtx) -> None:
            await fake.wait_until(lambda: len(fake.queue.extended) >= 1)

        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        await stop(worker, task)
        assert calls >= 2
        await client.close()


async def test_fencing_errors_on_ack_are_logged_as_warnings_with_the_job_id_not_raised(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)

        @worker.handler("work")
        async def too_slow(payload: Payload | None, ctx: JobCtx) -> None:
            del fake.queue.in_flight[ctx.id]  # the lease expired meanwhile

        fake.queue.push(make_job("work"), make_job("other"))
        worker.handle("other", _noop)
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.ops("ack")) == 2)
        await eventually(lambda: len(fake.queue.acked) == 1)
        await stop(worker, task)
        fenced = [r for r in caplog.records if "no longer ours" in r.getMessage()]
        assert len(fenced) == 1 and fenced[0].levelno == logging.WARNING
        assert "lease lost before its ack" in fenced[0].getMessage()
        (lost,) = set(fake.queue.in_flight) | {
            r.body["job_id"] for r in fake.ops("ack") if r.body["job_id"] not in fake.queue.acked
        }
        assert lost in fenced[0].getMessage()
        await client.close()


# -- the loop ----------------------------------------------------------------------------------------


async def test_reserve_errors_are_backed_off_and_the_loop_goes_on(fake: FakeServer) -> None:
    metrics = Recorder()
    async with fake:
        real_reserve = fake.handlers["reserve"]
        calls = 0

        async def flaky(conn, request):
            nonlocal calls
            calls += 1
            if calls == 1:
                return error("unavailable", "restarting")
            return await real_reserve(conn, request)

        fake.on("reserve", flaky)
        client = await SeppClient.connect(fake.address)
        worker = new_worker(
            client, reserve_error_backoff=timedelta(milliseconds=1), metrics=metrics
        )
        worker.handle("work", _noop)
        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.acked) == 1)
        await stop(worker, task)
        assert metrics.events[0] == ("reserve_failed", None)
        assert ("reserve_ok", False) in metrics.events
        assert ("processed", None) in metrics.events
        await client.close()


async def test_shutdown_stops_reserving_and_waits_for_running_handlers(
    fake: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    started = asyncio.Event()
    gate = asyncio.Event()
    finished = False
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)

        @worker.handler("work")
        async def slow(payload: Payload | None, ctx: JobCtx) -> None:
            nonlocal finished
            started.set()
            await gate.wait()
            finished = True

        fake.queue.push(make_job("work"))
        task = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        await fake.wait_until(lambda: len(fake.queue.reserves) == 2)  # parked for more
        worker.shutdown_handle().shutdown()
        await eventually(lambda: any("stopping" in r.getMessage() for r in caplog.records))
        assert not task.done() and not finished
        reserves = len(fake.queue.reserves)
        gate.set()
        await task
        assert finished
        assert len(fake.queue.acked) == 1
        assert len(fake.queue.reserves) == reserves  # no reserve after shutdown
        await client.close()


async def test_shutdown_from_another_thread_stops_the_worker(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)
        handle = worker.shutdown_handle()
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.reserves) >= 1)
        thread = threading.Thread(target=handle.shutdown)
        thread.start()
        await task
        thread.join()
        assert handle.is_shutdown
        await client.close()


async def test_a_worker_shut_down_before_run_returns_at_once(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)
        worker.shutdown_handle().shutdown()
        await worker.run()
        assert fake.queue.reserves == []
        await client.close()


async def test_cancelling_run_cancels_running_handlers(fake: FakeServer) -> None:
    cancelled = asyncio.Event()
    started = asyncio.Event()
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
        task = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(started.wait(), 5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert cancelled.is_set()
        assert fake.ops("ack") == [] and fake.ops("nack") == []
        await client.close()


async def test_the_default_metrics_are_silent_without_opentelemetry(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Without OpenTelemetry whether or not this machine has it: importing it fails.
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    _otel.reset_for_tests()
    caplog.set_level(logging.DEBUG)
    try:
        metrics = WorkerMetrics()
        assert _otel.api() is None
        assert metrics._otel is None
        calls = [
            metrics.record_processed(),
            metrics.record_nacked(True),
            metrics.record_nacked(False),
            metrics.record_in_flight_delta(1),
            metrics.record_in_flight_delta(-1),
            metrics.record_reserve_ok(False),
            metrics.record_reserve_ok(True),
            metrics.record_reserve_failed(),
            metrics.record_lease_lost(),
        ]
    finally:
        _otel.reset_for_tests()
    # Silent: every hook is a no-op that raises, logs and prints nothing.
    assert calls == [None] * 9
    assert caplog.records == []
    assert capsys.readouterr() == ("", "")


async def test_a_closed_client_ends_run_with_client_closed(fake: FakeServer) -> None:
    async with fake:
        client = await SeppClient.connect(fake.address)
        worker = new_worker(client)
        task = asyncio.ensure_future(worker.run())
        await fake.wait_until(lambda: len(fake.queue.reserves) >= 1)
        await client.close()
        with pytest.raises(ClientClosedError):
            await task
