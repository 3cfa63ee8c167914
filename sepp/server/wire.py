"""Translation between protocol values and the state machine's commands and
replies — the only place that knows both vocabularies.

Owns: building core commands from parsed request bodies (`new_job`), and protocol
bodies from core replies and errors (`enqueue_body`, `job_view_body`,
`error_response`, ...).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sepp.core.commands import NewJob
from sepp.core.events import CAUSE_NAMES
from sepp.core.results import (
    Accepted,
    AtomicRejected,
    AttemptMismatch,
    CommandError,
    DeadLetterView,
    EnqueueResult,
    FailedPrecondition,
    InvalidArgument,
    JobView,
    NotFound,
    PermissionDenied,
    QueueInUse,
    QueueNotFound,
    Rejection,
    ScheduleNotFound,
)
from sepp.protocol.errors import (
    FAILED_PRECONDITION,
    INTERNAL,
    INVALID_ARGUMENT,
    NOT_FOUND,
    PERMISSION_DENIED,
    REASON_ATTEMPT_MISMATCH,
    REASON_QUEUE_IN_USE,
    REASON_UNKNOWN_QUEUE,
    ProtocolError,
)
from sepp.protocol.messages import WireJob, job_body

_new_tuple = tuple.__new__


def new_job(job_id: str, wire: WireJob | ProtocolError) -> NewJob:
    if type(wire) is not WireJob:
        # A malformed job is rejected in its place in the batch, by decide.
        message = wire.message if isinstance(wire, ProtocolError) else "malformed job"
        return NewJob(job_id=job_id, queue="", job_type="", invalid=message)
    # Positional, in NewJob's field order: WireJob holds the same fields in the
    # same order after job_id (the hot path of a batch enqueue).
    job: NewJob = _new_tuple(NewJob, (job_id, *wire, None))
    return job


def rejection_body(rejection: Rejection) -> dict[str, Any]:
    body: dict[str, Any] = {
        "reason": rejection.reason,
        "message": rejection.describe(),
        "transient": rejection.transient,
    }
    for f in dataclasses.fields(rejection):
        value = getattr(rejection, f.name)
        body[f.name] = list(value) if isinstance(value, tuple) else value
    return body


def enqueue_body(reply: EnqueueResult | AtomicRejected) -> dict[str, Any]:
    if isinstance(reply, AtomicRejected):
        return {
            "failures": [
                {"index": index, "rejection": rejection_body(rejection)}
                for index, rejection in reply.failures
            ]
        }
    results: list[dict[str, Any]] = []
    for result in reply.results:
        if type(result) is Accepted:
            results.append({"job_id": result.job_id, "deduplicated": result.deduplicated})
        else:
            results.append({"rejection": rejection_body(result)})  # type: ignore[arg-type]
    return {"results": results}


def job_view_body(view: JobView) -> dict[str, Any]:
    return job_body(
        view.job_id,
        view.queue,
        view.job_type,
        view.payload_data,
        view.payload_encoding,
        view.priority,
        view.attempt,
        view.max_attempts,
        view.enqueued_at,
        view.scheduled_at,
        view.lease_expires_at,
        view.traceparent,
        view.tracestate,
        dict(view.custom) if view.custom else None,
    )


def job_view_row(view: JobView) -> list[Any]:
    """`job_view_body` in the array layout (messages.JOB_ARRAY_FIELDS: JobView's
    own field order), `custom` nil when empty."""
    row = list(view)
    custom = view.custom
    row[13] = dict(custom) if custom else None
    return row


def dead_letter_body(record: DeadLetterView) -> dict[str, Any]:
    return {
        "job": job_view_body(record.job),
        "cause": CAUSE_NAMES.get(record.cause, "unspecified"),
        "failed_at_ms": record.failed_at,
        "final_attempt": record.final_attempt,
        "last_reason": record.last_reason,
    }


def command_error(error: CommandError) -> tuple[str, dict[str, Any]]:
    """(status code, error body) for a whole-command error of the core."""
    body: dict[str, Any] = {"message": error.message}
    if isinstance(error, AttemptMismatch):
        body["reason"] = REASON_ATTEMPT_MISMATCH
        body["current_attempt"] = error.current_attempt
        return FAILED_PRECONDITION, body
    if isinstance(error, FailedPrecondition):
        body["reason"] = REASON_UNKNOWN_QUEUE
        body["queues"] = list(error.queues)
        return FAILED_PRECONDITION, body
    if isinstance(error, QueueInUse):
        body["reason"] = REASON_QUEUE_IN_USE
        body["queue"] = error.queue
        return FAILED_PRECONDITION, body
    if isinstance(error, QueueNotFound):
        body["queue"] = error.queue
        return NOT_FOUND, body
    if isinstance(error, ScheduleNotFound):
        body["schedule"] = error.name
        return NOT_FOUND, body
    if isinstance(error, NotFound):
        return NOT_FOUND, body
    if isinstance(error, PermissionDenied):
        return PERMISSION_DENIED, body
    if isinstance(error, InvalidArgument):
        return INVALID_ARGUMENT, body
    return INTERNAL, body
