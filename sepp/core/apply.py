"""`apply`: change the state by one event. Never validates, never refuses.

Owns: the per-event mutation functions and `apply_record`, the entry point used by
the live path and by replay alike (one record = the events of one command, stamped
with the time the command was decided).

Promises: an event that cannot be applied (an unknown job, a job in the wrong
status) is a bug in `decide` or a corrupt log that slipped past the checksums; it
raises `ApplyError` instead of guessing. Applying the same events to equal states
gives equal states.

Must not import: anything outside the standard library and `sepp.core`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from heapq import heappop, heappush
from typing import Any

from sepp.core.errors import ApplyError as ApplyError
from sepp.core.events import (
    AdminAction,
    DeadLetterDeleted,
    DeadLetterDrained,
    DeadLetterExpired,
    DeadLetterRequeued,
    DedupExpired,
    Event,
    JobAcked,
    JobCancelled,
    JobDeadLettered,
    JobEnqueued,
    JobLeaseExpired,
    JobLeaseExtended,
    JobNacked,
    JobPromoted,
    JobReleased,
    JobReserved,
    LeaderChanged,
    QueueDefined,
    QueueDeleted,
    QueuePaused,
    QueueResumed,
    ScheduleAdvanced,
    ScheduleDefined,
    ScheduleDeleted,
    SchedulePaused,
    ScheduleResumed,
)
from sepp.core.schedules import Schedule
from sepp.core.state import (
    DEAD,
    DELETED,
    IN_FLIGHT,
    READY,
    SCHEDULED,
    DeadLetter,
    Job,
    QueueState,
    ReadyEntry,
    State,
    fair_served,
    index_add,
    index_remove,
    is_sparse,
    push_ready,
    ready_level_for_push,
)


def _live(state: State, job_id: str, status: int, event: Any) -> Job:
    job = state.jobs.get(job_id)
    if job is None or job.status != status:
        raise ApplyError(f"{type(event).__name__} for {job_id}: job is {job!r}")
    return job


def _in_flight(state: State, event: Any) -> Job:
    job = _live(state, event.job_id, IN_FLIGHT, event)
    if job.attempt != event.attempt:
        raise ApplyError(f"{type(event).__name__} attempt {event.attempt} but job is {job!r}")
    return job


def _leave_flight(state: State, job: Job) -> QueueState:
    """Bookkeeping when an in-flight job stops being in flight; its queue."""
    q = state.queues[job.queue]
    q.in_flight_count -= 1
    job.worker_id = None
    index_remove(q, job, IN_FLIGHT)
    leases = state.leases
    if leases and leases[0][2] is job:
        job.status = DELETED  # temporarily invalid so the prune pops it
        state.prune_leases()
    return q


def _apply_enqueued(state: State, ev: JobEnqueued) -> None:
    # The hottest apply (every job starts here, on the live path and in replay):
    # locals and inlined helpers instead of method calls.
    (
        job_id,
        queue,
        job_type,
        payload_data,
        encoding,
        priority,
        max_attempts,
        enqueued_at,
        scheduled_at,
        run_at,
        key,
        dedup_expires_at,
        traceparent,
        tracestate,
        custom,
    ) = ev
    jobs = state.jobs
    if job_id in jobs:
        raise ApplyError(f"JobEnqueued for existing job {job_id}")
    strings = state._strings
    queue = strings.get(queue) or state.intern(queue)
    job_type = strings.get(job_type) or state.intern(job_type)
    if encoding is not None:
        encoding = strings.get(encoding) or state.intern(encoding)
    q = state.queues.get(queue) or state.queue(queue)
    order = state.next_order
    state.next_order = order + 1
    job = Job(
        job_id,
        queue,
        job_type,
        payload_data,
        encoding,
        priority,
        max_attempts,
        enqueued_at,
        scheduled_at,
        key,
        traceparent,
        tracestate,
        custom,
        order,
        1,
        READY if run_at is None else SCHEDULED,
        0 if run_at is None else run_at,
        None,
        None,
    )
    jobs[job_id] = job
    if run_at is None:
        entry: ReadyEntry = (enqueued_at, order, job)
        job.entry = entry
        ready_level_for_push(q, priority).push(entry)
        q.ready_count += 1
    else:
        heappush(state.scheduled, (run_at, job_id, job))
        q.scheduled_count += 1
    index_add(state, q, job)
    if dedup_expires_at is not None and key is not None:
        dedup = state.dedup
        replaced = dedup.get((queue, key))
        dedup[(queue, key)] = (job_id, dedup_expires_at)
        heappush(state.dedup_expiry, (dedup_expires_at, queue, key))
        if replaced is None:
            q.dedup_count += 1
        else:
            # A lapsed key re-used before the sweep expired it: the old record's
            # expiry entry is now stale and may be the heap's top (the invariant
            # "the top of every heap is valid" would break, and next_deadline()
            # would report the stale time).
            state.prune_dedup()


def _apply_reserved(state: State, ev: JobReserved) -> None:
    job_id, attempt, lease_expires_at, worker_id = ev
    job = state.jobs.get(job_id)
    if job is None or job.status != READY or job.attempt != attempt:
        raise ApplyError(f"JobReserved for {job_id} attempt {attempt}: job is {job!r}")
    q = state.queues[job.queue]
    job.entry = None
    q.ready[job.priority].prune()
    q.ready_count -= 1
    q.in_flight_count += 1
    job.status = IN_FLIGHT
    job.due_ms = lease_expires_at
    job.worker_id = worker_id
    heappush(state.leases, (lease_expires_at, job_id, job))
    index_remove(q, job, READY)
    index_add(state, q, job)
    # A delivery (issue 17): numbered for the fair reserve and counted in the
    # queue's rate window at this record's time, under the weight and rate limit
    # in force (the file's settings and the logged runtime overrides, so a
    # replay under the same file rebuilds both).
    config = state.config
    policy = config.queues.get(job.queue, config.defaults)
    seq = state.delivery_seq + 1
    state.delivery_seq = seq
    fair_served(q, policy.weight, seq)
    if policy.rate_limit_jobs is not None:
        state.count_delivery(job.queue, policy)


def _apply_acked(state: State, ev: JobAcked) -> None:
    job_id = ev[0]
    job = state.jobs.pop(job_id, None)
    if job is None or job.status != IN_FLIGHT or job.attempt != ev[1]:
        if job is not None:
            state.jobs[job_id] = job  # leave the state as it was: this is a bug report
        raise ApplyError(f"JobAcked for {job_id} attempt {ev[1]}: job is {job!r}")
    q = _leave_flight(state, job)
    job.status = DELETED
    if q.in_flight_count == 0:
        state.forget_if_empty(q)
    if is_sparse(state.jobs):
        state.jobs = dict(state.jobs)


def _apply_nacked(state: State, ev: JobNacked) -> None:
    job = _in_flight(state, ev)
    _leave_flight(state, job)
    job.attempt += 1
    job.last_reason = ev.reason
    _requeue(state, job, ev.run_at)


def _apply_released(state: State, ev: JobReleased) -> None:
    # The attempt was never handed to a handler: the job goes back under the
    # same attempt number (not counted against max_attempts) and keeps its
    # place in the ready order (its enqueued_at and arrival number).
    job = _in_flight(state, ev)
    _leave_flight(state, job)
    _requeue(state, job, None)


def _requeue(state: State, job: Job, run_at: int | None) -> None:
    q = state.queues[job.queue]
    if run_at is None:
        job.status = READY
        job.due_ms = 0
        push_ready(q, job)
        q.ready_count += 1
    else:
        job.status = SCHEDULED
        job.due_ms = run_at
        heappush(state.scheduled, (run_at, job.job_id, job))
        q.scheduled_count += 1
    index_add(state, q, job)


def _apply_lease_extended(state: State, ev: JobLeaseExtended) -> None:
    job = _in_flight(state, ev)
    if job.due_ms == ev.lease_expires_at:
        return
    job.due_ms = ev.lease_expires_at
    heappush(state.leases, (ev.lease_expires_at, ev.job_id, job))
    state.prune_leases()


def _apply_lease_expired(state: State, ev: JobLeaseExpired) -> None:
    job = _in_flight(state, ev)
    _leave_flight(state, job)
    job.attempt += 1
    _requeue(state, job, None)


def _apply_promoted(state: State, ev: JobPromoted) -> None:
    job = _live(state, ev.job_id, SCHEDULED, ev)
    q = state.queues[job.queue]
    q.scheduled_count -= 1
    job.status = READY
    job.due_ms = 0
    push_ready(q, job)
    q.ready_count += 1
    state.prune_scheduled()
    index_remove(q, job, SCHEDULED)
    index_add(state, q, job)


def _apply_dead_lettered(state: State, ev: JobDeadLettered) -> None:
    job = state.jobs.get(ev.job_id)
    if job is None or job.status == DEAD or job.attempt != ev.attempt:
        raise ApplyError(f"JobDeadLettered for {ev.job_id} attempt {ev.attempt}: job is {job!r}")
    q = state.queues[job.queue]
    status = job.status
    if status == IN_FLIGHT:
        _leave_flight(state, job)
    elif status == READY:
        q.ready_count -= 1
        job.entry = None
        q.ready[job.priority].prune()
        index_remove(q, job, READY)
    elif status == SCHEDULED:
        q.scheduled_count -= 1
        job.status = DEAD
        state.prune_scheduled()
        index_remove(q, job, SCHEDULED)
    del state.jobs[ev.job_id]
    if is_sparse(state.jobs):
        state.jobs = dict(state.jobs)
    job.due_ms = 0
    job.worker_id = None
    if ev.retained:
        job.status = DEAD
        record = DeadLetter(job, ev.cause, ev.failed_at, ev.attempt, ev.reason)
        state.dead[ev.job_id] = record
        q.dead[ev.job_id] = record
        index_add(state, q, job)
    else:
        job.status = DELETED
        state.forget_if_empty(q)


def _remove_dead(state: State, job_id: str, event: Any) -> None:
    record = state.dead.pop(job_id, None)
    if record is None:
        raise ApplyError(f"{type(event).__name__} for {job_id}: no such dead letter")
    q = state.queues[record.job.queue]
    del q.dead[job_id]
    record.job.status = DELETED
    index_remove(q, record.job, DEAD)
    if is_sparse(state.dead):
        state.dead = dict(state.dead)
    if is_sparse(q.dead):
        q.dead = dict(q.dead)
    state.forget_if_empty(q)


def _apply_dead_letter_drained(state: State, ev: DeadLetterDrained) -> None:
    _remove_dead(state, ev.job_id, ev)


def _apply_dead_letter_expired(state: State, ev: DeadLetterExpired) -> None:
    _remove_dead(state, ev.job_id, ev)


def _apply_dedup_expired(state: State, ev: DedupExpired) -> None:
    key = (ev.queue, ev.idempotency_key)
    record = state.dedup.get(key)
    if record is None or record[1] != ev.expires_at:
        raise ApplyError(f"DedupExpired for {key} at {ev.expires_at}: record is {record!r}")
    del state.dedup[key]
    if is_sparse(state.dedup):
        state.dedup = dict(state.dedup)
    state.prune_dedup()
    q = state.queues[ev.queue]
    q.dedup_count -= 1
    state.forget_if_empty(q)


def _apply_dead_letter_requeued(state: State, ev: DeadLetterRequeued) -> None:
    record = state.dead.pop(ev.job_id, None)
    if record is None:
        raise ApplyError(f"DeadLetterRequeued for {ev.job_id}: no such dead letter")
    job = record.job
    q = state.queues[job.queue]
    del q.dead[ev.job_id]
    index_remove(q, job, DEAD)
    if is_sparse(state.dead):
        state.dead = dict(state.dead)
    if is_sparse(q.dead):
        q.dead = dict(q.dead)
    job.attempt = 1
    job.enqueued_at = ev.enqueued_at
    # A requeued job joins the back of its band: a new arrival number.
    job.order = state.next_order
    state.next_order += 1
    job.scheduled_at = None
    job.last_reason = None
    state.jobs[ev.job_id] = job
    _requeue(state, job, None)


def _apply_admin_action(state: State, ev: AdminAction) -> None:
    """The audit header of an admin record: nothing to change."""


def _apply_job_cancelled(state: State, ev: JobCancelled) -> None:
    job = state.jobs.get(ev.job_id)
    if job is None or job.status not in (READY, SCHEDULED) or job.attempt != ev.attempt:
        raise ApplyError(f"JobCancelled for {ev.job_id} attempt {ev.attempt}: job is {job!r}")
    q = state.queues[job.queue]
    if job.status == READY:
        q.ready_count -= 1
        job.entry = None
        job.status = DELETED
        q.ready[job.priority].prune()
        index_remove(q, job, READY)
    else:
        q.scheduled_count -= 1
        job.status = DELETED
        state.prune_scheduled()
        index_remove(q, job, SCHEDULED)
    del state.jobs[ev.job_id]
    if is_sparse(state.jobs):
        state.jobs = dict(state.jobs)
    job.due_ms = 0
    state.forget_if_empty(q)


def _apply_dead_letter_deleted(state: State, ev: DeadLetterDeleted) -> None:
    _remove_dead(state, ev.job_id, ev)


def _apply_queue_paused(state: State, ev: QueuePaused) -> None:
    q = state.queue(ev.queue)
    if q.paused:
        raise ApplyError(f"QueuePaused for {ev.queue}: already paused")
    q.paused = True


def _apply_queue_resumed(state: State, ev: QueueResumed) -> None:
    q = state.queues.get(ev.queue)
    if q is None or not q.paused:
        raise ApplyError(f"QueueResumed for {ev.queue}: not paused")
    q.paused = False
    state.forget_if_empty(q)


def _apply_queue_defined(state: State, ev: QueueDefined) -> None:
    state.set_queue_overrides(ev.queue, ev.overrides or {})
    state.queue(ev.queue)


def _apply_queue_deleted(state: State, ev: QueueDeleted) -> None:
    if ev.queue not in state.queue_overrides:
        raise ApplyError(f"QueueDeleted for {ev.queue}: not defined at runtime")
    state.set_queue_overrides(ev.queue, None)
    q = state.queues.get(ev.queue)
    if q is not None:
        state.forget_if_empty(q)


def _apply_schedule_defined(state: State, ev: ScheduleDefined) -> None:
    old = state.schedules.get(ev.name)
    spec = ev._replace(zone=tuple(ev.zone))
    sched = Schedule(spec, old is not None and old.paused, ev.next_ms)
    state.schedules[ev.name] = sched
    state.push_schedule(sched)


def _schedule(state: State, name: str, event: Any) -> Schedule:
    sched = state.schedules.get(name)
    if sched is None:
        raise ApplyError(f"{type(event).__name__} for schedule {name}: no such schedule")
    return sched


def _apply_schedule_paused(state: State, ev: SchedulePaused) -> None:
    sched = _schedule(state, ev.name, ev)
    if sched.paused:
        raise ApplyError(f"SchedulePaused for {ev.name}: already paused")
    sched.paused = True
    state.push_schedule(sched)


def _apply_schedule_resumed(state: State, ev: ScheduleResumed) -> None:
    sched = _schedule(state, ev.name, ev)
    if not sched.paused:
        raise ApplyError(f"ScheduleResumed for {ev.name}: not paused")
    sched.paused = False
    sched.next_ms = ev.next_ms
    state.push_schedule(sched)


def _apply_schedule_deleted(state: State, ev: ScheduleDeleted) -> None:
    _schedule(state, ev.name, ev)
    del state.schedules[ev.name]
    heap = state.schedule_heap
    while heap and not state.schedule_entry_valid(heap[0]):
        heappop(heap)


def _apply_leader_changed(state: State, ev: LeaderChanged) -> None:
    """A marker in the log (cluster mode): no job state changes."""


def _apply_schedule_advanced(state: State, ev: ScheduleAdvanced) -> None:
    sched = _schedule(state, ev.name, ev)
    sched.next_ms = ev.next_ms
    state.push_schedule(sched)


_APPLY: list[Callable[[State, Any], None] | None] = [None] * 27
_APPLY[JobEnqueued.TYPE] = _apply_enqueued
_APPLY[JobReserved.TYPE] = _apply_reserved
_APPLY[JobAcked.TYPE] = _apply_acked
_APPLY[JobNacked.TYPE] = _apply_nacked
_APPLY[JobLeaseExtended.TYPE] = _apply_lease_extended
_APPLY[JobLeaseExpired.TYPE] = _apply_lease_expired
_APPLY[JobPromoted.TYPE] = _apply_promoted
_APPLY[JobDeadLettered.TYPE] = _apply_dead_lettered
_APPLY[DeadLetterDrained.TYPE] = _apply_dead_letter_drained
_APPLY[DeadLetterExpired.TYPE] = _apply_dead_letter_expired
_APPLY[DedupExpired.TYPE] = _apply_dedup_expired
_APPLY[DeadLetterRequeued.TYPE] = _apply_dead_letter_requeued
_APPLY[JobReleased.TYPE] = _apply_released
_APPLY[AdminAction.TYPE] = _apply_admin_action
_APPLY[JobCancelled.TYPE] = _apply_job_cancelled
_APPLY[DeadLetterDeleted.TYPE] = _apply_dead_letter_deleted
_APPLY[QueuePaused.TYPE] = _apply_queue_paused
_APPLY[QueueResumed.TYPE] = _apply_queue_resumed
_APPLY[QueueDefined.TYPE] = _apply_queue_defined
_APPLY[QueueDeleted.TYPE] = _apply_queue_deleted
_APPLY[ScheduleDefined.TYPE] = _apply_schedule_defined
_APPLY[SchedulePaused.TYPE] = _apply_schedule_paused
_APPLY[ScheduleResumed.TYPE] = _apply_schedule_resumed
_APPLY[ScheduleDeleted.TYPE] = _apply_schedule_deleted
_APPLY[ScheduleAdvanced.TYPE] = _apply_schedule_advanced
_APPLY[LeaderChanged.TYPE] = _apply_leader_changed
APPLY_TABLE: tuple[Callable[[State, Any], None] | None, ...] = tuple(_APPLY)


def apply(state: State, event: Event) -> None:
    """Apply one event."""
    fn = APPLY_TABLE[event.TYPE]
    if fn is None:  # pragma: no cover - every catalogue event has a function
        raise ApplyError(f"no apply function for {type(event).__name__}")
    fn(state, event)


def apply_record(state: State, time_ms: int, events: Sequence[Event] | Iterable[Event]) -> None:
    """Apply the events of one command decided at `time_ms`, in order."""
    if time_ms > state.clock_ms:
        state.clock_ms = time_ms
    table = APPLY_TABLE
    for event in events:
        table[event.TYPE](state, event)  # type: ignore[misc]
