"""`decide`: turn a command into events, or refuse it. Never mutates the state.

Owns: every business rule of sepp-semantics.md — validation and limits, priority,
attempts, scheduling, dedup, reserve order and lease clamping, fencing, the retry
policy with deterministic jitter, dead-lettering and the sweep.

Promises: `decide(state, command, now_ms)` returns a `Decision` (events to log and
apply, plus the reply) or a `CommandError` (nothing to log). It reads the clock only
through `now_ms`, clamped so it never goes backwards; everything it decides (times,
attempts, delays, dedup deadlines) is written into the events, so `apply` and replay
need nothing else.

Must not import: anything outside the standard library and `sepp.core`.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import replace as dataclasses_replace
from heapq import heappop, heappush, merge, nsmallest
from typing import Any, NamedTuple, TypeGuard, cast

from sepp.core.commands import (
    ADMIN_ACTOR_BYTES_MAX,
    ADMIN_IDS_PER_CALL_MAX,
    ADMIN_JOBS_PER_CHUNK_MAX,
    ADMIN_ROLES,
    ADMIN_ROLES_THAT_CHANGE,
    ORDER_FAIR,
    ORDER_STRICT,
    RETRY_DEAD_LETTER,
    RETRY_DEFAULT,
    RETRY_DELAY,
    Ack,
    AdminCommand,
    AdminDeadLetterJobs,
    AdminRequeueDeadLetters,
    CancelJobs,
    ChangeLeader,
    Command,
    DeadLetterJobs,
    DeleteDeadLetters,
    DeleteQueue,
    DeleteSchedule,
    DrainDeadLetters,
    Enqueue,
    Extend,
    Nack,
    NewJob,
    PauseQueue,
    PauseSchedule,
    PurgeQueue,
    PutQueue,
    PutSchedule,
    Release,
    RequeueDeadLetters,
    Reserve,
    ResumeQueue,
    ResumeSchedule,
    Sweep,
)
from sepp.core.config import (
    ANSWER_ENVELOPE_BYTES_MAX,
    CUSTOM_ENTRY_FIXED_BYTES,
    DEAD_LETTER_ANSWER_FIXED_BYTES,
    JOB_ANSWER_FIXED_BYTES,
    RETRY_BACKOFF_EXPONENTIAL,
    Limits,
    QueuePolicy,
    validate_config,
)
from sepp.core.errors import ConfigError
from sepp.core.events import (
    ADMIN_CANCEL_JOBS,
    ADMIN_DEAD_LETTER_JOBS,
    ADMIN_DELETE_DEAD_LETTERS,
    ADMIN_DELETE_QUEUE,
    ADMIN_DELETE_SCHEDULE,
    ADMIN_PAUSE_QUEUE,
    ADMIN_PAUSE_SCHEDULE,
    ADMIN_PURGE_QUEUE,
    ADMIN_PUT_QUEUE,
    ADMIN_PUT_SCHEDULE,
    ADMIN_REQUEUE_DEAD_LETTERS,
    ADMIN_RESUME_QUEUE,
    ADMIN_RESUME_SCHEDULE,
    CAUSE_ADMIN,
    CAUSE_ATTEMPTS_EXHAUSTED,
    CAUSE_LEASE_EXPIRED,
    CAUSE_NAMES,
    CAUSE_REJECTED,
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
from sepp.core.results import (
    OUTCOME_DONE,
    OUTCOME_NOT_FOUND,
    OUTCOME_WRONG_STATE,
    Accepted,
    AckResult,
    AdminOutcomes,
    AdminResult,
    AtomicRejected,
    AttemptMismatch,
    CommandError,
    CustomEntriesTooMany,
    CustomKeyTooLong,
    CustomMapTooLarge,
    DeleteQueueResult,
    DrainResult,
    EncodingNotAllowed,
    EnqueueResult,
    ExtendResult,
    FailedPrecondition,
    IdempotencyKeyTooLong,
    InvalidArgument,
    InvalidRequest,
    JobTypeNameTooLong,
    JobTypeNotAllowed,
    JobView,
    LeaderChangeResult,
    NackResult,
    NotFound,
    PayloadTooLarge,
    PermissionDenied,
    PurgeResult,
    PutQueueResult,
    QueueAdminResult,
    QueueFull,
    QueueInUse,
    QueueNameTooLong,
    QueueNotFound,
    Rejection,
    ReleaseResult,
    Reply,
    ReserveResult,
    ScheduledTooFar,
    ScheduleNotFound,
    ScheduleResult,
    SweepResult,
    TooManyIds,
    UnknownQueue,
)
from sepp.core.schedules import (
    CATCH_UP_ALL,
    CATCH_UP_ONE,
    CATCH_UP_POLICIES,
    CATCH_UP_SCAN_MAX,
    CUSTOM_SCHEDULE,
    CUSTOM_TICK,
    HOUR_MS,
    SCHEDULE_EVERY_MS_MAX,
    SCHEDULE_EVERY_MS_MIN,
    SCHEDULE_NAME_BYTES_MAX,
    SCHEDULE_ON_TIME_MS,
    SCHEDULES_MAX,
    TIMEZONE_NAME_BYTES_MAX,
    CronError,
    Schedule,
    first_tick,
    next_cron_tick,
    parse_cron,
    zone_error,
)
from sepp.core.state import (
    IN_FLIGHT,
    QUEUE_OVERRIDE_KEYS,
    READY,
    SCHEDULED,
    TIME_MS_MAX,
    DeadLetter,
    Job,
    QueueState,
    State,
    rate_room,
)

_new_tuple = tuple.__new__

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_UUID_MATCH = _UUID_RE.fullmatch


# Bounds on the msgpack size of what an answer carries (PROTOCOL.md 5.2, 5.6), so a
# reserve or drain answer is kept within one frame without encoding it first: the
# constants live in sepp.core.config, whose check that every acceptable job fits
# one answer uses them too.
# A drain lists at most this many records too large for any answer (left in the
# store), each at most this many bytes ({"job_id": ..., "bytes": ...}).
DRAIN_TOO_LARGE_LISTED_MAX = 16
DRAIN_TOO_LARGE_ENTRY_BYTES = 64


class Decision(NamedTuple):
    """What a command does: the events to log and apply (possibly none), the time
    they were decided at, the reply, and the queues that gained Ready jobs (so the
    server can wake parked reserves once the record is durable)."""

    events: tuple[Event, ...]
    time_ms: int
    reply: Reply
    woken: frozenset[str]


NOTHING_WOKEN: frozenset[str] = frozenset()


def decide(state: State, command: Command, now_ms: int) -> Decision | CommandError:
    """Decide `command` against `state` at `now_ms` (clamped to never go back)."""
    now = now_ms if now_ms > state.clock_ms else state.clock_ms
    handler = _HANDLERS.get(type(command))
    if handler is None:
        return InvalidArgument(f"unknown command {type(command).__name__}")
    result: Decision | CommandError = handler(state, command, now)
    return result


# ---------------------------------------------------------------------------
# Shared validation helpers


def canonical_job_id(job_id: object) -> str | None:
    """The canonical lowercase form of a UUID string, or None if it is not one."""
    if type(job_id) is not str or len(job_id) != 36:
        return None
    if _UUID_MATCH(job_id):  # already canonical: the usual case, no copy
        return job_id
    lowered = job_id.lower()
    return lowered if _UUID_MATCH(lowered) else None


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# Every check of what a caller passed reads the command's fields as they really are,
# through an untyped view of the command (`fields: tuple[object, ...] = command`, or
# `_field` for the dataclass commands), never through the typed attribute: in the
# compiled build (mypyc) a typed read converts the value to the declared type first,
# so a bool read as an int becomes the int and a string read as an int raises
# TypeError, where the check must see the value and refuse it. Once checked, the
# typed attributes are safe to use.


def _field(command: object, name: str) -> object:
    return getattr(command, name)


def _utf8_len(value: str) -> int:
    # isascii() is O(1) in CPython (a flag on the string): skip the encode for the
    # usual ASCII names.
    return len(value) if value.isascii() else len(value.encode())


def _queue_name_error(name: object) -> str | None:
    """Structural problem of a queue name, ignoring its length (too long is a
    rejection of its own, QueueNameTooLong)."""
    if not isinstance(name, str) or not name:
        return "queue name must be a non-empty string"
    if name == "." or name == "..":
        return "queue name must not be '.' or '..'"
    if "/" in name:
        return "queue name must not contain '/'"
    if not name.isprintable() and any(ord(c) < 32 or 127 <= ord(c) < 160 for c in name):
        return "queue name must not contain control characters"
    return None


def _optional_worker_id(worker_id: object, max_bytes: int) -> str | None:
    if worker_id is None:
        return None
    if not isinstance(worker_id, str) or not worker_id:
        return "worker_id must be a non-empty string when given"
    return _too_long("worker_id", worker_id, max_bytes, "max_worker_id_bytes")


def _too_long(what: str, value: str, max_bytes: int, limit_name: str) -> str | None:
    """Why `value` is over its limit of `max_bytes` UTF-8 bytes, or None. A string
    of more characters than the limit is over it whatever its encoding: no need to
    encode a huge one to say so."""
    chars = len(value)
    if chars <= max_bytes // 4:  # at most 4 bytes per character: cannot be over
        return None
    if chars > max_bytes:
        return f"{what} is over {limit_name} ({max_bytes} bytes): at least {chars} bytes"
    size = _utf8_len(value)
    if size <= max_bytes:
        return None
    return f"{what} is over {limit_name} ({max_bytes} bytes): {size} bytes"


def _optional_reason(reason: object, max_bytes: int) -> str | None:
    if reason is None:
        return None
    if not isinstance(reason, str):
        return "reason must be a string"
    return _too_long("reason", reason, max_bytes, "max_reason_bytes")


def _fence(
    state: State, job_id: object, attempt: object, enqueued_at: object = None
) -> Job | CommandError:
    """The in-flight job a worker may act on, or the fencing error.

    The fence is (job_id, attempt) and, when the command carries it, the job's
    `enqueued_at` as its delivery carried it: an operator requeue restarts the
    attempt at 1 but always moves enqueued_at forward (`_requeued_at`), so a
    holder of a lease from before the requeue is refused like a stale attempt
    instead of settling the new delivery. Without it (clients that do not send
    it) a requeued job's attempt 1 cannot be told from an older attempt 1."""
    if not _is_int(attempt) or attempt < 1:
        return InvalidArgument("attempt must be an integer >= 1")
    if enqueued_at is not None and not _is_int(enqueued_at):
        return InvalidArgument("enqueued_at must be an integer (ms) when given")
    # A live job's id is a key of state.jobs in canonical form: a hit needs no
    # format check (the usual ack, nack or extend).
    jid = job_id if type(job_id) is str else None
    job = state.jobs.get(jid) if jid is not None else None
    if job is None:
        jid = canonical_job_id(job_id)
        if jid is None:
            return InvalidArgument(f"job_id {job_id!r:.60} is not a canonical UUID")
        job = state.jobs.get(jid)
    if job is None or job.status != IN_FLIGHT:
        return NotFound(f"no in-flight job {jid}")
    if job.attempt != attempt:
        return AttemptMismatch(
            f"job {jid} is in flight under attempt {job.attempt}, not {attempt}: "
            "the lease was reassigned",
            job.attempt,
        )
    if enqueued_at is not None and job.enqueued_at != enqueued_at:
        return AttemptMismatch(
            f"job {jid} is in flight under a delivery enqueued at {job.enqueued_at}, "
            f"not {enqueued_at}: it was requeued and the lease reassigned",
            job.attempt,
        )
    return job


def _requeued_at(job: Job, now: int) -> int:
    """The enqueued_at an operator requeue gives `job`: now, but always after
    the old one, so the fencing token of its deliveries changes (`_fence`) even
    when the requeue falls in the millisecond of the old enqueue."""
    return now if now > job.enqueued_at else job.enqueued_at + 1


# ---------------------------------------------------------------------------
# Enqueue


def _custom_rejection(custom: object, policy: QueuePolicy) -> Rejection | None:
    if custom is None:
        return None
    if not isinstance(custom, Mapping):
        return InvalidRequest("custom must be a map of string keys to primitive values")
    if len(custom) > policy.max_custom_entries:
        return CustomEntriesTooMany(policy.max_custom_entries, len(custom))
    total = 0
    for key, value in custom.items():
        if not isinstance(key, str) or not key:
            return InvalidRequest("custom keys must be non-empty strings")
        key_bytes = len(key.encode())
        if key_bytes > policy.max_custom_key_bytes:
            return CustomKeyTooLong(key, policy.max_custom_key_bytes, key_bytes)
        if isinstance(value, bool):
            size = 1
        elif isinstance(value, int):
            if not INT64_MIN <= value <= INT64_MAX:
                return InvalidRequest(f"custom value of {key!r} does not fit in 64 bits")
            size = 8
        elif isinstance(value, float):
            size = 8
        elif isinstance(value, str):
            size = len(value.encode())
        else:
            return InvalidRequest(
                f"custom value of {key!r} must be a string, integer, float or bool"
            )
        total += key_bytes + size
    if total > policy.max_custom_total_bytes:
        return CustomMapTooLarge(policy.max_custom_total_bytes, total)
    return None


def validate_new_job(state: State, job: NewJob, now: int) -> Rejection | None:
    """Per-job checks that do not depend on other jobs: structure, strict mode,
    sizes and allow-lists, schedule horizon (sepp-semantics.md §12, §13)."""
    fields: tuple[object, ...] = job
    (
        _,
        queue,
        job_type,
        data,
        encoding,
        key,
        priority,
        max_attempts,
        scheduled_at,
        traceparent,
        tracestate,
        custom,
        invalid,
    ) = fields
    if invalid is not None:
        return InvalidRequest(invalid if isinstance(invalid, str) else repr(invalid))
    config = state.config
    limits = config.limits
    problem = _queue_name_error(queue)
    if problem is not None:
        return InvalidRequest(problem)
    queue = cast(str, queue)  # _queue_name_error checked it is one
    queue_bytes = _utf8_len(queue)
    if queue_bytes > limits.max_queue_name_bytes:
        return QueueNameTooLong(limits.max_queue_name_bytes, queue_bytes)
    if not isinstance(job_type, str) or not job_type:
        return InvalidRequest("job_type must be a non-empty string")
    type_bytes = _utf8_len(job_type)
    if type_bytes > limits.max_job_type_bytes:
        return JobTypeNameTooLong(limits.max_job_type_bytes, type_bytes)
    if data is not None or encoding is not None:
        if not isinstance(data, bytes) or not data:
            return InvalidRequest("payload data must be non-empty bytes")
        if not isinstance(encoding, str) or not encoding:
            return InvalidRequest("payload encoding must be a non-empty string")
        problem = _too_long(
            "payload encoding", encoding, limits.max_encoding_bytes, "max_encoding_bytes"
        )
        if problem is not None:
            return InvalidRequest(problem)
    if key is not None:
        if not isinstance(key, str) or not key:
            return InvalidRequest("idempotency_key must be a non-empty string when given")
        key_bytes = _utf8_len(key)
        if key_bytes > limits.max_idempotency_key_bytes:
            return IdempotencyKeyTooLong(limits.max_idempotency_key_bytes, key_bytes)
    if priority is not None and (not _is_int(priority) or not 0 <= priority <= 9):
        return InvalidRequest(f"priority must be 0-9, got {priority!r}")
    if max_attempts is not None and (not _is_int(max_attempts) or max_attempts < 1):
        return InvalidRequest(f"max_attempts must be >= 1, got {max_attempts!r}")
    if traceparent is not None or tracestate is not None:
        if not isinstance(traceparent, str) or not traceparent:
            return InvalidRequest("trace context needs a non-empty traceparent")
        if tracestate is not None and not isinstance(tracestate, str):
            return InvalidRequest("tracestate must be a string")
        # Both parts together: what the job carries into every answer that holds it.
        trace_max = limits.max_trace_context_bytes
        chars = len(traceparent) + (0 if tracestate is None else len(tracestate))
        if chars > trace_max // 4:  # else under the limit whatever the encoding
            size = _utf8_len(traceparent) + (0 if tracestate is None else _utf8_len(tracestate))
            if size > trace_max:
                return InvalidRequest(
                    "trace context (traceparent + tracestate) is over "
                    f"max_trace_context_bytes ({trace_max} bytes): {size}"
                )
    if scheduled_at is not None and not _is_int(scheduled_at):
        return InvalidRequest("scheduled_at must be an integer time in ms")
    if scheduled_at is not None and scheduled_at > TIME_MS_MAX:
        # Every client must be able to decode what the server echoes: a time past
        # 9999-12-31 cannot be (Python's datetime ends there). Refused here, before
        # the horizon check, so a scheduled_too_far rejection's `actual` is always
        # a representable time too. A past time (negative even) is fine: it is
        # stored as "not scheduled" (_new_job_event).
        return InvalidRequest(
            f"scheduled_at {scheduled_at} is after {TIME_MS_MAX} (9999-12-31T23:59:59.999Z), "
            "the latest time the protocol carries"
        )
    declared = queue in config.queues
    if config.strict_queues and not declared:
        return UnknownQueue(queue)
    policy = config.queues[queue] if declared else config.defaults
    if isinstance(data, bytes) and len(data) > policy.max_payload_bytes:
        return PayloadTooLarge(policy.max_payload_bytes, len(data))
    allowed = policy.allowed_encodings
    if allowed is not None and isinstance(encoding, str) and encoding not in allowed:
        return EncodingNotAllowed(encoding, allowed)
    allowed_types = policy.allowed_job_types
    if allowed_types is not None and job_type not in allowed_types:
        return JobTypeNotAllowed(job_type, allowed_types)
    if custom is not None:
        rejection = _custom_rejection(custom, policy)
        if rejection is not None:
            return rejection
    if isinstance(data, bytes):
        rejection = _undeliverable_payload(limits, policy, job, queue_bytes, type_bytes)
        if rejection is not None:
            return rejection
    if scheduled_at is not None and scheduled_at > now + policy.max_schedule_horizon_ms:
        return ScheduledTooFar(policy.max_schedule_horizon_ms, scheduled_at)
    return None


def _undeliverable_payload(
    limits: Limits, policy: QueuePolicy, job: NewJob, queue_bytes: int, type_bytes: int
) -> PayloadTooLarge | None:
    """Refuse a payload so close to the frame limit that the job, delivered with
    the fields the server adds (id, attempt, times), would not fit one reserve
    answer: no client could accept that answer, and the job would burn its
    attempts unseen. Called after the other fields were checked; the exact bound
    is only worked out when the generous one (every field at its limit) fails."""
    data = cast(bytes, job.payload_data)
    room = limits.max_message_bytes - ANSWER_ENVELOPE_BYTES_MAX - JOB_ANSWER_FIXED_BYTES
    generous = (
        limits.max_queue_name_bytes
        + limits.max_job_type_bytes
        + limits.max_encoding_bytes
        + limits.max_trace_context_bytes
        + policy.max_custom_total_bytes
        + CUSTOM_ENTRY_FIXED_BYTES * policy.max_custom_entries
    )
    if len(data) + generous <= room:
        return None
    others = queue_bytes + type_bytes + _utf8_len(cast(str, job.payload_encoding))
    others += _trace_and_custom_answer_bytes(job.traceparent, job.tracestate, job.custom)
    if len(data) + others <= room:
        return None
    return PayloadTooLarge(max(room - others, 0), len(data))


def _new_job_event(state: State, job: NewJob, job_id: str, now: int) -> JobEnqueued:
    config = state.config
    policy = config.queues.get(job.queue, config.defaults)
    priority = policy.default_priority if job.priority is None else job.priority
    max_attempts = policy.default_max_attempts if job.max_attempts is None else job.max_attempts
    if max_attempts > policy.max_attempts_ceiling:
        max_attempts = policy.max_attempts_ceiling
    # A past or present scheduled_at means "ready now" and is stored as not
    # scheduled (None): the job is echoed with scheduled_at_ms nil, so a time no
    # client can represent (a negative one) never reaches a worker.
    scheduled_at = job.scheduled_at
    if scheduled_at is not None and scheduled_at <= now:
        scheduled_at = None
    key = job.idempotency_key
    # Positional, in JobEnqueued's field order: keyword construction of a 15-field
    # tuple costs a measurable share of the enqueue budget.
    event: JobEnqueued = _new_tuple(
        JobEnqueued,
        (
            job_id,
            job.queue,
            job.job_type,
            job.payload_data,
            job.payload_encoding,
            priority,
            max_attempts,
            now,  # enqueued_at
            scheduled_at,
            scheduled_at,  # run_at: None unless in the future (above)
            key,
            now + policy.dedup_window_ms
            if key is not None and policy.dedup_window_ms > 0
            else None,
            job.traceparent,
            job.tracestate,
            dict(job.custom) if job.custom else None,
        ),
    )
    return event


class _Batch:
    """What earlier jobs of the same enqueue did, for the later ones: a repeated
    idempotency key is a dedup hit on the first job of the batch, and depth counts
    the jobs already admitted."""

    __slots__ = ("depth", "ids", "keys")

    def __init__(self) -> None:
        self.keys: dict[tuple[str, str], str] = {}
        self.depth: dict[str, int] = {}
        self.ids: set[str] = set()


def _admit(
    state: State, job: NewJob, now: int, batch: _Batch | None
) -> tuple[Accepted | Rejection, JobEnqueued | None]:
    """One job of an enqueue: its reply entry and, if it creates a job, its event."""
    rejection = validate_new_job(state, job, now)
    if rejection is not None:
        return rejection, None
    fields: tuple[object, ...] = job
    job_id = canonical_job_id(fields[0])
    if (
        job_id is None
        or job_id in state.jobs
        or job_id in state.dead
        or (batch is not None and job_id in batch.ids)
    ):
        # Ids are assigned by the server edge; a bad or reused one is a bug
        # upstream, refused rather than allowed to alias another job.
        return InvalidRequest(f"job id {fields[0]!r:.60} is not a fresh UUID"), None
    queue = job.queue
    key = job.idempotency_key
    if key is not None:
        original = batch.keys.get((queue, key)) if batch is not None else None
        if original is None:
            original = state.dedup_lookup(queue, key, now)
        if original is not None:
            return Accepted(original, True), None
    config = state.config
    cap = config.queues.get(queue, config.defaults).max_queue_depth
    if cap is not None:
        q = state.queues.get(queue)
        live = q.live_count if q is not None else 0
        if batch is not None:
            live += batch.depth.get(queue, 0)
        if live >= cap:
            return QueueFull(queue, cap), None
    event = _new_job_event(state, job, job_id, now)
    if batch is not None:
        batch.ids.add(job_id)
        batch.depth[queue] = batch.depth.get(queue, 0) + 1
        if key is not None and event.dedup_expires_at is not None:
            batch.keys[(queue, key)] = job_id
    return Accepted(job_id, False), event


def _decide_enqueue(state: State, cmd: Enqueue, now: int) -> Decision | CommandError:
    fields: tuple[object, ...] = cmd
    raw_jobs, atomic = fields
    if type(raw_jobs) is not tuple:
        return InvalidArgument("an enqueue's jobs must be a tuple of NewJob")
    for raw in raw_jobs:
        if type(raw) is not NewJob:
            return InvalidArgument(f"an enqueue's jobs must be NewJob, not {type(raw).__name__}")
    if type(atomic) is not bool:
        return InvalidArgument("atomic must be a bool")
    jobs = cmd.jobs
    limit = state.config.limits.max_enqueue_batch
    if not jobs:
        return InvalidArgument("an enqueue needs at least one job")
    if len(jobs) > limit:
        return InvalidArgument(f"an enqueue holds at most {limit} jobs, got {len(jobs)}")
    if len(jobs) == 1:
        # The common case, without the batch bookkeeping.
        result, event = _admit(state, jobs[0], now, None)
        if event is not None:
            one = frozenset((event.queue,)) if event.run_at is None else NOTHING_WOKEN
            return Decision((event,), now, EnqueueResult((result,)), one)
        if cmd.atomic and not isinstance(result, Accepted):
            return Decision((), now, AtomicRejected(((0, result),)), NOTHING_WOKEN)
        return Decision((), now, EnqueueResult((result,)), NOTHING_WOKEN)
    batch = _Batch()
    results: list[Accepted | Rejection] = []
    events: list[Event] = []
    failures: list[tuple[int, Rejection]] = []
    woken: set[str] = set()
    for index, job in enumerate(jobs):
        result, event = _admit(state, job, now, batch)
        results.append(result)
        if event is not None:
            events.append(event)
            if event.run_at is None:
                woken.add(event.queue)
        elif not isinstance(result, Accepted):
            failures.append((index, result))
    if cmd.atomic and failures:
        return Decision((), now, AtomicRejected(tuple(failures)), NOTHING_WOKEN)
    return Decision(
        tuple(events),
        now,
        EnqueueResult(tuple(results)),
        frozenset(woken) if woken else NOTHING_WOKEN,
    )


# ---------------------------------------------------------------------------
# Reserve


def _ordered(heap: list[Any]) -> Iterator[Any]:
    """The entries of a heap in ascending order, without changing it
    (O(k log k) for the first k entries)."""
    n = len(heap)
    if n == 0:
        return
    frontier: list[tuple[Any, int]] = [(heap[0], 0)]
    while frontier:
        entry, i = heappop(frontier)
        yield entry
        left = 2 * i + 1
        if left < n:
            heappush(frontier, (heap[left], left))
            if left + 1 < n:
                heappush(frontier, (heap[left + 1], left + 1))


def _decide_reserve(state: State, cmd: Reserve, now: int) -> Decision | CommandError:
    config = state.config
    limits = config.limits
    fields: tuple[object, ...] = cmd
    raw_queues, lease_ms, max_jobs, worker_id, max_bytes, order = fields
    if type(raw_queues) is not tuple:
        return InvalidArgument("reserve's queues must be a tuple of queue names")
    for name in raw_queues:
        if type(name) is not str:
            return InvalidArgument("queue name must be a non-empty string")
    queues = cmd.queues
    if not queues:
        return InvalidArgument("reserve needs at least one queue")
    if len(queues) > limits.max_reserve_queues:
        return InvalidArgument(
            f"reserve names at most {limits.max_reserve_queues} queues, got {len(queues)}"
        )
    lease_cap = 2**62
    known = state.queues
    for name in queues:
        # A queue the state knows was created from a validated name (an enqueue or
        # the config); only names never seen need checking (a reserve per request).
        if name not in known:
            problem = _queue_name_error(name)
            if problem is None and _utf8_len(name) > limits.max_queue_name_bytes:
                problem = f"queue name is longer than {limits.max_queue_name_bytes} bytes"
            if problem is not None:
                return InvalidArgument(problem)
        declared = name in config.queues
        if config.strict_queues and not declared:
            unknown = tuple(dict.fromkeys(q for q in queues if q not in config.queues))
            return FailedPrecondition(
                f"queues {list(unknown)} are not declared and strict_queues is on", unknown
            )
        cap = (config.queues[name] if declared else config.defaults).max_lease_duration_ms
        lease_cap = min(lease_cap, cap)
    if not _is_int(lease_ms) or lease_ms <= 0:
        return InvalidArgument("lease duration must be a positive number of ms")
    if not _is_int(max_jobs) or max_jobs < 1:
        return InvalidArgument("max_jobs must be >= 1")
    if max_bytes is not None and (not _is_int(max_bytes) or max_bytes < 0):
        return InvalidArgument("max_bytes must be an integer >= 0 when given")
    problem = _optional_worker_id(worker_id, state.config.limits.max_worker_id_bytes)
    if problem is not None:
        return InvalidArgument(problem)
    if order != ORDER_STRICT and order != ORDER_FAIR:
        return InvalidArgument(f'order must be "strict" or "fair", not {order!r:.40}')
    want = min(max_jobs, limits.max_reserve_batch)
    deadline = now + min(lease_ms, lease_cap)
    if deadline > TIME_MS_MAX:  # a huge configured lease cap: keep it decodable
        deadline = TIME_MS_MAX
    if order == ORDER_FAIR and len(queues) > 1:
        picked = _pick_fair(state, queues, want, cmd.max_bytes, now)
    elif want == 1:
        picked = _first_ready(state, queues, now)
    else:
        picked = _pick(state, queues, want, cmd.max_bytes, now)
    if not picked:
        return Decision((), now, ReserveResult(()), NOTHING_WOKEN)
    worker_id = cmd.worker_id
    # Positional tuples (JobReserved's field order: job_id, attempt,
    # lease_expires_at, worker_id) and no generators for the usual single job:
    # a reserve per request is the worker's hot path.
    if len(picked) == 1:
        job = picked[0]
        events: tuple[Event, ...] = (
            _new_tuple(JobReserved, (job.job_id, job.attempt, deadline, worker_id)),
        )
        views: tuple[JobView, ...] = (job.view(deadline),)
    else:
        events = tuple(
            _new_tuple(JobReserved, (job.job_id, job.attempt, deadline, worker_id))
            for job in picked
        )
        views = tuple(job.view(deadline) for job in picked)
    return _new_tuple(Decision, (events, now, ReserveResult(views), NOTHING_WOKEN))


def _room(state: State, q: QueueState, now: int) -> int:
    """How many of `q`'s jobs its flow control lets this reserve lease (issue
    17): the least of its max_in_flight room and its rate-limit room; -1 = no
    limit. Both limits apply at once.

    | max_in_flight | rate_limit | room |
    | --- | --- | --- |
    | unset | unset | -1 (unlimited) |
    | cap | unset | cap - in flight (0 at the cap) |
    | unset | jobs per per_ms | jobs - deliveries in (now - per_ms, now] |
    | both | both | the smaller of the two |"""
    config = state.config
    policy = config.queues.get(q.name, config.defaults)
    cap = policy.max_in_flight
    room = -1 if cap is None else max(0, cap - q.in_flight_count)
    if policy.rate_limit_jobs is not None and room != 0:
        rate = rate_room(state, q.name, policy, now)
        if room < 0 or rate < room:
            room = rate
    return room


def _first_ready(state: State, queues: tuple[str, ...], now: int) -> list[Job]:
    """The usual reserve (one job per request): the head of the highest non-empty
    priority of the first queue that has one. A head is always valid (apply
    prunes); one job is always delivered, whatever its size."""
    known = state.queues
    for name in queues:
        q = known.get(name)
        if q is None or q.ready_count == 0 or q.paused:
            continue
        if _room(state, q, now) == 0:
            continue  # at its max_in_flight or rate limit: fewer jobs, never an error
        for level in reversed(q.ready):  # highest priority first
            if level.fifo or level.heap:
                head = level.head()
                if head is not None and head[2].entry is head:
                    return [head[2]]
    return []


def job_answer_bytes(job: Job) -> int:
    """An upper bound on the bytes `job` takes in an answer (its msgpack map as
    delivered): every field counts, not only the payload."""
    size = JOB_ANSWER_FIXED_BYTES + _utf8_len(job.queue) + _utf8_len(job.job_type)
    data = job.payload_data
    if data is not None:
        size += len(data)
        encoding = job.payload_encoding
        if encoding is not None:
            size += _utf8_len(encoding)
    return size + _trace_and_custom_answer_bytes(job.traceparent, job.tracestate, job.custom)


def _trace_and_custom_answer_bytes(
    traceparent: str | None, tracestate: str | None, custom: Mapping[str, object] | None
) -> int:
    """A job's trace context and custom map, as they count in an answer."""
    size = 0
    if traceparent is not None:
        size += _utf8_len(traceparent)
    if tracestate is not None:
        size += _utf8_len(tracestate)
    if custom:
        for key, value in custom.items():
            size += CUSTOM_ENTRY_FIXED_BYTES + _utf8_len(key)
            if isinstance(value, str):
                size += _utf8_len(value)
    return size


def dead_letter_answer_bytes(record: DeadLetter) -> int:
    """An upper bound on the bytes `record` takes in a drain answer."""
    size = DEAD_LETTER_ANSWER_FIXED_BYTES + job_answer_bytes(record.job)
    reason = record.last_reason
    if reason is not None:
        size += _utf8_len(reason)
    return size


def _pick(
    state: State, queues: tuple[str, ...], want: int, max_bytes: int | None, now: int
) -> list[Job]:
    """Up to `want` Ready jobs from `queues` in the order given, each queue by
    priority then age."""
    picked: list[Job] = []
    # A reply must fit in one frame: stop adding jobs once their answer bytes
    # (every field, not only the payload) would pass the cap (one job is always
    # delivered, whatever its size).
    bytes_left = max_bytes if max_bytes is not None else -1
    for name in dict.fromkeys(queues):
        q = state.queues.get(name)
        if q is None or q.ready_count == 0 or q.paused:
            continue
        # The queue's max_in_flight and rate limit: at most `room` more of its jobs.
        room = _room(state, q, now)
        if room == 0:
            continue
        taken = 0
        for level in reversed(q.ready):  # highest priority first
            if not level.fifo and not level.heap:
                continue
            if room == taken:
                break
            if want - len(picked) == 1 or room - taken == 1:
                # A head is always valid (apply prunes).
                head = level.head()
                candidates: Iterator[Any] = iter(() if head is None else (head,))
            else:
                candidates = merge(iter(level.fifo), _ordered(level.heap))
            for entry in candidates:
                job = entry[2]
                if job.entry is not entry:
                    continue
                if bytes_left >= 0:
                    size = job_answer_bytes(job)
                    if picked and size > bytes_left:
                        return picked
                    bytes_left = max(0, bytes_left - size)
                picked.append(job)
                taken += 1
                if len(picked) == want:
                    return picked
                if taken == room:
                    break
    return picked


def _ready_jobs(q: QueueState) -> Iterator[Job]:
    """`q`'s Ready jobs in delivery order: priority, then age."""
    for level in reversed(q.ready):  # highest priority first
        if not level.fifo and not level.heap:
            continue
        for entry in merge(iter(level.fifo), _ordered(level.heap)):
            job = entry[2]
            if job.entry is entry:
                yield job


class _FairLane:
    """One queue of a fair reserve while it is being decided: its fair
    bookkeeping as the jobs picked so far would leave it (apply's `fair_served`,
    played ahead), its room and its jobs left."""

    def __init__(self, q: QueueState, weight: int, room: int) -> None:
        self.weight = weight
        self.room = room  # -1 = no limit
        self.left = q.ready_count
        self.last = q.fair_last
        self.turn_start = q.fair_turn_start
        self.turn_count = q.fair_turn_count
        self.jobs: Iterator[Job] = _ready_jobs(q)

    def key(self) -> int:
        count = self.turn_count
        return self.turn_start if 0 < count < self.weight else self.last

    def served(self, seq: int) -> None:
        count = self.turn_count
        if count == 0 or count >= self.weight:
            self.turn_start = self.last
            self.turn_count = 1
        else:
            self.turn_count = count + 1
        self.last = seq


def _pick_fair(
    state: State, queues: tuple[str, ...], want: int, max_bytes: int | None, now: int
) -> list[Job]:
    """Up to `want` Ready jobs in fair order (issue 17): weighted round robin
    over the named queues that can deliver (ready jobs, not paused, room under
    their max_in_flight and rate limit). Each job goes to the queue with the
    smallest `fair_key` (ties: the order given); a queue whose turn comes is
    served up to its `weight` times in a row, then waits behind every queue
    whose key is older.

    Starvation bound: a named queue that can deliver is served within the next
    sum of the other named queues' weights deliveries of fair reserves naming
    them -- at most one turn each (keys never decrease, and a queue that took
    its turn has a key newer than the waiting one's) -- whatever other reserves
    (strict ones, or fair ones over other queues) deliver meanwhile.

    The keys come from the state (delivery numbers apply stamps on every
    JobReserved), so the order is deterministic and a replay decides alike."""
    config = state.config
    lanes: list[_FairLane] = []
    for name in dict.fromkeys(queues):
        q = state.queues.get(name)
        if q is None or q.ready_count == 0 or q.paused:
            continue
        room = _room(state, q, now)
        if room == 0:
            continue
        weight = config.queues.get(name, config.defaults).weight
        lanes.append(_FairLane(q, weight, room))
    picked: list[Job] = []
    bytes_left = max_bytes if max_bytes is not None else -1
    seq = state.delivery_seq
    while lanes and len(picked) < want:
        best = lanes[0]
        best_key = best.key()
        for lane in lanes:
            key = lane.key()
            if key < best_key:
                best, best_key = lane, key
        job = next(best.jobs, None)
        if job is None:  # pragma: no cover - left counts the valid entries
            lanes.remove(best)
            continue
        if bytes_left >= 0:
            size = job_answer_bytes(job)
            if picked and size > bytes_left:
                return picked
            bytes_left = max(0, bytes_left - size)
        picked.append(job)
        seq += 1
        best.served(seq)
        best.left -= 1
        if best.room > 0:
            best.room -= 1
        if best.left == 0 or best.room == 0:
            lanes.remove(best)
    return picked


# ---------------------------------------------------------------------------
# Ack, nack, extend


def _lease_holder(
    state: State, job_id: object, attempt: object, worker_id: object, enqueued_at: object
) -> Job | CommandError:
    """The job an ack or a release names, if the command holds its current lease
    (fenced: a stale attempt or delivery is refused) and its worker id is within
    limits."""
    problem = _optional_worker_id(worker_id, state.config.limits.max_worker_id_bytes)
    if problem is not None:
        return InvalidArgument(problem)
    return _fence(state, job_id, attempt, enqueued_at)


def _freed(state: State, queue: str) -> frozenset[str]:
    """The queues to wake when a job of `queue` leaves In-flight: the queue
    itself when its max_in_flight may have kept parked reserves waiting."""
    if state.config.policy(queue).max_in_flight is None:
        return NOTHING_WOKEN
    return frozenset((queue,))


def _decide_ack(state: State, cmd: Ack, now: int) -> Decision | CommandError:
    fields: tuple[object, ...] = cmd
    job_id, attempt, worker_id, enqueued_at = fields
    job = _lease_holder(state, job_id, attempt, worker_id, enqueued_at)
    if isinstance(job, CommandError):
        return job
    event = _new_tuple(JobAcked, (job.job_id, job.attempt, cmd.worker_id))
    return _new_tuple(Decision, ((event,), now, AckResult(job.job_id), _freed(state, job.queue)))


def _decide_release(state: State, cmd: Release, now: int) -> Decision | CommandError:
    """Hand back an attempt that reached nobody. Fenced like an ack (a stale
    attempt is refused), so only the holder of the current lease can release it.
    The job keeps its attempt number and its place in the ready order: the
    attempt is not counted against max_attempts, and the next delivery carries
    the same number."""
    fields: tuple[object, ...] = cmd
    job_id, attempt, worker_id = fields
    job = _lease_holder(state, job_id, attempt, worker_id, None)
    if isinstance(job, CommandError):
        return job
    event = _new_tuple(JobReleased, (job.job_id, job.attempt, cmd.worker_id))
    return _new_tuple(Decision, ((event,), now, ReleaseResult(job.job_id), frozenset((job.queue,))))


def retry_delay_ms(policy: QueuePolicy, job_id: str, attempt: int) -> int:
    """The queue's retry policy for a nack of `attempt` without an explicit delay:
    base delay, doubled per attempt when exponential (saturating), capped by
    retry_delay_max_ms and the schedule horizon, minus a deterministic jitter of up
    to a quarter derived from (job id, attempt) — so jobs that fail together spread
    out, and the same inputs always give the same delay."""
    base = policy.retry_delay_ms
    if base <= 0:
        return 0
    if policy.retry_backoff == RETRY_BACKOFF_EXPONENTIAL:
        shift = min(attempt - 1, 62)
        growth = base << shift
    else:
        growth = base
    delay = min(growth, policy.retry_delay_max_ms, policy.max_schedule_horizon_ms)
    jitter = zlib.crc32(f"{job_id}:{attempt}".encode()) % (delay // 4 + 1)
    return delay - jitter


def _dead_letter_event(
    state: State, job: Job, cause: int, now: int, reason: str | None
) -> JobDeadLettered:
    return JobDeadLettered(
        job_id=job.job_id,
        attempt=job.attempt,
        cause=cause,
        failed_at=now,
        reason=reason,
        retained=state.config.dead_letter_retention_ms > 0,
    )


def _decide_nack(state: State, cmd: Nack, now: int) -> Decision | CommandError:
    fields: tuple[object, ...] = cmd
    job_id, attempt, retry, delay_ms, reason, worker_id, enqueued_at = fields
    problem = _optional_worker_id(worker_id, state.config.limits.max_worker_id_bytes)
    if problem is not None:
        return InvalidArgument(problem)
    problem = _optional_reason(reason, state.config.limits.max_reason_bytes)
    if problem is not None:
        return InvalidArgument(problem)
    if type(retry) is not str or retry not in (RETRY_DEFAULT, RETRY_DELAY, RETRY_DEAD_LETTER):
        return InvalidArgument(f"unknown retry directive {retry!r:.60}")
    if retry == RETRY_DELAY and (not _is_int(delay_ms) or delay_ms < 0):
        return InvalidArgument("a retry delay must be an integer >= 0 ms")
    job = _fence(state, job_id, attempt, enqueued_at)
    if isinstance(job, CommandError):
        return job
    if cmd.retry == RETRY_DEAD_LETTER:
        event: Event = _dead_letter_event(state, job, CAUSE_REJECTED, now, cmd.reason)
        return Decision((event,), now, NackResult(job.job_id, True), _freed(state, job.queue))
    if job.attempt >= job.max_attempts:
        event = _dead_letter_event(state, job, CAUSE_ATTEMPTS_EXHAUSTED, now, cmd.reason)
        return Decision((event,), now, NackResult(job.job_id, True), _freed(state, job.queue))
    policy = state.config.policy(job.queue)
    if cmd.retry == RETRY_DELAY and cmd.delay_ms is not None:
        delay = min(cmd.delay_ms, policy.max_schedule_horizon_ms)
    else:
        delay = retry_delay_ms(policy, job.job_id, job.attempt)
    run_at = now + delay if delay > 0 else None
    event = JobNacked(
        job_id=job.job_id,
        attempt=job.attempt,
        run_at=run_at,
        reason=cmd.reason,
        worker_id=cmd.worker_id,
    )
    woken = frozenset((job.queue,)) if run_at is None else _freed(state, job.queue)
    return Decision((event,), now, NackResult(job.job_id, False), woken)


def _decide_extend(state: State, cmd: Extend, now: int) -> Decision | CommandError:
    fields: tuple[object, ...] = cmd
    job_id, attempt, lease_ms, worker_id, enqueued_at = fields
    problem = _optional_worker_id(worker_id, state.config.limits.max_worker_id_bytes)
    if problem is not None:
        return InvalidArgument(problem)
    if not _is_int(lease_ms) or lease_ms <= 0:
        return InvalidArgument("lease duration must be a positive number of ms")
    job = _fence(state, job_id, attempt, enqueued_at)
    if isinstance(job, CommandError):
        return job
    cap = state.config.policy(job.queue).max_lease_duration_ms
    deadline = min(now + min(cmd.lease_ms, cap), TIME_MS_MAX)
    event = JobLeaseExtended(
        job_id=job.job_id, attempt=job.attempt, lease_expires_at=deadline, worker_id=cmd.worker_id
    )
    return Decision((event,), now, ExtendResult(job.job_id, deadline), NOTHING_WOKEN)


# ---------------------------------------------------------------------------
# Dead letters


def _decide_drain(state: State, cmd: DrainDeadLetters, now: int) -> Decision | CommandError:
    """Up to `max_records` dead letters, oldest first, deleted by the same record
    that answers: so the answer must carry every record it deletes. With a byte
    cap (the edge sets it from its frame limit) it stops before the first record
    that would pass it, and a record larger than the whole cap -- one no answer
    can carry (a job stored under older, looser limits, or a payload limit close
    to the frame limit) -- is never taken: it stays in the store and is listed
    in `too_large` (at most DRAIN_TOO_LARGE_LISTED_MAX of them), so a drain
    never deletes what it cannot deliver."""
    limits = state.config.limits
    queue = _field(cmd, "queue")
    if queue is not None:
        if not isinstance(queue, str) or not queue:
            return InvalidArgument("queue must be a non-empty string when given")
        problem = _too_long("queue", queue, limits.max_queue_name_bytes, "max_queue_name_bytes")
        if problem is not None:
            return InvalidArgument(problem)
    max_records = _field(cmd, "max_records")
    if not _is_int(max_records) or max_records < 1:
        return InvalidArgument("max must be >= 1")
    max_bytes = _field(cmd, "max_bytes")
    if max_bytes is not None and (not _is_int(max_bytes) or max_bytes < 0):
        return InvalidArgument("max_bytes must be an integer >= 0 when given")
    want = min(cmd.max_records, limits.max_reserve_batch)
    if cmd.queue is None:
        source = state.dead
    else:
        q = state.queues.get(cmd.queue)
        source = q.dead if q is not None else {}
    cap = cmd.max_bytes
    bytes_left = cap if cap is not None else -1
    # Records too large for any answer are passed over; the scan past them is
    # bounded like the sweep's, so a store full of them cannot stall the loop.
    passed_over = 0
    records: list[DeadLetter] = []
    too_large: list[tuple[str, int]] = []
    for record in source.values():
        if cap is not None:
            size = dead_letter_answer_bytes(record)
            if size > cap:
                if (
                    len(too_large) < DRAIN_TOO_LARGE_LISTED_MAX
                    and bytes_left >= DRAIN_TOO_LARGE_ENTRY_BYTES
                ):
                    too_large.append((record.job.job_id, size))
                    bytes_left -= DRAIN_TOO_LARGE_ENTRY_BYTES
                passed_over += 1
                if passed_over >= state.config.sweep_limit:
                    break
                continue
            if size > bytes_left:
                break  # the answer is full: the next drain takes it
            bytes_left -= size
        records.append(record)
        if len(records) == want:
            break
    events = tuple(DeadLetterDrained(job_id=r.job.job_id) for r in records)
    reply = DrainResult(tuple(r.view() for r in records), tuple(too_large))
    return Decision(events, now, reply, NOTHING_WOKEN)


def _operator_ids(command: DeadLetterJobs | RequeueDeadLetters) -> tuple[object, ...] | str:
    """An operator action's job ids as passed (any may be junk: each is refused on
    its own), or what is wrong with them."""
    job_ids = _field(command, "job_ids")
    if type(job_ids) is not tuple:
        return "job_ids must be a tuple of job ids"
    if len(job_ids) > 100:
        return "an operator action handles at most 100 jobs"
    return job_ids


def _decide_dead_letter_jobs(
    state: State, cmd: DeadLetterJobs, now: int
) -> Decision | CommandError:
    problem = _optional_reason(_field(cmd, "reason"), state.config.limits.max_reason_bytes)
    if problem is not None:
        return InvalidArgument(problem)
    job_ids = _operator_ids(cmd)
    if isinstance(job_ids, str):
        return InvalidArgument(job_ids)
    events: list[Event] = []
    affected: list[str] = []
    refused: list[tuple[str, str]] = []
    for raw in job_ids:
        jid = canonical_job_id(raw)
        job = state.jobs.get(jid) if jid is not None else None
        if jid is None or job is None:
            refused.append((str(raw), "not a live job"))
        elif job.status not in (READY, SCHEDULED):
            refused.append(
                (jid, "only Ready or Scheduled jobs can be dead-lettered by an operator")
            )
        elif jid in affected:
            continue
        else:
            events.append(_dead_letter_event(state, job, CAUSE_ADMIN, now, cmd.reason))
            affected.append(jid)
    return Decision(tuple(events), now, AdminResult(tuple(affected), tuple(refused)), NOTHING_WOKEN)


def _decide_requeue(state: State, cmd: RequeueDeadLetters, now: int) -> Decision | CommandError:
    job_ids = _operator_ids(cmd)
    if isinstance(job_ids, str):
        return InvalidArgument(job_ids)
    events: list[Event] = []
    affected: list[str] = []
    refused: list[tuple[str, str]] = []
    woken: set[str] = set()
    for raw in job_ids:
        jid = canonical_job_id(raw)
        record = state.dead.get(jid) if jid is not None else None
        if jid is None or record is None:
            refused.append((str(raw), "no such dead letter"))
        elif jid in affected:
            continue
        else:
            events.append(DeadLetterRequeued(job_id=jid, enqueued_at=_requeued_at(record.job, now)))
            affected.append(jid)
            woken.add(record.job.queue)
    return Decision(
        tuple(events), now, AdminResult(tuple(affected), tuple(refused)), frozenset(woken)
    )


# ---------------------------------------------------------------------------
# Sweep


def _decide_sweep(state: State, cmd: Sweep, now: int) -> Decision | CommandError:
    """Everything due at `now`, each phase capped at sweep_limit entries so one
    backlog cannot starve the others (sepp-semantics.md §18)."""
    limit = state.config.sweep_limit
    events: list[Event] = []
    woken: set[str] = set()
    promoted = redelivered = dead_lettered = dedup_expired = dead_expired = 0

    seen: set[str] = set()
    for entry in _ordered(state.scheduled):
        if entry[0] > now or promoted >= limit:
            break
        job = entry[2]
        if job.status != SCHEDULED or job.due_ms != entry[0] or job.job_id in seen:
            continue
        seen.add(job.job_id)
        events.append(JobPromoted(job_id=job.job_id))
        woken.add(job.queue)
        promoted += 1

    seen.clear()
    handled = 0
    for entry in _ordered(state.leases):
        if entry[0] > now or handled >= limit:
            break
        job = entry[2]
        if job.status != IN_FLIGHT or job.due_ms != entry[0] or job.job_id in seen:
            continue
        seen.add(job.job_id)
        handled += 1
        if job.attempt >= job.max_attempts:
            events.append(_dead_letter_event(state, job, CAUSE_LEASE_EXPIRED, now, None))
            woken.update(_freed(state, job.queue))
            dead_lettered += 1
        else:
            events.append(JobLeaseExpired(job_id=job.job_id, attempt=job.attempt))
            woken.add(job.queue)
            redelivered += 1

    seen_keys: set[tuple[str, str]] = set()
    for dentry in _ordered(state.dedup_expiry):
        if dentry[0] > now or dedup_expired >= limit:
            break
        key = (dentry[1], dentry[2])
        record = state.dedup.get(key)
        # Only the record this entry was made for: a key re-inserted after an
        # earlier expiry has a later deadline and must survive.
        if record is None or record[1] != dentry[0] or key in seen_keys:
            continue
        seen_keys.add(key)
        events.append(DedupExpired(queue=key[0], idempotency_key=key[1], expires_at=dentry[0]))
        dedup_expired += 1

    retention = state.config.dead_letter_retention_ms
    if retention > 0:
        for dead in state.dead.values():
            if dead.failed_at + retention > now or dead_expired >= limit:
                break
            events.append(DeadLetterExpired(job_id=dead.job.job_id))
            dead_expired += 1

    fired, skipped = _sweep_schedules(state, now, limit, events, woken)

    reply = SweepResult(
        promoted, redelivered, dead_lettered, dedup_expired, dead_expired, fired, skipped
    )
    return Decision(tuple(events), now, reply, frozenset(woken) if woken else NOTHING_WOKEN)


# ---------------------------------------------------------------------------
# Admin commands (issue 15): each logs an AdminAction header (actor, role,
# reason, queue, the ids it changed) and then its changes; a command that
# changes nothing logs nothing.
#
# Decision table (tests/core/test_admin.py has one test per row):
#   actor empty / too long, role unknown, reason too long -> InvalidArgument
#   role `viewer`                                       -> PermissionDenied
#   more than ADMIN_IDS_PER_CALL_MAX ids                -> TooManyIds
#   ids and a filter together, or neither (dead letters) -> InvalidArgument
#   max_jobs outside 1..ADMIN_JOBS_PER_CHUNK_MAX        -> InvalidArgument
#   unknown cause                                       -> InvalidArgument
#   bad queue name                                      -> InvalidArgument
#   undeclared queue with strict_queues (pause/resume)  -> QueueNotFound
#   per id: not a job / not a dead letter               -> outcome not_found
#   per id: a job in another state (in flight, dead)    -> outcome wrong_state
#   pause a paused queue / resume a running one         -> changed=False, no events
#   put: an unknown setting, a value of the wrong type   -> InvalidArgument
#   put: settings that break the config rules            -> InvalidArgument (names the key)
#   put: the same overrides again                        -> changed=False, no events
#   delete: a queue not defined at runtime               -> QueueNotFound
#   delete: in-flight jobs, or > 1000 ready + scheduled  -> QueueInUse


def _admin_error(state: State, cmd: AdminCommand) -> CommandError | None:
    actor = _field(cmd, "actor")
    if not isinstance(actor, str) or not actor:
        return InvalidArgument("actor must be a non-empty string")
    problem = _too_long("actor", actor, ADMIN_ACTOR_BYTES_MAX, "ADMIN_ACTOR_BYTES_MAX")
    if problem is not None:
        return InvalidArgument(problem)
    role = _field(cmd, "role")
    if role not in ADMIN_ROLES:
        return InvalidArgument(f"role must be one of {list(ADMIN_ROLES)}")
    if role not in ADMIN_ROLES_THAT_CHANGE:
        return PermissionDenied(f"role {role} may not change anything")
    problem = _optional_reason(_field(cmd, "reason"), state.config.limits.max_reason_bytes)
    if problem is not None:
        return InvalidArgument(problem)
    return None


def _admin_ids(cmd: object) -> tuple[object, ...] | CommandError:
    job_ids = _field(cmd, "job_ids")
    if type(job_ids) is not tuple:
        return InvalidArgument("job_ids must be a tuple of job ids")
    if len(job_ids) > ADMIN_IDS_PER_CALL_MAX:
        return TooManyIds(
            f"an admin call names at most {ADMIN_IDS_PER_CALL_MAX} ids, got {len(job_ids)}",
            ADMIN_IDS_PER_CALL_MAX,
            len(job_ids),
        )
    return job_ids


def _admin_queue_error(state: State, queue: object) -> CommandError | None:
    problem = _queue_name_error(queue)
    if problem is None and isinstance(queue, str):
        limit = state.config.limits.max_queue_name_bytes
        problem = _too_long("queue", queue, limit, "max_queue_name_bytes")
    return InvalidArgument(problem) if problem is not None else None


def _admin_queue(state: State, cmd: AdminCommand) -> str | CommandError:
    """The queue an admin command on one queue names, once the command's actor,
    role and reason and the name itself are valid; else the refusal."""
    error = _admin_error(state, cmd)
    if error is not None:
        return error
    queue = _field(cmd, "queue")
    error = _admin_queue_error(state, queue)
    if error is not None:
        return error
    return cast(str, queue)


def _admin_max_jobs(cmd: object) -> int | CommandError:
    max_jobs = _field(cmd, "max_jobs")
    if not _is_int(max_jobs) or not 1 <= max_jobs <= ADMIN_JOBS_PER_CHUNK_MAX:
        return InvalidArgument(f"max_jobs must be 1..{ADMIN_JOBS_PER_CHUNK_MAX}")
    return max_jobs


def _header(cmd: AdminCommand, action: str, queue: str | None, done: list[str]) -> AdminAction:
    return AdminAction(
        action=action,
        actor=cmd.actor,
        role=cmd.role,
        reason=cmd.reason,
        queue=queue,
        job_ids=tuple(done),
    )


def _decide_live_jobs_admin(
    state: State, cmd: AdminDeadLetterJobs | CancelJobs, now: int
) -> Decision | CommandError:
    error = _admin_error(state, cmd)
    if error is not None:
        return error
    job_ids = _admin_ids(cmd)
    if isinstance(job_ids, CommandError):
        return job_ids
    dead_letter = isinstance(cmd, AdminDeadLetterJobs)
    changes: list[Event] = []
    done: list[str] = []
    outcomes: list[tuple[str, str]] = []
    seen: set[str] = set()
    for raw in job_ids:
        jid = canonical_job_id(raw)
        if jid is None:
            outcomes.append((str(raw), OUTCOME_NOT_FOUND))
            continue
        if jid in seen:
            continue
        seen.add(jid)
        job = state.jobs.get(jid)
        if job is None:
            outcome = OUTCOME_WRONG_STATE if jid in state.dead else OUTCOME_NOT_FOUND
        elif job.status not in (READY, SCHEDULED):
            outcome = OUTCOME_WRONG_STATE
        else:
            outcome = OUTCOME_DONE
            done.append(jid)
            if dead_letter:
                changes.append(_dead_letter_event(state, job, CAUSE_ADMIN, now, cmd.reason))
            else:
                changes.append(JobCancelled(job_id=jid, attempt=job.attempt))
        outcomes.append((jid, outcome))
    events: tuple[Event, ...] = ()
    if done:
        action = ADMIN_DEAD_LETTER_JOBS if dead_letter else ADMIN_CANCEL_JOBS
        events = (_header(cmd, action, None, done), *changes)
    return Decision(events, now, AdminOutcomes(tuple(outcomes), 0), NOTHING_WOKEN)


def _decide_dead_letters_admin(
    state: State, cmd: AdminRequeueDeadLetters | DeleteDeadLetters, now: int
) -> Decision | CommandError:
    error = _admin_error(state, cmd)
    if error is not None:
        return error
    job_ids = _admin_ids(cmd)
    if isinstance(job_ids, CommandError):
        return job_ids
    max_jobs = _admin_max_jobs(cmd)
    if isinstance(max_jobs, CommandError):
        return max_jobs
    queue = _field(cmd, "queue")
    cause = _field(cmd, "cause")
    if queue is not None:
        error = _admin_queue_error(state, queue)
        if error is not None:
            return error
    if cause is not None and (not _is_int(cause) or cause not in CAUSE_NAMES):
        return InvalidArgument(f"cause must be one of {sorted(CAUSE_NAMES)}")
    has_filter = queue is not None or cause is not None
    if job_ids and has_filter:
        return InvalidArgument("name either job ids or a filter (queue, cause), not both")
    if not job_ids and not has_filter:
        return InvalidArgument("name job ids, a queue or a cause")
    requeue = isinstance(cmd, AdminRequeueDeadLetters)
    records: list[DeadLetter] = []
    outcomes: list[tuple[str, str]] = []
    remaining = 0
    if job_ids:
        seen: set[str] = set()
        for raw in job_ids:
            jid = canonical_job_id(raw)
            record = state.dead.get(jid) if jid is not None else None
            if jid is None or record is None:
                outcomes.append((str(raw) if jid is None else jid, OUTCOME_NOT_FOUND))
            elif jid not in seen:
                seen.add(jid)
                records.append(record)
                outcomes.append((jid, OUTCOME_DONE))
    else:
        if queue is None:
            source = state.dead
        else:
            q = state.queues.get(cast(str, queue))
            source = q.dead if q is not None else {}
        if cause is None:
            for record in source.values():
                if len(records) == max_jobs:
                    break
                records.append(record)
            remaining = len(source) - len(records)
        else:
            # With a cause filter the count of what is left is bounded like the
            # sweep's scans: matches among the next sweep_limit records.
            scanned = 0
            for record in source.values():
                if len(records) < max_jobs:
                    if record.cause == cause:
                        records.append(record)
                    continue
                if scanned >= state.config.sweep_limit:
                    break
                scanned += 1
                if record.cause == cause:
                    remaining += 1
        outcomes = [(r.job.job_id, OUTCOME_DONE) for r in records]
    events: tuple[Event, ...] = ()
    woken: frozenset[str] = NOTHING_WOKEN
    if records:
        done = [r.job.job_id for r in records]
        header_queue = cast("str | None", queue)
        if requeue:
            changes: list[Event] = [
                DeadLetterRequeued(job_id=r.job.job_id, enqueued_at=_requeued_at(r.job, now))
                for r in records
            ]
            woken = frozenset(r.job.queue for r in records)
            action = ADMIN_REQUEUE_DEAD_LETTERS
        else:
            changes = [DeadLetterDeleted(job_id=jid) for jid in done]
            action = ADMIN_DELETE_DEAD_LETTERS
        events = (_header(cmd, action, header_queue, done), *changes)
    return Decision(events, now, AdminOutcomes(tuple(outcomes), remaining), woken)


def _decide_pause_resume(
    state: State, cmd: PauseQueue | ResumeQueue, now: int
) -> Decision | CommandError:
    name = _admin_queue(state, cmd)
    if isinstance(name, CommandError):
        return name
    config = state.config
    if config.strict_queues and name not in config.queues:
        return QueueNotFound(f"queue {name!r} is not declared and strict_queues is on", name)
    pause = isinstance(cmd, PauseQueue)
    q = state.queues.get(name)
    paused = q is not None and q.paused
    if paused == pause:
        return Decision((), now, QueueAdminResult(name, paused, False), NOTHING_WOKEN)
    action = ADMIN_PAUSE_QUEUE if pause else ADMIN_RESUME_QUEUE
    change: Event = QueuePaused(queue=name) if pause else QueueResumed(queue=name)
    events: tuple[Event, ...] = (_header(cmd, action, name, []), change)
    woken = NOTHING_WOKEN if pause else frozenset((name,))
    return Decision(events, now, QueueAdminResult(name, pause, True), woken)


def _override_error(key: object, value: object) -> str | None:
    if key not in QUEUE_OVERRIDE_KEYS:
        return f"{key!r} is not a per-queue setting an operator may override"
    if key == "retry_backoff":
        return None if isinstance(value, str) else "retry_backoff must be a string"
    if not _is_int(value):
        return f"{key} must be an integer"
    return None


def _decide_put_queue(state: State, cmd: PutQueue, now: int) -> Decision | CommandError:
    name = _admin_queue(state, cmd)
    if isinstance(name, CommandError):
        return name
    raw = _field(cmd, "overrides")
    if not isinstance(raw, Mapping):
        return InvalidArgument("overrides must be a map of setting -> value")
    overrides: dict[str, Any] = {}
    for key, value in raw.items():
        problem = _override_error(key, value)
        if problem is not None:
            return InvalidArgument(problem)
        overrides[key] = value
    base = state.base_config
    policy = dataclasses_replace(base.queues.get(name, base.defaults), **overrides)
    queues = dict(state.config.queues)
    queues[name] = policy
    try:
        validate_config(dataclasses_replace(state.config, queues=queues))
    except ConfigError as exc:
        return InvalidArgument(f"{exc.key}: {exc.problem}")
    previous = state.queue_overrides.get(name)
    created = previous is None
    if previous == overrides:
        reply = PutQueueResult(name, False, False, policy)
        return Decision((), now, reply, NOTHING_WOKEN)
    events: tuple[Event, ...] = (
        _header(cmd, ADMIN_PUT_QUEUE, name, []),
        QueueDefined(queue=name, overrides=dict(sorted(overrides.items()))),
    )
    # A raised (or dropped) max_in_flight or rate limit may let parked reserves
    # have jobs.
    before = state.config.policy(name)
    capped = (
        policy.max_in_flight is not None
        or before.max_in_flight is not None
        or policy.rate_limit_jobs is not None
        or before.rate_limit_jobs is not None
    )
    woken = frozenset((name,)) if capped else NOTHING_WOKEN
    return Decision(events, now, PutQueueResult(name, created, True, policy), woken)


def _decide_delete_queue(state: State, cmd: DeleteQueue, now: int) -> Decision | CommandError:
    name = _admin_queue(state, cmd)
    if isinstance(name, CommandError):
        return name
    if name not in state.queue_overrides:
        why = "is declared in the configuration file" if name in state.base_config.queues else ""
        return QueueNotFound(
            f"queue {name!r} is not defined at runtime" + (f" (it {why})" if why else ""), name
        )
    q = state.queues.get(name)
    by_file = name in state.base_config.queues
    doomed: list[Job] = []
    if q is not None:
        if q.in_flight_count:
            return QueueInUse(f"queue {name!r} has {q.in_flight_count} jobs in flight", name)
        live = q.ready_count + q.scheduled_count
        if not by_file and live > ADMIN_JOBS_PER_CHUNK_MAX:
            return QueueInUse(
                f"queue {name!r} holds {live} jobs: purge it first "
                f"(a delete removes at most {ADMIN_JOBS_PER_CHUNK_MAX})",
                name,
            )
        if not by_file and live:
            doomed = _purge_order(state, q, live)
    changes: list[Event] = [JobCancelled(job_id=j.job_id, attempt=j.attempt) for j in doomed]
    events: tuple[Event, ...] = (
        _header(cmd, ADMIN_DELETE_QUEUE, name, [j.job_id for j in doomed]),
        *changes,
        QueueDeleted(queue=name),
    )
    return Decision(events, now, DeleteQueueResult(name, len(doomed), by_file), NOTHING_WOKEN)


def _due_key(job: Job) -> tuple[int, str]:
    return (job.due_ms, job.job_id)


def _purge_order(state: State, q: QueueState, max_jobs: int) -> list[Job]:
    """Up to `max_jobs` Ready jobs of `q` in delivery order, then Scheduled ones
    by due time."""
    picked: list[Job] = []
    for level in reversed(q.ready):
        if len(picked) == max_jobs:
            break
        for entry in merge(iter(level.fifo), _ordered(level.heap)):
            if entry[2].entry is entry:
                picked.append(entry[2])
                if len(picked) == max_jobs:
                    break
    if len(picked) < max_jobs and q.scheduled_count and q.index is not None:
        ix = q.index[SCHEDULED]
        due = [ix.jobs[i] for i in range(ix.head, len(ix.jobs)) if ix.valid(i)]
        picked.extend(nsmallest(max_jobs - len(picked), due, key=_due_key))
    return picked


def _decide_purge(state: State, cmd: PurgeQueue, now: int) -> Decision | CommandError:
    name = _admin_queue(state, cmd)
    if isinstance(name, CommandError):
        return name
    max_jobs = _admin_max_jobs(cmd)
    if isinstance(max_jobs, CommandError):
        return max_jobs
    q = state.queues.get(name)
    if q is None:
        return Decision((), now, PurgeResult(name, 0, 0), NOTHING_WOKEN)
    # Ready jobs in delivery order, then Scheduled ones by due time: an order the
    # state itself defines (the status indexes' order is rebuilt differently by a
    # snapshot load), so a purge decides the same after a restart.
    picked = _purge_order(state, q, max_jobs)
    remaining = q.ready_count + q.scheduled_count - len(picked)
    if not picked:
        return Decision((), now, PurgeResult(name, 0, remaining), NOTHING_WOKEN)
    done = [job.job_id for job in picked]
    changes = [JobCancelled(job_id=job.job_id, attempt=job.attempt) for job in picked]
    events: tuple[Event, ...] = (_header(cmd, ADMIN_PURGE_QUEUE, name, done), *changes)
    return Decision(events, now, PurgeResult(name, len(picked), remaining), NOTHING_WOKEN)


# ---------------------------------------------------------------------------
# Schedules (issue 17). Admin commands like the queue ones (an AdminAction
# header, then the change). The sweep fires due ticks (_sweep_schedules).
#
# Decision table (tests/core/test_schedules.py has one test per row):
#   actor / role / reason as every admin command        -> InvalidArgument / PermissionDenied
#   name empty, too long, control characters            -> InvalidArgument
#   bad queue name                                      -> InvalidArgument
#   undeclared queue with strict_queues                  -> QueueNotFound
#   both or neither of cron and every_ms                 -> InvalidArgument
#   every_ms outside SCHEDULE_EVERY_MS_MIN..MAX          -> InvalidArgument
#   a cron that does not parse, or never fires           -> InvalidArgument
#   timezone not a name, a malformed zone table          -> InvalidArgument
#   catch_up not none / one / all                        -> InvalidArgument
#   a job the queue would refuse (type, payload, custom) -> InvalidArgument (names the rejection)
#   a new schedule over SCHEDULES_MAX                    -> InvalidArgument
#   the same definition again                            -> changed=False, no events
#   an update that keeps cron, timezone, zone, every_ms  -> keeps next_ms (the anchor)
#   pause / resume / delete an unknown schedule          -> ScheduleNotFound
#   pause a paused one / resume a running one            -> changed=False, no events
#   resume                                               -> next tick after now (no catch-up)
# Sweep, per due schedule (heap of next ticks: nothing due, nothing looked at):
#   catch_up all   -> every due tick fires, oldest first (sweep_limit per sweep)
#   catch_up one   -> the newest due tick fires, older ones are skipped
#   catch_up none  -> the newest due tick fires if at most SCHEDULE_ON_TIME_MS late
#   the tick's idempotency key already used in its queue -> skipped (fired before)
#   the queue is full (max_queue_depth)                  -> skipped
# Like every phase of a sweep, the schedules see the state as the sweep found it:
# a job this sweep dead-letters still counts towards its queue's depth.


def _schedule_name_error(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "schedule name must be a non-empty string"
    if _utf8_len(name) > SCHEDULE_NAME_BYTES_MAX:
        return f"schedule name is longer than {SCHEDULE_NAME_BYTES_MAX} bytes"
    if not name.isprintable():
        return "schedule name must not contain control characters"
    return None


def _schedule_target(state: State, cmd: AdminCommand) -> Schedule | CommandError:
    error = _admin_error(state, cmd)
    if error is not None:
        return error
    name = _field(cmd, "name")
    problem = _schedule_name_error(name)
    if problem is not None:
        return InvalidArgument(problem)
    sched = state.schedules.get(cast(str, name))
    if sched is None:
        return ScheduleNotFound(f"schedule {name!r} does not exist", cast(str, name))
    return sched


def _schedule_key(name: str, tick: int) -> str:
    return f"schedule:{name}:{tick}"


def _schedule_job_id(name: str, created_at: int, tick: int) -> str:
    """A fired job's id: a function of the schedule (name, creation time) and the
    tick, so the sweep needs no id from the edge and replay never decides one."""
    digest = hashlib.sha256(f"{name}:{created_at}:{tick}".encode()).hexdigest()
    h = digest[:12] + "8" + digest[13:16] + "a" + digest[17:32]  # version 8, RFC variant
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _schedule_custom(custom: Mapping[str, Any] | None, name: str, tick: int) -> dict[str, Any]:
    out: dict[str, Any] = dict(custom) if custom else {}
    out[CUSTOM_SCHEDULE] = name
    out[CUSTOM_TICK] = tick
    return out


def _put_schedule_error(state: State, cmd: PutSchedule, now: int) -> CommandError | None:
    error = _admin_error(state, cmd)
    if error is not None:
        return error
    name = _field(cmd, "name")
    problem = _schedule_name_error(name)
    if problem is not None:
        return InvalidArgument(problem)
    queue = _field(cmd, "queue")
    error = _admin_queue_error(state, queue)
    if error is not None:
        return error
    config = state.config
    if config.strict_queues and queue not in config.queues:
        return QueueNotFound(f"queue {queue!r} is not declared and strict_queues is on", str(queue))
    cron, every_ms = _field(cmd, "cron"), _field(cmd, "every_ms")
    if (cron is None) == (every_ms is None):
        return InvalidArgument("a schedule needs exactly one of cron and every_ms")
    if every_ms is not None and (
        not _is_int(every_ms) or not SCHEDULE_EVERY_MS_MIN <= every_ms <= SCHEDULE_EVERY_MS_MAX
    ):
        return InvalidArgument(
            f"every_ms must be an integer {SCHEDULE_EVERY_MS_MIN}..{SCHEDULE_EVERY_MS_MAX}"
        )
    if cron is not None:
        if not isinstance(cron, str) or len(cron) > 200:
            return InvalidArgument("cron must be a string of at most 200 characters")
        try:
            parse_cron(cron)
        except CronError as exc:
            return InvalidArgument(f"cron {cron!r}: {exc}")
    timezone = _field(cmd, "timezone")
    if not isinstance(timezone, str) or not timezone or len(timezone) > TIMEZONE_NAME_BYTES_MAX:
        return InvalidArgument(f"timezone must be a name of 1..{TIMEZONE_NAME_BYTES_MAX} bytes")
    problem = zone_error(_field(cmd, "zone"))
    if problem is not None:
        return InvalidArgument(problem)
    if _field(cmd, "catch_up") not in CATCH_UP_POLICIES:
        return InvalidArgument(f"catch_up must be one of {list(CATCH_UP_POLICIES)}")
    custom = _field(cmd, "custom")
    if custom is not None and not isinstance(custom, Mapping):
        return InvalidArgument("custom must be a map")
    # The job as the sweep will enqueue it (the latest tick the key can hold),
    # checked by the enqueue's own rules now rather than skipped at every tick.
    probe = NewJob(
        job_id="00000000-0000-8000-a000-000000000000",
        queue=cast(str, queue),
        # Untyped reads (see _field): the compiled build would convert them.
        job_type=cast(Any, _field(cmd, "job_type")),
        payload_data=cast(Any, _field(cmd, "payload_data")),
        payload_encoding=cast(Any, _field(cmd, "payload_encoding")),
        idempotency_key=_schedule_key(cast(str, name), TIME_MS_MAX),
        priority=cast(Any, _field(cmd, "priority")),
        max_attempts=cast(Any, _field(cmd, "max_attempts")),
        custom=_schedule_custom(cast("Mapping[str, Any] | None", custom), "", TIME_MS_MAX)
        | {CUSTOM_SCHEDULE: name},
    )
    rejection = validate_new_job(state, probe, now)
    if rejection is not None:
        return InvalidArgument(f"the schedule's jobs would be refused: {rejection!r}")
    if name not in state.schedules and len(state.schedules) >= SCHEDULES_MAX:
        return InvalidArgument(f"a server holds at most {SCHEDULES_MAX} schedules (SCHEDULES_MAX)")
    return None


def _decide_put_schedule(state: State, cmd: PutSchedule, now: int) -> Decision | CommandError:
    error = _put_schedule_error(state, cmd, now)
    if error is not None:
        return error
    zone = tuple(cmd.zone)
    old = state.schedules.get(cmd.name)
    if (
        old is not None
        and old.spec.cron == cmd.cron
        and old.spec.timezone == cmd.timezone
        and tuple(old.spec.zone) == zone
        and old.spec.every_ms == cmd.every_ms
    ):
        next_ms: int | None = old.next_ms
    else:
        next_ms = first_tick(cmd.cron, zone, cmd.every_ms, now)
    if next_ms is None:
        return InvalidArgument(f"cron {cmd.cron!r} never fires")
    spec = ScheduleDefined(
        name=cmd.name,
        queue=cmd.queue,
        job_type=cmd.job_type,
        payload_data=cmd.payload_data,
        payload_encoding=cmd.payload_encoding,
        priority=cmd.priority,
        max_attempts=cmd.max_attempts,
        custom=dict(cmd.custom) if cmd.custom else None,
        cron=cmd.cron,
        timezone=cmd.timezone,
        zone=zone,
        every_ms=cmd.every_ms,
        catch_up=cmd.catch_up,
        next_ms=next_ms,
        created_at=old.spec.created_at if old is not None else now,
    )
    paused = old is not None and old.paused
    # Unchanged: the same definition, its next tick where the schedule is now (the
    # spec's own next_ms is the one it was defined with; ticks have moved it since).
    if old is not None and old.spec._replace(next_ms=next_ms) == spec:
        return Decision(
            (), now, ScheduleResult(cmd.name, False, False, paused, next_ms), NOTHING_WOKEN
        )
    events: tuple[Event, ...] = (_header(cmd, ADMIN_PUT_SCHEDULE, cmd.queue, []), spec)
    reply = ScheduleResult(cmd.name, old is None, True, paused, next_ms)
    return Decision(events, now, reply, NOTHING_WOKEN)


def _decide_pause_resume_schedule(
    state: State, cmd: PauseSchedule | ResumeSchedule, now: int
) -> Decision | CommandError:
    sched = _schedule_target(state, cmd)
    if isinstance(sched, CommandError):
        return sched
    name = sched.spec.name
    pause = isinstance(cmd, PauseSchedule)
    if sched.paused == pause:
        reply = ScheduleResult(name, False, False, pause, sched.next_ms)
        return Decision((), now, reply, NOTHING_WOKEN)
    if pause:
        change: Event = SchedulePaused(name=name)
        next_ms = sched.next_ms
    else:
        # Ticks while paused were paused, not missed: the first tick after now.
        after = sched.next_after(now)
        next_ms = after if after is not None else TIME_MS_MAX
        change = ScheduleResumed(name=name, next_ms=next_ms)
    action = ADMIN_PAUSE_SCHEDULE if pause else ADMIN_RESUME_SCHEDULE
    events: tuple[Event, ...] = (_header(cmd, action, sched.spec.queue, []), change)
    return Decision(events, now, ScheduleResult(name, False, True, pause, next_ms), NOTHING_WOKEN)


def _decide_delete_schedule(state: State, cmd: DeleteSchedule, now: int) -> Decision | CommandError:
    sched = _schedule_target(state, cmd)
    if isinstance(sched, CommandError):
        return sched
    name = sched.spec.name
    events: tuple[Event, ...] = (
        _header(cmd, ADMIN_DELETE_SCHEDULE, sched.spec.queue, []),
        ScheduleDeleted(name=name),
    )
    return Decision(
        events, now, ScheduleResult(name, False, True, sched.paused, None), NOTHING_WOKEN
    )


def _newest_due(sched: Schedule, now: int) -> tuple[int, int]:
    """(the newest tick <= now, how many ticks are due); next_ms <= now."""
    first = sched.next_ms
    every = sched.spec.every_ms
    if every is not None:
        k = (now - first) // every
        return first + k * every, k + 1
    cron = sched.cron
    zone = tuple(sched.spec.zone)
    if cron is None:  # not assert: must hold under -O
        raise ValueError(f"schedule {sched.spec.name} has neither cron nor every_ms")
    t = first
    for count in range(1, CATCH_UP_SCAN_MAX + 1):
        nxt = next_cron_tick(cron, zone, t)
        if nxt is None or nxt > now:
            return t, count
        t = nxt
    # Far behind: find the newest due tick by looking back from now in growing
    # windows (the skipped count is then a lower bound).
    window = HOUR_MS
    while True:
        start = max(now - window, t)
        u = next_cron_tick(cron, zone, start)
        if u is not None and u <= now:
            while True:
                nxt = next_cron_tick(cron, zone, u)
                if nxt is None or nxt > now:
                    return u, CATCH_UP_SCAN_MAX + 1
                u = nxt
        if start == t:
            return t, CATCH_UP_SCAN_MAX
        window *= 2


def _schedule_job(
    state: State, sched: Schedule, tick: int, now: int, depth: dict[str, int]
) -> JobEnqueued | None:
    spec = sched.spec
    queue = spec.queue
    key = _schedule_key(spec.name, tick)
    if state.dedup_lookup(queue, key, now) is not None:
        return None
    job_id = _schedule_job_id(spec.name, spec.created_at, tick)
    if job_id in state.jobs or job_id in state.dead:
        return None
    config = state.config
    cap = config.queues.get(queue, config.defaults).max_queue_depth
    if cap is not None:
        q = state.queues.get(queue)
        live = (q.live_count if q is not None else 0) + depth.get(queue, 0)
        if live >= cap:
            return None
    depth[queue] = depth.get(queue, 0) + 1
    job = NewJob(
        job_id=job_id,
        queue=queue,
        job_type=spec.job_type,
        payload_data=spec.payload_data,
        payload_encoding=spec.payload_encoding,
        idempotency_key=key,
        priority=spec.priority,
        max_attempts=spec.max_attempts,
        custom=_schedule_custom(spec.custom, spec.name, tick),
    )
    return _new_job_event(state, job, job_id, now)


def _sweep_schedules(
    state: State, now: int, limit: int, events: list[Event], woken: set[str]
) -> tuple[int, int]:
    """Fire the due ticks of due schedules (at most `limit` jobs per sweep)."""
    fired_total = skipped_total = 0
    depth: dict[str, int] = {}
    seen: set[str] = set()
    for entry in _ordered(state.schedule_heap):
        if entry[0] > now or fired_total >= limit:
            break
        if entry[1] in seen or not state.schedule_entry_valid(entry):
            continue
        seen.add(entry[1])
        sched = state.schedules[entry[1]]
        policy = sched.spec.catch_up
        skipped = 0
        ticks: list[int] = []
        if policy == CATCH_UP_ALL:
            t: int | None = sched.next_ms
            while t is not None and t <= now and len(ticks) < limit - fired_total:
                ticks.append(t)
                t = sched.next_after(t)
            next_ms = t if t is not None else TIME_MS_MAX
        else:
            last, count = _newest_due(sched, now)
            after = sched.next_after(now)
            next_ms = after if after is not None else TIME_MS_MAX
            if policy == CATCH_UP_ONE or now - last <= SCHEDULE_ON_TIME_MS:
                ticks.append(last)
                skipped = count - 1
            else:
                skipped = count
        fired: list[int] = []
        for tick in ticks:
            event = _schedule_job(state, sched, tick, now, depth)
            if event is None:
                skipped += 1
                continue
            events.append(event)
            fired.append(tick)
            woken.add(event.queue)
        events.append(
            ScheduleAdvanced(
                name=sched.spec.name, fired=tuple(fired), skipped=skipped, next_ms=next_ms
            )
        )
        fired_total += len(fired)
        skipped_total += skipped
    return fired_total, skipped_total


# ---------------------------------------------------------------------------
# Cluster mode: a leader change (issue 19)

# A node id and a leader address in UTF-8 bytes.
NODE_ID_BYTES_MAX = 256
LEADER_ADDRESS_BYTES_MAX = 512


def _decide_change_leader(state: State, cmd: ChangeLeader, now: int) -> Decision | CommandError:
    """| input | decision |
    | --- | --- |
    | epoch not an int >= 1 | InvalidArgument |
    | node_id not a non-empty str of at most NODE_ID_BYTES_MAX bytes | InvalidArgument |
    | address not a str of at most LEADER_ADDRESS_BYTES_MAX bytes | InvalidArgument |
    | otherwise | LeaderChanged (no job state changes) |

    The epoch is not checked against the log's: the cluster's conditional append
    fences a stale leader, the core cannot."""
    epoch = _field(cmd, "epoch")
    node_id = _field(cmd, "node_id")
    address = _field(cmd, "address")
    if not _is_int(epoch) or epoch < 1:
        return InvalidArgument("epoch must be an integer >= 1")
    if type(node_id) is not str or not node_id or _utf8_len(node_id) > NODE_ID_BYTES_MAX:
        return InvalidArgument(
            f"node_id must be a non-empty string of <= {NODE_ID_BYTES_MAX} bytes"
        )
    if type(address) is not str or _utf8_len(address) > LEADER_ADDRESS_BYTES_MAX:
        return InvalidArgument(f"address must be a string of <= {LEADER_ADDRESS_BYTES_MAX} bytes")
    event = LeaderChanged(epoch=epoch, node_id=node_id, address=address)
    return Decision((event,), now, LeaderChangeResult(epoch=epoch), NOTHING_WOKEN)


_HANDLERS: dict[type[Any], Any] = {
    Enqueue: _decide_enqueue,
    Reserve: _decide_reserve,
    Ack: _decide_ack,
    Nack: _decide_nack,
    Extend: _decide_extend,
    DrainDeadLetters: _decide_drain,
    Sweep: _decide_sweep,
    DeadLetterJobs: _decide_dead_letter_jobs,
    RequeueDeadLetters: _decide_requeue,
    Release: _decide_release,
    AdminDeadLetterJobs: _decide_live_jobs_admin,
    CancelJobs: _decide_live_jobs_admin,
    AdminRequeueDeadLetters: _decide_dead_letters_admin,
    DeleteDeadLetters: _decide_dead_letters_admin,
    PauseQueue: _decide_pause_resume,
    ResumeQueue: _decide_pause_resume,
    PurgeQueue: _decide_purge,
    PutQueue: _decide_put_queue,
    DeleteQueue: _decide_delete_queue,
    PutSchedule: _decide_put_schedule,
    PauseSchedule: _decide_pause_resume_schedule,
    ResumeSchedule: _decide_pause_resume_schedule,
    DeleteSchedule: _decide_delete_schedule,
    ChangeLeader: _decide_change_leader,
}
