"""The Worker: reserve -> run a handler -> ack or nack, with bounded concurrency,
lease renewal and graceful shutdown.

Owns: `Worker` (the sepp-py API), `HandlerError` (how a handler chooses its
job's retry), `ShutdownHandle`, `DuplicateHandlerError` and `WorkerMetrics`
(hooks called as jobs move; OpenTelemetry counters when it is installed).

A handler is ``async def handler(payload, ctx) -> None`` or a plain
``def handler(payload, ctx) -> None``; a plain function runs in a thread of the
worker's own pool (at most `max_in_flight` threads), so it may block:

* returning acks the job;
* raising ``HandlerError.retry(reason)`` nacks it under the queue's policy,
  ``HandlerError.retry_after(reason, delay)`` nacks it with a delay,
  ``HandlerError.permanent(reason)`` dead-letters it;
* raising anything else nacks it for a default retry.

Promises: at most `max_in_flight` handlers run at once, and a reserve never
asks for more jobs than there are free slots (slots neither running a handler
nor promised to another reserve on the wire); while handlers run, reserves stay
outstanding for the free slots (``max_jobs=1``: one reserve of one job per free
slot), and a finished handler's ack or nack never waits for a reserve, nor a
reserve for an ack; while a handler runs its lease is
renewed (unless `auto_extend=False`), at a third of what the server granted; a
job whose lease was lost (an extend answered not_found / attempt_mismatch, or
the lease ran out while extends failed) is logged as a WARNING with its id, has
its handler cancelled and is never acked or nacked afterwards; a job type
without a handler is backed off, never retried within milliseconds; after
`ShutdownHandle.shutdown` (or SIGINT / SIGTERM with ``run(handle_signals=True)``)
no reserve is sent, the reserves still parked are withdrawn (a job already on
its way is released, not run) and `run` returns once the running handlers have
finished and their jobs are settled.

Must not import: sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
import math
import os
import signal
import socket
import threading
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from sepp.client import _convert, _otel
from sepp.client.client import Lease, RetryDirective, SeppClient, _SentReserve
from sepp.client.errors import (
    AttemptMismatchError,
    ClientClosedError,
    JobNotFoundError,
    LeaseError,
    SeppError,
    UndecodableJobError,
)
from sepp.client.types import (
    RESERVE_ORDERS,
    Job,
    JobCtx,
    Payload,
    QueueListError,
    ReserveOptions,
    UndecodableJob,
)
from sepp.protocol.messages import OP_ACK

__all__ = [
    "DuplicateHandlerError",
    "Handler",
    "HandlerError",
    "ShutdownHandle",
    "Worker",
    "WorkerMetrics",
]

logger = logging.getLogger("sepp.client.worker")

# An ``async def`` handler, or a plain ``def`` one (run in a thread).
Handler = Callable[[Payload | None, JobCtx], Awaitable[None] | None]

_T = TypeVar("_T")

# An empty reserve answered much sooner than its wait (a server that is
# shutting down answers at once) is followed by a short pause, so the loop does
# not spin against the server.
EARLY_EMPTY_THRESHOLD = timedelta(milliseconds=100)
EARLY_EMPTY_BACKOFF = timedelta(milliseconds=250)
EARLY_EMPTY_BACKOFF_S = EARLY_EMPTY_BACKOFF.total_seconds()
# How many reserves a worker without `max_jobs` keeps outstanding: one asks for
# every free slot, and while it is on the wire a second one may ask for the
# slots freed meanwhile. With `max_jobs` set, every free slot may have a reserve
# (up to `max_in_flight` of them, each for at most `max_jobs` jobs), so
# `max_jobs=1` leases one job per reserve without one round trip per job.
RESERVES_IN_FLIGHT_UNSET_MAX_JOBS = 3
# A worker without `max_jobs` asks for at most this share of `max_in_flight` in
# one reserve (a "wave"), and sends the next one the moment a wave's worth of
# slots is free, from the handler that freed the last of them, before the other
# wave's handlers run. Two waves take turns: the server decides and syncs one
# while this process runs the other, instead of the two sides waiting for each
# other in turn.
RESERVE_WAVES = 2
# ... but never more than this many: one connection carries them all, and a
# server answers requests past `server.max_in_flight_per_connection` (1024 by
# default) with resource_exhausted; acks, nacks and extends need room too.
RESERVES_IN_FLIGHT_MAX = 256
NO_HANDLER_REASON = "no handler registered for this job_type"
# A job of a type without a handler (e.g. during a rolling deploy, before every
# worker has the new code) is nacked with this delay, doubled per attempt up to
# NO_HANDLER_DELAY_MAX: spread out over minutes instead of burning its attempts
# within milliseconds. On its last attempt, where a nack would dead-letter it,
# it is held for that long and then released (the attempt is not counted).
NO_HANDLER_DELAY = timedelta(seconds=10)
NO_HANDLER_DELAY_MAX = timedelta(minutes=10)
NO_HANDLER_HOLD_MAX = timedelta(minutes=1)
# How many job ids the no-handler backoff remembers (oldest forgotten first).
NO_HANDLER_JOBS_REMEMBERED_MAX = 4096
# How many job types "no handler" was warned about (a bound against junk types).
NO_HANDLER_TYPES_WARNED_MAX = 1024


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


# No span around a job when OpenTelemetry is not installed (a reusable no-op).
_NO_SPAN: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


class _ReleaseJob(Exception):
    """Internal: the outcome of a job to hand back (release) instead of nacking."""


_RELEASE = _ReleaseJob()


class _AckOutcome:
    """Where the answer of one job's coalesced ack goes (the client's `Outcome`:
    what a future would be told), straight to the worker, with no task waiting."""

    __slots__ = ("_ctx", "_done", "_worker")

    def __init__(self, worker: Worker, ctx: JobCtx) -> None:
        self._worker = worker
        self._ctx = ctx
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, result: dict[str, Any], /) -> None:
        if not self._done:
            self._done = True
            self._worker._ack_answered(self._ctx, None)

    def set_exception(self, error: BaseException, /) -> None:
        if not self._done:
            self._done = True
            self._worker._ack_answered(self._ctx, error)


class _Running:
    """One job from its reserve to the end of its task: whether its handler is
    done (its slot free), and the renewal of its lease."""

    __slots__ = ("ctx", "due", "extending", "handler_done", "lost", "task")

    def __init__(self, ctx: JobCtx) -> None:
        self.ctx = ctx
        self.task: asyncio.Task[None]
        # Loop time the next extend is due; True while one is on the wire.
        self.due = 0.0
        self.extending = False
        self.handler_done = False
        # Why the lease was lost (then the handler was cancelled), or None.
        self.lost: str | None = None


def _default_worker_id() -> str:
    try:
        host = socket.gethostname() or "unknown"
    except OSError:
        host = "unknown"
    return f"{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _type_name(value: object) -> str:
    return type(value).__name__


def _check_timedelta(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, timedelta):
        example = f"e.g. timedelta(seconds={value!r})" if type(value) in (int, float) else ""
        raise TypeError(
            f"{name} must be a datetime.timedelta{' or None' if optional else ''}"
            f"{', ' + example if example else ''}; got {_type_name(value)} {value!r}"
        )


def _check_int(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if type(value) is not int:
        raise TypeError(
            f"{name} must be an int{' or None' if optional else ''}; "
            f"got {_type_name(value)} {value!r}"
        )


def _queue_names(queues: object) -> list[str]:
    """`queues` as a list of names; a lone string is refused (iterating it would
    reserve from one queue per character)."""
    if isinstance(queues, str | bytes):
        raise QueueListError(
            f"queues must be a list of queue names, e.g. [{queues!r}], "
            f"not the {_type_name(queues)} {queues!r}"
        )
    if not isinstance(queues, Iterable):
        raise TypeError(f"queues must be a list of queue names; got {_type_name(queues)}")
    names = list(queues)
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"queues must hold queue names (str); got {_type_name(name)} {name!r}")
    return names


def _is_async_handler(handler: Callable[..., Any]) -> bool:
    """Whether calling `handler` gives a coroutine: ``async def`` functions,
    `functools.partial` of them, and objects with an ``async def __call__``."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - an object's async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _check_handler(handler: object) -> bool:
    """Refuse what cannot be a handler; return whether it is async."""
    if not callable(handler):
        raise TypeError(
            f"a handler must be a function handler(payload, ctx); got {_type_name(handler)}"
        )
    if inspect.isasyncgenfunction(handler) or inspect.isgeneratorfunction(handler):
        raise TypeError(
            "a handler must be a function (async def or def) that returns None, "
            "not a generator function"
        )
    return _is_async_handler(handler)


@dataclass(frozen=True)
class _Registered:
    fn: Handler
    is_async: bool


class Worker:
    """Runs handlers for the jobs of `queues`, on a `SeppClient`.

    `queues` is a list of queue names (``["emails"]``; a lone string is refused
    with `TypeError`), tried in order; `lease_duration` a `timedelta`. Register
    handlers with `handle` / the `handler` decorator (one per job type) and
    optionally `catch_all`; then ``await worker.run()``, which returns after the
    `ShutdownHandle` fires (or SIGINT / SIGTERM, with
    ``run(handle_signals=True)``) and running handlers finish.

    Handlers: ``async def`` handlers run on the event loop; plain ``def``
    handlers run in a thread pool of `max_in_flight` threads owned by the
    worker (so blocking calls are fine there; use `SyncSeppClient` rather than
    ``ctx.extend`` from a thread). A thread cannot be cancelled: after a lost
    lease a plain handler runs to its end and its outcome is ignored.

    Jobs of a type without a handler (and no catch-all), e.g. during a rolling
    deploy, are backed off: nacked with a delay of `no_handler_delay` doubled per
    attempt (capped at 10 minutes), so they wait for a worker that knows them
    instead of burning their attempts within milliseconds. On a job's last
    attempt, where a nack would dead-letter it, the job is held (its lease
    renewed) for that delay, at most a minute, and then released without
    counting the attempt (`SeppClient.release`; a held job takes one of the
    `max_in_flight` slots meanwhile). A WARNING is logged once per
    unknown type.

    `max_in_flight` (default 16) bounds concurrent handlers; a handler's slot
    is free again when it returns (its ack or nack goes out on its own, the
    next reserve does not wait for the answer). The worker keeps reserves
    outstanding for the free slots while handlers run, and never leases more
    jobs than there are free slots (a job waiting for a slot would burn its
    lease). `max_jobs` caps the jobs of one reserve, not the jobs per round
    trip: unset, the slots are reserved in two waves of half of them each (see
    `RESERVE_WAVES`: the server works on one wave while this process runs the
    other); with ``max_jobs=1`` each free slot has
    its own reserve of one job in flight (up to 256), all pipelined on the
    client's connection and parked on the server side by side.

    Lease renewal is on
    by default (`auto_extend=True`, like BullMQ's lock renewal): while a handler
    runs, its lease is renewed by `lease_duration` every third of what the
    server actually granted (it may clamp the lease to its maximum silently), or
    every `auto_extend_interval`. A handler that never returns then keeps its
    job forever, so bound hang-prone work yourself (e.g. `asyncio.timeout`).
    With ``auto_extend=False`` a handler that outlives its lease loses the job
    to another worker. A lost lease is logged as a WARNING with the job id.

    `order`: ``"strict"`` (default) takes jobs from `queues` in the order given;
    ``"fair"`` serves them in weighted round robin (the queues' ``weight``
    settings), so a busy queue cannot starve the others.
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
        auto_extend: bool = True,
        auto_extend_interval: timedelta | None = None,
        worker_id: str | None = None,
        metrics: WorkerMetrics | None = None,
        no_handler_delay: timedelta = NO_HANDLER_DELAY,
        order: str = "strict",
    ) -> None:
        if not isinstance(client, SeppClient):
            raise TypeError(
                "client must be an async SeppClient (await SeppClient.connect(...)); "
                f"got {_type_name(client)}"
            )
        names = _queue_names(queues)
        _check_timedelta("lease_duration", lease_duration)
        _check_timedelta("wait_timeout", wait_timeout, optional=True)
        _check_timedelta("reserve_error_backoff", reserve_error_backoff)
        _check_timedelta("auto_extend_interval", auto_extend_interval, optional=True)
        _check_timedelta("no_handler_delay", no_handler_delay)
        _check_int("max_jobs", max_jobs, optional=True)
        _check_int("max_in_flight", max_in_flight)
        if not isinstance(auto_extend, bool):
            raise TypeError(f"auto_extend must be True or False; got {auto_extend!r}")
        if worker_id is not None and not isinstance(worker_id, str):
            raise TypeError(f"worker_id must be a str or None; got {_type_name(worker_id)}")
        if wait_timeout is not None and wait_timeout <= timedelta(0):
            raise ValueError("wait_timeout must be positive")
        if order not in RESERVE_ORDERS:
            raise ValueError(f'order must be "strict" or "fair"; got {order!r}')
        self._order = order
        options: dict[str, Any] = {
            "worker_id": _default_worker_id() if worker_id is None else worker_id,
            "max_jobs": max_jobs,
        }
        if wait_timeout is not None:
            options["wait_timeout"] = wait_timeout
        self._opts = ReserveOptions(names, lease_duration, **options)
        self._client = client
        self._handlers: dict[str, _Registered] = {}
        self._catch_all_handler: _Registered | None = None
        self._max_in_flight = max(1, max_in_flight)
        self._reserves_max = (
            RESERVES_IN_FLIGHT_UNSET_MAX_JOBS
            if max_jobs is None
            else min(self._max_in_flight, RESERVES_IN_FLIGHT_MAX)
        )
        # The most jobs one reserve asks for.
        self._reserve_cap = (
            -(-self._max_in_flight // RESERVE_WAVES) if max_jobs is None else max_jobs
        )
        self._early_empty_s = min(
            EARLY_EMPTY_THRESHOLD, self._opts.wait_timeout / 2
        ).total_seconds()
        self._reserve_error_backoff = reserve_error_backoff
        self._auto_extend = auto_extend or auto_extend_interval is not None
        self._auto_extend_interval_s = (
            None
            if auto_extend_interval is None
            else max(auto_extend_interval, timedelta(milliseconds=1)).total_seconds()
        )
        self._no_handler_delay = max(no_handler_delay, timedelta(0))
        self._no_handler_warned: set[str] = set()
        # job id -> how often it came back without a handler (for the hold).
        self._no_handler_seen: OrderedDict[str, int] = OrderedDict()
        self._shutdown = ShutdownHandle()
        self._metrics = metrics if metrics is not None else WorkerMetrics()
        # Handlers running now, and slots promised to reserves on the wire.
        self._in_flight = 0
        self._asked = 0
        self._executor: ThreadPoolExecutor | None = None
        # The task of each job (until its ack or nack is answered).
        self._tasks: dict[asyncio.Task[None], _Running] = {}
        # Each outstanding reserve's task, with the jobs it asked for.
        # Reserve tasks: the slots each asked for, and its request when it was
        # sent before the task's first step (`_launch`).
        self._reserving: dict[asyncio.Task[None], tuple[int, _SentReserve | None]] = {}
        # True while the reserve loop runs: handlers may launch reserves.
        self._launching = False
        # The ReserveOptions of each size asked so far (at most max_in_flight).
        self._options: dict[int, ReserveOptions] = {}
        # Dead-lettering undecodable jobs, releasing surplus ones; extends.
        self._background: set[asyncio.Task[Any]] = set()
        self._extending: set[asyncio.Task[None]] = set()
        # The jobs whose leases are renewed, and the one timer that does it.
        self._kept: set[_Running] = set()
        self._keeper: asyncio.TimerHandle | None = None
        self._keeper_due = 0.0
        self._loop: asyncio.AbstractEventLoop
        # Set whenever a slot frees, a reserve ends or shutdown comes.
        self._wake = asyncio.Event()
        self._stop_error: ClientClosedError | None = None
        # Loop time before which no reserve is sent (after a failure).
        self._paused_until = 0.0
        # Acks sent without waiting whose answers are still due, and what
        # `_drain` waits on for them.
        self._acks_due = 0
        self._acks_waiter: asyncio.Future[None] | None = None
        self._signals_received = 0

    # -- configuration -------------------------------------------------------------------------

    @property
    def worker_id(self) -> str:
        """The id sent with every reserve, ack, nack and extend."""
        return self._opts.worker_id or ""

    @property
    def in_flight(self) -> int:
        """How many handlers are running now."""
        return self._in_flight

    @staticmethod
    def _registered(job_type: object, handler: Handler) -> _Registered:
        if not isinstance(job_type, str) or not job_type:
            raise TypeError(f"job_type must be a non-empty str; got {job_type!r}")
        return _Registered(handler, _check_handler(handler))

    def handle(self, job_type: str, handler: Handler) -> Worker:
        """Register `handler` (``async def`` or plain ``def``) for `job_type`;
        `DuplicateHandlerError` if one is registered already, `TypeError` if it
        is not a function of ``(payload, ctx)``. Returns the worker, for
        chaining."""
        registered = self._registered(job_type, handler)
        if job_type in self._handlers:
            raise DuplicateHandlerError(job_type)
        self._handlers[job_type] = registered
        return self

    def replace_handler(self, job_type: str, handler: Handler) -> Worker:
        """Register `handler` for `job_type`, replacing any earlier one."""
        self._handlers[job_type] = self._registered(job_type, handler)
        return self

    def remove_handler(self, job_type: str) -> Worker:
        """Forget the handler of `job_type`, if there is one."""
        self._handlers.pop(job_type, None)
        return self

    def catch_all(self, handler: Handler) -> Handler:
        """Register the handler for job types without their own (replacing an
        earlier catch-all). Returns `handler`, so it works as a decorator."""
        self._catch_all_handler = _Registered(handler, _check_handler(handler))
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

    def stop(self) -> None:
        """Stop gracefully: the same as ``shutdown_handle().shutdown()``."""
        self._shutdown.shutdown()

    # -- the loop ----------------------------------------------------------------------------

    async def run(self, *, handle_signals: bool = False) -> None:
        """Reserve and process jobs until shutdown, then wait for running
        handlers and return.

        With `handle_signals`, SIGINT (Ctrl-C) and SIGTERM stop the worker
        gracefully while `run` runs: the first one stops reserving and lets
        running handlers finish, a second one cancels them (their jobs are
        released, or come back when their leases expire) so `run` returns at
        once; either way without a traceback. The previous handlers are put
        back when `run` returns. Needs the main thread's event loop.

        On shutdown the reserves still waiting are withdrawn (a job already on
        its way to one is released, its attempt not counted), so nothing more is
        leased to a stopping worker; running handlers finish and their jobs are
        acked or nacked before `run` returns.

        Reserve failures are logged and retried after `reserve_error_backoff`;
        they never end the loop, except `ClientClosedError` (the client was
        closed), which `run` raises once running handlers are done. The final
        wait has no time limit. Cancelling `run` instead of using the
        `ShutdownHandle` cancels the running handlers too (their jobs are
        released, or come back when their leases expire).
        """
        loop = asyncio.get_running_loop()
        self._shutdown._bind(loop)
        self._signals_received = 0
        restore = self._install_signal_handlers(loop) if handle_signals else []
        self._loop = loop
        self._wake = asyncio.Event()
        self._stop_error = None
        self._paused_until = 0.0
        watcher = loop.create_task(self._wake_on_shutdown())
        logger.info(
            "worker %s started (max_in_flight=%d, max_jobs=%s, auto_extend=%s)",
            self.worker_id,
            self._max_in_flight,
            self._opts.max_jobs,
            self._auto_extend,
        )
        try:
            try:
                await self._reserve_loop()
            except asyncio.CancelledError:
                tasks = [*self._reserving, *self._tasks, *self._background, *self._extending]
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                self._forget_unstarted()
                raise
            finally:
                watcher.cancel()
            # Withdraw the reserves still waiting: a job the server had already
            # put in one of their answers is released by the client, not run.
            reserving = list(self._reserving)
            for task in reserving:
                task.cancel()
            await asyncio.gather(*reserving, return_exceptions=True)
            self._forget_unstarted()
            if self._stop_error is not None:
                # Nothing can succeed on a closed client: stop instead of looping.
                logger.error("worker %s: the client was closed; stopping", self.worker_id)
                await self._drain()
                raise self._stop_error
            logger.info(
                "worker %s stopping; waiting for %d running jobs", self.worker_id, len(self._tasks)
            )
            await self._drain()
            logger.info("worker %s stopped", self.worker_id)
        finally:
            if self._keeper is not None:
                self._keeper.cancel()
                self._keeper = None
            for task in list(self._extending):
                task.cancel()
            for sig, previous in restore:
                loop.remove_signal_handler(sig)
                signal.signal(sig, previous)
            executor, self._executor = self._executor, None
            if executor is not None:
                # Threads of handlers cancelled by a lost lease may still run:
                # they finish on their own, nothing waits for them.
                executor.shutdown(wait=False)

    async def _drain(self) -> None:
        """Wait for the running jobs (handlers, then their acks and nacks), for
        the dead-lettering of undecodable jobs and for the answers of acks sent
        without waiting."""
        while True:
            if self._tasks or self._background:
                await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
                self._forget_unstarted()
            elif self._acks_due:
                self._acks_waiter = self._loop.create_future()
                try:
                    await self._acks_waiter
                finally:
                    self._acks_waiter = None
            else:
                return

    async def _wake_on_shutdown(self) -> None:
        await self._shutdown.wait()
        self._wake.set()

    def _install_signal_handlers(
        self, loop: asyncio.AbstractEventLoop
    ) -> list[tuple[signal.Signals, Any]]:
        installed: list[tuple[signal.Signals, Any]] = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError) as exc:
                for done, before in installed:
                    loop.remove_signal_handler(done)
                    signal.signal(done, before)
                raise RuntimeError(
                    "run(handle_signals=True) needs an event loop in the main thread "
                    f"that supports signal handlers: {exc}"
                ) from exc
            installed.append((sig, previous if previous is not None else signal.SIG_DFL))
        return installed

    def _on_signal(self, sig: signal.Signals) -> None:
        self._signals_received += 1
        if self._signals_received == 1:
            logger.warning(
                "worker %s: %s received: taking no new jobs, finishing %d running "
                "(send it again to cancel them)",
                self.worker_id,
                sig.name,
                len(self._tasks),
            )
            self._shutdown.shutdown()
            return
        logger.warning(
            "worker %s: %s received again: cancelling %d running handlers",
            self.worker_id,
            sig.name,
            len(self._tasks),
        )
        self._shutdown.shutdown()
        for task in list(self._tasks):
            task.cancel()

    async def _reserve_loop(self) -> None:
        """Keep reserves outstanding for the free slots until shutdown.

        A slot is free when it is neither running a handler nor promised to a
        reserve still on the wire (`_asked`), so the jobs leased never outnumber
        the slots that can start them at once: a leased job waiting for a slot
        would burn its lease. Up to `_reserves_max` reserves are outstanding at
        a time, each for ``min(free slots, cap)`` jobs (`_reserve_cap`: `max_jobs`,
        or unset a wave, half of the slots), so with ``max_jobs=1`` a worker
        keeps one reserve per free slot in flight (the connection pipelines
        them; the server parks each) instead of one round trip per job, and a
        handler that finishes never waits for a reserve to be sent. In waves,
        the reserve for a wave's freed slots is sent by `_handler_done` itself;
        this loop tops up what is left (slots short of a wave only while no
        reserve is out). Nothing here waits for an ack: each job's task sends
        its own.
        """
        loop = self._loop
        wake = self._wake
        shutdown = self._shutdown
        cap = self._reserve_cap
        waves = self._opts.max_jobs is None
        self._launching = True
        try:
            await self._reserve_loop_body(loop, wake, shutdown, cap, waves)
        finally:
            self._launching = False

    async def _reserve_loop_body(
        self,
        loop: asyncio.AbstractEventLoop,
        wake: asyncio.Event,
        shutdown: ShutdownHandle,
        cap: int,
        waves: bool,
    ) -> None:
        while not shutdown.is_shutdown and self._stop_error is None:
            pause = self._paused_until - loop.time()
            if pause > 0:
                # After a failed or early-empty reserve: no new reserve for a
                # while (only shutdown, or the pause ending, resumes the loop).
                wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(pause):
                        await wake.wait()
                continue
            free = self._max_in_flight - self._in_flight - self._asked
            if (
                free <= 0
                or len(self._reserving) >= self._reserves_max
                or (waves and free < cap and self._reserving)
            ):
                # In waves, slots short of a wave wait for more to free up while
                # a reserve is out (one reserve per freed slot would follow).
                wake.clear()
                await wake.wait()
                continue
            self._launch(free if cap > free else cap)

    def _launch(self, wanted: int) -> None:
        """Start a reserve for `wanted` jobs: sent now when the client can, else
        at its task's first step. In waves it is on the wire before this loop
        turn's other callbacks run; with `max_jobs` it leaves in one write with
        the turn's other reserves, as soon as those callbacks have started."""
        opts = self._options.get(wanted)
        if opts is None:
            opts = self._options[wanted] = dataclasses.replace(self._opts, max_jobs=wanted)
        if self._opts.max_jobs is not None:
            # A turn that frees several slots launches several reserves (one
            # per slot with max_jobs=1): one write for all of them, one wake-up
            # of the server. In waves one reserve covers the freed slots.
            self._client._cork_for_turn()
        sent = self._client._reserve_now(opts, self._order)
        self._asked += wanted
        task = self._loop.create_task(self._reserve(opts, sent))
        self._reserving[task] = (wanted, sent)

    def _pause_reserving(self, seconds: float) -> None:
        self._paused_until = max(self._paused_until, self._loop.time() + seconds)
        self._wake.set()

    async def _reserve(self, opts: ReserveOptions, sent: _SentReserve | None) -> None:
        """One reserve: start a handler for each job it leased. The first job
        runs in this very task (one task per reserve answer less; with
        ``max_jobs=1`` one task per job instead of two), which from then on is
        that job's task, no longer a reserve."""
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - always run as a task
            return
        try:
            first = await self._reserved(opts, task, sent)
        except Exception as exc:
            # A bug on this side: log it with its traceback, keep the loop.
            logger.error("reserve task crashed: %r", exc, exc_info=exc)
            return
        finally:
            self._reserve_ended(task)
        if first is not None:
            await self._process(*first)

    async def _reserved(
        self, opts: ReserveOptions, task: asyncio.Task[None], sent: _SentReserve | None
    ) -> tuple[Job, _Running] | None:
        """Send the reserve and start its jobs; the first is adopted by `task`
        and returned, for the caller to run."""
        started = self._loop.time()
        try:
            if sent is None:
                jobs = await self._client.reserve(opts, order=self._order)
            else:
                jobs = await self._client._reserve_answer(sent)
        except ClientClosedError as exc:
            self._stop_error = exc
            return None
        except UndecodableJobError as exc:
            # Jobs this client cannot decode are leased to us: dead-letter
            # them with the reason now (never skip them, never let them burn
            # their attempts on lease expiry); run the others as usual.
            self._in_background(self._dead_letter_undecodable(exc.undecodable))
            jobs = exc.jobs or None
            if jobs is None:
                return None
        except SeppError as exc:
            self._metrics.record_reserve_failed()
            # Reserves in flight together fail together (a dropped connection):
            # one warning for them, not one each.
            paused = self._paused_until > self._loop.time()
            (logger.debug if paused else logger.warning)(
                "reserve failed: %s; retrying in %s", exc, self._reserve_error_backoff
            )
            self._pause_reserving(self._reserve_error_backoff.total_seconds())
            return None
        if not jobs:
            self._metrics.record_reserve_ok(True)
            # An empty answer much sooner than its wait (a server that is
            # shutting down answers at once): pause, so as not to spin.
            if self._loop.time() - started < self._early_empty_s:
                self._pause_reserving(EARLY_EMPTY_BACKOFF_S)
            return None
        self._metrics.record_reserve_ok(False)
        # The jobs of one answer were leased at the same moment for the same
        # duration: one first renewal time serves them all.
        extend_due = 0.0
        lease = jobs[0].ctx._lease
        if self._auto_extend and lease is not None:
            extend_due = self._loop.time() + self._extend_delay_s(lease)
        wanted = opts.max_jobs or 0
        for job in jobs[wanted:]:
            # A server that sent more than asked: no slot for these.
            logger.warning("the server leased more jobs than asked for; releasing %s", job.ctx.id)
            self._in_background(self._release(job.ctx))
        for job in jobs[1:wanted]:
            self._start(job, extend_due)
        running = _Running(jobs[0].ctx)
        self._adopt(running, task, extend_due)
        # The answer is in: its slots moved from promised to running in this one
        # step, so the loop never sees them counted twice or not at all. Woken
        # after the job tasks were scheduled, the loop runs after their first
        # steps: quick handlers are done by then, and it asks for all of their
        # slots in one reserve instead of one at a time.
        self._reserve_ended(task)
        return jobs[0], running

    def _reserve_ended(self, task: asyncio.Task[None]) -> None:
        """The reserve of `task` was answered (or failed, or was cancelled): the
        slots it promised are free again. Idempotent."""
        entry = self._reserving.pop(task, None)
        if entry is not None:
            self._asked -= entry[0]
            self._wake.set()

    def _in_background(self, work: Coroutine[Any, Any, Any]) -> None:
        task = self._loop.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _dead_letter_undecodable(self, undecodable: list[UndecodableJob]) -> None:
        for job in undecodable:
            try:
                await self._client.nack(job, RetryDirective.DEAD_LETTER, reason=job.reason)
                # The raw job goes into the log line too: with the default
                # dead-letter retention of 0 the server drops the record, and
                # this line is then the job's only remaining copy.
                logger.error(
                    "dead-lettered job %s (attempt %s, queue %r): %s; raw job: %r",
                    job.id,
                    job.attempt,
                    job.queue,
                    job.reason,
                    job.raw,
                )
            except (SeppError, ValueError) as exc:
                logger.error(
                    "could not dead-letter undecodable job %s: %s; raw job: %r",
                    job.id,
                    exc,
                    job.raw,
                )

    async def _unless_shutdown(self, awaitable: Coroutine[Any, Any, _T]) -> tuple[bool, _T | None]:
        """Run `awaitable` unless shutdown comes first: ``(True, result)`` if it
        finished (its exception propagates), ``(False, None)`` if shutdown won
        and it was cancelled."""
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

    def _start(self, job: Job, extend_due: float) -> None:
        """Run `job` in a task of its own."""
        running = _Running(job.ctx)
        self._adopt(running, self._loop.create_task(self._process(job, running)), extend_due)

    def _adopt(self, running: _Running, task: asyncio.Task[None], extend_due: float) -> None:
        """Count `running` as running in `task`; renew its lease from
        `extend_due` (loop time; 0 for never)."""
        running.task = task
        self._in_flight += 1
        self._metrics.record_in_flight_delta(1)
        self._tasks[task] = running
        if extend_due and running.ctx._lease is not None:
            self._keep_at(running, extend_due)

    def _handler_done(self, running: _Running) -> None:
        """The job's handler finished (or never ran): its slot is free, before
        its ack or nack is answered."""
        if running.handler_done:
            return
        running.handler_done = True
        self._kept.discard(running)
        self._in_flight -= 1
        self._metrics.record_in_flight_delta(-1)
        cap = self._reserve_cap
        if (
            self._launching
            and self._max_in_flight - self._in_flight - self._asked >= cap
            and len(self._reserving) < self._reserves_max
            and not self._shutdown.is_shutdown
            and self._stop_error is None
            and self._paused_until <= self._loop.time()
        ):
            # A wave's worth of slots is free: its reserve leaves now, before
            # the handlers already scheduled run (see RESERVE_WAVES).
            self._launch(cap)
        self._wake.set()

    def _forget_unstarted(self) -> None:
        """A task cancelled before its first step never ran its `finally`."""
        for task in [task for task in self._tasks if task.done()]:
            self._handler_done(self._tasks.pop(task))
        for task in [task for task in self._reserving if task.done()]:
            sent = self._reserving[task][1]
            if sent is not None:
                # Sent, but its task never ran: withdraw it (a job already on
                # its way is released, not left to its lease).
                sent.connection.abandon(sent.request_id, sent.future, sent.release)
            self._reserve_ended(task)

    # -- one job ---------------------------------------------------------------------------------

    async def _process(self, job: Job, running: _Running) -> None:
        ctx = job.ctx
        try:
            span: contextlib.AbstractContextManager[None] = _NO_SPAN
            if _otel.api() is not None:
                trace = ctx.trace_context
                producer = None if trace is None else (trace.traceparent, trace.tracestate)
                span = _otel.consumer_span("sepp.process", producer)
            with span:
                registered = self._handlers.get(ctx.job_type) or self._catch_all_handler
                outcome: Exception | None
                try:
                    if registered is None:
                        outcome = await self._no_handler(ctx)
                    elif registered.is_async:
                        # Awaited here, not in a helper coroutine: one coroutine less per job.
                        outcome = None
                        try:
                            await registered.fn(job.payload, ctx)  # type: ignore[misc]
                        except Exception as exc:  # a handler's failure is data
                            outcome = exc
                    else:
                        outcome = await self._run_in_thread_outcome(registered.fn, job)
                except asyncio.CancelledError:
                    if running.lost is None:
                        # run() was cancelled, or a second signal stopped it:
                        # the job did not finish here, so hand it back rather
                        # than leave it to its lease.
                        self._handler_done(running)
                        await self._release_unfinished(ctx)
                        raise
                    # The lease keeper cancelled the handler: the lease is gone.
                    running.task.uncancel()
                    outcome = None
                self._handler_done(running)
                # The keeper's verdict decides, even if the handler ignored the
                # cancellation and finished: someone else may own the job now.
                if running.lost is not None:
                    self._metrics.record_lease_lost()
                    logger.warning(
                        "job %s (type %s, attempt %d): lease lost (%s); its handler was "
                        "cancelled and the job will not be acked or nacked by this worker",
                        ctx.id,
                        ctx.job_type,
                        ctx.attempt,
                        running.lost,
                    )
                    return
                if outcome is _RELEASE:
                    await self._release(ctx)
                    return
                if outcome is None and self._ack_without_waiting(ctx):
                    return
                await self._settle(ctx, outcome)
        except Exception as exc:
            # A bug on this side (a handler's own failure is data, settled
            # above): log it with its traceback, as a done callback would.
            logger.error("job task %s crashed: %r", ctx.id, exc, exc_info=exc)
        finally:
            # Here rather than in a done callback: one loop callback less per job.
            self._tasks.pop(running.task, None)
            self._handler_done(running)

    async def _run_in_thread_outcome(self, fn: Handler, job: Job) -> Exception | None:
        """A plain ``def`` handler's failure, or None if it returned (an async
        handler runs inline in `_process`)."""
        try:
            await self._run_in_thread(fn, job)
        except Exception as exc:  # a handler's failure is data: it decides the nack
            return exc
        return None

    async def _run_in_thread(self, fn: Handler, job: Job) -> None:
        """Run a plain ``def`` handler in the worker's thread pool (one thread per
        slot: at most `max_in_flight`), with the caller's context variables."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=self._max_in_flight, thread_name_prefix="sepp-worker"
            )
        call = functools.partial(contextvars.copy_context().run, fn, job.payload, job.ctx)
        result = await asyncio.get_running_loop().run_in_executor(self._executor, call)
        if inspect.isawaitable(result):
            # A plain function that returned a coroutine (a lambda around an
            # async function): await it here, on the loop.
            await result

    # -- leases ------------------------------------------------------------------------------------
    #
    # One timer for every running job instead of a heartbeat task (and its
    # sleep) per job: `_kept` holds the jobs whose leases are renewed, each with
    # the loop time its next extend is due; the timer fires at the earliest one,
    # sends the extends that are due (each in its own task, so concurrent ones
    # can share a frame) and sets itself for the next. A job leaves `_kept` when
    # its handler finishes; a timer that finds no job due just re-arms, so a
    # job costs one set insertion and removal, not a timer.

    def _extend_delay_s(self, lease: Lease) -> float:
        if self._auto_extend_interval_s is not None:
            return self._auto_extend_interval_s
        # A third of what the server actually granted, which may be less than
        # we asked for (it clamps to its maximum without a word). Nothing left
        # means this client's clock runs ahead of the server's: then a third of
        # what we asked for (at most a second), not a tight loop of extends.
        remaining_ms = lease.known_expiry_ms - _convert.now_ms()
        if remaining_ms <= 0:
            return min(self._opts.lease_duration.total_seconds() / 3, 1.0)
        return max(remaining_ms / 3000, 0.001)

    def _keep_at(self, running: _Running, due: float) -> None:
        """Renew `running`'s lease from `due` (loop time) until its handler
        finishes."""
        running.due = due
        self._kept.add(running)
        if self._keeper is None or due < self._keeper_due:
            self._arm_keeper(due)

    def _arm_keeper(self, due: float) -> None:
        if self._keeper is not None:
            self._keeper.cancel()
        self._keeper_due = due
        self._keeper = self._loop.call_at(due, self._keeper_fired)

    def _keeper_fired(self) -> None:
        self._keeper = None
        now = self._loop.time()
        nearest = math.inf
        for running in self._kept:
            if running.extending:
                continue
            if running.due <= now:
                running.extending = True
                task = self._loop.create_task(self._extend(running))
                self._extending.add(task)
                task.add_done_callback(self._extending.discard)
            elif running.due < nearest:
                nearest = running.due
        if nearest != math.inf:
            self._arm_keeper(nearest)

    async def _extend(self, running: _Running) -> None:
        lease = running.ctx._lease
        if lease is None:
            return
        try:
            expiry = await lease.extend(self._opts.lease_duration)
        except LeaseError as exc:
            lost = f"extend refused: {exc}"
        except SeppError as exc:
            if _convert.now_ms() < lease.known_expiry_ms:
                logger.warning("extend failed (%s); the lease still holds, will retry", exc)
                self._keep_again(running)
                return
            lost = f"extend failed ({exc}) and the lease has run out"
        else:
            logger.debug("lease extended to %s", expiry)
            self._keep_again(running)
            return
        running.extending = False
        if running.handler_done:
            # Finished meanwhile: its ack or nack meets the fencing error.
            return
        running.lost = lost
        running.task.cancel()

    def _keep_again(self, running: _Running) -> None:
        running.extending = False
        lease = running.ctx._lease
        if not running.handler_done and lease is not None:
            self._keep_at(running, self._loop.time() + self._extend_delay_s(lease))

    # -- jobs nobody here can run ------------------------------------------------------------------

    def _no_handler_backoff(self, ctx: JobCtx) -> timedelta:
        doublings: int = min(max(ctx.attempt - 1, 0), 20)
        return min(self._no_handler_delay * (1 << doublings), NO_HANDLER_DELAY_MAX)

    def _warn_no_handler_once(self, ctx: JobCtx) -> None:
        if ctx.job_type in self._no_handler_warned:
            return
        if len(self._no_handler_warned) < NO_HANDLER_TYPES_WARNED_MAX:
            self._no_handler_warned.add(ctx.job_type)
        logger.warning(
            "worker %s has no handler for job_type %r (job %s, queue %s): such jobs are "
            "retried after %s, doubling per attempt, for a worker that handles them "
            "(logged once per type)",
            self.worker_id,
            ctx.job_type,
            ctx.id,
            ctx.queue,
            self._no_handler_backoff(ctx),
        )

    async def _no_handler(self, ctx: JobCtx) -> Exception:
        """Back off a job of a type without a handler: never burn its attempts
        in a burst, and on its last attempt do not dead-letter it when it can
        be released instead. Returns the nack to send, or `_RELEASE`."""
        self._warn_no_handler_once(ctx)
        if ctx.attempt < ctx.max_attempts:
            delay = self._no_handler_backoff(ctx)
            logger.info(
                "job %s: no handler for job_type %r; retrying in %s", ctx.id, ctx.job_type, delay
            )
            return HandlerError.retry_after(NO_HANDLER_REASON, delay)
        # The last attempt: a nack would dead-letter the job. Hold it for a
        # while (its lease renewed like a handler's), then release it without
        # using the attempt.
        seen = self._no_handler_seen.pop(ctx.id, 0)
        self._no_handler_seen[ctx.id] = seen + 1
        while len(self._no_handler_seen) > NO_HANDLER_JOBS_REMEMBERED_MAX:
            self._no_handler_seen.popitem(last=False)
        hold = min(self._no_handler_delay * (1 << min(seen, 20)), NO_HANDLER_HOLD_MAX)
        logger.info(
            "job %s: no handler for job_type %r on its last attempt; holding it %s, "
            "then releasing it",
            ctx.id,
            ctx.job_type,
            hold,
        )
        await self._unless_shutdown(asyncio.sleep(hold.total_seconds()))
        return _RELEASE

    async def _release(self, ctx: JobCtx) -> bool:
        """Hand the job back without counting its attempt; True if it was
        released."""
        try:
            await self._client.release(ctx)
        except SeppError as exc:
            logger.warning(
                "could not release job %s (it comes back when its lease expires): %s", ctx.id, exc
            )
            return False
        logger.info("released job %s (attempt %d not counted)", ctx.id, ctx.attempt)
        return True

    async def _release_unfinished(self, ctx: JobCtx) -> None:
        if not await self._release(ctx):
            logger.info(
                "job %s was cancelled before it finished; it comes back when its lease expires",
                ctx.id,
            )

    def _ack_without_waiting(self, ctx: JobCtx) -> bool:
        """Join the ack of `ctx` to this moment's coalesced settle without a
        coroutine or a future: its answer reaches `_AckOutcome`, and the job's
        task ends now (`_drain` waits for the answers still due). False if the
        client cannot take it that way (no settle on this server, a congested
        connection, OpenTelemetry spans on): then the ack is awaited as usual."""
        outcome = _AckOutcome(self, ctx)
        if not self._client._settle_nowait(OP_ACK, SeppClient._lease_body(ctx), outcome):
            return False
        self._acks_due += 1
        return True

    def _ack_answered(self, ctx: JobCtx, error: BaseException | None) -> None:
        self._acks_due -= 1
        waiter = self._acks_waiter
        if self._acks_due == 0 and waiter is not None and not waiter.done():
            waiter.set_result(None)
        if error is None:
            self._metrics.record_processed()
        elif isinstance(error, SeppError):
            self._report_failed(ctx, "ack", error)
        else:
            logger.error("the ack of job %s failed: %r", ctx.id, error, exc_info=error)

    def _report_failed(self, ctx: JobCtx, action: str, exc: SeppError) -> None:
        """An ack or nack refused or failed. A fencing error means the lease was
        lost meanwhile (another worker may run the job): a WARNING, not raised."""
        if isinstance(exc, JobNotFoundError | AttemptMismatchError):
            self._metrics.record_lease_lost()
            logger.warning(
                "job %s (type %s, attempt %d): lease lost before its %s (%s): the job is "
                "no longer ours and another worker may run it again; keep auto_extend on "
                "or lease for longer",
                ctx.id,
                ctx.job_type,
                ctx.attempt,
                action,
                exc,
            )
            return
        logger.warning(
            "could not report job %s (it comes back when its lease expires): %s", ctx.id, exc
        )

    async def _settle(self, ctx: JobCtx, outcome: Exception | None) -> None:
        """Ack or nack after the handler; failures are logged (`_report_failed`),
        not raised."""
        action = "ack" if outcome is None else "nack"
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
        except SeppError as exc:
            self._report_failed(ctx, action, exc)
