"""A blocking client for scripts, web apps and other threaded code.

Owns: `SyncSeppClient`, which runs a `SeppClient` on a private event loop in a
background thread and offers the same methods as plain blocking calls. Any
number of threads may call one instance at once: each call is handed to the
loop thread, where the calls share the one pipelined connection.

sepp-py has no blocking client; this one mirrors the async API method for method
(`connect`, `enqueue`, `enqueue_batch`, `enqueue_atomic`, `reserve`, `ack`,
`nack`, `extend`, `get_server_info`, `drain_dead_letters`, plus `release`,
`queue_stats` and `health`). Jobs it returns are ordinary `Job`s; renew a lease with
``client.extend(ctx, by)`` (``ctx.extend`` is a coroutine of the private loop).

The hot calls (`enqueue`, `ack`, `nack`, `extend`) take a lighter road: the
calling thread hands the loop a plain callback (no task, no coroutine, and one
wake-up of the loop for all the calls threads hand over before it runs) that
joins the call to the client's coalesced batch (`SeppClient` docstring), and
waits on a lock for its own result; calls from several threads at once go to the
server as one request. The other calls, and these when they cannot be
coalesced, run as coroutines on the loop.

Must not import: sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import _thread
import asyncio
import collections
import ssl
import threading
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sepp.client import _convert
from sepp.client._retry import RetryPolicy
from sepp.client.client import (
    CLIENT_NAME,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RPC_TIMEOUT,
    RetryDirective,
    SeppClient,
)
from sepp.client.errors import ClientClosedError, JobRejection, SeppError
from sepp.client.types import (
    AdminOutcomes,
    DeadLetterRecord,
    DeleteQueueResult,
    EnqueueAck,
    EnqueueRequest,
    HealthStatus,
    Job,
    JobCtx,
    JobInfo,
    JobPage,
    PurgeResult,
    PutQueueResult,
    QueueChange,
    QueueInfo,
    QueueStats,
    ReserveOptions,
    ScheduleChange,
    ScheduleInfo,
    ServerInfo,
    UndecodableJob,
)
from sepp.protocol.messages import OP_ACK, OP_EXTEND, OP_NACK

__all__ = ["SyncSeppClient"]

_T = TypeVar("_T")

# A loop-side starter of a hot call: given the arguments and the `_Waiter` to
# settle, returns False when the call must take the coroutine road instead.
_Start = Callable[..., bool]


class _Waiter:
    """One calling thread's wait for a hot call started on the loop: a lock the
    loop releases once `outcome` is set (``(True, result)`` or ``(False,
    error)``; left ``None`` when the call could not be started this way). It is
    the call's `Outcome` itself, so the answer reaches the thread without a
    loop turn."""

    __slots__ = ("lock", "outcome")

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()
        self.lock.acquire()
        self.outcome: tuple[bool, Any] | None = None

    def done(self) -> bool:
        return self.outcome is not None

    def set_result(self, result: dict[str, Any], /) -> None:
        if self.outcome is None:
            self.outcome = (True, result)
            self.lock.release()

    def set_exception(self, error: BaseException, /) -> None:
        if self.outcome is None:
            self.outcome = (False, error)
            self.lock.release()

    def declined(self) -> None:
        self.lock.release()


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self, after_posted: Callable[[], None] | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        # Called once the hot calls handed over at one wake-up are all started.
        self.after_posted = after_posted
        # Hot calls handed over by calling threads, started by `_start_posted`
        # on the loop; `_posted_wake` is set while a wake-up is on its way.
        self._posted: collections.deque[tuple[_Start, tuple[Any, ...], _Waiter]] = (
            collections.deque()
        )
        self._posted_wake = False
        self._thread = threading.Thread(target=self._run, name="sepp-sync-client", daemon=True)
        self._thread.start()

    def start(self, start: _Start, *args: Any) -> tuple[bool, Any] | None:
        """Run `start(*args)` on the loop and wait for the future it returns:
        ``(True, result)`` or ``(False, error)``; None if `start` declined."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a SyncSeppClient cannot be called from its own loop thread")
        if self.loop.is_closed():
            raise ClientClosedError()
        waiter = _Waiter()
        self._posted.append((start, args, waiter))
        if not self._posted_wake:
            self._posted_wake = True
            self.loop.call_soon_threadsafe(self._start_posted)
        try:
            waiter.lock.acquire()
        except BaseException:
            # Interrupted (e.g. KeyboardInterrupt): do not leave the call waiting.
            self.loop.call_soon_threadsafe(waiter.set_exception, ClientClosedError())
            raise
        return waiter.outcome

    def _start_posted(self) -> None:
        self._posted_wake = False
        posted = self._posted
        while posted:
            start, args, waiter = posted.popleft()
            try:
                started = start(*args, waiter)
            except BaseException as exc:  # a bad argument: the caller's error
                waiter.set_exception(exc)
                continue
            if not started:
                waiter.declined()
        if self.after_posted is not None:
            self.after_posted()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("a SyncSeppClient cannot be called from its own loop thread")
        future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted (e.g. KeyboardInterrupt): do not leave the call running.
            future.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        # Release any thread still waiting on a hot call the loop never started.
        while self._posted:
            _, _, waiter = self._posted.popleft()
            waiter.set_exception(ClientClosedError())
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join()
        self.loop.close()


class SyncSeppClient:
    """A thread-safe blocking handle to a sepp server.

    ``SyncSeppClient.connect(address, ...)`` takes the arguments of
    `SeppClient.connect`; the constructor takes the same and connects on the
    first call. Close it with `close` or use it as a context manager.
    """

    def __init__(
        self,
        addr: str | Sequence[str],
        *,
        api_key: str | None = None,
        retry_policy: RetryPolicy | None = None,
        tls: bool | ssl.SSLContext = False,
        tls_ca_cert: bytes | None = None,
        tls_domain: str | None = None,
        credentials: ssl.SSLContext | None = None,
        connect_timeout: timedelta = DEFAULT_CONNECT_TIMEOUT,
        rpc_timeout: timedelta = DEFAULT_RPC_TIMEOUT,
        max_receive_message_bytes: int | None = None,
        client_name: str = CLIENT_NAME,
        follow_leader: bool = True,
    ) -> None:
        kwargs: dict[str, Any] = {
            "api_key": api_key,
            "retry_policy": retry_policy,
            "tls": tls,
            "tls_ca_cert": tls_ca_cert,
            "tls_domain": tls_domain,
            "credentials": credentials,
            "connect_timeout": connect_timeout,
            "rpc_timeout": rpc_timeout,
            "max_receive_message_bytes": max_receive_message_bytes,
            "client_name": client_name,
            "follow_leader": follow_leader,
        }
        self._runner = _LoopThread()
        self._closed = False
        self._close_lock = threading.Lock()

        async def build() -> SeppClient:
            # The async client must be made on its loop (its lock binds there).
            return SeppClient(addr, **kwargs)

        try:
            self._client = self._runner.submit(build())
        except BaseException:
            self._runner.stop()
            raise
        # Every call handed over at one wake-up of the loop is in: send them now
        # rather than a loop turn later (nothing else runs on this private loop).
        self._runner.after_posted = self._client._flush_coalesced

    @classmethod
    def connect(
        cls,
        addr: str | Sequence[str],
        *,
        api_key: str | None = None,
        retry_policy: RetryPolicy | None = None,
        tls: bool | ssl.SSLContext = False,
        tls_ca_cert: bytes | None = None,
        tls_domain: str | None = None,
        credentials: ssl.SSLContext | None = None,
        connect_timeout: timedelta = DEFAULT_CONNECT_TIMEOUT,
        rpc_timeout: timedelta = DEFAULT_RPC_TIMEOUT,
        max_receive_message_bytes: int | None = None,
        client_name: str = CLIENT_NAME,
        follow_leader: bool = True,
    ) -> SyncSeppClient:
        """Connect and complete the handshake; raises as `SeppClient.connect`.
        `addr` may name several cluster nodes (``"h1:p,h2:p,h3:p"`` or a list):
        the client finds the leader and follows it across failovers as
        `SeppClient.connect` describes."""
        client = cls(
            addr,
            api_key=api_key,
            retry_policy=retry_policy,
            tls=tls,
            tls_ca_cert=tls_ca_cert,
            tls_domain=tls_domain,
            credentials=credentials,
            connect_timeout=connect_timeout,
            rpc_timeout=rpc_timeout,
            max_receive_message_bytes=max_receive_message_bytes,
            client_name=client_name,
            follow_leader=follow_leader,
        )
        try:
            client._run(client._client._ensure_connection())
        except BaseException:
            client.close()
            raise
        return client

    def _run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        if self._closed:
            coroutine.close()
            raise ClientClosedError()
        return self._runner.submit(coroutine)

    def _hot(self, start: _Start, *args: Any) -> tuple[bool, Any] | None:
        """A hot call started on the loop without a coroutine (None: take the
        coroutine road); its error is raised here."""
        if self._closed:
            raise ClientClosedError()
        outcome = self._runner.start(start, *args)
        if outcome is not None and not outcome[0]:
            error = outcome[1]
            raise error if isinstance(error, BaseException) else SeppError(str(error))
        return outcome

    @property
    def async_client(self) -> SeppClient:
        """The async client underneath (usable only on its own loop)."""
        return self._client

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the connection and stop the loop thread. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._runner.submit(self._client.close())
        finally:
            self._runner.stop()

    def __enter__(self) -> SyncSeppClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the API, method for method -------------------------------------------------------------

    def enqueue(self, job: EnqueueRequest) -> EnqueueAck:
        """See `SeppClient.enqueue`."""
        if type(job) is EnqueueRequest:
            outcome = self._hot(self._client._enqueue_nowait, job)
            if outcome is not None:
                return SeppClient._enqueue_answer(outcome[1])
        return self._run(self._client.enqueue(job))

    def enqueue_batch(self, jobs: Iterable[EnqueueRequest]) -> list[EnqueueAck | JobRejection]:
        """See `SeppClient.enqueue_batch`."""
        return self._run(self._client.enqueue_batch(list(jobs)))

    def enqueue_atomic(self, jobs: Iterable[EnqueueRequest]) -> list[EnqueueAck]:
        """See `SeppClient.enqueue_atomic`."""
        return self._run(self._client.enqueue_atomic(list(jobs)))

    def reserve(self, opts: ReserveOptions, *, order: str = "strict") -> list[Job] | None:
        """See `SeppClient.reserve`. Blocks the calling thread for the wait."""
        return self._run(self._client.reserve(opts, order=order))

    def ack(self, ctx: JobCtx | UndecodableJob) -> None:
        """See `SeppClient.ack`."""
        client = self._client
        if self._hot(client._settle_nowait, OP_ACK, client._lease_body(ctx)) is None:
            self._run(client.ack(ctx))

    def nack(
        self,
        ctx: JobCtx | UndecodableJob,
        retry: RetryDirective = RetryDirective.DEFAULT,
        reason: str = "",
    ) -> bool:
        """See `SeppClient.nack`."""
        client = self._client
        outcome = self._hot(client._settle_nowait, OP_NACK, client._nack_body(ctx, retry, reason))
        if outcome is not None:
            return SeppClient._nack_answer(outcome[1])
        return self._run(client.nack(ctx, retry, reason))

    def release(self, ctx: JobCtx) -> None:
        """See `SeppClient.release`."""
        self._run(self._client.release(ctx))

    def extend(self, ctx: JobCtx, extension: timedelta) -> datetime:
        """See `SeppClient.extend`."""
        client = self._client
        if isinstance(extension, timedelta) and isinstance(ctx, JobCtx):
            lease = ctx._lease
            worker_id, token = SeppClient._lease_fence(ctx)
            body = SeppClient._extend_body(ctx.id, ctx.attempt, extension, worker_id, token)
            outcome = self._hot(client._settle_nowait, OP_EXTEND, body)
            if outcome is not None:
                expiry = SeppClient._extend_answer(outcome[1])
                if lease is not None:
                    lease._known_expiry_ms = _convert.datetime_to_ms(expiry)
                return expiry
        return self._run(client.extend(ctx, extension))

    def get_server_info(self) -> ServerInfo:
        """See `SeppClient.get_server_info`."""
        return self._run(self._client.get_server_info())

    def drain_dead_letters(
        self, queue: str | None = None, max_records: int = 1
    ) -> list[DeadLetterRecord]:
        """See `SeppClient.drain_dead_letters`."""
        return self._run(self._client.drain_dead_letters(queue, max_records))

    def queue_stats(self, queues: Iterable[str] | None = None) -> list[QueueStats]:
        """See `SeppClient.queue_stats`."""
        names = queues if queues is None or isinstance(queues, str) else list(queues)
        return self._run(self._client.queue_stats(names))

    def health(self) -> HealthStatus:
        """See `SeppClient.health`."""
        return self._run(self._client.health())

    # -- admin operations (issue 15): see the methods of the same name on SeppClient --

    def get_job(self, job_id: str) -> JobInfo | None:
        return self._run(self._client.get_job(job_id))

    def list_jobs(
        self,
        queue: str,
        state: str,
        *,
        cursor: str | None = None,
        limit: int = 100,
        cause: str | None = None,
    ) -> JobPage:
        return self._run(
            self._client.list_jobs(queue, state, cursor=cursor, limit=limit, cause=cause)
        )

    def list_dead_letters(
        self, queue: str, *, cause: str | None = None, cursor: str | None = None, limit: int = 100
    ) -> JobPage:
        return self._run(
            self._client.list_dead_letters(queue, cause=cause, cursor=cursor, limit=limit)
        )

    def list_queues(self) -> list[QueueInfo]:
        return self._run(self._client.list_queues())

    def queue_info(self, queue: str) -> QueueInfo:
        return self._run(self._client.queue_info(queue))

    def dead_letter_jobs(self, ids: Iterable[str], *, reason: str | None = None) -> AdminOutcomes:
        return self._run(self._client.dead_letter_jobs(list(ids), reason=reason))

    def cancel_jobs(self, ids: Iterable[str], *, reason: str | None = None) -> AdminOutcomes:
        return self._run(self._client.cancel_jobs(list(ids), reason=reason))

    def requeue_dead_letters(
        self,
        ids: Iterable[str] | None = None,
        *,
        queue: str | None = None,
        cause: str | None = None,
        reason: str | None = None,
    ) -> AdminOutcomes:
        return self._run(
            self._client.requeue_dead_letters(
                None if ids is None else list(ids), queue=queue, cause=cause, reason=reason
            )
        )

    def delete_dead_letters(
        self,
        ids: Iterable[str] | None = None,
        *,
        queue: str | None = None,
        cause: str | None = None,
        reason: str | None = None,
    ) -> AdminOutcomes:
        return self._run(
            self._client.delete_dead_letters(
                None if ids is None else list(ids), queue=queue, cause=cause, reason=reason
            )
        )

    def pause_queue(self, queue: str, *, reason: str | None = None) -> QueueChange:
        return self._run(self._client.pause_queue(queue, reason=reason))

    def resume_queue(self, queue: str, *, reason: str | None = None) -> QueueChange:
        return self._run(self._client.resume_queue(queue, reason=reason))

    def purge_queue(self, queue: str, *, reason: str | None = None) -> PurgeResult:
        return self._run(self._client.purge_queue(queue, reason=reason))

    def put_queue(
        self,
        queue: str,
        overrides: dict[str, int | str] | None = None,
        *,
        reason: str | None = None,
    ) -> PutQueueResult:
        return self._run(self._client.put_queue(queue, overrides, reason=reason))

    def delete_queue(self, queue: str, *, reason: str | None = None) -> DeleteQueueResult:
        return self._run(self._client.delete_queue(queue, reason=reason))

    def list_schedules(self) -> list[ScheduleInfo]:
        return self._run(self._client.list_schedules())

    def put_schedule(
        self,
        name: str,
        queue: str,
        job_type: str,
        *,
        cron: str | None = None,
        every_ms: int | None = None,
        timezone: str = "UTC",
        payload: bytes | str | None = None,
        encoding: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        custom: dict[str, Any] | None = None,
        catch_up: str = "one",
        reason: str | None = None,
    ) -> ScheduleChange:
        return self._run(
            self._client.put_schedule(
                name, queue, job_type, cron=cron, every_ms=every_ms, timezone=timezone,
                payload=payload, encoding=encoding, priority=priority,
                max_attempts=max_attempts, custom=custom, catch_up=catch_up, reason=reason,
            )
        )  # fmt: skip

    def pause_schedule(self, name: str, *, reason: str | None = None) -> ScheduleChange:
        return self._run(self._client.pause_schedule(name, reason=reason))

    def resume_schedule(self, name: str, *, reason: str | None = None) -> ScheduleChange:
        return self._run(self._client.resume_schedule(name, reason=reason))

    def delete_schedule(self, name: str, *, reason: str | None = None) -> ScheduleChange:
        return self._run(self._client.delete_schedule(name, reason=reason))
