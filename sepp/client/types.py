"""Domain types of the sepp client: what goes into an enqueue and what comes out
of a reserve, a drain, server info and queue stats.

Owns: the plain value classes of the public API. Names, fields and defaults follow
sepp-py 0.1.0; our additions (`QueueStats`, `HealthStatus`, the last three fields
of `ServerInfo`) come after everything sepp-py has, with defaults, so positional
construction stays compatible. Times are timezone-aware UTC `datetime`s and
durations are `timedelta`s; the wire's millisecond integers never show here.

Must not import: asyncio, sockets, sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from sepp.client.client import Lease

__all__ = [
    "AdminOutcomes",
    "ClusterInfo",
    "DeadLetterCause",
    "DeadLetterRecord",
    "DeleteQueueResult",
    "EnqueueAck",
    "EnqueueRequest",
    "HealthStatus",
    "Job",
    "JobCtx",
    "JobInfo",
    "JobPage",
    "Payload",
    "Primitive",
    "Priority",
    "PriorityOutOfRangeError",
    "PurgeResult",
    "PutQueueResult",
    "QueueChange",
    "QueueInfo",
    "QueueStats",
    "ReserveOptions",
    "ScheduleChange",
    "ScheduleInfo",
    "ServerInfo",
    "TraceContext",
    "TraceContextError",
]

# A reserve waits this long for a job when the caller does not say.
DEFAULT_WAIT_TIMEOUT = timedelta(seconds=30)

# The value type of a job's `custom` map.
Primitive = str | int | float | bool


@dataclass(frozen=True)
class Payload:
    """A job's body: opaque bytes and an encoding hint such as
    ``"application/json"``.

    The server stores `data` without looking at it; a queue may restrict the
    encodings it accepts. The server refuses empty `data` or `encoding`: for a
    job without a body pass ``payload=None``.
    """

    data: bytes
    encoding: str

    # Written out (the dataclass keeps it) to set the two fields in the instance's
    # dict directly: a frozen dataclass's own __init__ sets each through
    # object.__setattr__, and checks in a __post_init__ call (a third of the
    # cost of an enqueue's request objects went there).
    def __init__(self, data: bytes, encoding: str) -> None:
        if type(data) is not bytes or type(encoding) is not str:
            data = _payload_data(data)
            if not isinstance(encoding, str):
                raise TypeError(
                    "Payload encoding must be a str such as 'application/json'; "
                    f"got {type(encoding).__name__}"
                )
        fields = self.__dict__
        fields["data"] = data
        fields["encoding"] = encoding


def _payload_data(data: object) -> bytes:
    """A payload's data as bytes (from a bytearray or memoryview too); TypeError
    for anything else."""
    if isinstance(data, bytearray | memoryview):
        return bytes(data)
    if not isinstance(data, bytes):
        hint = " (encode text first: 'text'.encode())" if isinstance(data, str) else ""
        raise TypeError(
            f"Payload data must be bytes{hint}, e.g. Payload(b'{{}}', 'application/json'); "
            f"got {type(data).__name__}"
        )
    return data


class QueueListError(TypeError, ValueError):
    """`queues` was one string instead of a list of names. A `TypeError`, and a
    `ValueError` as sepp-py raises for it."""


def _expect(name: str, value: object, expected: type, what: str) -> None:
    """Refuse a wrongly typed argument at the call, saying what is expected
    (rather than an AttributeError from deep inside the client). A bool is not
    taken for an int."""
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise TypeError(f"{name} must be {what}; got {type(value).__name__} {value!r:.80}")


class PriorityOutOfRangeError(ValueError):
    """A `Priority` outside ``0..9``."""

    def __init__(self, value: object) -> None:
        self.value = value
        super().__init__(f"priority must be an integer from 0 to 9, got {value!r}")


@dataclass(frozen=True, order=True)
class Priority:
    """A job priority from 0 to 9; jobs with a higher value are reserved first.

    ``Priority(7)`` or the constants `P0` .. `P9` (`MIN` is `P0`, `MAX` is `P9`).
    """

    value: int

    MIN: ClassVar[Priority]
    MAX: ClassVar[Priority]
    P0: ClassVar[Priority]
    P1: ClassVar[Priority]
    P2: ClassVar[Priority]
    P3: ClassVar[Priority]
    P4: ClassVar[Priority]
    P5: ClassVar[Priority]
    P6: ClassVar[Priority]
    P7: ClassVar[Priority]
    P8: ClassVar[Priority]
    P9: ClassVar[Priority]

    def __post_init__(self) -> None:
        value = self.value
        if type(value) is not int or not 0 <= value <= 9:
            raise PriorityOutOfRangeError(value)

    def __int__(self) -> int:
        return self.value

    def __str__(self) -> str:
        return str(self.value)


for _n in range(10):
    setattr(Priority, f"P{_n}", Priority(_n))
Priority.MIN = Priority.P0
Priority.MAX = Priority.P9


class TraceContextError(ValueError):
    """A malformed W3C ``traceparent``."""


_HEX = frozenset("0123456789abcdefABCDEF")


def _check_traceparent(traceparent: str) -> None:
    # version-traceid-spanid-flags: 2, 32, 16 and 2 hex digits; ids not all zero.
    parts = traceparent.split("-")
    if len(parts) != 4:
        raise TraceContextError("traceparent must have four fields separated by '-'")
    for name, part, width in zip(
        ("version", "trace id", "span id", "flags"), parts, (2, 32, 16, 2)
    ):
        if len(part) != width or not _HEX.issuperset(part):
            raise TraceContextError(f"traceparent {name} must be {width} hex digits")
    if set(parts[1]) == {"0"} or set(parts[2]) == {"0"}:
        raise TraceContextError("traceparent trace id and span id must not be all zeros")


@dataclass(frozen=True)
class TraceContext:
    """A W3C trace context carried by a job from its producer to its worker.

    `traceparent` is checked on construction. With OpenTelemetry installed the
    client fills it in from the current span on enqueue and the `Worker` links
    its processing span to it; build one by hand only to bridge another tracing
    system.
    """

    traceparent: str
    tracestate: str | None = None

    def __post_init__(self) -> None:
        _check_traceparent(self.traceparent)

    @classmethod
    def from_current_otel(cls) -> TraceContext | None:
        """The current OpenTelemetry span as a trace context, or ``None`` when
        there is no valid span or OpenTelemetry is not installed."""
        from sepp.client import _otel

        headers = _otel.current_trace_headers()
        if headers is None:
            return None
        try:
            return cls(*headers)
        except TraceContextError:
            return None

    def attach_to_otel(self) -> contextlib.AbstractContextManager[None]:
        """A context manager that makes this the current OpenTelemetry context
        inside its block (a no-op without OpenTelemetry)."""
        from sepp.client import _otel

        return _otel.attach_trace_context(self.traceparent, self.tracestate)

    def otel_span_context(self) -> Any:
        """This trace context as an OpenTelemetry ``SpanContext`` (for a span
        link), or ``None`` if invalid or OpenTelemetry is not installed."""
        from sepp.client import _otel

        return _otel.span_context(self.traceparent, self.tracestate)


@dataclass
class EnqueueRequest:
    """One job to enqueue.

    `queue` and `job_type` must be non-empty. Everything else is optional and
    falls back to the queue's defaults on the server. `priority` takes a
    `Priority` or an int 0..9; `scheduled_at` (naive means UTC) delays delivery
    until then; `idempotency_key` makes the server drop repeats of this job
    within its dedup window.
    """

    queue: str
    job_type: str
    payload: Payload | None = None
    idempotency_key: str | None = None
    priority: Priority | int | None = None
    max_attempts: int | None = None
    custom: Mapping[str, Primitive] = field(default_factory=dict)
    trace_context: TraceContext | None = None
    scheduled_at: datetime | None = None

    def __post_init__(self) -> None:
        if (
            type(self.queue) is str
            and type(self.job_type) is str
            and self.queue
            and self.job_type
            and (self.payload is None or type(self.payload) is Payload)
            and (self.idempotency_key is None or type(self.idempotency_key) is str)
            and (self.priority is None or type(self.priority) is Priority)
            and self.max_attempts is None
            and type(self.custom) is dict
            and self.trace_context is None
            and self.scheduled_at is None
        ):
            return  # the common call, in one test; anything else is checked below
        _expect("queue", self.queue, str, "a queue name (str)")
        _expect("job_type", self.job_type, str, "a job type name (str)")
        if self.payload is not None and not isinstance(self.payload, Payload):
            raise TypeError(
                "payload must be a Payload or None, e.g. "
                "payload=Payload(b'{\"user\": 42}', 'application/json'); "
                f"got {type(self.payload).__name__}"
            )
        if self.idempotency_key is not None:
            _expect("idempotency_key", self.idempotency_key, str, "a str or None")
        if self.max_attempts is not None:
            _expect("max_attempts", self.max_attempts, int, "an int or None")
        _expect("custom", self.custom, Mapping, "a mapping of str to str, int, float or bool")
        if self.trace_context is not None:
            _expect("trace_context", self.trace_context, TraceContext, "a TraceContext or None")
        if self.scheduled_at is not None and not isinstance(self.scheduled_at, datetime):
            raise TypeError(
                "scheduled_at must be a datetime (timezone-aware, or naive meaning UTC) or "
                "None; for a Unix timestamp use datetime.fromtimestamp(ts, timezone.utc); "
                f"got {type(self.scheduled_at).__name__} {self.scheduled_at!r:.80}"
            )
        if not self.queue:
            raise ValueError("queue must not be empty")
        if not self.job_type:
            raise ValueError("job_type must not be empty")
        if self.priority is not None and not isinstance(self.priority, Priority):
            self.priority = Priority(self.priority)


@dataclass(frozen=True)
class EnqueueAck:
    """An accepted job: its id, and whether an earlier job with the same
    idempotency key made this enqueue a no-op (then `job_id` is that job's)."""

    job_id: str
    deduplicated: bool

    def __init__(self, job_id: str, deduplicated: bool) -> None:
        # As Payload's: into the instance's dict (the frozen dataclass's own
        # __init__ costs twice as much; the client makes one per enqueue).
        fields = self.__dict__
        fields["job_id"] = job_id
        fields["deduplicated"] = deduplicated


@dataclass
class JobCtx:
    """Everything about a reserved job but its payload, and the handle of its
    lease.

    Pass it back to `ack`, `nack` and `extend`: its `attempt` and
    `enqueued_at` (as delivered; an operator requeue moves it) fence those calls
    against a lease that has since been reassigned. `lease_expires_at`
    is the real deadline, after the server clamped the requested lease.
    """

    id: str
    queue: str
    job_type: str
    priority: Priority
    attempt: int
    max_attempts: int
    enqueued_at: datetime
    custom: dict[str, Primitive]
    trace_context: TraceContext | None
    lease_expires_at: datetime
    # When the producer asked for delivery; None for "as soon as possible".
    scheduled_at: datetime | None = None
    _lease: Lease | None = field(default=None, repr=False, compare=False)

    async def extend(self, extension: timedelta) -> datetime:
        """Renew the lease to ``now + extension`` (clamped by the server) and
        return the new deadline. For the async client only; with
        `SyncSeppClient` call its ``extend(ctx, extension)``."""
        if self._lease is None:
            raise RuntimeError("this JobCtx has no lease: it did not come from reserve()")
        return await self._lease.extend(extension)

    def __str__(self) -> str:
        return (
            f"JobCtx(id={self.id}, job_type={self.job_type}, "
            f"attempt={self.attempt}/{self.max_attempts}, priority={self.priority.value})"
        )


@dataclass
class Job:
    """A reserved job: its payload (``None`` if it has none) and its context."""

    payload: Payload | None
    ctx: JobCtx


@dataclass(frozen=True)
class UndecodableJob:
    """A job a reserve leased to this client that the client could not decode
    into a `Job` (a field of a type or range it cannot represent: a newer or
    broken server, or a producer the server should have refused).

    Never skipped: `reserve` raises `UndecodableJobError` carrying it. It is
    leased like any other job, so the caller decides its fate with the usual
    calls — ``await client.nack(u, RetryDirective.DEAD_LETTER, reason=u.reason)``
    puts it in the dead-letter store with a reason saying why (findable there
    when the server retains dead letters), ``client.ack(u)`` deletes it;
    otherwise its lease expires and it is delivered again. `raw` is the job map
    exactly as received; `id`, `attempt`, `queue` and `job_type` are what could
    be read of it (``None`` when unreadable: then it cannot be acked or nacked).
    """

    raw: Any
    error: str
    id: str | None
    attempt: int | None
    queue: str | None
    job_type: str | None
    worker_id: str | None = None

    @property
    def reason(self) -> str:
        """A nack reason that says why the job could not be handled."""
        return f"undecodable by the sepp Python client: {self.error}"


@dataclass(frozen=True)
class UndecodableDeadLetter:
    """A dead-letter record a drain returned that the client could not decode
    into a `DeadLetterRecord`. The drain already deleted it on the server:
    `raw` (the record map exactly as received, job included) is the only copy.
    `job_id` and `queue` are what could be read of it."""

    raw: Any
    error: str
    job_id: str | None
    queue: str | None


RESERVE_ORDERS = ("strict", "fair")


@dataclass
class ReserveOptions:
    """The parameters of `SeppClient.reserve`.

    `queues` are tried in order (or in weighted round robin: ``reserve(opts,
    order="fair")``). `lease_duration` is required and positive; the
    server may clamp it. `wait_timeout` (30 s by default) is how long the
    server holds the call open when nothing is ready. `max_jobs` defaults to 1
    on the server.
    """

    queues: Sequence[str]
    lease_duration: timedelta
    wait_timeout: timedelta = DEFAULT_WAIT_TIMEOUT
    worker_id: str | None = None
    max_jobs: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.queues, str | bytes):
            raise QueueListError(
                f"queues must be a list of queue names, e.g. [{self.queues!r}], not one string"
            )
        _expect("queues", self.queues, Iterable, "a list of queue names")
        self.queues = list(self.queues)
        if not self.queues:
            raise ValueError("at least one queue is required")
        for index, name in enumerate(self.queues):
            _expect(f"queue name {index}", name, str, "a str")
            if not name:
                raise ValueError(f"queue name {index} must not be empty")
        _expect("lease_duration", self.lease_duration, timedelta, "a datetime.timedelta")
        _expect("wait_timeout", self.wait_timeout, timedelta, "a datetime.timedelta")
        if self.max_jobs is not None:
            _expect("max_jobs", self.max_jobs, int, "an int or None")
        if self.worker_id is not None:
            _expect("worker_id", self.worker_id, str, "a str or None")
        if self.lease_duration <= timedelta(0):
            raise ValueError("lease_duration must be positive")
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ValueError("max_jobs must be at least 1")
        if self.worker_id is not None and not self.worker_id:
            raise ValueError("worker_id must not be empty")


# The role of the serving node of a cluster (issue 19); the others are
# "follower" and "candidate".
ROLE_LEADER = "leader"


@dataclass(frozen=True)
class ClusterInfo:
    """What a node of a cluster says of itself (in its ``hello`` answer and in
    server info; a single node says nothing): its `role` (``"leader"``,
    ``"follower"`` or ``"candidate"``), `node_id`, `epoch` (the leader term it
    knows) and the address (``host:port``) of the `leader` it knows, or None."""

    role: str
    node_id: str | None = None
    epoch: int | None = None
    leader: str | None = None
    # Server info only (a debug read, for the failover harness): the last log
    # message the node applied or appended and the digest of its state there.
    log_seq: int | None = None
    state_hash: str | None = None

    @property
    def is_leader(self) -> bool:
        return self.role == ROLE_LEADER


@dataclass(frozen=True)
class ServerInfo:
    """The server's version, capabilities and global limits.

    The ``max_*`` limits are the ones behind the rejection values, so a
    producer can check jobs before sending them; a queue may override them.
    """

    version: str
    supported_protocol_versions: list[str]
    server_time: datetime
    restricts_encodings: bool
    allowed_encodings: list[str]
    max_payload_bytes: int
    max_custom_entries: int
    max_custom_total_bytes: int
    max_custom_key_bytes: int
    max_queue_name_bytes: int
    max_job_type_bytes: int
    max_idempotency_key_bytes: int
    max_schedule_horizon: timedelta
    max_enqueue_batch: int
    max_reserve_batch: int
    max_reserve_queues: int
    max_wait_timeout: timedelta
    max_lease_duration: timedelta
    strict_queues: bool
    # False means dead jobs are deleted and drain_dead_letters always returns [].
    dead_letter_retention_enabled: bool
    # sepp additions (not in sepp-py): the frame limit, retention and persist mode.
    max_message_bytes: int = 16 * 1024 * 1024
    dead_letter_retention: timedelta = timedelta(0)
    persist_mode: str = ""
    # The byte limits of client-supplied strings (PROTOCOL.md 6); an older server
    # does not report them, and these defaults are the server's.
    max_trace_context_bytes: int = 2048
    max_encoding_bytes: int = 256
    max_worker_id_bytes: int = 256
    max_reason_bytes: int = 4096
    max_stats_queues: int = 1024
    # Cluster mode (issue 19): the answering node's role, epoch and leader;
    # None from a single node.
    cluster: ClusterInfo | None = None


class DeadLetterCause(enum.Enum):
    """Why a job was dead-lettered."""

    UNSPECIFIED = "unspecified"
    """Not set, or a cause this client does not know."""
    ATTEMPTS_EXHAUSTED = "attempts_exhausted"
    """Its last allowed attempt was nacked."""
    REJECTED = "rejected"
    """A worker nacked it with `RetryDirective.DEAD_LETTER`."""
    LEASE_EXPIRED = "lease_expired"
    """Its lease ran out on the last allowed attempt."""
    ADMIN = "admin"
    """An operator dead-lettered it."""


@dataclass(frozen=True)
class DeadLetterRecord:
    """A dead-lettered job removed from the server by `drain_dead_letters`.

    `cause`, `last_reason` and `final_attempt` explain the failure;
    `to_enqueue_request` builds a fresh job to replay it.
    """

    queue: str
    job_id: str
    job_type: str
    payload: Payload | None
    priority: Priority
    max_attempts: int
    custom: dict[str, Primitive]
    trace_context: TraceContext | None
    enqueued_at: datetime
    scheduled_at: datetime | None
    cause: DeadLetterCause
    failed_at: datetime
    final_attempt: int
    last_reason: str | None

    def to_enqueue_request(self) -> EnqueueRequest:
        """An `EnqueueRequest` for the same queue, type, payload, priority,
        max attempts, custom map and trace context. The replay is a new job (new
        id, attempts from 1) that runs now: `scheduled_at` is not copied."""
        return EnqueueRequest(
            queue=self.queue,
            job_type=self.job_type,
            payload=self.payload,
            priority=self.priority,
            max_attempts=self.max_attempts or None,
            custom=dict(self.custom),
            trace_context=self.trace_context,
        )


@dataclass(frozen=True)
class QueueStats:
    """One queue's counts from `SeppClient.queue_stats` (a sepp addition).

    `oldest_ready_age` is how long the oldest ready job has waited, ``None``
    when nothing is ready.
    """

    name: str
    ready: int
    scheduled: int
    in_flight: int
    dead_lettered: int
    oldest_ready_age: timedelta | None


@dataclass(frozen=True)
class HealthStatus:
    """The answer of `SeppClient.health` (a sepp addition): `serving` while the
    server accepts commands; otherwise `reason` says why not. `damaged_history`
    lists, as the server reports them (PROTOCOL.md 5.10), damage found in log
    segments below the snapshot recovery started from: no job was lost, but those
    records are gone for audits. Empty when there is none."""

    serving: bool
    status: str
    reason: str | None = None
    damaged_history: tuple[Mapping[str, Any], ...] = ()


# -- admin (issue 15; PROTOCOL.md 5.14-5.27) ------------------------------------------------


@dataclass(frozen=True)
class JobInfo:
    """One job as an operator sees it, in any state (`SeppClient.get_job`,
    `list_jobs`). `state` is ``"ready"``, ``"scheduled"``, ``"inflight"`` or
    ``"dead_letter"``; the fields that do not apply to it are ``None``."""

    job_id: str
    queue: str
    job_type: str
    state: str
    priority: int
    attempt: int
    max_attempts: int
    enqueued_at: datetime | None
    scheduled_at: datetime | None
    run_at: datetime | None
    lease_expires_at: datetime | None
    worker_id: str | None
    payload: Payload | None
    idempotency_key: str | None
    trace_context: TraceContext | None
    custom: dict[str, Primitive]
    last_reason: str | None
    dead_letter_cause: str | None
    failed_at: datetime | None
    final_attempt: int | None


@dataclass(frozen=True)
class JobPage:
    """A page of `list_jobs` / `list_dead_letters`: pass `next_cursor` back for
    the next one; ``None`` means the listing is complete."""

    jobs: list[JobInfo]
    next_cursor: str | None


@dataclass(frozen=True)
class QueueInfo:
    """A queue's counts and effective settings (`list_queues`, `queue_info`);
    `overrides` are its runtime overrides (`put_queue`), ``None`` when it has none."""

    name: str
    declared: bool
    paused: bool
    ready: int
    scheduled: int
    inflight: int
    dead_letter: int
    settings: dict[str, Any]
    overrides: dict[str, Any] | None


@dataclass(frozen=True)
class AdminOutcomes:
    """What an admin call did to each job id: ``(job id, outcome)`` pairs,
    outcome ``"done"``, ``"not_found"`` or ``"wrong_state"``; `remaining`: for a
    call by filter, how many more match (call again while > 0)."""

    outcomes: list[tuple[str, str]]
    remaining: int

    @property
    def done(self) -> list[str]:
        return [job_id for job_id, outcome in self.outcomes if outcome == "done"]


@dataclass(frozen=True)
class QueueChange:
    """The answer of `pause_queue` / `resume_queue`: `changed` is False when the
    queue already was so."""

    queue: str
    paused: bool
    changed: bool


@dataclass(frozen=True)
class PurgeResult:
    queue: str
    purged: int
    # Ready + Scheduled jobs still in the queue (purge again while > 0).
    remaining: int


@dataclass(frozen=True)
class PutQueueResult:
    queue: str
    created: bool
    changed: bool
    settings: dict[str, Any]


@dataclass(frozen=True)
class DeleteQueueResult:
    queue: str
    # Ready and Scheduled jobs deleted with it.
    cancelled: int
    # The configuration file declares it: only its runtime overrides were removed.
    declared_by_file: bool


@dataclass(frozen=True)
class ScheduleInfo:
    """A schedule (`list_schedules`): its definition, whether it is paused and
    its next fire time (`next_fire_at`, UTC; `next_ms` the same in ms)."""

    name: str
    queue: str
    job_type: str
    cron: str | None
    timezone: str
    every_ms: int | None
    catch_up: str
    paused: bool
    next_ms: int
    next_fire_at: datetime
    priority: int | None
    max_attempts: int | None
    payload_encoding: str | None
    created_at: datetime


@dataclass(frozen=True)
class ScheduleChange:
    """The answer of `put_schedule`, `pause_schedule`, `resume_schedule` and
    `delete_schedule`: `changed` False when nothing was logged; `next_ms` the
    schedule's next tick (``None`` once deleted)."""

    name: str
    created: bool
    changed: bool
    paused: bool
    next_ms: int | None
