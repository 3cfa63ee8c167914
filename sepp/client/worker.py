"""The Worker: reserve -> run a handler -> ack or nack, with bounded concurrency,
automatic lease extension and graceful shutdown.

Owns: `Worker` (the sepp-py API), `HandlerError` (how a handler chooses its
job's retry), `ShutdownHandle`, `DuplicateHandlerError` and `WorkerMetrics`
(hooks called as jobs move; OpenTelemetry counters when it is installed).

A handler is ``async def handler(payload, ctx) -> None``:

* returning acks the job;
* raising ``HandlerError.retry(reason)`` nacks it under the queue's policy,
  ``HandlerError.retry_after(reason, delay)`` nacks it with a delay,
  ``HandlerError.permanent(reason)`` dead-letters it;
* raising anything else nacks it for a default retry.

Promises: at most `max_in_flight` handlers run at once, and a reserve never
asks for more jobs than there are free slots; a job whose lease was lost (an
auto-extend answered not_found / attempt_mismatch, or the lease ran out while
extends failed) has its handler cancelled and is never acked or nacked
afterwards; after `ShutdownHandle.shutdown` no reserve is sent and `run`
returns once the running handlers have finished.

Must not import: sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from datetime import timedelta
from typing import Any, TypeVar

from sepp.client import _convert, _otel
from sepp.client.client import Lease, RetryDirective, SeppClient
from sepp.client.errors import (
    AttemptMismatchError,
    ClientClosedError,
    JobNotFoundError,
    LeaseError,
    SeppError,
    UndecodableJobError,
)
from sepp.client.types import Job, JobCtx, Payload, ReserveOptions, UndecodableJob

__all__ = [
    "DuplicateHandlerError",
    "Handler",
    "HandlerError",
    "ShutdownHandle",
    "Worker",
    "WorkerMetrics",
]

logger = logging.getLogger("sepp.client.worker")

Handler = Callable[[Payload | None, JobCtx], Awaitable[None]]

_T = TypeVar("_T")

# An empty reserve answered much sooner than its wait (a server that is
# shutting down answers at once) is followed by a short pause, so the loop does
# not spin against the server.
EARLY_EMPTY_THRESHOLD = timedelta(milliseconds=100)
EARLY_EMPTY_BACKOFF = timedelta(milliseconds=250)
NO_HANDLER_REASON = "no handler registered for this job_type"


class HandlerError(Exception):
    """Raise from a handler to nack its job with a chosen `RetryDirective`.
    Build it with `retry`, `retry_after` or `permanent`."""

    def __init__(self, reason: str, directive: RetryDirective) -> None:
        super().__init__(reason)
        self.reason = reason
        self.directive = directive

    @classmethod
    def retry(cls, reason: str) -> HandlerError:
        """Retry under the queue's retry policy."""
        return cls(reason, RetryDirective.DEFAULT)

    @classmethod
    def retry_after(cls, reason: str, delay: timedelta) -> HandlerError:
        """Retry no sooner than `delay` from now."""
        return cls(reason, RetryDirective.after(delay))

    @classmethod
    def permanent(cls, reason: str) -> HandlerError:
        """Do not retry: dead-letter the job now."""
        return cls(reason, RetryDirective.DEAD_LETTER)


class DuplicateHandlerError(SeppError):
    """`Worker.handle` was given a job type that already has a handler."""

    def __init__(self, job_type: str) -> None:
        super().__init__(f"a handler for job_type {job_type!r} is already registered")
        self.job_type = job_type


class ShutdownHandle:
    """Stops a `Worker` gracefully: no new reserves, running handlers finish,
    then `Worker.run` returns.

    `shutdown` may be called from any thread (or a signal handler) and more
    than once.
    """

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._flag = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def shutdown(self) -> None:
        """Ask the worker to stop reserving and drain."""
        with self._lock:
            self._flag = True
            loop = self._loop
        if loop is None or loop.is_closed():
            self._event.set()
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._event.set()
        else:
            loop.call_soon_threadsafe(self._event.set)

    @property
    def is_shutdown(self) -> bool:
        """Whether `shutdown` was called."""
        return self._flag

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            self._loop = loop
            if self._flag:
                self._event.set()

    async def wait(self) -> None:
        """Wait until `shutdown` is called (a sepp addition)."""
        await self._event.wait()


class WorkerMetrics:
    """Hooks a `Worker` calls as jobs move (a sepp addition; sepp-py only has
    its OpenTelemetry counters). Subclass and pass ``metrics=`` to count jobs
    your own way; the default records OpenTelemetry counters when it is
    installed and does nothing otherwise."""

    def __init__(self) -> None:
        self._otel = _otel.instruments()

    def record_processed(self) -> None:
        """A job was acked."""
        if self._otel is not None:
            self._otel.processed.add(1)

    def record_nacked(self, dead_lettered: bool) -> None:
        """A job was nacked; `dead_lettered` if that ended it."""
        if self._otel is not None:
            self._otel.nacked.add(1, {"outcome": "dead_letter" if dead_lettered else "retry"})

    def record_in_flight_delta(self, delta: int) -> None:
        """A handler started (+1) or finished (-1)."""
        if self._otel is not None:
            self._otel.in_flight.add(delta)

    def record_reserve_ok(self, empty: bool) -> None:
        """A reserve answered, with jobs or `empty`."""
        if self._otel is not None:
            self._otel.reserves_completed.add(1, {"jobs": "empty" if empty else "some"})

    def record_reserve_failed(self) -> None:
        """A reserve failed."""
        if self._otel is not None:
            self._otel.reserves_failed.add(1)

    def record_lease_lost(self) -> None:
        """A handler was cancelled because its job's lease was lost."""


class _LeaseLost(Exception):
    """Internal: the heartbeat decided the lease is gone."""


def _default_worker_id() -> str:
    try:
        host = socket.gethostname() or "unknown"
    except OSError:
        host = "unknown"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class Worker:
    """Runs handlers for the jobs of `queues`, on a `SeppClient`.

    Register handlers with `handle` / the `handler` decorator (one per job
    type) and optionally `catch_all`; then ``await worker.run()``, which returns
    after the `ShutdownHandle` fires and running handlers finish. A job type
    without a handler (and no catch-all) is nacked for retry.

    `max_in_flight` (default 16) bounds concurrent handlers. With `auto_extend`
    a heartbeat renews each running job's lease — by `lease_duration`, every
    third of the lease remaining, or every `auto_extend_interval` — so long
    handlers keep their jobs; a handler that never returns then keeps its job
    forever, so bound hang-prone work yourself (e.g. `asyncio.timeout`).
    """

    def __init__(
        self,
        client: SeppClient,
        queues: Iterable[str],
        lease_duration: timedelta,
        *,
        wait_timeout: timedelta | None = None,
        max_jobs: int | None = None,
        max_in_flight: int = 16,
        reserve_error_backoff: timedelta = timedelta(seconds=1),
        auto_extend: bool = False,
        auto_extend_interval: timedelta | None = None,
        worker_id: str | None = None,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        if wait_timeout is not None and wait_timeout <= timedelta(0):
            raise ValueError("wait_timeout must be positive")
        options: dict[str, Any] = {
            "worker_id": _default_worker_id() if worker_id is None else worker_id,
            "max_jobs": max_jobs,
        }
        if wait_timeout is not None:
            options["wait_timeout"] = wait_timeout
        self._opts = ReserveOptions(list(queues), lease_duration, **options)
        self._client = client
        self._handlers: dict[str, Handler] = {}
        self._catch_all_handler: Handler | None = None
        self._max_in_flight = max(1, max_in_flight)
        self._reserve_error_backoff = reserve_error_backoff
        self._auto_extend = auto_extend or auto_extend_interval is not None
        self._auto_extend_interval = (
            None
            if auto_extend_interval is None
            else max(auto_extend_interval, timedelta(milliseconds=1))
        )
        self._shutdown = ShutdownHandle()
        self._metrics = metrics if metrics is not None else WorkerMetrics()
        self._in_flight = 0

    # -- configuration -------------------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        """The id sent with every reserve, ack, nack and extend."""
        return self._opts.worker_id or ""

    @property
    def in_flight(self) -> int:
        """How many handlers are running now."""
        return self._in_flight

    def handle(self, job_type: str, handler: Handler) -> Worker:
        """Register `handler` for `job_type`; `DuplicateHandlerError` if one is
        registered already. Returns the worker, for chaining."""
        if job_type in self._handlers:
            raise DuplicateHandlerError(job_type)
        self._handlers[job_type] = handler
        return self

    def replace_handler(self, job_type: str, handler: Handler) -> Worker:
        """Register `handler` for `job_type`, replacing any earlier one."""
        self._handlers[job_type] = handler
        return self

    def remove_handler(self, job_type: str) -> Worker:
        """Forget the handler of `job_type`, if there is one."""
        self._handlers.pop(job_type, None)
        return self

    def catch_all(self, handler: Handler) -> Handler:
        """Register the handler for job types without their own (replacing an
        earlier catch-all). Returns `handler`, so it works as a decorator."""
        self._catch_all_handler = handler
        return handler

    def handler(self, job_type: str) -> Callable[[Handler], Handler]:
        """Decorator form of `handle`."""

        def register(fn: Handler) -> Handler:
            self.handle(job_type, fn)
            return fn

        return register

    def shutdown_handle(self) -> ShutdownHandle:
        """The handle that stops this worker."""
        return self._shutdown

    # -- the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Reserve and process jobs until shutdown, then wait for running
        handlers and return.

        Reserve failures are logged and retried after `reserve_error_backoff`;
        they never end the loop, except `ClientClosedError` (the client was
        closed), which `run` raises once running handlers are done. The final
        wait has no time limit. Cancelling `run` instead of using the
        `ShutdownHandle` cancels the running handlers too (their jobs come back
        when their leases expire).
        """
        self._shutdown._bind(asyncio.get_running_loop())
        slots = asyncio.Semaphore(self._max_in_flight)
        tasks: set[asyncio.Task[None]] = set()
        logger.info(
            "worker %s started (max_in_flight=%d, auto_extend=%s)",
            self.worker_id,
            self._max_in_flight,
            self._auto_extend,
        )
        try:
            await self._reserve_loop(slots, tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        except ClientClosedError:
            # Nothing can succeed on a closed client: stop instead of looping.
            logger.error("worker %s: the client was closed; stopping", self.worker_id)
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        logger.info("worker %s stopping; waiting for %d running jobs", self.worker_id, len(tasks))
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        logger.info("worker %s stopped", self.worker_id)

    async def _reserve_loop(self, slots: asyncio.Semaphore, tasks: set[asyncio.Task[None]]) -> None:
        while not self._shutdown.is_shutdown:
            # Hold one slot before asking: a reserve must have room for its jobs.
            acquired, _ = await self._unless_shutdown(slots.acquire())
            if not acquired:
                return
            opts = self._reserve_options()
            started = time.monotonic()
            try:
                answered, jobs = await self._unless_shutdown(self._client.reserve(opts))
            except ClientClosedError:
                slots.release()
                raise
            except UndecodableJobError as exc:
                # Jobs this client cannot decode are leased to us: dead-letter
                # them with the reason now (never skip them, never let them burn
                # their attempts on lease expiry); run the others as usual.
                await self._dead_letter_undecodable(exc.undecodable)
                answered, jobs = True, exc.jobs
            except SeppError as exc:
                slots.release()
                self._metrics.record_reserve_failed()
                logger.warning(
                    "reserve failed: %s; retrying in %s", exc, self._reserve_error_backoff
                )
                waited, _ = await self._unless_shutdown(
                    asyncio.sleep(self._reserve_error_backoff.total_seconds())
                )
                if not waited:
                    return
                continue
            if not answered:
                slots.release()
                return
            if not jobs:
                slots.release()
                self._metrics.record_reserve_ok(empty=True)
                elapsed = timedelta(seconds=time.monotonic() - started)
                if elapsed < min(EARLY_EMPTY_THRESHOLD, opts.wait_timeout / 2):
                    paused, _ = await self._unless_shutdown(
                        asyncio.sleep(EARLY_EMPTY_BACKOFF.total_seconds())
                    )
                    if not paused:
                        return
                continue
            self._metrics.record_reserve_ok(empty=False)
            # The first job takes the slot already held; the others were free
            # when the reserve was sized, so these acquires do not wait.
            self._start(jobs[0], slots, tasks)
            for job in jobs[1:]:
                await slots.acquire()
                self._start(job, slots, tasks)

    async def _dead_letter_undecodable(self, undecodable: list[UndecodableJob]) -> None:
        for job in undecodable:
            try:
                await self._client.nack(job, RetryDirective.DEAD_LETTER, reason=job.reason)
                logger.error(
                    "dead-lettered job %s (attempt %s, queue %r): %s",
                    job.id,
                    job.attempt,
                    job.queue,
                    job.reason,
                )
            except (SeppError, ValueError) as exc:
                logger.error("could not dead-letter undecodable job %s: %s", job.id, exc)

    def _reserve_options(self) -> ReserveOptions:
        free = max(1, self._max_in_flight - self._in_flight)
        wanted = free if self._opts.max_jobs is None else min(self._opts.max_jobs, free)
        return dataclasses.replace(self._opts, max_jobs=wanted)

    async def _unless_shutdown(self, awaitable: Coroutine[Any, Any, _T]) -> tuple[bool, _T | None]:
        """Run `awaitable` unless shutdown comes first: ``(True, result)`` if it
        finished (its exception propagates), ``(False, None)`` if shutdown won
        and it was cancelled. When both finish together the result wins, so
        jobs a reserve just leased are processed, not dropped."""
        work = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self._shutdown.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            stop.cancel()
            await asyncio.gather(work, stop, return_exceptions=True)
            raise
        stop.cancel()
        await asyncio.gather(stop, return_exceptions=True)
        if work.done():
            return True, work.result()
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return False, None

    def _start(self, job: Job, slots: asyncio.Semaphore, tasks: set[asyncio.Task[None]]) -> None:
        self._in_flight += 1
        self._metrics.record_in_flight_delta(1)
        task = asyncio.get_running_loop().create_task(
            self._process(job), name=f"sepp-job-{job.ctx.id}"
        )
        tasks.add(task)

        def finished(done: asyncio.Task[None]) -> None:
            tasks.discard(done)
            slots.release()
            self._in_flight -= 1
            self._metrics.record_in_flight_delta(-1)
            if not done.cancelled() and done.exception() is not None:
                logger.error("job task %s crashed: %r", job.ctx.id, done.exception())

        task.add_done_callback(finished)

    # -- one job ---------------------------------------------------------------------------------

    async def _process(self, job: Job) -> None:
        ctx = job.ctx
        trace = ctx.trace_context
        producer = None if trace is None else (trace.traceparent, trace.tracestate)
        with _otel.consumer_span("sepp.process", producer):
            handler = self._handlers.get(ctx.job_type) or self._catch_all_handler
            if handler is None:
                logger.warning("no handler for job_type %r; nacking job %s", ctx.job_type, ctx.id)
                await self._settle(ctx, HandlerError.retry(NO_HANDLER_REASON))
                return
            if self._auto_extend and ctx._lease is not None:
                try:
                    outcome = await self._run_extending(handler, job, ctx._lease)
                except _LeaseLost:
                    self._metrics.record_lease_lost()
                    logger.info(
                        "lease of job %s (attempt %d) was lost; its handler was cancelled",
                        ctx.id,
                        ctx.attempt,
                    )
                    return
            else:
                outcome = await self._run_handler(handler, job)
            await self._settle(ctx, outcome)

    @staticmethod
    async def _run_handler(handler: Handler, job: Job) -> Exception | None:
        """The handler's failure, or None if it returned."""
        try:
            await handler(job.payload, job.ctx)
        except Exception as exc:  # a handler's failure is data: it decides the nack
            return exc
        return None

    async def _run_extending(self, handler: Handler, job: Job, lease: Lease) -> Exception | None:
        handler_task = asyncio.ensure_future(self._run_handler(handler, job))
        lost = asyncio.Event()
        heartbeat = asyncio.ensure_future(self._heartbeat(lease, handler_task, lost))
        try:
            outcome = await handler_task
        except asyncio.CancelledError:
            if not lost.is_set():
                raise  # cancelled from outside (run() itself was cancelled)
            outcome = None
        finally:
            heartbeat.cancel()
            await asyncio.gather(heartbeat, return_exceptions=True)
        # The heartbeat's verdict decides, even if the handler ignored the
        # cancellation and finished: someone else may own the job now.
        if lost.is_set():
            raise _LeaseLost()
        return outcome

    async def _heartbeat(
        self, lease: Lease, handler_task: asyncio.Future[Any], lost: asyncio.Event
    ) -> None:
        extend_by = self._opts.lease_duration
        while True:
            if self._auto_extend_interval is not None:
                interval = self._auto_extend_interval
            else:
                # A third of what the server actually granted, which may be
                # less than we asked for after clamping.
                remaining = max(0, lease.known_expiry_ms - _convert.now_ms())
                interval = max(timedelta(milliseconds=remaining) / 3, timedelta(milliseconds=1))
            await asyncio.sleep(interval.total_seconds())
            try:
                expiry = await lease.extend(extend_by)
            except LeaseError as exc:
                logger.debug("extend refused (%s): the lease is lost", exc)
            except SeppError as exc:
                if _convert.now_ms() < lease.known_expiry_ms:
                    logger.warning("extend failed (%s); the lease still holds, will retry", exc)
                    continue
                logger.warning("extend failed (%s) and the lease has run out", exc)
            else:
                logger.debug("lease extended to %s", expiry)
                continue
            lost.set()
            handler_task.cancel()
            return

    async def _settle(self, ctx: JobCtx, outcome: Exception | None) -> None:
        """Ack or nack after the handler; fencing errors mean the lease was
        lost meanwhile and are only logged at debug level."""
        try:
            if outcome is None:
                await self._client.ack(ctx)
                self._metrics.record_processed()
                return
            if isinstance(outcome, HandlerError):
                directive, reason = outcome.directive, outcome.reason
                logger.info("job %s failed (%s); nacking", ctx.id, reason)
            else:
                directive = RetryDirective.DEFAULT
                reason = f"handler raised {type(outcome).__name__}: {outcome}"
                logger.warning("job %s: %s; nacking for retry", ctx.id, reason, exc_info=outcome)
            dead_lettered = await self._client.nack(ctx, directive, reason)
            self._metrics.record_nacked(dead_lettered)
        except (JobNotFoundError, AttemptMismatchError) as exc:
            logger.debug("job %s is no longer ours, nothing to report: %s", ctx.id, exc)
        except SeppError as exc:
            logger.warning(
                "could not report job %s (it comes back when its lease expires): %s", ctx.id, exc
            )
