"""Exceptions and rejection values of the sepp client.

Owns: the exception tree (names and shapes follow sepp-py 0.1.0, so code that
catches its errors catches ours), the per-job rejection values an enqueue returns,
and the two translations from the wire into them: `error_from_response` (a
response with an error status) and `rejection_from_wire` (one rejection map of an
enqueue answer).

Shape of the tree:

* `SeppError` is the root of everything raised here. Errors built from a server
  answer carry the wire `code`, `reason` and the whole error body as `details`.
* `ClientError` and its subclasses: transport and protocol failures any call may
  raise (`TransportError`, `OverloadedError`, `UnauthenticatedError`, ...);
  `NotLeaderError` (a `TransportError`): in cluster mode, no leader could be
  reached before the call's deadline, or a deposed leader could not say whether
  the request was done.
* `LeaseError` (`JobNotFoundError`, `AttemptMismatchError`): the caller no longer
  owns the job. `ReserveError` (`UnknownQueuesError`): strict mode refused a
  reserve; `UndecodableJobError`: a reserve delivered jobs this client cannot
  decode (it carries them raw). `UndecodableDeadLetterError`: the same for a
  drain.
* `JobRejection` subclasses are values, not exceptions: one per refused job.
  `JobRejectedError` and `BatchValidationError` wrap them for the single-job and
  atomic enqueue.

Must not import: asyncio, sockets, sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sepp.protocol.errors import (
    FAILED_PRECONDITION,
    INTERNAL,
    INVALID_ARGUMENT,
    NOT_FOUND,
    PERMISSION_DENIED,
    REASON_ATTEMPT_MISMATCH,
    REASON_FRAME_TOO_LARGE,
    REASON_NOT_LEADER,
    REASON_QUEUE_IN_USE,
    REASON_UNKNOWN_QUEUE,
    RESOURCE_EXHAUSTED,
    UNAUTHENTICATED,
    UNAVAILABLE,
)
from sepp.protocol.messages import OP_ACK, OP_EXTEND, OP_NACK, OP_RELEASE, OP_RESERVE

if TYPE_CHECKING:
    from sepp.client.types import DeadLetterRecord, Job, UndecodableDeadLetter, UndecodableJob

__all__ = [
    "AttemptMismatchError",
    "BatchResultCountMismatchError",
    "BatchValidationError",
    "ClientClosedError",
    "ClientError",
    "ConnectError",
    "CustomEntriesTooMany",
    "CustomKeyTooLong",
    "CustomMapTooLarge",
    "EmptyBatchError",
    "EncodingNotAllowed",
    "IdempotencyKeyTooLong",
    "InvalidApiKeyError",
    "InvalidRequest",
    "InvalidRequestError",
    "JobConversionError",
    "JobNotFoundError",
    "JobRejectedError",
    "JobRejection",
    "JobTypeNameTooLong",
    "JobTypeNotAllowed",
    "JobValidationError",
    "LeaseError",
    "MalformedJobError",
    "MalformedResponseError",
    "MalformedServerInfoError",
    "MessageTooLargeError",
    "NotLeaderError",
    "OverloadedError",
    "PayloadTooLarge",
    "PermissionDeniedError",
    "QueueClosing",
    "QueueFull",
    "QueueInUseError",
    "QueueNameTooLong",
    "QueueNotFoundError",
    "ReserveError",
    "ScheduleNotFoundError",
    "ScheduledTooFar",
    "SeppError",
    "ServerInfoError",
    "ServerInternalError",
    "TransportError",
    "UnauthenticatedError",
    "UndecodableDeadLetterError",
    "UndecodableJobError",
    "UnexpectedStatusError",
    "UnknownQueue",
    "UnknownQueuesError",
    "UnknownRejection",
    "UnsupportedProtocolError",
]

# Codes of TransportError raised by the client itself (the server never sends them).
CONNECTION_LOST = "connection_lost"
DEADLINE_EXCEEDED = "deadline_exceeded"


class SeppError(Exception):
    """The root of every error this library raises.

    When an error was built from a server answer, `code` is the wire status
    (e.g. ``"not_found"``), `reason` its optional detail reason and `details`
    the whole error body; otherwise they are ``None``, ``None`` and ``{}``.
    """

    code: str | None = None
    reason: str | None = None
    details: Mapping[str, Any] = {}


def _stamp(error: SeppError, code: str | None, body: Mapping[str, Any] | None) -> SeppError:
    error.code = code
    if body is not None:
        reason = body.get("reason")
        error.reason = reason if isinstance(reason, str) else None
        error.details = dict(body)
    return error


# -- transport and protocol failures -------------------------------------------


class ClientError(SeppError):
    """A transport or protocol failure that any call may raise.

    Wire codes map onto the subclasses: ``unavailable`` and a lost or timed-out
    connection become `TransportError`, ``resource_exhausted`` becomes
    `OverloadedError`, ``unauthenticated`` `UnauthenticatedError`,
    ``invalid_argument`` `InvalidRequestError`, ``internal``
    `ServerInternalError`. The retry policy retries the transient ones.
    """


class ConnectError(ClientError):
    """Opening the connection (TCP, TLS or the ``hello`` handshake) failed."""

    def __init__(self, addr: str, reason: str) -> None:
        self.addr = addr
        # As in sepp-py, `reason` here is the human-readable cause.
        self.reason = reason
        super().__init__(f"cannot connect to the sepp server at {addr}: {reason}")


class UnsupportedProtocolError(ConnectError):
    """The server does not speak this client's protocol version.

    `supported_protocol_versions` lists what the server offered, when it said.
    Not transient: retrying cannot help.
    """

    def __init__(self, addr: str, reason: str, supported_protocol_versions: list[Any]) -> None:
        super().__init__(addr, reason)
        self.supported_protocol_versions = supported_protocol_versions


class InvalidApiKeyError(ClientError):
    """The configured API key cannot be sent (it is empty or not a string)."""

    def __init__(self) -> None:
        super().__init__("the API key must be a non-empty string")


class TransportError(ClientError):
    """A transient transport failure: the connection dropped, a deadline passed,
    or the server is shutting down (``unavailable``). `code` tells which:
    ``"connection_lost"``, ``"deadline_exceeded"`` or ``"unavailable"``.
    Retry-safe calls are retried on it when a retry policy is configured.
    """

    def __init__(self, message: str = "", *, code: str = CONNECTION_LOST) -> None:
        super().__init__(message or "the connection to the sepp server failed")
        self.code = code


class NotLeaderError(TransportError):
    """Cluster mode: the node asked is not the serving leader (``unavailable``
    with reason ``not_leader``), and the client could not get the request done
    by the leader before the call's deadline.

    The client handles the ordinary case itself: a request a node refused
    because it is not the leader was not done, so it is sent again at the
    leader the refusal names (or the one the client finds by asking the other
    addresses), for every operation, reserve included, within the call's
    deadline. This error reaches the caller only when:

    * no node answered as leader before the deadline (an election is taking
      longer; `leader` is the last leader a node named, or None), or
    * `outcome_unknown` is true: a leader lost its leadership with the request
      in flight and cannot say whether it was done. Only requests that are
      safe to repeat are sent again after that (an enqueue whose every job has
      an idempotency key, ack / nack / extend / release, reads); a reserve or
      an enqueue without keys gets this error, like a dropped connection.

    `code` is ``"unavailable"`` and `reason` ``"not_leader"``; transient: a
    `RetryPolicy` retries it for the calls it covers.
    """

    def __init__(
        self, message: str = "", *, leader: str | None = None, outcome_unknown: bool = False
    ) -> None:
        super().__init__(message or "no sepp node answered as the leader", code=UNAVAILABLE)
        self.reason = REASON_NOT_LEADER
        self.leader = leader
        self.outcome_unknown = outcome_unknown


class ClientClosedError(ClientError):
    """The client was closed; make a new one with `SeppClient.connect`."""

    def __init__(self) -> None:
        super().__init__("the sepp client is closed")


class UnauthenticatedError(ClientError):
    """The server refused the credentials (API key missing or unknown)."""


class OverloadedError(ClientError):
    """The server is shedding load (``resource_exhausted``: its commit backlog or
    this connection's in-flight cap is full); back off and retry."""


class MessageTooLargeError(OverloadedError):
    """A request frame is over the server's ``max_message_bytes``.

    Raised before sending when the client knows the limit (from ``hello``), or
    when the server answers ``frame_too_large``. Never retried: the same
    request cannot fit later. A subclass of `OverloadedError` because that is
    what an oversized gRPC message becomes in sepp-py.
    """

    def __init__(self, message: str, *, size: int | None = None, limit: int | None = None) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class InvalidRequestError(ClientError):
    """The server refused the request as malformed (``invalid_argument``).
    `field` names the field at fault when the server said (a schedule's
    ``cron``, ``timezone``, ``every_ms``, ...), else ``None``."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ServerInternalError(ClientError):
    """The server failed internally (``internal``, e.g. its storage failed); the
    outcome of the command is unknown."""


class UnexpectedStatusError(ClientError):
    """The server answered with a status this client does not map to a more
    specific error for that operation."""

    def __init__(self, code: str, message: str) -> None:
        self.status_message = message
        super().__init__(f"server returned unexpected status {code!r}: {message}")
        self.code = code


class EmptyBatchError(ClientError):
    """An enqueue was called with no jobs."""

    def __init__(self) -> None:
        super().__init__("empty batch")


class BatchResultCountMismatchError(ClientError):
    """The server returned a different number of results than jobs sent."""

    def __init__(self, expected: int, got: int) -> None:
        self.expected = expected
        self.got = got
        super().__init__(f"server returned {got} results for a batch of {expected} jobs")


class MalformedResponseError(ClientError):
    """A response broke the protocol: a missing or mistyped field, a frame that
    is not a response, an unexpected shape."""


class JobConversionError(SeppError):
    """A job received from the server could not be decoded. `reserve` and
    `drain_dead_letters` never skip such a job: they raise
    `UndecodableJobError` / `UndecodableDeadLetterError` carrying it raw."""


class ServerInfoError(SeppError):
    """A ``server_info`` answer could not be decoded into a `ServerInfo`."""


class MalformedJobError(ClientError):
    """A job in a response could not be decoded; `cause` says why."""

    def __init__(self, cause: JobConversionError) -> None:
        self.cause = cause
        super().__init__(f"server returned a malformed job: {cause}")


class MalformedServerInfoError(ClientError):
    """A server-info answer could not be decoded; `cause` says why."""

    def __init__(self, cause: ServerInfoError) -> None:
        self.cause = cause
        super().__init__(f"server returned malformed server info: {cause}")


# -- per-job rejections (values) --------------------------------------------------


class JobRejection:
    """Why the server refused one job of an enqueue: a value, not an exception.

    `enqueue_batch` returns these in place of an `EnqueueAck`; match on the
    subclass (``isinstance(r, PayloadTooLarge)``). All are deterministic (the
    same job is refused again) except `QueueFull` and `QueueClosing`, whose
    `transient` is true.
    """

    @property
    def message(self) -> str:
        raise NotImplementedError

    @property
    def transient(self) -> bool:
        """Whether the same job may be accepted later, unchanged."""
        return False

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class UnknownQueue(JobRejection):
    """Strict mode: the queue is not declared on the server."""

    queue: str

    @property
    def message(self) -> str:
        return f"queue {self.queue!r} is not declared (the server is in strict mode)"


@dataclass(frozen=True)
class PayloadTooLarge(JobRejection):
    """The payload is longer than the queue's ``max_payload_bytes``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"payload of {self.actual} bytes is over the limit of {self.limit} bytes"


@dataclass(frozen=True)
class EncodingNotAllowed(JobRejection):
    """The payload's encoding is not on the queue's allow-list."""

    encoding: str
    allowed: list[str]

    @property
    def message(self) -> str:
        return f"encoding {self.encoding!r} is not allowed (allowed: {self.allowed})"


@dataclass(frozen=True)
class JobTypeNotAllowed(JobRejection):
    """The job type is not on the queue's allow-list."""

    job_type: str
    allowed: list[str]

    @property
    def message(self) -> str:
        return f"job type {self.job_type!r} is not allowed (allowed: {self.allowed})"


@dataclass(frozen=True)
class CustomEntriesTooMany(JobRejection):
    """The custom map has more entries than ``max_custom_entries``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"custom map has {self.actual} entries; at most {self.limit} are allowed"


@dataclass(frozen=True)
class CustomMapTooLarge(JobRejection):
    """The custom map's keys and values add up to more than
    ``max_custom_total_bytes``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"custom map of {self.actual} bytes is over the limit of {self.limit} bytes"


@dataclass(frozen=True)
class CustomKeyTooLong(JobRejection):
    """One custom key is longer than ``max_custom_key_bytes``."""

    key: str
    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"custom key {self.key!r} has {self.actual} bytes; the limit is {self.limit}"


@dataclass(frozen=True)
class QueueNameTooLong(JobRejection):
    """The queue name is longer than ``max_queue_name_bytes``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"queue name has {self.actual} bytes; the limit is {self.limit}"


@dataclass(frozen=True)
class JobTypeNameTooLong(JobRejection):
    """The job type is longer than ``max_job_type_bytes``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"job type has {self.actual} bytes; the limit is {self.limit}"


@dataclass(frozen=True)
class IdempotencyKeyTooLong(JobRejection):
    """The idempotency key is longer than ``max_idempotency_key_bytes``."""

    limit: int
    actual: int

    @property
    def message(self) -> str:
        return f"idempotency key has {self.actual} bytes; the limit is {self.limit}"


@dataclass(frozen=True)
class ScheduledTooFar(JobRejection):
    """``scheduled_at`` lies beyond the server's schedule horizon.

    `actual` is the requested run time, `horizon` the furthest distance from
    the server's now that it accepts."""

    horizon: timedelta
    actual: datetime

    @property
    def message(self) -> str:
        return f"scheduled_at {self.actual.isoformat()} is beyond the horizon of {self.horizon}"


@dataclass(frozen=True)
class InvalidRequest(JobRejection):
    """The job failed structural validation; `detail` says how."""

    detail: str

    @property
    def message(self) -> str:
        return f"invalid job: {self.detail}"


@dataclass(frozen=True)
class QueueFull(JobRejection):
    """The queue is at its ``max_queue_depth``. Transient: it clears as the
    queue drains."""

    queue: str
    limit: int

    @property
    def message(self) -> str:
        return f"queue {self.queue!r} is full ({self.limit} jobs)"

    @property
    def transient(self) -> bool:
        return True


@dataclass(frozen=True)
class QueueClosing(JobRejection):
    """The queue is being deleted. Transient: it clears when the deletion ends
    or is abandoned."""

    queue: str

    @property
    def message(self) -> str:
        return f"queue {self.queue!r} is being deleted and accepts no jobs"

    @property
    def transient(self) -> bool:
        return True


@dataclass(frozen=True)
class UnknownRejection(JobRejection):
    """A rejection reason this client version does not know. `reason` is the
    wire reason, `detail` the server's message."""

    reason: str = ""
    detail: str = ""
    server_transient: bool = field(default=False, repr=False, compare=False)

    @property
    def message(self) -> str:
        if self.reason:
            return f"rejected for a reason this client does not know ({self.reason}): {self.detail}"
        return "rejected for a reason this client does not know"

    @property
    def transient(self) -> bool:
        return self.server_transient


@dataclass(frozen=True)
class JobValidationError:
    """One failing job of an atomic batch: its zero-based `index` in the request
    and its `rejection`."""

    index: int
    rejection: JobRejection


class JobRejectedError(SeppError):
    """The single-job `enqueue` was refused; `rejection` says why."""

    def __init__(self, rejection: JobRejection) -> None:
        self.rejection = rejection
        super().__init__(f"the server rejected the job: {rejection}")


class BatchValidationError(SeppError):
    """An atomic enqueue stored nothing because jobs failed validation; `errors`
    lists every failing job."""

    def __init__(self, errors: list[JobValidationError]) -> None:
        self.errors = errors
        indexes = ", ".join(str(e.index) for e in errors)
        super().__init__(f"atomic batch rejected: {len(errors)} job(s) failed (indexes {indexes})")


# -- lease and reserve failures -----------------------------------------------------


class LeaseError(SeppError):
    """Base of the fencing failures of ack, nack and extend: the caller no longer
    holds the job's lease (it expired and the job moved on)."""


class JobNotFoundError(LeaseError):
    """No in-flight job has this id: already acked or dead-lettered, its lease
    expired, or it never existed (``not_found``)."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "no in-flight job with this id")


class AttemptMismatchError(LeaseError):
    """The job is in flight under a newer attempt: the lease was reassigned.
    `current_attempt` is the server's attempt, when it said."""

    def __init__(self, message: str = "", current_attempt: int | None = None) -> None:
        super().__init__(message or "attempt mismatch: the lease was reassigned")
        self.current_attempt = current_attempt


class ReserveError(SeppError):
    """Base of the domain failures of `reserve`."""


class UndecodableJobError(ReserveError):
    """A reserve answer held jobs this client cannot decode (see
    `UndecodableJob`). Nothing of the answer is lost or skipped:

    * `undecodable`: the jobs that could not be decoded, each with its raw map,
      id, attempt and the reason; they are leased to you — nack them (e.g.
      ``RetryDirective.DEAD_LETTER`` with ``reason=u.reason``) or ack them;
    * `jobs`: the jobs of the same answer that decoded, leased too: handle them
      as if `reserve` had returned them.
    """

    def __init__(self, jobs: list[Job], undecodable: list[UndecodableJob]) -> None:
        described = "; ".join(
            f"job {u.id} (attempt {u.attempt}, queue {u.queue!r}): {u.error}" for u in undecodable
        )
        super().__init__(
            f"{len(undecodable)} reserved job(s) cannot be decoded by this client "
            f"and are leased to you (nack or ack them): {described}"
        )
        self.jobs = jobs
        self.undecodable = undecodable


class UndecodableDeadLetterError(SeppError):
    """A drain answer held dead-letter records this client cannot decode. The
    drain already deleted them on the server, so they are handed over raw:

    * `undecodable`: the records that could not be decoded (`UndecodableDeadLetter`:
      the raw record map, job id, queue, reason) — the only copy;
    * `records`: the records of the same answer that decoded.
    """

    def __init__(
        self, records: list[DeadLetterRecord], undecodable: list[UndecodableDeadLetter]
    ) -> None:
        described = "; ".join(f"job {u.job_id} (queue {u.queue!r}): {u.error}" for u in undecodable)
        super().__init__(
            f"{len(undecodable)} drained dead-letter record(s) cannot be decoded by this "
            f"client; they are deleted on the server, the raw records are in "
            f"`undecodable`: {described}"
        )
        self.records = records
        self.undecodable = undecodable


class PermissionDeniedError(ClientError):
    """The connection's role may not do this admin operation (PROTOCOL.md 5.14)."""


class QueueNotFoundError(ClientError):
    """An admin operation named a queue the server does not know. `queue` names
    it, when the server said."""

    def __init__(self, message: str, queue: str | None = None) -> None:
        super().__init__(message)
        self.queue = queue


class QueueInUseError(ClientError):
    """A queue cannot be deleted now: it has jobs in flight (or more ready and
    scheduled jobs than one call deletes: purge it first)."""

    def __init__(self, message: str, queue: str | None = None) -> None:
        super().__init__(message)
        self.queue = queue


class ScheduleNotFoundError(ClientError):
    """A schedule operation named a schedule the server does not hold.
    `schedule` names it, when the server said."""

    def __init__(self, message: str, schedule: str | None = None) -> None:
        super().__init__(message)
        self.schedule = schedule


class UnknownQueuesError(ReserveError):
    """Strict mode: a reserve named queues the server does not declare.
    `queues` lists them, when the server said."""

    def __init__(self, message: str, queues: list[str] | None = None) -> None:
        super().__init__(f"requested queues are not declared on the server: {message}")
        self.queues = list(queues or [])


# -- translation from the wire ------------------------------------------------------------

_LEASE_OPS = frozenset({OP_ACK, OP_NACK, OP_EXTEND, OP_RELEASE})


def error_from_response(op: str, code: str, body: Mapping[str, Any]) -> SeppError:
    """The exception for an error answer `code` to a request of operation `op`
    (``op`` is ``""`` for a connection-level error frame)."""
    message = body.get("message")
    text = message if isinstance(message, str) else ""
    reason = body.get("reason")
    error: SeppError
    if code == INVALID_ARGUMENT:
        field = body.get("field")
        error = InvalidRequestError(text, field if isinstance(field, str) else None)
    elif code == NOT_FOUND and op in _LEASE_OPS:
        error = JobNotFoundError(text)
    elif code == FAILED_PRECONDITION and (
        reason == REASON_ATTEMPT_MISMATCH or (reason is None and op in _LEASE_OPS)
    ):
        current = body.get("current_attempt")
        error = AttemptMismatchError(text, current if type(current) is int else None)
    elif code == FAILED_PRECONDITION and (
        reason == REASON_UNKNOWN_QUEUE or (reason is None and op == OP_RESERVE)
    ):
        queues = body.get("queues")
        names = [q for q in queues if isinstance(q, str)] if isinstance(queues, list) else []
        error = UnknownQueuesError(text, names)
    elif code == FAILED_PRECONDITION and reason == REASON_QUEUE_IN_USE:
        queue = body.get("queue")
        error = QueueInUseError(text, queue if isinstance(queue, str) else None)
    elif code == NOT_FOUND and isinstance(body.get("queue"), str):
        error = QueueNotFoundError(text, body["queue"])
    elif code == NOT_FOUND and isinstance(body.get("schedule"), str):
        error = ScheduleNotFoundError(text, body["schedule"])
    elif code == PERMISSION_DENIED:
        error = PermissionDeniedError(text)
    elif code == UNAUTHENTICATED:
        error = UnauthenticatedError(text)
    elif code == RESOURCE_EXHAUSTED and reason == REASON_FRAME_TOO_LARGE:
        error = MessageTooLargeError(text)
    elif code == RESOURCE_EXHAUSTED:
        error = OverloadedError(text)
    elif code == UNAVAILABLE and reason == REASON_NOT_LEADER:
        leader = body.get("leader")
        error = NotLeaderError(
            text,
            leader=leader if isinstance(leader, str) and leader else None,
            outcome_unknown=body.get("outcome_unknown") is True,
        )
    elif code == UNAVAILABLE:
        error = TransportError(text, code=UNAVAILABLE)
    elif code == INTERNAL:
        error = ServerInternalError(text)
    else:
        error = UnexpectedStatusError(code, text)
    return _stamp(error, code, body)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _text(raw: Mapping[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise MalformedResponseError(f"rejection field {name!r} must be a string")
    return value


def _count(raw: Mapping[str, Any], name: str) -> int:
    value = raw.get(name)
    if type(value) is not int:
        raise MalformedResponseError(f"rejection field {name!r} must be an integer")
    return value


def _texts(raw: Mapping[str, Any], name: str) -> list[str]:
    value = raw.get(name)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise MalformedResponseError(f"rejection field {name!r} must be an array of strings")
    return list(value)


def _scheduled_too_far(raw: Mapping[str, Any]) -> ScheduledTooFar:
    try:
        actual = _EPOCH + timedelta(milliseconds=_count(raw, "actual"))
        horizon = timedelta(milliseconds=_count(raw, "horizon_ms"))
    except OverflowError as exc:
        raise MalformedResponseError("scheduled_too_far times are out of range") from exc
    return ScheduledTooFar(horizon=horizon, actual=actual)


_REJECTIONS: dict[str, Callable[[Mapping[str, Any]], JobRejection]] = {
    "unknown_queue": lambda r: UnknownQueue(_text(r, "queue")),
    "payload_too_large": lambda r: PayloadTooLarge(_count(r, "limit"), _count(r, "actual")),
    "encoding_not_allowed": lambda r: EncodingNotAllowed(
        _text(r, "encoding"), _texts(r, "allowed")
    ),
    "job_type_not_allowed": lambda r: JobTypeNotAllowed(_text(r, "job_type"), _texts(r, "allowed")),
    "custom_entries_too_many": lambda r: CustomEntriesTooMany(
        _count(r, "limit"), _count(r, "actual")
    ),
    "custom_map_too_large": lambda r: CustomMapTooLarge(_count(r, "limit"), _count(r, "actual")),
    "custom_key_too_long": lambda r: CustomKeyTooLong(
        _text(r, "key"), _count(r, "limit"), _count(r, "actual")
    ),
    "queue_name_too_long": lambda r: QueueNameTooLong(_count(r, "limit"), _count(r, "actual")),
    "job_type_name_too_long": lambda r: JobTypeNameTooLong(_count(r, "limit"), _count(r, "actual")),
    "idempotency_key_too_long": lambda r: IdempotencyKeyTooLong(
        _count(r, "limit"), _count(r, "actual")
    ),
    "scheduled_too_far": _scheduled_too_far,
    "invalid_request": lambda r: InvalidRequest(_text(r, "message")),
    "queue_full": lambda r: QueueFull(_text(r, "queue"), _count(r, "limit")),
    "queue_closing": lambda r: QueueClosing(_text(r, "queue")),
}


def rejection_from_wire(raw: Any) -> JobRejection:
    """One ``{"reason": ..., "message": ..., ...fields}`` map of an enqueue answer.
    An unknown reason becomes `UnknownRejection`; a known reason with missing or
    mistyped fields raises `MalformedResponseError`."""
    if not isinstance(raw, dict):
        raise MalformedResponseError("a rejection must be a map")
    reason = raw.get("reason")
    build = _REJECTIONS.get(reason) if isinstance(reason, str) else None
    if build is None:
        message = raw.get("message")
        return UnknownRejection(
            reason if isinstance(reason, str) else "",
            message if isinstance(message, str) else "",
            raw.get("transient") is True,
        )
    return build(raw)
