"""The gRPC `sepp.v1` front: `QueueService` and `grpc.health.v1.Health` on
`grpc.aio`, in the server's own event loop.

Owns: `GrpcListener` (bind, start, stop; the shape of the admin listener), the
eight RPCs, each decoded into one call of the service layer (service.py) and its
result rendered (convert.py), auth (`authorization: Bearer <key>` metadata on
every QueueService call; health is outside auth), the status-code table
(`status_of`), the server's channel options (keepalive, message sizes).

Promises:
- An answer leaves only once what it reports is durable (`service.durable`).
- Per-job problems are values (the 14-variant JobRejection oneof); only
  whole-request problems are status codes, by one table (`status_of`, one test
  per row in tests/grpc/test_errors.py).
- A reserve whose call is cancelled (client cancel, deadline, disconnect) while
  it waits leases nothing (service.reserve_wait). Jobs of an answer that would not
  fit the official clients' default 4 MiB receive limit are not sent: they are
  released, Ready again with no attempt counted (`fit_jobs`).
- The clients' keepalive pings (every 30 s, also while idle) are welcome: the
  gRPC core's defaults (pings without calls refused, at most one every 5 minutes)
  would answer them with GOAWAY "too_many_pings" and drop the connection.

Must not import: another front end (sepp.server.server, the native wire, the admin
front), storage, the native protocol, the client library.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import sepp.grpc  # noqa: F401  - GRPC_ENABLE_FORK_SUPPORT off before grpc loads

import grpc  # isort: skip
import grpc.aio  # isort: skip
from grpc_health.v1 import _async as health_async  # isort: skip
from grpc_health.v1 import health_pb2, health_pb2_grpc  # isort: skip

from sepp.core.commands import RETRY_DEAD_LETTER, RETRY_DEFAULT, RETRY_DELAY, Extend, Nack
from sepp.core.decide import Decision
from sepp.core.results import (
    AckResult,
    AttemptMismatch,
    CommandError,
    DrainResult,
    EnqueueResult,
    ExtendResult,
    FailedPrecondition,
    InvalidArgument,
    JobView,
    NackResult,
    NotFound,
    PermissionDenied,
    QueueInUse,
    QueueNotFound,
)
from sepp.grpc import convert
from sepp.grpc.v1 import queue_pb2 as pb
from sepp.server.service import (
    AUTH_LET_IN,
    CommandRefused,
    InvalidRequest,
    Overloaded,
    SeppService,
    ShuttingDown,
    StorageFailed,
)

log = logging.getLogger("sepp.grpc")

SERVICE_NAME = "sepp.v1.QueueService"
# The reference's port for the job API (sepp-semantics.md §1); [grpc] listen_addr
# is off by default, this is what the docs suggest.
REFERENCE_PORT = 50051

# What a gRPC client accepts by default (grpc.max_receive_message_length, 4 MiB):
# the official clients keep it unless told otherwise. A reserve or drain answer
# stays within it: the core fills jobs up to ANSWER_BYTES_MAX of its own estimate
# (an upper bound of the native encoding; protobuf's can be a few bytes per custom
# entry larger, far below the margin), and a reserve answer is measured before it
# leaves (fit_jobs). One job alone is always delivered, whatever its size.
CLIENT_RECEIVE_BYTES_DEFAULT = 4 * 1024 * 1024
ANSWER_MARGIN_BYTES = 256 * 1024
ANSWER_BYTES_MAX = CLIENT_RECEIVE_BYTES_DEFAULT - ANSWER_MARGIN_BYTES
# A repeated message field costs its tag and a length prefix beside the message.
REPEATED_ITEM_OVERHEAD_BYTES = 6

# Keepalive (grpc/doc/keepalive.md): the official clients ping every 30 s with
# permit_without_calls, so the server must accept pings without calls, and pings
# as often as every 10 s before it counts a strike (grpc.http2.max_ping_strikes,
# default 2, stays: a peer pinging faster than that is still dropped).
KEEPALIVE_MIN_PING_INTERVAL_MS = 10_000
# How long stop() lets calls in flight finish (their answers are durable by then
# or refused); parked reserves were answered empty by service.stop() before.
STOP_GRACE_S = 5.0


def server_options(receive_bytes_max: int) -> list[tuple[str, Any]]:
    """The grpc.aio server's channel arguments."""
    return [
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MIN_PING_INTERVAL_MS),
        # The reference's limits.max_message_bytes (16 MiB by default) for one request.
        ("grpc.max_receive_message_length", receive_bytes_max),
        # Two servers on one port must be an error, not a silent load balancer.
        ("grpc.so_reuseport", 0),
    ]


# -- the status-code table --------------------------------------------------------------------


class _Refused(Exception):
    """A whole request refused with a status code (raised inside a handler)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# Core refusals, most specific first (sepp-semantics.md §7, §15).
_COMMAND_ERROR_CODES: tuple[tuple[type[CommandError], grpc.StatusCode], ...] = (
    (AttemptMismatch, grpc.StatusCode.FAILED_PRECONDITION),
    # Strict mode: a reserve naming undeclared queues; the names are in the message.
    (FailedPrecondition, grpc.StatusCode.FAILED_PRECONDITION),
    (QueueInUse, grpc.StatusCode.FAILED_PRECONDITION),
    (QueueNotFound, grpc.StatusCode.NOT_FOUND),
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
)


def status_of(error: BaseException | CommandError) -> tuple[grpc.StatusCode, str]:
    """(status code, message) for a core refusal or a typed refusal of the
    service. Anything else is not an expected failure and is not mapped here."""
    if isinstance(error, CommandRefused):
        error = error.error
    if isinstance(error, CommandError):
        for kind, code in _COMMAND_ERROR_CODES:
            if isinstance(error, kind):
                return code, error.message
        return grpc.StatusCode.INTERNAL, error.message
    if isinstance(error, _Refused):
        return error.code, error.message
    if isinstance(error, ShuttingDown):
        return grpc.StatusCode.UNAVAILABLE, str(error)
    if isinstance(error, InvalidRequest):
        return grpc.StatusCode.INVALID_ARGUMENT, str(error)
    if isinstance(error, Overloaded):
        # The official clients: OverloadedError, retried with backoff.
        return grpc.StatusCode.RESOURCE_EXHAUSTED, str(error)
    if isinstance(error, StorageFailed):
        return grpc.StatusCode.INTERNAL, f"storage failed: {error}"
    raise TypeError(f"no status code for {type(error).__name__}") from None


_EXPECTED = (_Refused, ShuttingDown, InvalidRequest, Overloaded, StorageFailed, CommandRefused)


def _invalid(message: str) -> _Refused:
    return _Refused(grpc.StatusCode.INVALID_ARGUMENT, message)


def _decided(decision: Decision | CommandError) -> Decision:
    if type(decision) is not Decision:
        raise CommandRefused(decision)  # type: ignore[arg-type]
    return decision


# -- answers within the client's receive limit ------------------------------------------------


def fit_jobs(
    jobs: tuple[JobView, ...], bytes_max: int
) -> tuple[pb.ReserveResponse, tuple[JobView, ...]]:
    """The answer carrying the first of `jobs` that fit `bytes_max` (at least one),
    and the jobs left out (to release)."""
    response = pb.ReserveResponse()
    out = response.jobs
    size = 0
    for index, view in enumerate(jobs):
        job = convert.job_pb(view)
        size += job.ByteSize() + REPEATED_ITEM_OVERHEAD_BYTES
        if index and size > bytes_max:
            return response, jobs[index:]
        out.append(job)
    return response, ()


# -- the service ----------------------------------------------------------------------------


Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class QueueServiceFront:
    """The eight RPCs of sepp.v1.QueueService over one SeppService."""

    def __init__(self, service: SeppService) -> None:
        self.service = service
        self.answer_bytes_max = ANSWER_BYTES_MAX

    # -- plumbing

    def handlers(self) -> grpc.GenericRpcHandler:
        def unary(method: Handler, request: Any, response: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                self._guarded(method),
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )

        return grpc.method_handlers_generic_handler(
            SERVICE_NAME,
            {
                "EnqueueBatch": unary(
                    self.enqueue_batch, pb.EnqueueBatchRequest, pb.EnqueueBatchResponse
                ),
                "EnqueueAtomic": unary(
                    self.enqueue_atomic, pb.EnqueueBatchRequest, pb.EnqueueAtomicResponse
                ),
                "Reserve": unary(self.reserve, pb.ReserveRequest, pb.ReserveResponse),
                "Ack": unary(self.ack, pb.AckRequest, pb.AckResponse),
                "Nack": unary(self.nack, pb.NackRequest, pb.NackResponse),
                "Extend": unary(self.extend, pb.ExtendRequest, pb.ExtendResponse),
                "DrainDeadLetters": unary(
                    self.drain_dead_letters,
                    pb.DrainDeadLettersRequest,
                    pb.DrainDeadLettersResponse,
                ),
                "GetServerInfo": unary(
                    self.get_server_info, pb.GetServerInfoRequest, pb.GetServerInfoResponse
                ),
            },
        )

    def _guarded(self, method: Handler) -> Handler:
        service = self.service

        async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                if service.pipeline is None:
                    raise _Refused(grpc.StatusCode.UNAVAILABLE, "the server is recovering")
                if service.auth_required:
                    self._authenticate(context)
                return await method(request, context)
            except _EXPECTED as exc:
                code, message = status_of(exc)
            await context.abort(code, message)

        return handler

    def _authenticate(self, context: grpc.aio.ServicerContext) -> None:
        """`authorization: Bearer <key>`; a missing header, another scheme or an
        unknown key is UNAUTHENTICATED."""
        api_key: str | None = None
        for name, value in context.invocation_metadata() or ():
            if name == "authorization":
                scheme, _, token = str(value).partition(" ")
                api_key = token.strip() if scheme.lower() == "bearer" else ""
                break
        if self.service.authenticate(api_key) not in AUTH_LET_IN:
            raise _Refused(grpc.StatusCode.UNAUTHENTICATED, "missing or unknown API key")

    # -- enqueue

    def _new_jobs(self, request: pb.EnqueueBatchRequest) -> tuple[Any, ...]:
        service = self.service
        jobs = request.jobs
        if len(jobs) == 1:  # the usual enqueue: one job
            return (convert.new_job(service.new_job_id(), jobs[0]),)
        # An empty or oversized batch is the core's INVALID_ARGUMENT.
        return tuple(map(convert.new_job, service.new_job_ids(len(jobs)), jobs))

    async def enqueue_batch(
        self, request: pb.EnqueueBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnqueueBatchResponse:
        # A large batch is stored in parts (sepp/server/parts.py).
        decision = await self.service.enqueue_durable(self._new_jobs(request), False)
        reply = _decided(decision).reply
        assert isinstance(reply, EnqueueResult)
        return convert.enqueue_batch_response(reply)

    async def enqueue_atomic(
        self, request: pb.EnqueueBatchRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnqueueAtomicResponse:
        decision = await self.service.enqueue_durable(self._new_jobs(request), True)
        reply = _decided(decision).reply
        return convert.enqueue_atomic_response(reply)  # type: ignore[arg-type]

    # -- reserve

    async def reserve(
        self, request: pb.ReserveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReserveResponse:
        if not request.HasField("lease_duration"):
            raise _invalid("lease_duration is required")
        lease_ms = convert.duration_ms(request.lease_duration)
        if lease_ms is None or lease_ms <= 0:
            raise _invalid("lease_duration must be at least 1 ms")
        wait_ms = 0
        if request.HasField("wait_timeout"):
            wait = convert.duration_ms(request.wait_timeout)
            if wait is None or wait < 0:
                raise _invalid("wait_timeout must be >= 0")
            wait_ms = wait
        service = self.service
        peer = context.peer()
        # Cancelled while parked (the call ended: client cancel, deadline,
        # disconnect), reserve_wait leases nothing.
        jobs = await service.reserve_wait(
            tuple(request.queues),
            lease_ms,
            request.max_jobs if request.HasField("max_jobs") else 1,
            request.worker_id if request.HasField("worker_id") else None,
            wait_ms,
            peer,
            answer_bytes_max=self.answer_bytes_max,
        )
        if not jobs:
            return pb.ReserveResponse()
        if context.cancelled():
            # Nobody reads this answer: hand the jobs back rather than let their
            # leases lapse (which would count an attempt nobody made).
            service.release_undelivered(jobs, peer)
            return pb.ReserveResponse()
        response, left_out = fit_jobs(jobs, self.answer_bytes_max)
        if left_out:
            service.release_undelivered(left_out, peer)
        return response

    # -- ack, nack, extend

    async def ack(
        self, request: pb.AckRequest, context: grpc.aio.ServicerContext
    ) -> pb.AckResponse:
        service = self.service
        decision, barrier = service.ack(
            request.job_id,
            request.attempt,
            request.worker_id if request.HasField("worker_id") else None,
        )
        await service.durable(barrier)
        reply = _decided(decision).reply
        assert isinstance(reply, AckResult)
        # The id as the server keeps it (canonical lowercase; ids compare
        # case-insensitively).
        return pb.AckResponse(job_id=reply.job_id)

    async def nack(
        self, request: pb.NackRequest, context: grpc.aio.ServicerContext
    ) -> pb.NackResponse:
        retry, delay_ms = RETRY_DEFAULT, None
        if request.HasField("retry"):
            strategy = request.retry.WhichOneof("strategy")
            if strategy is None:
                raise _invalid("a retry directive must name a strategy")
            if strategy == "delay":
                delay_ms = convert.duration_ms(request.retry.delay)
                if delay_ms is None or delay_ms < 0:
                    raise _invalid("a retry delay must be >= 0")
                retry = RETRY_DELAY
            elif strategy == "dead_letter":
                retry = RETRY_DEAD_LETTER
        service = self.service
        decision, barrier = service.nack(
            Nack(
                job_id=request.job_id,
                attempt=request.attempt,
                retry=retry,
                delay_ms=delay_ms,
                reason=request.reason if request.HasField("reason") else None,
                worker_id=request.worker_id if request.HasField("worker_id") else None,
            )
        )
        await service.durable(barrier)
        reply = _decided(decision).reply
        assert isinstance(reply, NackResult)
        return pb.NackResponse(job_id=reply.job_id, dead_lettered=reply.dead_lettered)

    async def extend(
        self, request: pb.ExtendRequest, context: grpc.aio.ServicerContext
    ) -> pb.ExtendResponse:
        if not request.HasField("lease_duration"):
            raise _invalid("lease_duration is required")
        lease_ms = convert.duration_ms(request.lease_duration)
        if lease_ms is None or lease_ms <= 0:
            raise _invalid("lease_duration must be at least 1 ms")
        service = self.service
        decision, barrier = service.extend(
            Extend(
                job_id=request.job_id,
                attempt=request.attempt,
                lease_ms=lease_ms,
                worker_id=request.worker_id if request.HasField("worker_id") else None,
            )
        )
        await service.durable(barrier)
        reply = _decided(decision).reply
        assert isinstance(reply, ExtendResult)
        return pb.ExtendResponse(
            job_id=reply.job_id, lease_expires_at=convert.ms_timestamp(reply.lease_expires_at)
        )

    # -- dead letters, server info

    async def drain_dead_letters(
        self, request: pb.DrainDeadLettersRequest, context: grpc.aio.ServicerContext
    ) -> pb.DrainDeadLettersResponse:
        service = self.service
        decision, barrier = service.drain_dead_letters(
            request.queue if request.HasField("queue") else None,
            request.max if request.HasField("max") else 1,
            context.peer(),
            max_bytes=self.answer_bytes_max,
        )
        await service.durable(barrier)
        reply = _decided(decision).reply
        assert isinstance(reply, DrainResult)
        return pb.DrainDeadLettersResponse(
            records=[convert.dead_letter_pb(record) for record in reply.records]
        )

    async def get_server_info(
        self, request: pb.GetServerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetServerInfoResponse:
        service = self.service
        info = service.server_info()
        await service.durable(service.read_barrier())
        return convert.server_info_pb(info)


# -- health ---------------------------------------------------------------------------------


class _Health(health_async.HealthServicer):  # type: ignore[misc]
    """grpc.health.v1.Health, outside auth: SERVING for "" and SERVICE_NAME while
    the service serves; NOT_SERVING while recovering, once shutdown began or
    storage failed (service.health())."""

    def __init__(self, service: SeppService) -> None:
        super().__init__()
        self.service = service

    async def Check(  # the gRPC method's name
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        if request.service not in ("", SERVICE_NAME):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        service = self.service
        serving = service.pipeline is not None and service.health().serving
        return health_pb2.HealthCheckResponse(
            status=health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )


# -- the listener ----------------------------------------------------------------------------


def _tls_credentials(service: SeppService) -> grpc.ServerCredentials | None:
    """TLS from the native listener's settings (server.tls_cert_path / tls_key_path;
    the CLI has checked the files before recovery)."""
    cert = service.config.get("server", "tls_cert_path")
    key = service.config.get("server", "tls_key_path")
    if cert is None or key is None:
        return None
    with open(key, "rb") as key_file, open(cert, "rb") as cert_file:
        return grpc.ssl_server_credentials([(key_file.read(), cert_file.read())])


class GrpcListener:
    """The gRPC front on one address, in the running loop (SeppServer starts and
    stops it like the admin listener)."""

    name = "grpc"

    def __init__(self, service: SeppService) -> None:
        self.service = service
        self.front = QueueServiceFront(service)
        self.address: tuple[str, int] | None = None
        self.tls = False
        self._server: grpc.aio.Server | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        """Listen; returns the bound (host, port). Raises OSError."""
        receive_bytes_max = self.service.config.get("limits", "max_message_bytes")
        server = grpc.aio.server(options=server_options(receive_bytes_max))
        server.add_generic_rpc_handlers((self.front.handlers(),))
        health_pb2_grpc.add_HealthServicer_to_server(_Health(self.service), server)
        target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        credentials = _tls_credentials(self.service)
        try:
            if credentials is None:
                bound_port = server.add_insecure_port(target)
            else:
                bound_port = server.add_secure_port(target, credentials)
        except RuntimeError as exc:  # grpcio: "Failed to bind to address ..."
            raise OSError(f"cannot bind {target}: {exc}") from None
        if not bound_port:
            raise OSError(f"cannot bind {target}")
        await server.start()
        self._server = server
        self.tls = credentials is not None
        self.address = (host, bound_port)
        log.info(
            "grpc (sepp.v1) listening on %s:%d (%s)",
            host,
            bound_port,
            "TLS" if self.tls else "plaintext",
        )
        return self.address

    async def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace_s)
