"""Conversions between wire bodies (msgpack maps, millisecond integers) and the
domain types of `sepp.client.types`.

Owns: time conversion (aware UTC datetimes and timedeltas <-> ms integers), the
job map of an enqueue, and decoding of delivered jobs, dead-letter records,
server info and queue stats. Decoding checks every field it reads and raises
`JobConversionError` / `ServerInfoError` / `MalformedResponseError`, never a
bare KeyError or TypeError.

Must not import: asyncio, sockets, sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sepp.client.errors import (
    JobConversionError,
    MalformedResponseError,
    ServerInfoError,
)
from sepp.client.types import (
    ClusterInfo,
    DeadLetterCause,
    DeadLetterRecord,
    EnqueueRequest,
    Job,
    JobCtx,
    Payload,
    Primitive,
    Priority,
    PriorityOutOfRangeError,
    QueueStats,
    ServerInfo,
    TraceContext,
    TraceContextError,
    UndecodableDeadLetter,
    UndecodableJob,
)
from sepp.protocol.messages import JOB_ARRAY_FIELDS

if TYPE_CHECKING:
    from sepp.client.client import Lease

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_new_object = object.__new__
ONE_MS = timedelta(milliseconds=1)
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_TIMEDELTA_MAX_MS = timedelta.max // ONE_MS

# A nack's reason is cut to this many UTF-8 bytes before it is sent: a server
# refuses a longer one (max_reason_bytes, which it never sets below this), and a
# refused nack would leave the job to its lease.
REASON_BYTES_MAX = 4096
_REASON_CUT_MARK = " [cut]"


def reason_within_limit(reason: str) -> str:
    """`reason`, or its first REASON_BYTES_MAX UTF-8 bytes (ending with " [cut]",
    never splitting a character) when it is longer."""
    if len(reason) <= REASON_BYTES_MAX // 4:  # at most 4 bytes a character
        return reason
    encoded = reason.encode("utf-8", "surrogatepass")
    if len(encoded) <= REASON_BYTES_MAX:
        return reason
    room = REASON_BYTES_MAX - len(_REASON_CUT_MARK)
    return encoded[:room].decode("utf-8", "ignore") + _REASON_CUT_MARK


# -- time ---------------------------------------------------------------------------


def datetime_to_ms(value: datetime) -> int:
    """Milliseconds since the epoch, floored; a naive datetime is taken as UTC.
    Integer arithmetic throughout: float seconds lose a millisecond far out."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return (value - EPOCH) // ONE_MS


def ms_to_datetime(ms: int) -> datetime | None:
    """The UTC datetime of `ms`, or ``None`` if it is negative or out of range."""
    if ms < 0:
        return None
    try:
        return EPOCH + timedelta(milliseconds=ms)
    except OverflowError:
        return None


def timedelta_to_ms(value: timedelta, *, round_up: bool = False) -> int:
    """Whole milliseconds of `value`. `round_up` for leases: a positive
    sub-millisecond lease must not become the invalid 0."""
    if round_up:
        return -(-value // ONE_MS)
    return value // ONE_MS


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- enqueue --------------------------------------------------------------------------


def _check_custom(custom: Mapping[str, Primitive]) -> dict[str, Primitive]:
    out: dict[str, Primitive] = {}
    for key, value in custom.items():
        if not isinstance(key, str):
            raise TypeError(f"custom keys must be strings, got {type(key).__name__}")
        if not isinstance(value, str | int | float | bool):
            raise TypeError(
                f"custom value for {key!r} must be str, int, float or bool, "
                f"got {type(value).__name__}"
            )
        if isinstance(value, int) and not _INT64_MIN <= value <= _INT64_MAX:
            raise ValueError(f"custom value for {key!r} does not fit in 64 bits")
        out[key] = value
    return out


def enqueue_job_to_wire(
    request: EnqueueRequest, default_trace: tuple[str, str | None] | None = None
) -> dict[str, Any]:
    """The job map of an enqueue (PROTOCOL.md §5.1). Optional fields are left
    out when unset so the queue's defaults apply. `default_trace` is used when
    the request has no trace context of its own."""
    job: dict[str, Any] = {"queue": request.queue, "job_type": request.job_type}
    if request.payload is not None:
        job["payload"] = {"data": bytes(request.payload.data), "encoding": request.payload.encoding}
    if request.idempotency_key is not None:
        job["idempotency_key"] = request.idempotency_key
    if request.priority is not None:
        job["priority"] = int(request.priority)
    if request.max_attempts is not None:
        job["max_attempts"] = request.max_attempts
    if request.scheduled_at is not None:
        scheduled_ms = datetime_to_ms(request.scheduled_at)
        # A pre-epoch instant is in the past: "ready now", like no schedule at all.
        if scheduled_ms >= 0:
            job["scheduled_at_ms"] = scheduled_ms
    if request.trace_context is not None:
        trace: tuple[str, str | None] | None = (
            request.trace_context.traceparent,
            request.trace_context.tracestate,
        )
    else:
        trace = default_trace
    if trace is not None:
        traceparent, tracestate = trace
        wire_trace: dict[str, Any] = {"traceparent": traceparent}
        if tracestate is not None:
            wire_trace["tracestate"] = tracestate
        job["trace_context"] = wire_trace
    if request.custom:
        job["custom"] = _check_custom(request.custom)
    return job


# -- delivered jobs ----------------------------------------------------------------------


def _field(raw: Mapping[str, Any], name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = raw.get(name)
    # bool is an int; an int field holding True is as wrong as one holding "1".
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise JobConversionError(f"{what} field {name!r} is missing or has the wrong type")
    return value


def _time(raw: Mapping[str, Any], name: str, what: str) -> datetime:
    ms = _field(raw, name, int, what)
    value = ms_to_datetime(ms)
    if value is None:
        raise JobConversionError(f"{what} time {name!r} is not representable ({ms})")
    return value


def _scheduled_at(raw: Mapping[str, Any], enqueued_at: datetime) -> datetime | None:
    """PROTOCOL.md §5.2: a scheduled_at_ms that is not after enqueued_at_ms means
    "not scheduled". A server never sends one; older servers echoed a past time
    (negative even) as requested, which decodes as None here, not as an error."""
    value = raw.get("scheduled_at_ms")
    if value is None:
        return None
    ms = _field(raw, "scheduled_at_ms", int, "job")
    if ms <= datetime_to_ms(enqueued_at):
        return None
    return _time(raw, "scheduled_at_ms", "job")


def _payload(raw: Mapping[str, Any]) -> Payload | None:
    payload = raw.get("payload")
    if payload is None:
        return None
    if not isinstance(payload, dict):
        raise JobConversionError("job payload must be a map or nil")
    data = payload.get("data")
    encoding = payload.get("encoding")
    if not isinstance(data, bytes) or not isinstance(encoding, str):
        raise JobConversionError("job payload needs binary data and a string encoding")
    return Payload(data, encoding)


def _checked_payload(data: bytes, encoding: str) -> Payload:
    """A `Payload` of values already checked to be exactly bytes and str -- all
    `Payload.__post_init__` checks -- built without running the checks again
    (a delivered job's payload; half the cost of `Payload(data, encoding)`)."""
    payload: Payload = _new_object(Payload)
    payload.__dict__.update(data=data, encoding=encoding)
    return payload


def _trace(raw: Mapping[str, Any]) -> TraceContext | None:
    trace = raw.get("trace_context")
    if not isinstance(trace, dict):
        return None
    traceparent = trace.get("traceparent")
    tracestate = trace.get("tracestate")
    if not isinstance(traceparent, str):
        return None
    try:
        return TraceContext(traceparent, tracestate if isinstance(tracestate, str) else None)
    except TraceContextError:
        # A broken trace context must not cost the job: drop only the trace.
        return None


def _custom(raw: Mapping[str, Any]) -> dict[str, Primitive]:
    custom = raw.get("custom")
    if custom is None:
        return {}
    if not isinstance(custom, dict):
        raise JobConversionError("job custom must be a map")
    out: dict[str, Primitive] = {}
    for key, value in custom.items():
        if not isinstance(key, str) or not isinstance(value, str | int | float | bool):
            raise JobConversionError(f"job custom entry {key!r} has an unsupported type")
        out[key] = value
    return out


def _priority(raw: Mapping[str, Any]) -> Priority:
    value = _field(raw, "priority", int, "job")
    try:
        return Priority(value)
    except PriorityOutOfRangeError as exc:
        raise JobConversionError(f"job priority {value} is outside 0..9") from exc


# The ten priorities, made once (a delivered job reuses them).
_PRIORITIES: dict[int, Priority] = {value: Priority(value) for value in range(10)}
# The last millisecond a datetime can hold.
_DATETIME_MS_MAX = (datetime.max.replace(tzinfo=UTC) - EPOCH) // ONE_MS


# The datetimes of recent delivered times, by ms: the jobs of one reserve answer
# share their lease deadline, and jobs enqueued in one batch their enqueue time,
# so most jobs find theirs here (a datetime is immutable: sharing one is safe).
_DATETIMES: dict[int, datetime] = {}
_DATETIMES_KEPT = 256


def _datetime_of_ms(ms: int) -> datetime:
    """The aware UTC datetime of `ms` (0 .. the last ms a datetime holds),
    remembered in `_DATETIMES`."""
    if len(_DATETIMES) >= _DATETIMES_KEPT:
        _DATETIMES.clear()
    # timedelta(days, seconds, microseconds, milliseconds): positional
    # arguments are a third cheaper than the keyword.
    at = _DATETIMES[ms] = EPOCH + timedelta(0, 0, 0, ms)
    return at


# A job row's length (the array layout): a newer server may send more fields.
_ROW_LENGTH = len(JOB_ARRAY_FIELDS)


def job_map_of_row(row: Any) -> Any:
    """The job map a row of the array layout stands for (what a server sends in
    the map layout), or `row` itself when it is no row: the field-by-field
    reading and `undecodable_job` read that map."""
    if type(row) is not list or len(row) < _ROW_LENGTH:
        return row
    job = dict(zip(JOB_ARRAY_FIELDS, row, strict=False))
    pdata = job.pop("payload_data")
    pencoding = job.pop("payload_encoding")
    job["payload"] = (
        None if pdata is None and pencoding is None else {"data": pdata, "encoding": pencoding}
    )
    if job["custom"] is None:
        job["custom"] = {}
    traceparent = job.pop("traceparent")
    tracestate = job.pop("tracestate")
    job["trace_context"] = (
        None
        if traceparent is None and tracestate is None
        else {"traceparent": traceparent, "tracestate": tracestate}
    )
    return job


def _usual_job(
    job_id: Any,
    queue: Any,
    job_type: Any,
    priority: Any,
    attempt: Any,
    max_attempts: Any,
    enqueued_ms: Any,
    scheduled_ms: Any,
    lease_ms: Any,
    has_payload: bool,
    pdata: Any,
    pencoding: Any,
    extras: dict[str, Any] | None,
    make_lease: Callable[[str, int, int, int], Lease | None] | None,
) -> Job | None:
    """The job of fields as a server sends them, checked in one test; None at any
    doubt (the caller then reads field by field, naming what is wrong). `extras`:
    the job map, read for its custom entries and trace context (None: it has
    neither)."""
    if not (
        type(job_id) is str
        and job_id
        and type(job_type) is str
        and job_type
        and type(queue) is str
        and type(attempt) is int
        and type(max_attempts) is int
        and type(priority) is int
        and 0 <= priority <= 9
        and type(lease_ms) is int
        and 0 <= lease_ms <= _DATETIME_MS_MAX
        and type(enqueued_ms) is int
        and 0 <= enqueued_ms <= _DATETIME_MS_MAX
        and (scheduled_ms is None or (type(scheduled_ms) is int and scheduled_ms <= enqueued_ms))
        and (not has_payload or (type(pdata) is bytes and type(pencoding) is str))
    ):
        return None
    ctx = JobCtx(
        job_id,
        queue,
        job_type,
        _PRIORITIES[priority],
        attempt,
        max_attempts,
        _DATETIMES.get(enqueued_ms) or _datetime_of_ms(enqueued_ms),
        {} if extras is None or extras.get("custom") is None else _custom(extras),
        None if extras is None or extras.get("trace_context") is None else _trace(extras),
        _DATETIMES.get(lease_ms) or _datetime_of_ms(lease_ms),
        None,
    )
    if make_lease is not None:
        ctx._lease = make_lease(job_id, attempt, lease_ms, enqueued_ms)
    return Job(_checked_payload(pdata, pencoding) if has_payload else None, ctx)


def job_from_wire(
    raw: Any, make_lease: Callable[[str, int, int, int], Lease | None] | None = None
) -> Job:
    """A delivered job of a reserve answer (PROTOCOL.md §5.2), a map or, in the
    array layout, a row of `JOB_ARRAY_FIELDS`. `make_lease` gets the job's id,
    attempt, lease deadline (ms since the epoch) and enqueued_at_ms (the fencing
    token its ack / nack / extend carry, PROTOCOL.md §5.3)."""
    if type(raw) is list:
        if len(raw) >= _ROW_LENGTH:
            (
                job_id,
                queue,
                job_type,
                pdata,
                pencoding,
                priority,
                max_attempts,
                attempt,
                enqueued_ms,
                scheduled_ms,
                lease_ms,
                traceparent,
                tracestate,
                custom,
            ) = raw if len(raw) == _ROW_LENGTH else raw[:_ROW_LENGTH]
            if custom is None and traceparent is None and tracestate is None:
                job = _usual_job(
                    job_id,
                    queue,
                    job_type,
                    priority,
                    attempt,
                    max_attempts,
                    enqueued_ms,
                    scheduled_ms,
                    lease_ms,
                    pdata is not None or pencoding is not None,
                    pdata,
                    pencoding,
                    None,
                    make_lease,
                )
                if job is not None:
                    return job
        else:
            raise JobConversionError(f"a job row needs {_ROW_LENGTH} fields, got {len(raw)}")
        # Custom entries, a trace context or any doubt: read as the map it stands for.
        raw = job_map_of_row(raw)
    if type(raw) is dict:
        # The usual job, every field as a server sends it, read in one pass; any
        # doubt goes to the field-by-field reading below, which names the field.
        get = raw.get
        payload = get("payload")
        pdata = pencoding = None
        if type(payload) is dict:
            pdata = payload.get("data")
            pencoding = payload.get("encoding")
        job = _usual_job(
            get("id"),
            get("queue"),
            get("job_type"),
            get("priority"),
            get("attempt"),
            get("max_attempts"),
            get("enqueued_at_ms"),
            get("scheduled_at_ms"),
            get("lease_expires_at_ms"),
            payload is not None,
            pdata,
            pencoding,
            raw,
            make_lease,
        )
        if job is not None:
            return job
    if not isinstance(raw, dict):
        raise JobConversionError("a job must be a map")
    job_id = _field(raw, "id", str, "job")
    job_type = _field(raw, "job_type", str, "job")
    if not job_id or not job_type:
        raise JobConversionError("job id and job_type must not be empty")
    attempt = _field(raw, "attempt", int, "job")
    lease_expires_at = _time(raw, "lease_expires_at_ms", "job")
    enqueued_at = _time(raw, "enqueued_at_ms", "job")
    ctx = JobCtx(
        id=job_id,
        queue=_field(raw, "queue", str, "job"),
        job_type=job_type,
        priority=_priority(raw),
        attempt=attempt,
        max_attempts=_field(raw, "max_attempts", int, "job"),
        enqueued_at=enqueued_at,
        custom=_custom(raw),
        trace_context=_trace(raw),
        lease_expires_at=lease_expires_at,
        scheduled_at=_scheduled_at(raw, enqueued_at),
    )
    if make_lease is not None:
        ctx._lease = make_lease(
            job_id, attempt, datetime_to_ms(lease_expires_at), datetime_to_ms(enqueued_at)
        )
    return Job(payload=_payload(raw), ctx=ctx)


_CAUSES = {cause.value: cause for cause in DeadLetterCause}


def dead_letter_from_wire(raw: Any) -> DeadLetterRecord:
    """One record of a drain answer (PROTOCOL.md §5.6)."""
    if not isinstance(raw, dict):
        raise JobConversionError("a dead-letter record must be a map")
    job = raw.get("job")
    if not isinstance(job, dict):
        raise JobConversionError("dead-letter record is missing its job")
    job_id = _field(job, "id", str, "job")
    job_type = _field(job, "job_type", str, "job")
    if not job_id or not job_type:
        raise JobConversionError("job id and job_type must not be empty")
    cause = raw.get("cause")
    last_reason = raw.get("last_reason")
    enqueued_at = _time(job, "enqueued_at_ms", "job")
    return DeadLetterRecord(
        queue=_field(job, "queue", str, "job"),
        job_id=job_id,
        job_type=job_type,
        payload=_payload(job),
        priority=_priority(job),
        max_attempts=_field(job, "max_attempts", int, "job"),
        custom=_custom(job),
        trace_context=_trace(job),
        enqueued_at=enqueued_at,
        scheduled_at=_scheduled_at(job, enqueued_at),
        cause=_CAUSES.get(cause, DeadLetterCause.UNSPECIFIED)
        if isinstance(cause, str)
        else DeadLetterCause.UNSPECIFIED,
        failed_at=_time(raw, "failed_at_ms", "dead-letter record"),
        final_attempt=_field(raw, "final_attempt", int, "dead-letter record"),
        last_reason=last_reason if isinstance(last_reason, str) else None,
    )


def _readable(raw: Any, name: str, kind: type) -> Any:
    """A field of an undecodable map, if it has the right type; else None."""
    value = raw.get(name) if isinstance(raw, dict) else None
    if type(value) is not kind:
        return None
    return value


def undecodable_job(raw: Any, error: JobConversionError, worker_id: str | None) -> UndecodableJob:
    """What can be read of a delivered job `job_from_wire` refused: enough to ack
    or nack it (its id and attempt), and the raw map."""
    return UndecodableJob(
        raw=raw,
        error=str(error),
        id=_readable(raw, "id", str) or None,
        attempt=_readable(raw, "attempt", int),
        queue=_readable(raw, "queue", str),
        job_type=_readable(raw, "job_type", str),
        worker_id=worker_id,
    )


def undecodable_dead_letter(raw: Any, error: JobConversionError) -> UndecodableDeadLetter:
    """What can be read of a drained record `dead_letter_from_wire` refused."""
    job = raw.get("job") if isinstance(raw, dict) else None
    return UndecodableDeadLetter(
        raw=raw,
        error=str(error),
        job_id=_readable(job, "id", str),
        queue=_readable(job, "queue", str),
    )


# -- server info and stats --------------------------------------------------------------


def _info(body: Mapping[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ServerInfoError(f"server info field {name!r} is missing or has the wrong type")
    return value


def _info_texts(body: Mapping[str, Any], name: str) -> list[str]:
    value = _info(body, name, list)
    if not all(isinstance(v, str) for v in value):
        raise ServerInfoError(f"server info field {name!r} must be an array of strings")
    return list(value)


def _info_ms(body: Mapping[str, Any], name: str) -> timedelta:
    ms = _info(body, name, int)
    # A limit configured beyond timedelta's range (an "endless" horizon) is
    # reported as the largest timedelta, not as a broken answer.
    return timedelta.max if ms > _TIMEDELTA_MAX_MS else timedelta(milliseconds=ms)


# Reported by servers since issue 13; read leniently (defaults otherwise).
_FIELD_LIMITS = (
    "max_trace_context_bytes",
    "max_encoding_bytes",
    "max_worker_id_bytes",
    "max_reason_bytes",
    "max_stats_queues",
)


def cluster_from_wire(raw: Any) -> ClusterInfo | None:
    """The ``cluster`` map of a hello or server_info answer (absent on a single
    node). A role that is not a string raises `ValueError`; the other fields
    are optional and read leniently."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("role"), str):
        raise ValueError("'cluster' needs a 'role' string")
    node_id, epoch, leader = raw.get("node_id"), raw.get("epoch"), raw.get("leader")
    log_seq, digest = raw.get("log_seq"), raw.get("state_hash")
    return ClusterInfo(
        role=raw["role"],
        node_id=node_id if isinstance(node_id, str) else None,
        epoch=epoch if type(epoch) is int else None,
        leader=leader if isinstance(leader, str) and leader else None,
        log_seq=log_seq if type(log_seq) is int else None,
        state_hash=digest if isinstance(digest, str) else None,
    )


def server_info_from_wire(body: Mapping[str, Any]) -> ServerInfo:
    """A server_info answer (PROTOCOL.md §5.7)."""
    version = _info(body, "server_version", str)
    if not version:
        raise ServerInfoError("server info has an empty server_version")
    server_time = ms_to_datetime(_info(body, "server_time_ms", int))
    if server_time is None:
        raise ServerInfoError("server_time_ms is not a representable time")
    retention = body.get("dead_letter_retention_ms")
    mode = body.get("persist_mode")
    frame_max = body.get("max_message_bytes")
    try:
        cluster = cluster_from_wire(body.get("cluster"))
    except ValueError as exc:
        raise ServerInfoError(f"malformed server info: {exc}") from exc
    try:
        return ServerInfo(
            version=version,
            supported_protocol_versions=_info_texts(body, "supported_protocol_versions"),
            server_time=server_time,
            restricts_encodings=_info(body, "restricts_encodings", bool),
            allowed_encodings=_info_texts(body, "allowed_encodings"),
            max_payload_bytes=_info(body, "max_payload_bytes", int),
            max_custom_entries=_info(body, "max_custom_entries", int),
            max_custom_total_bytes=_info(body, "max_custom_total_bytes", int),
            max_custom_key_bytes=_info(body, "max_custom_key_bytes", int),
            max_queue_name_bytes=_info(body, "max_queue_name_bytes", int),
            max_job_type_bytes=_info(body, "max_job_type_bytes", int),
            max_idempotency_key_bytes=_info(body, "max_idempotency_key_bytes", int),
            max_schedule_horizon=_info_ms(body, "max_schedule_horizon_ms"),
            max_enqueue_batch=_info(body, "max_enqueue_batch", int),
            max_reserve_batch=_info(body, "max_reserve_batch", int),
            max_reserve_queues=_info(body, "max_reserve_queues", int),
            max_wait_timeout=_info_ms(body, "max_wait_timeout_ms"),
            max_lease_duration=_info_ms(body, "max_lease_duration_ms"),
            strict_queues=_info(body, "strict_queues", bool),
            dead_letter_retention_enabled=_info(body, "dead_letter_retention_enabled", bool),
            # The additions are read leniently: an older server may not send them.
            max_message_bytes=frame_max if type(frame_max) is int else ServerInfo.max_message_bytes,
            dead_letter_retention=timedelta(milliseconds=retention)
            if type(retention) is int
            else timedelta(0),
            persist_mode=mode if isinstance(mode, str) else "",
            cluster=cluster,
            **{
                name: body[name]
                for name in _FIELD_LIMITS
                if type(body.get(name)) is int and body[name] > 0
            },
        )
    except OverflowError as exc:
        raise ServerInfoError("a server info duration is out of range") from exc


def _stat(raw: Mapping[str, Any], name: str) -> int:
    value = raw.get(name)
    if type(value) is not int:
        raise MalformedResponseError(f"queue stats field {name!r} must be an integer")
    return value


def queue_stats_from_wire(body: Mapping[str, Any]) -> list[QueueStats]:
    """A queue_stats answer (PROTOCOL.md §5.8)."""
    queues = body.get("queues")
    if not isinstance(queues, list):
        raise MalformedResponseError("queue stats answer needs a 'queues' array")
    out = []
    for raw in queues:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise MalformedResponseError("each queue stats entry needs a name")
        age = raw.get("oldest_ready_age_ms")
        if age is not None and type(age) is not int:
            raise MalformedResponseError("oldest_ready_age_ms must be an integer or nil")
        out.append(
            QueueStats(
                name=raw["name"],
                ready=_stat(raw, "ready"),
                scheduled=_stat(raw, "scheduled"),
                in_flight=_stat(raw, "in_flight"),
                dead_lettered=_stat(raw, "dead_lettered"),
                oldest_ready_age=None if age is None else timedelta(milliseconds=age),
            )
        )
    return out
