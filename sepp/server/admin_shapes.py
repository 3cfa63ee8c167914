"""The shapes of the admin results: the maps both admin fronts render.

Owns: `job_info_body`, `page_body`, `queue_info_body`, `settings_body` and the
bodies of the admin command results (outcomes, pause/resume, purge, put and
delete queue, schedules): plain maps of strings, integers, lists and maps, the same names
on the native protocol (PROTOCOL.md 5.14-5.27, encoded with msgpack by
native_admin.py) and in the admin HTTP API (JSON, sepp/admin/api.py, which
turns the payload's bytes into base64). One place, so the two fronts never
drift apart.

Must not import: a front end, the wire translation, the protocol package or a
transport library. Not compiled.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sepp.core.reads import JobInfo, JobPage, QueueInfo, ScheduleInfo
from sepp.core.results import (
    AdminOutcomes,
    DeleteQueueResult,
    PurgeResult,
    PutQueueResult,
    QueueAdminResult,
    ScheduleResult,
)


def job_info_body(info: JobInfo) -> dict[str, Any]:
    return {
        "id": info.job_id,
        "queue": info.queue,
        "job_type": info.job_type,
        "state": info.state,
        "priority": info.priority,
        "attempt": info.attempt,
        "max_attempts": info.max_attempts,
        "enqueued_at_ms": info.enqueued_at,
        "scheduled_at_ms": info.scheduled_at,
        "run_at_ms": info.run_at,
        "lease_expires_at_ms": info.lease_expires_at,
        "worker_id": info.worker_id,
        "payload": None
        if info.payload_data is None
        else {"data": info.payload_data, "encoding": info.payload_encoding},
        "idempotency_key": info.idempotency_key,
        "trace_context": None
        if info.traceparent is None
        else {"traceparent": info.traceparent, "tracestate": info.tracestate},
        "custom": dict(info.custom or {}),
        "last_reason": info.last_reason,
        "dead_letter_cause": info.dead_letter_cause,
        "failed_at_ms": info.failed_at,
        "final_attempt": info.final_attempt,
    }


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def settings_body(policy: Any) -> dict[str, Any]:
    return {f.name: _plain(getattr(policy, f.name)) for f in dataclasses.fields(policy)}


def queue_info_body(info: QueueInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "declared": info.declared,
        "paused": info.paused,
        "ready": info.ready,
        "scheduled": info.scheduled,
        "inflight": info.inflight,
        "dead_letter": info.dead_letter,
        "settings": settings_body(info.policy),
        "overrides": None
        if info.overrides is None
        else {k: _plain(v) for k, v in info.overrides.items()},
    }


def page_body(page: JobPage) -> dict[str, Any]:
    return {"jobs": [job_info_body(j) for j in page.jobs], "next_cursor": page.next_cursor}


def outcomes_body(reply: AdminOutcomes) -> dict[str, Any]:
    return {
        "outcomes": [{"id": job_id, "outcome": outcome} for job_id, outcome in reply.outcomes],
        "remaining": reply.remaining,
    }


def queue_admin_body(reply: QueueAdminResult) -> dict[str, Any]:
    return {"queue": reply.queue, "paused": reply.paused, "changed": reply.changed}


def purge_body(reply: PurgeResult) -> dict[str, Any]:
    return {"queue": reply.queue, "purged": reply.purged, "remaining": reply.remaining}


def put_queue_body(reply: PutQueueResult) -> dict[str, Any]:
    return {
        "queue": reply.queue,
        "created": reply.created,
        "changed": reply.changed,
        "settings": settings_body(reply.policy),
    }


def delete_queue_body(reply: DeleteQueueResult) -> dict[str, Any]:
    return {
        "queue": reply.queue,
        "cancelled": reply.cancelled,
        "declared_by_file": reply.declared_by_file,
    }


def schedule_info_body(info: ScheduleInfo) -> dict[str, Any]:
    """A schedule's definition, paused flag and next fire time (`next_ms`)."""
    return info._asdict()


def schedule_result_body(reply: ScheduleResult) -> dict[str, Any]:
    return {"schedule": reply._asdict()}
