"""Admin reads (issue 15): pure functions of the state, no events, no clock.

Owns: `get_job` (a job by id, in any state, as a `JobInfo`), `list_jobs` (the
jobs of one queue in one state, a page at a time, with an opaque cursor),
`list_queues` / `queue_info` (counts, pause flag and effective settings), the
cursor encoding and the read limits.

Promises:
- `list_jobs` pages through the queue's status index (`sepp.core.state.StatusIndex`):
  a bisect to the cursor, then a walk, so a page of `limit` jobs costs
  O(log n + limit + stale entries passed) whatever the queue's size. A cursor stays
  valid however the queue changes between pages: a page holds the jobs that were in
  that state when it was read, in the order they entered it; a job that left and came
  back is listed again at its new place. Cursors name the index epoch: one from
  before a restart (the indexes are rebuilt from the snapshot) is refused with
  `InvalidCursor`, the caller starts over.
- Dead letters are listed without being consumed; `cause` filters them (the walk
  then passes over the other causes, bounded by READ_SCAN_ENTRIES_MAX per page).

Must not import: anything outside the standard library and `sepp.core`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from typing import Any, NamedTuple

from sepp.core.config import QueuePolicy
from sepp.core.events import CAUSE_NAMES
from sepp.core.results import CommandError, InvalidArgument, InvalidCursor, QueueNotFound
from sepp.core.state import (
    DEAD,
    IN_FLIGHT,
    READY,
    SCHEDULED,
    Job,
    State,
    echoed_scheduled_at,
)

# The state names of the admin API (issue 15) and the status each stands for.
JOB_STATES = {
    "ready": READY,
    "scheduled": SCHEDULED,
    "inflight": IN_FLIGHT,
    "dead_letter": DEAD,
}
_STATE_NAMES = {status: name for name, status in JOB_STATES.items()}

# Jobs one page may hold.
PAGE_JOBS_MAX = 1000
PAGE_JOBS_DEFAULT = 100
# Index entries one page may walk past (stale ones, or dead letters of another
# cause) before it ends early; its cursor then resumes there.
READ_SCAN_ENTRIES_MAX = 100_000


class JobInfo(NamedTuple):
    """One job as an operator sees it, in any state."""

    job_id: str
    queue: str
    job_type: str
    # "ready", "scheduled", "inflight" or "dead_letter".
    state: str
    priority: int
    attempt: int
    max_attempts: int
    enqueued_at: int
    # As the producer asked (echoed like a delivery), or None.
    scheduled_at: int | None
    # Scheduled: when it becomes Ready. None otherwise.
    run_at: int | None
    # In flight: the lease deadline and the worker holding it.
    lease_expires_at: int | None
    worker_id: str | None
    payload_data: bytes | None
    payload_encoding: str | None
    idempotency_key: str | None
    traceparent: str | None
    tracestate: str | None
    custom: Mapping[str, Any] | None
    # The reason of the last nack (or, for a dead letter, its final reason).
    last_reason: str | None
    # Dead letters: the cause's name ("attempts_exhausted", "rejected",
    # "lease_expired", "admin"), when it died, and its final attempt.
    dead_letter_cause: str | None
    failed_at: int | None
    final_attempt: int | None


class JobPage(NamedTuple):
    jobs: tuple[JobInfo, ...]
    # Pass it back for the next page; None: the listing is complete.
    next_cursor: str | None


class QueueInfo(NamedTuple):
    name: str
    # Declared (in the configuration file's [[queues]] or at runtime by PutQueue),
    # or only in use.
    declared: bool
    paused: bool
    ready: int
    scheduled: int
    inflight: int
    dead_letter: int
    # The settings in force for the queue (file, then runtime overrides on top).
    policy: QueuePolicy
    # Its runtime overrides (PutQueue), or None: not defined at runtime.
    overrides: Mapping[str, Any] | None


def _info(job: Job, state_name: str) -> JobInfo:
    status = job.status
    return JobInfo(
        job.job_id,
        job.queue,
        job.job_type,
        state_name,
        job.priority,
        job.attempt,
        job.max_attempts,
        job.enqueued_at,
        echoed_scheduled_at(job.scheduled_at, job.enqueued_at),
        job.due_ms if status == SCHEDULED else None,
        job.due_ms if status == IN_FLIGHT else None,
        job.worker_id if status == IN_FLIGHT else None,
        job.payload_data,
        job.payload_encoding,
        job.idempotency_key,
        job.traceparent,
        job.tracestate,
        dict(job.custom) if job.custom else None,
        job.last_reason,
        None,
        None,
        None,
    )


def get_job(state: State, job_id: str) -> JobInfo | None:
    """The job `job_id` in any state (live or dead letter), or None: unknown (never
    enqueued, or gone: acked, cancelled, deleted, drained, expired)."""
    job = state.jobs.get(job_id)
    if job is not None:
        return _info(job, _STATE_NAMES[job.status])
    record = state.dead.get(job_id)
    if record is None:
        return None
    info = _info(record.job, "dead_letter")
    return info._replace(
        last_reason=record.last_reason,
        dead_letter_cause=CAUSE_NAMES.get(record.cause, str(record.cause)),
        failed_at=record.failed_at,
        final_attempt=record.final_attempt,
    )


def _encode_cursor(epoch: int, seq: int) -> str:
    return f"{epoch:x}.{seq:x}"


def _decode_cursor(cursor: str, epoch: int) -> int | None:
    """The seq a cursor resumes after, or None when it is not one of ours."""
    parts = cursor.split(".")
    if len(parts) != 2:
        return None
    try:
        cursor_epoch, seq = int(parts[0], 16), int(parts[1], 16)
    except ValueError:
        return None
    if cursor_epoch != epoch or seq < 0:
        return None
    return seq


def list_jobs(
    state: State,
    queue: str,
    job_state: str,
    cursor: str | None = None,
    limit: int = PAGE_JOBS_DEFAULT,
    cause: str | None = None,
) -> JobPage | CommandError:
    """A page of the jobs of `queue` in `job_state` ("ready", "scheduled",
    "inflight", "dead_letter"), in the order they entered it, after `cursor`
    (None: from the start). `cause` (a cause name) filters dead letters."""
    status = JOB_STATES.get(job_state)
    if status is None:
        return InvalidArgument(f"state must be one of {list(JOB_STATES)}")
    if type(limit) is not int or not 1 <= limit <= PAGE_JOBS_MAX:
        return InvalidArgument(f"limit must be 1..{PAGE_JOBS_MAX}")
    cause_code: int | None = None
    if cause is not None:
        if status != DEAD:
            return InvalidArgument("cause filters dead letters only")
        codes = {name: code for code, name in CAUSE_NAMES.items()}
        if cause not in codes:
            return InvalidArgument(f"cause must be one of {sorted(codes)}")
        cause_code = codes[cause]
    after = 0
    if cursor is not None:
        decoded = _decode_cursor(cursor, state.index_epoch) if isinstance(cursor, str) else None
        if decoded is None:
            return InvalidCursor("unknown or outdated cursor: list from the start")
        after = decoded
    q = state.queues.get(queue)
    if q is None:
        if queue in state.config.queues:
            return JobPage((), None)
        return QueueNotFound(f"no queue {queue!r}", queue)
    if q.index is None:
        return JobPage((), None)
    ix = q.index[status]
    seqs, jobs = ix.seqs, ix.jobs
    end = len(jobs)
    i = max(ix.head, bisect_right(seqs, after))
    found: list[JobInfo] = []
    scanned = 0
    last = after
    while i < end and len(found) < limit and scanned < READ_SCAN_ENTRIES_MAX:
        job = jobs[i]
        seq = seqs[i]
        i += 1
        scanned += 1
        last = seq
        if job.status != status or job.iseq != seq:
            continue
        if status == DEAD:
            record = q.dead.get(job.job_id)
            if record is None or (cause_code is not None and record.cause != cause_code):
                continue
            info = get_job(state, job.job_id)
            if info is not None:
                found.append(info)
        else:
            found.append(_info(job, job_state))
    next_cursor = _encode_cursor(state.index_epoch, last) if i < end else None
    return JobPage(tuple(found), next_cursor)


def queue_info(state: State, name: str) -> QueueInfo | None:
    """One queue's counts and settings, or None when the state does not know it
    (neither declared nor holding anything)."""
    q = state.queues.get(name)
    if q is None:
        return None
    return QueueInfo(
        name,
        name in state.config.queues,
        q.paused,
        q.ready_count,
        q.scheduled_count,
        q.in_flight_count,
        len(q.dead),
        state.config.policy(name),
        dict(state.queue_overrides[name]) if name in state.queue_overrides else None,
    )


def list_queues(state: State) -> tuple[QueueInfo, ...]:
    """Every queue the state knows (declared, or holding something, or paused),
    by name."""
    infos = (queue_info(state, name) for name in sorted(state.queues))
    return tuple(info for info in infos if info is not None)


# ---------------------------------------------------------------------------
# Schedules (issue 17)


class ScheduleInfo(NamedTuple):
    """A schedule as `sepp schedules list` shows it: its definition, whether it is
    paused, and its next tick (ms; the next fire time)."""

    name: str
    queue: str
    job_type: str
    cron: str | None
    timezone: str
    every_ms: int | None
    catch_up: str
    paused: bool
    next_ms: int
    priority: int | None
    max_attempts: int | None
    payload_encoding: str | None
    created_at: int


def list_schedules(state: State) -> tuple[ScheduleInfo, ...]:
    """Every schedule, by name."""
    out = []
    for name in sorted(state.schedules):
        sched = state.schedules[name]
        spec = sched.spec
        out.append(
            ScheduleInfo(
                name=name,
                queue=spec.queue,
                job_type=spec.job_type,
                cron=spec.cron,
                timezone=spec.timezone,
                every_ms=spec.every_ms,
                catch_up=spec.catch_up,
                paused=sched.paused,
                next_ms=sched.next_ms,
                priority=spec.priority,
                max_attempts=spec.max_attempts,
                payload_encoding=spec.payload_encoding,
                created_at=spec.created_at,
            )
        )
    return tuple(out)
