"""The admin answers of the native protocol (PROTOCOL.md 5.14-5.27) as client
types: what `SeppClient.get_job`, `list_jobs`, `list_queues` and the admin
commands return.

Owns: `job_info`, `job_page`, `queue_info`, `admin_outcomes` and the small result
converters. A malformed answer raises MalformedResponseError.

Must not import: asyncio, sockets, sepp.core, sepp.storage, sepp.server.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sepp.client._convert import _custom, _payload, _trace, ms_to_datetime
from sepp.client.errors import JobConversionError, MalformedResponseError
from sepp.client.types import (
    AdminOutcomes,
    DeleteQueueResult,
    JobInfo,
    JobPage,
    PurgeResult,
    PutQueueResult,
    QueueChange,
    QueueInfo,
    ScheduleChange,
    ScheduleInfo,
)


def _get(
    raw: Mapping[str, Any], name: str, kind: type, what: str, *, optional: bool = False
) -> Any:
    value = raw.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedResponseError(f"{what} field {name!r} is missing or has the wrong type")
    return value


def _when(raw: Mapping[str, Any], name: str) -> datetime | None:
    ms = _get(raw, name, int, "job", optional=True)
    return None if ms is None else ms_to_datetime(ms)


def _map(raw: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise MalformedResponseError(f"{what} must be a map")
    return raw


def job_info(raw: Any) -> JobInfo:
    raw = _map(raw, "a job")
    try:
        payload = _payload(raw)
        custom = _custom(raw)
    except JobConversionError as exc:
        raise MalformedResponseError(str(exc)) from exc
    return JobInfo(
        job_id=_get(raw, "id", str, "job"),
        queue=_get(raw, "queue", str, "job"),
        job_type=_get(raw, "job_type", str, "job"),
        state=_get(raw, "state", str, "job"),
        priority=_get(raw, "priority", int, "job"),
        attempt=_get(raw, "attempt", int, "job"),
        max_attempts=_get(raw, "max_attempts", int, "job"),
        enqueued_at=_when(raw, "enqueued_at_ms"),
        scheduled_at=_when(raw, "scheduled_at_ms"),
        run_at=_when(raw, "run_at_ms"),
        lease_expires_at=_when(raw, "lease_expires_at_ms"),
        worker_id=_get(raw, "worker_id", str, "job", optional=True),
        payload=payload,
        idempotency_key=_get(raw, "idempotency_key", str, "job", optional=True),
        trace_context=_trace(raw),
        custom=custom,
        last_reason=_get(raw, "last_reason", str, "job", optional=True),
        dead_letter_cause=_get(raw, "dead_letter_cause", str, "job", optional=True),
        failed_at=_when(raw, "failed_at_ms"),
        final_attempt=_get(raw, "final_attempt", int, "job", optional=True),
    )


def job_page(body: Mapping[str, Any]) -> JobPage:
    jobs = _get(body, "jobs", list, "a job page")
    return JobPage(
        [job_info(j) for j in jobs], _get(body, "next_cursor", str, "a job page", optional=True)
    )


def queue_info(raw: Any) -> QueueInfo:
    raw = _map(raw, "a queue")
    overrides = raw.get("overrides")
    return QueueInfo(
        name=_get(raw, "name", str, "queue"),
        declared=_get(raw, "declared", bool, "queue"),
        paused=_get(raw, "paused", bool, "queue"),
        ready=_get(raw, "ready", int, "queue"),
        scheduled=_get(raw, "scheduled", int, "queue"),
        inflight=_get(raw, "inflight", int, "queue"),
        dead_letter=_get(raw, "dead_letter", int, "queue"),
        settings=dict(_map(raw.get("settings"), "queue settings")),
        overrides=None if overrides is None else dict(_map(overrides, "queue overrides")),
    )


def admin_outcomes(body: Mapping[str, Any]) -> AdminOutcomes:
    outcomes = []
    for raw in _get(body, "outcomes", list, "an admin answer"):
        raw = _map(raw, "an outcome")
        outcomes.append((_get(raw, "id", str, "outcome"), _get(raw, "outcome", str, "outcome")))
    return AdminOutcomes(outcomes, _get(body, "remaining", int, "an admin answer"))


def queue_change(body: Mapping[str, Any]) -> QueueChange:
    return QueueChange(
        _get(body, "queue", str, "queue"),
        _get(body, "paused", bool, "queue"),
        _get(body, "changed", bool, "queue"),
    )


def purge_result(body: Mapping[str, Any]) -> PurgeResult:
    return PurgeResult(
        _get(body, "queue", str, "purge"),
        _get(body, "purged", int, "purge"),
        _get(body, "remaining", int, "purge"),
    )


def put_queue_result(body: Mapping[str, Any]) -> PutQueueResult:
    return PutQueueResult(
        _get(body, "queue", str, "put_queue"),
        _get(body, "created", bool, "put_queue"),
        _get(body, "changed", bool, "put_queue"),
        dict(_map(body.get("settings"), "queue settings")),
    )


def delete_queue_result(body: Mapping[str, Any]) -> DeleteQueueResult:
    return DeleteQueueResult(
        _get(body, "queue", str, "delete_queue"),
        _get(body, "cancelled", int, "delete_queue"),
        _get(body, "declared_by_file", bool, "delete_queue"),
    )


def _instant(raw: Mapping[str, Any], name: str) -> datetime:
    when = ms_to_datetime(_get(raw, name, int, "schedule"))
    if when is None:
        raise MalformedResponseError(f"schedule field {name!r} is out of range")
    return when


def schedule_info(raw: Any) -> ScheduleInfo:
    raw = _map(raw, "a schedule")
    next_ms = _get(raw, "next_ms", int, "schedule")
    return ScheduleInfo(
        name=_get(raw, "name", str, "schedule"),
        queue=_get(raw, "queue", str, "schedule"),
        job_type=_get(raw, "job_type", str, "schedule"),
        cron=_get(raw, "cron", str, "schedule", optional=True),
        timezone=_get(raw, "timezone", str, "schedule"),
        every_ms=_get(raw, "every_ms", int, "schedule", optional=True),
        catch_up=_get(raw, "catch_up", str, "schedule"),
        paused=_get(raw, "paused", bool, "schedule"),
        next_ms=next_ms,
        next_fire_at=_instant(raw, "next_ms"),
        priority=_get(raw, "priority", int, "schedule", optional=True),
        max_attempts=_get(raw, "max_attempts", int, "schedule", optional=True),
        payload_encoding=_get(raw, "payload_encoding", str, "schedule", optional=True),
        created_at=_instant(raw, "created_at"),
    )


def schedule_change(body: Mapping[str, Any]) -> ScheduleChange:
    raw = _map(body.get("schedule"), "a schedule answer")
    return ScheduleChange(
        _get(raw, "name", str, "schedule"),
        _get(raw, "created", bool, "schedule"),
        _get(raw, "changed", bool, "schedule"),
        _get(raw, "paused", bool, "schedule"),
        _get(raw, "next_ms", int, "schedule", optional=True),
    )
