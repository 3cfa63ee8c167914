"""An in-memory, scriptable sepp server for the client tests.

A real asyncio listener on 127.0.0.1:0 that speaks the protocol through
`sepp.protocol` (framing, envelopes), so the client is tested over real sockets
without the real server. Each request is answered by a handler chosen by its
op; handlers run as separate tasks, so a slow one never holds up the others
(responses go out in whatever order handlers finish).

Scripting:

* ``server.reply(op, status, body)`` answers every `op` with a fixed response;
  ``server.on(op, handler)`` installs ``handler(conn, request)``, sync or
  async, returning ``(status, body)``, `DROP` (abort the connection without
  answering), `CLOSE` (flush and close without answering) or `SILENT` (never
  answer);
* ``server.queue`` is a tiny job queue (reserve long-polls, leases, fencing on
  ack / nack / extend / release; ``withdraw`` always answers that it came too
  late) that the reserve/ack/nack/extend handlers use unless
  replaced; tests put jobs in with ``server.queue.push(make_job(...))``;
* every request received is recorded in ``server.requests``; ``await
  server.wait_until(predicate)`` waits for a condition without sleeping.

The built-in hello checks the protocol version and, if ``api_key`` is set, the
key; health always answers ``serving``. A frame longer than
``max_message_bytes`` is answered with the connection-level error frame of
PROTOCOL.md §1 and the connection is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import ssl as ssl_module
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from sepp.protocol import (
    FRAME_BYTES_MAX_DEFAULT,
    FrameReader,
    FrameTooLarge,
    FramingError,
    Request,
    decode_request,
    encode_frame,
    encode_response,
)
from sepp.protocol.errors import ProtocolError
from sepp.protocol.messages import job_body

Reply = tuple[str, dict[str, Any]]
DROP = object()
SILENT = object()
CLOSE = object()
Handler = Callable[["FakeConnection", Request], Any]


# A complete server_info answer with the reference defaults.
SERVER_INFO = {
    "server_version": "0.1.0",
    "supported_protocol_versions": ["v1"],
    "server_time_ms": 1_764_500_000_000,
    "restricts_encodings": True,
    "allowed_encodings": ["application/json"],
    "max_payload_bytes": 1_048_576,
    "max_message_bytes": 16_777_216,
    "max_custom_entries": 64,
    "max_custom_total_bytes": 16_384,
    "max_custom_key_bytes": 256,
    "max_queue_name_bytes": 512,
    "max_job_type_bytes": 256,
    "max_idempotency_key_bytes": 256,
    "max_schedule_horizon_ms": 30 * 86_400_000,
    "max_enqueue_batch": 256,
    "max_reserve_batch": 256,
    "max_reserve_queues": 32,
    "max_wait_timeout_ms": 300_000,
    "max_lease_duration_ms": 300_000,
    "strict_queues": False,
    "dead_letter_retention_enabled": True,
    "dead_letter_retention_ms": 86_400_000,
    "persist_mode": "sync_data",
}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# Job ids: a counter, not uuid4: nothing in a client test may depend on
# randomness from outside SEPP_SEED (the ids are unique, and that is all they need be).
_job_ids = itertools.count(1)


def make_job(
    job_type: str = "work",
    *,
    queue: str = "q",
    job_id: str | None = None,
    payload: bytes | None = b"{}",
    encoding: str = "application/json",
    priority: int = 0,
    attempt: int = 0,
    max_attempts: int = 3,
    enqueued_at_ms: int | None = None,
    scheduled_at_ms: int | None = None,
    custom: dict[str, Any] | None = None,
    traceparent: str | None = None,
) -> dict[str, Any]:
    """A job body as the wire carries it (lease fields are set on reserve)."""
    return job_body(
        job_id or str(uuid.UUID(int=next(_job_ids), version=4)),
        queue,
        job_type,
        payload,
        encoding if payload is not None else None,
        priority,
        attempt,
        max_attempts,
        now_ms() if enqueued_at_ms is None else enqueued_at_ms,
        scheduled_at_ms,
        None,
        traceparent,
        None,
        custom,
    )


def job_row(job: dict[str, Any]) -> list[Any]:
    """The row a server sends for the job map `job` in the array layout of a
    reserve answer (PROTOCOL.md 5.2), spelled out here rather than read from
    JOB_ARRAY_FIELDS (so a reordering shows)."""
    payload = job.get("payload")
    trace = job.get("trace_context")
    return [
        job.get("id"),
        job.get("queue"),
        job.get("job_type"),
        None if payload is None else payload.get("data"),
        None if payload is None else payload.get("encoding"),
        job.get("priority"),
        job.get("max_attempts"),
        job.get("attempt"),
        job.get("enqueued_at_ms"),
        job.get("scheduled_at_ms"),
        job.get("lease_expires_at_ms"),
        None if trace is None else trace.get("traceparent"),
        None if trace is None else trace.get("tracestate"),
        job.get("custom") or None,
    ]


def error(code: str, message: str = "scripted error", **details: Any) -> Reply:
    return code, {"message": message, **details}


class FakeQueue:
    """Ready jobs, leases and the record of what workers reported."""

    def __init__(self, server: FakeServer) -> None:
        self._server = server
        self.ready: list[dict[str, Any]] = []
        self.in_flight: dict[str, dict[str, Any]] = {}
        self.acked: list[str] = []
        self.nacked: list[dict[str, Any]] = []
        self.released: list[dict[str, Any]] = []
        self.extended: list[str] = []
        # job id -> error code to answer extends of that job with.
        self.fail_extend: dict[str, str] = {}
        self.reserves: list[dict[str, Any]] = []
        # Whether reserves asking for the array layout get rows, as this
        # server does; False: maps whatever is asked, as servers before it.
        self.rows = False
        self._changed = asyncio.Event()

    def push(self, *jobs: dict[str, Any]) -> None:
        self.ready.extend(jobs)
        self._changed.set()

    def _fence(self, body: dict[str, Any]) -> Reply | None:
        job = self.in_flight.get(body["job_id"])
        if job is None:
            return error("not_found", "no in-flight job with this id")
        if job["attempt"] != body["attempt"]:
            return error(
                "failed_precondition",
                "attempt mismatch",
                reason="attempt_mismatch",
                current_attempt=job["attempt"],
            )
        return None

    async def reserve(self, conn: FakeConnection, request: Request) -> Reply:
        body = request.body
        self.reserves.append(body)
        self._server.notify()
        deadline = time.monotonic() + body.get("wait_ms", 0) / 1000
        while not self.ready:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "ok", {"jobs": []}
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed.wait()
        taken = self.ready[: body.get("max_jobs", 1)]
        del self.ready[: len(taken)]
        for job in taken:
            job["attempt"] += 1
            job["lease_expires_at_ms"] = now_ms() + body["lease_ms"]
            self.in_flight[job["id"]] = job
        if self.rows and body.get("job_layout") == "array":
            return "ok", {"jobs": [job_row(job) for job in taken]}
        return "ok", {"jobs": taken}

    def ack(self, conn: FakeConnection, request: Request) -> Reply:
        refused = self._fence(request.body)
        if refused is not None:
            return refused
        job_id = request.body["job_id"]
        del self.in_flight[job_id]
        self.acked.append(job_id)
        return "ok", {"job_id": job_id}

    def nack(self, conn: FakeConnection, request: Request) -> Reply:
        refused = self._fence(request.body)
        if refused is not None:
            return refused
        job_id = request.body["job_id"]
        job = self.in_flight.pop(job_id)
        self.nacked.append(request.body)
        dead = request.body.get("retry") == "dead_letter" or job["attempt"] >= job["max_attempts"]
        if not dead and request.body.get("retry") == "delay" and request.body["delay_ms"] == 0:
            self.push(job)
        return "ok", {"job_id": job_id, "dead_lettered": dead}

    def release(self, conn: FakeConnection, request: Request) -> Reply:
        """Ready again under the same attempt (the next reserve counts it anew)."""
        refused = self._fence(request.body)
        if refused is not None:
            return refused
        job_id = request.body["job_id"]
        job = self.in_flight.pop(job_id)
        self.released.append(request.body)
        job["attempt"] -= 1
        self.push(job)
        return "ok", {"job_id": job_id}

    def extend(self, conn: FakeConnection, request: Request) -> Reply:
        job_id = request.body["job_id"]
        self.extended.append(job_id)
        code = self.fail_extend.get(job_id)
        if code == "attempt_mismatch":
            return error("failed_precondition", "reassigned", reason="attempt_mismatch")
        if code is not None:
            return error(code, "scripted extend failure")
        refused = self._fence(request.body)
        if refused is not None:
            return refused
        expiry = now_ms() + request.body["lease_ms"]
        self.in_flight[job_id]["lease_expires_at_ms"] = expiry
        return "ok", {"job_id": job_id, "lease_expires_at_ms": expiry}


class FakeConnection:
    def __init__(
        self, server: FakeServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.frames = FrameReader(server.max_message_bytes)
        self.helloed = False
        self.closed = False
        self.tasks: set[asyncio.Task[None]] = set()

    def send(self, request_id: int, status: str, body: dict[str, Any]) -> None:
        if not self.closed:
            self.writer.write(encode_frame(encode_response(request_id, status, body)))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def close(self) -> None:
        """Flush what was sent, then close in order."""
        self.closed = True
        await self.writer.drain()
        self.writer.close()

    def abort(self) -> None:
        """Drop the connection at once (no answer, no orderly close)."""
        self.closed = True
        self.writer.transport.abort()

    async def serve(self) -> None:
        try:
            while True:
                data = await self.reader.read(65536)
                if not data:
                    return
                try:
                    frames = self.frames.feed(data)
                except FrameTooLarge:
                    self.send(
                        0,
                        "resource_exhausted",
                        {"message": "frame too large", "reason": "frame_too_large"},
                    )
                    await self.writer.drain()
                    return
                for frame in frames:
                    try:
                        request = decode_request(frame)
                    except ProtocolError as exc:
                        self.send(exc.request_id, "invalid_argument", {"message": exc.message})  # type: ignore[attr-defined]
                        continue
                    self.server.requests.append(request)
                    self.server.notify()
                    task = asyncio.get_running_loop().create_task(self._answer(request))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
        except (ConnectionError, FramingError):
            return
        finally:
            self.closed = True
            for task in list(self.tasks):
                task.cancel()
            self.writer.close()

    async def _answer(self, request: Request) -> None:
        handler = self.server.handlers.get(request.op)
        if handler is None:
            self.send(request.id, "invalid_argument", {"message": f"no script for {request.op}"})
            return
        result = handler(self, request)
        if inspect.isawaitable(result):
            result = await result
        self.server.notify()  # the handler may have changed what waiters look at
        if result is SILENT:
            return
        if result is DROP:
            self.abort()
            return
        if result is CLOSE:
            await self.close()
            return
        status, body = result
        self.send(request.id, status, body)
        if request.op == "hello" and status != "ok":
            await self.close()


class FakeServer:
    def __init__(
        self,
        *,
        api_key: str | None = None,
        max_message_bytes: int = FRAME_BYTES_MAX_DEFAULT,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        self.api_key = api_key
        self.ssl = ssl
        self.max_message_bytes = max_message_bytes
        self.requests: list[Request] = []
        # Extra fields of the hello answer (e.g. the batch limits a real server
        # advertises, which turn on the client's coalescing).
        self.hello_extra: dict[str, Any] = {}
        self.connections: list[FakeConnection] = []
        self.queue = FakeQueue(self)
        self.handlers: dict[str, Handler] = {
            "hello": self._hello,
            "health": lambda conn, req: ("ok", {"status": "serving"}),
            "reserve": self.queue.reserve,
            "ack": self.queue.ack,
            "nack": self.queue.nack,
            "extend": self.queue.extend,
            "release": self.queue.release,
            # By default the fake cannot withdraw its long polls: as if each
            # withdraw came too late (the answer had already left).
            "withdraw": lambda conn, req: ("ok", {"withdrawn": False}),
        }
        self._server: asyncio.Server | None = None
        self._serve_tasks: set[asyncio.Task[None]] = set()
        self._changed = asyncio.Event()
        self.port = 0

    # -- scripting ------------------------------------------------------------------------

    def on(self, op: str, handler: Handler) -> None:
        self.handlers[op] = handler

    def reply(self, op: str, status: str = "ok", body: dict[str, Any] | None = None) -> None:
        answer = (status, dict(body or {}))
        if status != "ok":
            answer[1].setdefault("message", "scripted")
        self.handlers[op] = lambda conn, req: answer

    def ops(self, op: str) -> list[Request]:
        return [r for r in self.requests if r.op == op]

    def notify(self) -> None:
        self._changed.set()

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until `predicate()` holds, re-checking whenever a request
        arrives or `notify` is called (no polling sleep)."""
        async with asyncio.timeout(timeout):
            while not predicate():
                self._changed.clear()
                await self._changed.wait()

    def _hello(self, conn: FakeConnection, request: Request) -> Reply:
        body = request.body
        if body.get("protocol") != 1:
            return error(
                "invalid_argument",
                "unsupported protocol version",
                supported_protocol_versions=[1],
            )
        if self.api_key is not None and body.get("api_key") != self.api_key:
            return error("unauthenticated", "missing or unknown API key")
        conn.helloed = True
        return "ok", {
            "protocol": 1,
            "server_version": "fake-0",
            "server_time_ms": now_ms(),
            "max_message_bytes": self.max_message_bytes,
            "auth_required": self.api_key is not None,
            **self.hello_extra,
        }

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def hellos(self) -> int:
        return len(self.ops("hello"))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = FakeConnection(self, reader, writer)
        self.connections.append(conn)
        self.notify()
        task = asyncio.current_task()
        if task is not None:
            self._serve_tasks.add(task)
        try:
            await conn.serve()
        finally:
            if task is not None:
                self._serve_tasks.discard(task)
            self.notify()

    def drop_all(self) -> None:
        """Abort every open connection."""
        for conn in self.connections:
            if not conn.closed:
                conn.abort()

    async def __aenter__(self) -> FakeServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, ssl=self.ssl)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        # Aborting ends each connection's read loop; cancelling the loop tasks
        # instead would make asyncio's start_server callback log an error.
        self.drop_all()
        await asyncio.gather(*self._serve_tasks, return_exceptions=True)
        await self._server.wait_closed()


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll `predicate` until it holds or `timeout` passes (then TimeoutError).
    For conditions on the client side that no event announces."""
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.001)


class ThreadedFakeServer:
    """A `FakeServer` on its own event loop in a background thread, for tests of
    the blocking client. Read its state through `call` (runs on its loop)."""

    def __init__(self, **kwargs: Any) -> None:
        self._kwargs = kwargs
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: FakeServer

    def call(self, fn: Callable[[FakeServer], Any]) -> Any:
        async def run() -> Any:
            return fn(self.server)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)

    def __enter__(self) -> ThreadedFakeServer:
        self._thread.start()

        async def start() -> FakeServer:
            return await FakeServer(**self._kwargs).__aenter__()

        self.server = asyncio.run_coroutine_threadsafe(start(), self.loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.__aexit__(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
