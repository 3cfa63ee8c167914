"""Translation between `sepp.v1` protobuf messages and the core's commands and
replies: the only place of the gRPC front that knows both vocabularies (the gRPC
counterpart of sepp/server/wire.py).

Owns: new jobs from EnqueueRequest (`new_job`), the 14 rejection variants
(`rejection_pb`, one builder per class of the catalogue), jobs, dead-letter
records, server info, and the unit changes: Timestamp / Duration <-> integer
milliseconds (this server keeps times in ms; sub-millisecond parts of a request
are truncated).

Promises: no value is invented -- a field the request did not set is None for
the core (no trace context, no priority...), and a field the core did not set is
left unset in the answer (no scheduled_at, no payload). Custom values keep their
kind: string, double, int64 and bool each round-trip as themselves (a bool is
never an int, a 1.0 never a 1).

Must not import: grpc (messages only), storage, another front end.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from sepp.core.commands import NewJob
from sepp.core.results import (
    Accepted,
    AtomicRejected,
    CustomEntriesTooMany,
    CustomKeyTooLong,
    CustomMapTooLarge,
    DeadLetterView,
    EncodingNotAllowed,
    EnqueueResult,
    IdempotencyKeyTooLong,
    InvalidRequest,
    JobTypeNameTooLong,
    JobTypeNotAllowed,
    JobView,
    PayloadTooLarge,
    QueueClosing,
    QueueFull,
    QueueNameTooLong,
    Rejection,
    ScheduledTooFar,
    UnknownQueue,
)
from sepp.grpc.v1 import queue_pb2 as pb

_new_tuple = tuple.__new__

NS_PER_MS = 1_000_000
NANOS_MAX = 999_999_999


# -- times --------------------------------------------------------------------------------


def timestamp_ms(ts: Timestamp) -> int | None:
    """Milliseconds since the epoch, or None when `nanos` is out of its range."""
    nanos = ts.nanos
    if not 0 <= nanos <= NANOS_MAX:
        return None
    return int(ts.seconds) * 1000 + nanos // NS_PER_MS


def duration_ms(d: Duration) -> int | None:
    """Whole milliseconds (truncated toward zero), or None for a malformed
    Duration (nanos out of range, or of the other sign than seconds)."""
    seconds, nanos = int(d.seconds), d.nanos
    if not -NANOS_MAX <= nanos <= NANOS_MAX or (seconds > 0 > nanos) or (seconds < 0 < nanos):
        return None
    ms = seconds * 1000
    return ms + nanos // NS_PER_MS if nanos >= 0 else ms - (-nanos) // NS_PER_MS


def ms_timestamp(ms: int) -> Timestamp:
    seconds, rest = divmod(ms, 1000)
    return Timestamp(seconds=seconds, nanos=rest * NS_PER_MS)


def ms_duration(ms: int) -> Duration:
    seconds, rest = divmod(ms, 1000)
    return Duration(seconds=seconds, nanos=rest * NS_PER_MS)


# -- enqueue ------------------------------------------------------------------------------


def new_job(job_id: str, m: pb.EnqueueRequest) -> NewJob:
    """The core's NewJob for one EnqueueRequest. Whatever only this front can see
    (an unset custom value, a malformed scheduled_at) makes the job `invalid`: the
    core rejects it with InvalidRequest in its place in the batch, after the
    checks every front shares."""
    invalid: str | None = None
    payload_data = payload_encoding = None
    if m.HasField("payload"):
        payload = m.payload
        payload_data = payload.data
        payload_encoding = payload.encoding
    traceparent = tracestate = None
    if m.HasField("trace_context"):
        trace = m.trace_context
        traceparent = trace.traceparent
        if trace.HasField("tracestate"):
            tracestate = trace.tracestate
    scheduled_at = None
    if m.HasField("scheduled_at"):
        scheduled_at = timestamp_ms(m.scheduled_at)
        if scheduled_at is None:
            invalid = "scheduled_at is not a valid timestamp (nanos out of range)"
    custom: dict[str, Any] | None = None
    if m.custom:
        custom = {}
        for key, value in m.custom.items():
            which = value.WhichOneof("value")
            if which is None:
                invalid = f"custom value of key {key[:60]!r} is not set"
                continue
            custom[key] = getattr(value, which)
    # Positional, in NewJob's field order (one is built per job of every enqueue).
    job: NewJob = _new_tuple(
        NewJob,
        (
            job_id,
            m.queue,
            m.job_type,
            payload_data,
            payload_encoding,
            m.idempotency_key if m.HasField("idempotency_key") else None,
            m.priority if m.HasField("priority") else None,
            m.max_attempts if m.HasField("max_attempts") else None,
            scheduled_at,
            traceparent,
            tracestate,
            custom,
            invalid,
        ),
    )
    return job


# One builder per rejection of the catalogue (sepp-semantics.md §13): the oneof
# field of JobRejection is the rejection's `reason` label, and each builder fills
# that variant's own message. tests/grpc/test_rejections.py has one row per class.
_REJECTION_BUILDERS: dict[type[Any], Callable[[Any], pb.JobRejection]] = {
    UnknownQueue: lambda r: pb.JobRejection(unknown_queue=pb.UnknownQueue(queue=r.queue)),
    PayloadTooLarge: lambda r: pb.JobRejection(
        payload_too_large=pb.PayloadTooLarge(limit=r.limit, actual=r.actual)
    ),
    EncodingNotAllowed: lambda r: pb.JobRejection(
        encoding_not_allowed=pb.EncodingNotAllowed(encoding=r.encoding, allowed=list(r.allowed))
    ),
    JobTypeNotAllowed: lambda r: pb.JobRejection(
        job_type_not_allowed=pb.JobTypeNotAllowed(job_type=r.job_type, allowed=list(r.allowed))
    ),
    CustomEntriesTooMany: lambda r: pb.JobRejection(
        custom_entries_too_many=pb.CustomEntriesTooMany(limit=r.limit, actual=r.actual)
    ),
    CustomMapTooLarge: lambda r: pb.JobRejection(
        custom_map_too_large=pb.CustomMapTooLarge(limit=r.limit, actual=r.actual)
    ),
    CustomKeyTooLong: lambda r: pb.JobRejection(
        custom_key_too_long=pb.CustomKeyTooLong(key=r.key, limit=r.limit, actual=r.actual)
    ),
    QueueNameTooLong: lambda r: pb.JobRejection(
        queue_name_too_long=pb.QueueNameTooLong(limit=r.limit, actual=r.actual)
    ),
    JobTypeNameTooLong: lambda r: pb.JobRejection(
        job_type_name_too_long=pb.JobTypeNameTooLong(limit=r.limit, actual=r.actual)
    ),
    IdempotencyKeyTooLong: lambda r: pb.JobRejection(
        idempotency_key_too_long=pb.IdempotencyKeyTooLong(limit=r.limit, actual=r.actual)
    ),
    ScheduledTooFar: lambda r: pb.JobRejection(
        scheduled_too_far=pb.ScheduledTooFar(
            horizon=ms_duration(r.horizon_ms), actual=ms_timestamp(r.actual)
        )
    ),
    InvalidRequest: lambda r: pb.JobRejection(invalid_request=pb.InvalidRequest(message=r.message)),
    QueueFull: lambda r: pb.JobRejection(queue_full=pb.QueueFull(queue=r.queue, limit=r.limit)),
    QueueClosing: lambda r: pb.JobRejection(queue_closing=pb.QueueClosing(queue=r.queue)),
}


def rejection_pb(rejection: Rejection) -> pb.JobRejection:
    return _REJECTION_BUILDERS[type(rejection)](rejection)


def enqueue_batch_response(reply: EnqueueResult) -> pb.EnqueueBatchResponse:
    results = []
    for result in reply.results:
        if type(result) is Accepted:
            results.append(
                pb.JobResult(
                    success=pb.EnqueueResponse(
                        job_id=result.job_id, deduplicated=result.deduplicated
                    )
                )
            )
        else:
            results.append(pb.JobResult(rejection=rejection_pb(result)))  # type: ignore[arg-type]
    return pb.EnqueueBatchResponse(results=results)


def enqueue_atomic_response(reply: EnqueueResult | AtomicRejected) -> pb.EnqueueAtomicResponse:
    if isinstance(reply, AtomicRejected):
        return pb.EnqueueAtomicResponse(
            rejection=pb.BatchValidationFailure(
                errors=[
                    pb.JobValidationError(index=index, rejection=rejection_pb(rejection))
                    for index, rejection in reply.failures
                ]
            )
        )
    return pb.EnqueueAtomicResponse(
        success=pb.EnqueueAtomicSuccess(
            responses=[
                pb.EnqueueResponse(job_id=r.job_id, deduplicated=r.deduplicated)
                for r in reply.results
                if type(r) is Accepted
            ]
        )
    )


# -- jobs -----------------------------------------------------------------------------------


def job_pb(view: JobView) -> pb.Job:
    job = pb.Job(
        id=view.job_id,
        job_type=view.job_type,
        priority=view.priority,
        attempt=view.attempt,
        max_attempts=view.max_attempts,
        queue=view.queue,
        enqueued_at=ms_timestamp(view.enqueued_at),
    )
    if view.payload_data is not None:
        job.payload.data = view.payload_data
        job.payload.encoding = view.payload_encoding or ""
    if view.traceparent is not None:
        trace = job.trace_context
        trace.traceparent = view.traceparent
        if view.tracestate is not None:
            trace.tracestate = view.tracestate
    if view.lease_expires_at is not None:
        job.lease_expires_at.CopyFrom(ms_timestamp(view.lease_expires_at))
    if view.scheduled_at is not None:
        job.scheduled_at.CopyFrom(ms_timestamp(view.scheduled_at))
    if view.custom:
        custom = job.custom
        for key, value in view.custom.items():
            entry = custom[key]
            # bool first: a bool is an int to Python, never to the client.
            if isinstance(value, bool):
                entry.bool_value = value
            elif isinstance(value, int):
                entry.int_value = value
            elif isinstance(value, float):
                entry.double_value = value
            else:
                entry.string_value = value
    return job


# The core's cause codes (events.CAUSE_NAMES) are the enum's numbers: 1
# attempts_exhausted, 2 rejected, 3 lease_expired, 4 admin.
_CAUSES = frozenset(pb.DeadLetterCause.values())


def dead_letter_pb(record: DeadLetterView) -> pb.DeadLetterRecord:
    out = pb.DeadLetterRecord(
        job=job_pb(record.job),
        cause=record.cause if record.cause in _CAUSES else 0,  # type: ignore[arg-type]
        failed_at=ms_timestamp(record.failed_at),
        final_attempt=record.final_attempt,
    )
    if record.last_reason is not None:
        out.last_reason = record.last_reason
    return out


# -- server info ----------------------------------------------------------------------------


def server_info_pb(info: dict[str, Any]) -> pb.GetServerInfoResponse:
    """The service's server_info (the names every front shares) as the reference
    answers it: every field set."""
    return pb.GetServerInfoResponse(
        server_version=info["server_version"],
        supported_protocol_versions=["v1"],
        server_time=ms_timestamp(info["server_time_ms"]),
        restricts_encodings=info["restricts_encodings"],
        allowed_encodings=info["allowed_encodings"],
        max_payload_bytes=info["max_payload_bytes"],
        max_custom_entries=info["max_custom_entries"],
        max_custom_total_bytes=info["max_custom_total_bytes"],
        max_custom_key_bytes=info["max_custom_key_bytes"],
        max_queue_name_bytes=info["max_queue_name_bytes"],
        max_job_type_bytes=info["max_job_type_bytes"],
        max_idempotency_key_bytes=info["max_idempotency_key_bytes"],
        max_schedule_horizon=ms_duration(info["max_schedule_horizon_ms"]),
        max_enqueue_batch=info["max_enqueue_batch"],
        max_reserve_batch=info["max_reserve_batch"],
        max_reserve_queues=info["max_reserve_queues"],
        max_wait_timeout=ms_duration(info["max_wait_timeout_ms"]),
        max_lease_duration=ms_duration(info["max_lease_duration_ms"]),
        strict_queues=info["strict_queues"],
        dead_letter_retention_enabled=info["dead_letter_retention_enabled"],
    )
