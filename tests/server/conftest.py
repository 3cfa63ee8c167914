"""Helpers for the server tests: a raw protocol client and a runner for async tests.

`RawClient` speaks frames through `sepp.protocol` over asyncio streams and nothing
more: it can send arbitrary bytes, pipeline requests, and collects responses by
request id in whatever order they come back. It deliberately knows no business
rules, so the tests see exactly what the server puts on the wire.

`async def` tests in this folder run on a fresh event loop (`asyncio.run`) under a
hard timeout; every client opened during the test is closed afterwards. Waiting is
always "poll with a deadline" (`wait_until`) or "wait for an event", never a fixed
sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

import pytest

from sepp.protocol import errors as perr
from sepp.protocol import messages as pm
from sepp.protocol.framing import FRAME_BYTES_CEILING, FrameReader, encode_frame
from tests.support import ANSWER_TIMEOUT_S, wait_until

# A whole async test, as a last-resort guard against hangs.
TEST_TIMEOUT_S = 120.0
LEASE_MS = 60_000


# -- running async tests -------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run `async def` tests of this folder on their own event loop."""
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    kwargs = {name: pyfuncitem.funcargs[name] for name in names}
    asyncio.run(_run_async_test(pyfuncitem.obj, kwargs))
    return True


async def _run_async_test(test: Callable[..., Awaitable[None]], kwargs: dict[str, Any]) -> None:
    try:
        await asyncio.wait_for(test(**kwargs), TEST_TIMEOUT_S)
    finally:
        await RawClient.close_all()


# -- the raw client ------------------------------------------------------------------


class ConnectionClosed(Exception):
    """The server closed the connection before the awaited answer arrived.

    Not an AssertionError: a test that tolerates a closed connection must say so
    with `except ConnectionClosed`, and that never swallows a failed assertion."""


class RawClient:
    """One TCP connection to a sepp server, speaking frames and nothing else."""

    _open: set[RawClient] = set()

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, reading: bool = True
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._frames = FrameReader(FRAME_BYTES_CEILING)
        self._ids = itertools.count(1)
        self._changed = asyncio.Condition()
        # Every response, in arrival order, and by request id.
        self.arrivals: list[pm.Response] = []
        self.responses: dict[int, pm.Response] = {}
        # Frames the client could not decode as responses (must stay empty).
        self.bad_frames: list[tuple[bytes, str]] = []
        self.duplicates: list[pm.Response] = []
        self.closed = False
        self.close_error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        if reading:
            self.start_reading()
        else:
            # Read nothing at all: responses pile up in the kernel, then in the server.
            writer.transport.pause_reading()
        RawClient._open.add(self)

    @classmethod
    async def connect(
        cls,
        address: str,
        *,
        rcvbuf: int | None = None,
        reading: bool = True,
        tls: ssl.SSLContext | None = None,
    ) -> RawClient:
        host, _, port = address.rpartition(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:
            # Before connect, so the window is small from the first byte on.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        except BaseException:
            sock.close()
            raise
        reader, writer = await asyncio.open_connection(
            sock=sock,
            limit=2**20,
            ssl=tls,
            server_hostname="localhost" if tls is not None else None,
        )
        return cls(reader, writer, reading=reading)

    @classmethod
    async def close_all(cls) -> None:
        for client in list(cls._open):
            await client.close()

    # -- reading ----------------------------------------------------------------

    def start_reading(self) -> None:
        if self._task is None:
            self._writer.transport.resume_reading()
            self._task = asyncio.get_running_loop().create_task(self._read_loop())

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    break
                frames = self._frames.feed(data)
                if frames:
                    for frame in frames:
                        self._accept(frame)
                    async with self._changed:
                        self._changed.notify_all()
        except (ConnectionError, OSError) as exc:
            self.close_error = exc
        finally:
            self.closed = True
            async with self._changed:
                self._changed.notify_all()

    def _accept(self, frame: bytes) -> None:
        try:
            response = pm.decode_response(frame)
        except perr.FramingError as exc:
            self.bad_frames.append((frame, str(exc)))
            return
        self.arrivals.append(response)
        if response.id in self.responses:
            self.duplicates.append(response)
        self.responses[response.id] = response

    async def wait(self, predicate: Callable[[], bool], timeout: float = ANSWER_TIMEOUT_S) -> None:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(predicate)

    async def response(self, request_id: int, timeout: float = ANSWER_TIMEOUT_S) -> pm.Response:
        """The answer to `request_id`, waiting for it."""
        await self.wait(lambda: request_id in self.responses or self.closed, timeout)
        if request_id not in self.responses:
            raise ConnectionClosed(f"connection closed before the answer to {request_id}")
        return self.responses[request_id]

    async def wait_closed(self, timeout: float = ANSWER_TIMEOUT_S) -> None:
        await self.wait(lambda: self.closed, timeout)

    @property
    def connection_errors(self) -> list[pm.Response]:
        """Responses with request id 0: connection-level errors."""
        return [r for r in self.arrivals if r.id == 0]

    # -- writing ----------------------------------------------------------------

    def next_id(self) -> int:
        return next(self._ids)

    def send_raw(self, data: bytes) -> None:
        self._writer.write(data)

    def send_value(self, value: Any) -> None:
        """Any msgpack value as one frame."""
        self.send_raw(encode_frame(pm.pack(value)))

    def send(self, op: str, body: Any = None, request_id: int | None = None) -> int:
        """Send a request without waiting; returns its id."""
        if request_id is None:
            request_id = self.next_id()
        self.send_value([request_id, op, {} if body is None else body])
        return request_id

    async def drain(self) -> None:
        await self._writer.drain()

    def half_close(self) -> None:
        self._writer.write_eof()

    async def call(
        self, op: str, body: Any = None, timeout: float = ANSWER_TIMEOUT_S
    ) -> pm.Response:
        request_id = self.send(op, body)
        return await self.response(request_id, timeout)

    async def ok(self, op: str, body: Any = None, timeout: float = ANSWER_TIMEOUT_S) -> Any:
        """Call and insist on status ok; returns the body."""
        response = await self.call(op, body, timeout)
        assert response.status == perr.OK, response
        return response.body

    async def hello(self, api_key: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"protocol": pm.PROTOCOL_VERSION, "client": "sepp-tests/raw"}
        if api_key is not None:
            body["api_key"] = api_key
        result: dict[str, Any] = await self.ok("hello", body)
        return result

    async def close(self) -> None:
        RawClient._open.discard(self)
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    # -- the operations, thinly ---------------------------------------------------

    async def enqueue(self, *jobs: dict[str, Any], atomic: bool | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"jobs": list(jobs)}
        if atomic is not None:
            body["atomic"] = atomic
        result: dict[str, Any] = await self.ok("enqueue", body)
        return result

    async def enqueue_ids(self, *jobs: dict[str, Any]) -> list[str]:
        """Enqueue jobs that must all be accepted; their ids in order."""
        results = (await self.enqueue(*jobs))["results"]
        assert all("job_id" in r for r in results), results
        return [r["job_id"] for r in results]

    def reserve_body(
        self,
        queues: Iterable[str],
        *,
        lease_ms: int = LEASE_MS,
        wait_ms: int = 0,
        max_jobs: int = 1,
        worker_id: str | None = None,
        job_layout: str | None = None,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "queues": list(queues),
            "lease_ms": lease_ms,
            "wait_ms": wait_ms,
            "max_jobs": max_jobs,
        }
        if worker_id is not None:
            body["worker_id"] = worker_id
        if job_layout is not None:
            body["job_layout"] = job_layout
        return body

    async def reserve(
        self,
        queues: Iterable[str],
        *,
        lease_ms: int = LEASE_MS,
        wait_ms: int = 0,
        max_jobs: int = 1,
        timeout: float = ANSWER_TIMEOUT_S,
        job_layout: str | None = None,
    ) -> list[Any]:
        """The delivered jobs: maps, or rows with ``job_layout="array"``."""
        body = self.reserve_body(
            queues, lease_ms=lease_ms, wait_ms=wait_ms, max_jobs=max_jobs, job_layout=job_layout
        )
        result = await self.ok("reserve", body, timeout=timeout + wait_ms / 1000)
        jobs: list[Any] = result["jobs"]
        return jobs

    async def ack(self, job: dict[str, Any]) -> pm.Response:
        return await self.call("ack", {"job_id": job["id"], "attempt": job["attempt"]})

    async def nack(self, job: dict[str, Any], **fields: Any) -> pm.Response:
        body = {"job_id": job["id"], "attempt": job["attempt"], **fields}
        return await self.call("nack", body)

    async def server_time(self) -> int:
        body = await self.ok("server_info")
        now: int = body["server_time_ms"]
        return now

    async def stats(self, queue: str) -> dict[str, Any]:
        body = await self.ok("queue_stats", {"queues": [queue]})
        (entry,) = body["queues"]
        entry["server_time_ms"] = body["server_time_ms"]
        result: dict[str, Any] = entry
        return result

    def assert_clean(self) -> None:
        """Every frame the server sent was a well-formed response, none twice."""
        assert not self.bad_frames, self.bad_frames
        assert not self.duplicates, self.duplicates


async def connect(address: str, api_key: str | None = None) -> RawClient:
    """A connection that has done its hello."""
    client = await RawClient.connect(address)
    await client.hello(api_key)
    return client


def job(queue: str, job_type: str = "work", **fields: Any) -> dict[str, Any]:
    """A job map for an enqueue."""
    return {"queue": queue, "job_type": job_type, **fields}


def payload(data: bytes, encoding: str = "application/octet-stream") -> dict[str, Any]:
    return {"data": data, "encoding": encoding}


def reserved_at(delivered: dict[str, Any], lease_ms: int) -> int:
    """When the server leased a delivered job (its lease deadline minus the lease,
    for leases below the clamp)."""
    at: int = delivered["lease_expires_at_ms"] - lease_ms
    return at


async def wait_server_tick(client: RawClient, after_ms: int) -> int:
    """Poll the server's clock until it is past `after_ms` (one ms at least), so the
    next command gets a later time stamp than everything before."""
    return int(
        await wait_until(
            lambda: _later(client, after_ms), what=f"the server clock to pass {after_ms}"
        )
    )


async def _later(client: RawClient, after_ms: int) -> int:
    now = await client.server_time()
    return now if now > after_ms else 0


@pytest.fixture
def queue_names(request: pytest.FixtureRequest) -> Iterator[str]:
    """Fresh queue names for a test: q0, q1, ... prefixed by the test's name."""
    stem = request.node.name.replace("[", "-").replace("]", "")[:40]
    return (f"{stem}-q{i}" for i in itertools.count())
