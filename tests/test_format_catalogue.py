"""The event catalogue of `log_format` (data, documented in FORMAT.md) and the event
classes of `sepp.core.events` (code) state the same facts. log_format may not import
sepp, so this test, which may import both, is what keeps them in step."""

from __future__ import annotations

from typing import Any

import pytest

from log_format import CATALOGUE, EVENT_SPECS_BY_TYPE, FormatError, validate_event
from sepp.core import events as core

JOB = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
T = 1_700_000_000_000

SAMPLES: list[Any] = [
    core.JobEnqueued(
        job_id=JOB, queue="emails", job_type="send", payload_data=b"\x00payload",
        payload_encoding="application/json", priority=9, max_attempts=3, enqueued_at=T,
        scheduled_at=T + 5, run_at=T + 5, idempotency_key="key-1",
        dedup_expires_at=T + 86_400_000, traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        tracestate="congo=t61rcWkgMzE", custom={"tenant": "acme", "n": 2, "r": 0.5, "vip": True},
    ),
    core.JobEnqueued(
        job_id=JOB, queue="emails", job_type="send", payload_data=None, payload_encoding=None,
        priority=0, max_attempts=1, enqueued_at=T, scheduled_at=None, run_at=None,
        idempotency_key=None, dedup_expires_at=None, traceparent=None, tracestate=None, custom=None,
    ),
    core.JobReserved(job_id=JOB, attempt=1, lease_expires_at=T + 30_000, worker_id="w-1"),
    core.JobReserved(job_id=JOB, attempt=2, lease_expires_at=T, worker_id=None),
    core.JobAcked(job_id=JOB, attempt=1, worker_id="w-1"),
    core.JobNacked(job_id=JOB, attempt=1, run_at=T + 1000, reason="timeout", worker_id=None),
    core.JobNacked(job_id=JOB, attempt=1, run_at=None, reason=None, worker_id="w-1"),
    core.JobLeaseExtended(job_id=JOB, attempt=1, lease_expires_at=T + 60_000, worker_id=None),
    core.JobLeaseExpired(job_id=JOB, attempt=3),
    core.JobPromoted(job_id=JOB),
    core.JobDeadLettered(
        job_id=JOB, attempt=3, cause=core.CAUSE_ATTEMPTS_EXHAUSTED, failed_at=T, reason="boom",
        retained=True,
    ),
    core.JobDeadLettered(
        job_id=JOB, attempt=1, cause=core.CAUSE_ADMIN, failed_at=T, reason=None, retained=False,
    ),
    core.DeadLetterDrained(job_id=JOB),
    core.DeadLetterExpired(job_id=JOB),
    core.DedupExpired(queue="emails", idempotency_key="key-1", expires_at=T),
    core.DeadLetterRequeued(job_id=JOB, enqueued_at=T),
    core.JobReleased(job_id=JOB, attempt=1, worker_id=None),
    core.AdminAction(action="queue.purge", actor="ann", role="admin", reason="cleanup", queue="emails", job_ids=[JOB]),
    core.AdminAction(action="queue.pause", actor="local", role="operator", reason=None, queue=None, job_ids=[]),
    core.JobCancelled(job_id=JOB, attempt=2),
    core.DeadLetterDeleted(job_id=JOB),
    core.QueuePaused(queue="emails"),
    core.QueueResumed(queue="emails"),
    core.QueueDefined(queue="emails", overrides={"default_priority": 4, "retry_backoff": "exponential"}),
    core.QueueDefined(queue="emails", overrides=None),
    core.QueueDeleted(queue="emails"),
    core.ScheduleDefined(
        name="nightly", queue="emails", job_type="digest", payload_data=b"{}",
        payload_encoding="application/json", priority=3, max_attempts=5, custom={"team": "ops"},
        cron="0 2 * * *", timezone="Europe/Berlin", zone=(-(2**62), 3_600_000, T, 7_200_000),
        every_ms=None, catch_up="one", next_ms=T + 60_000, created_at=T,
    ),
    core.ScheduleDefined(
        name="tick", queue="emails", job_type="ping", payload_data=None, payload_encoding=None,
        priority=None, max_attempts=None, custom=None, cron=None, timezone="UTC",
        zone=(-(2**62), 0), every_ms=1000, catch_up="all", next_ms=T + 1000, created_at=T,
    ),
    core.SchedulePaused(name="nightly"),
    core.ScheduleResumed(name="nightly", next_ms=T + 86_400_000),
    core.ScheduleDeleted(name="nightly"),
    core.ScheduleAdvanced(name="tick", fired=(T + 1000, T + 2000), skipped=0, next_ms=T + 3000),
    core.ScheduleAdvanced(name="tick", fired=(), skipped=4, next_ms=T + 3000),
    core.LeaderChanged(epoch=2, node_id="n2", address="10.0.0.2:7420"),
]  # fmt: skip


def test_catalogue_and_event_classes_list_the_same_type_ids() -> None:
    assert sorted(cls.TYPE for cls in core.EVENT_CLASSES) == sorted(EVENT_SPECS_BY_TYPE)
    assert len(CATALOGUE) == len(core.EVENT_CLASSES)


@pytest.mark.parametrize("cls", core.EVENT_CLASSES, ids=lambda cls: cls.__name__)
def test_event_class_matches_its_catalogue_entry(cls: Any) -> None:
    spec = EVENT_SPECS_BY_TYPE[cls.TYPE]
    assert spec.name == cls.__name__
    assert spec.version == cls.VERSION
    assert tuple(field.name for field in spec.fields) == cls._fields


def test_samples_cover_every_event_class() -> None:
    assert {type(event) for event in SAMPLES} == set(core.EVENT_CLASSES)


@pytest.mark.parametrize("event", SAMPLES, ids=lambda event: type(event).__name__)
def test_validate_event_accepts_what_to_fields_produces(event: Any) -> None:
    validate_event(core.to_fields(event))


@pytest.mark.parametrize("event", SAMPLES, ids=lambda event: type(event).__name__)
def test_from_fields_accepts_every_event_validate_event_accepts(event: Any) -> None:
    assert core.from_fields(core.to_fields(event)) == event


def test_validate_event_rejects_what_from_fields_rejects() -> None:
    for fields in ([99, 1], [7, 2, JOB], [7, 1]):
        with pytest.raises(core.EventDecodeError):
            core.from_fields(fields)
        with pytest.raises(FormatError):
            validate_event(fields)
