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

Must not import: sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import asyncio
import ssl
import threading
from collections.abc import Coroutine, Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sepp.client._retry import RetryPolicy
from sepp.client.client import (
    CLIENT_NAME,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RPC_TIMEOUT,
    RetryDirective,
    SeppClient,
)
from sepp.client.errors import ClientClosedError, JobRejection
from sepp.client.types import (
    DeadLetterRecord,
    EnqueueAck,
    EnqueueRequest,
    HealthStatus,
    Job,
    JobCtx,
    QueueStats,
    ReserveOptions,
    ServerInfo,
    UndecodableJob,
)

__all__ = ["SyncSeppClient"]

_T = TypeVar("_T")


class _LoopThread:
    """An event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sepp-sync-client", daemon=True)
        self._thread.start()

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
        addr: str,
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

    @classmethod
    def connect(
        cls,
        addr: str,
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
    ) -> SyncSeppClient:
        """Connect and complete the handshake; raises as `SeppClient.connect`."""
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
        return self._run(self._client.enqueue(job))

    def enqueue_batch(self, jobs: Iterable[EnqueueRequest]) -> list[EnqueueAck | JobRejection]:
        """See `SeppClient.enqueue_batch`."""
        return self._run(self._client.enqueue_batch(list(jobs)))

    def enqueue_atomic(self, jobs: Iterable[EnqueueRequest]) -> list[EnqueueAck]:
        """See `SeppClient.enqueue_atomic`."""
        return self._run(self._client.enqueue_atomic(list(jobs)))

    def reserve(self, opts: ReserveOptions) -> list[Job] | None:
        """See `SeppClient.reserve`. Blocks the calling thread for the wait."""
        return self._run(self._client.reserve(opts))

    def ack(self, ctx: JobCtx | UndecodableJob) -> None:
        """See `SeppClient.ack`."""
        self._run(self._client.ack(ctx))

    def nack(
        self,
        ctx: JobCtx | UndecodableJob,
        retry: RetryDirective = RetryDirective.DEFAULT,
        reason: str = "",
    ) -> bool:
        """See `SeppClient.nack`."""
        return self._run(self._client.nack(ctx, retry, reason))

    def release(self, ctx: JobCtx) -> None:
        """See `SeppClient.release`."""
        self._run(self._client.release(ctx))

    def extend(self, ctx: JobCtx, extension: timedelta) -> datetime:
        """See `SeppClient.extend`."""
        return self._run(self._client.extend(ctx, extension))

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
