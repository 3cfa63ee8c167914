"""Events: the facts the state machine records, one per state transition.

Owns: the event classes, their stable type ids and versions, and the conversion
between an event object and the plain list that the log stores (`to_fields` /
`from_fields`). The byte-level encoding of those lists (msgpack inside a framed,
checksummed record) belongs to `log_format`; its FORMAT.md documents this catalogue
field by field and a test keeps the two in step.

Promises: an event carries every value that was *decided* (times, attempts, delays),
so `apply` only copies fields and replay never consults a clock, a config or a
random source.

Must not import: anything outside the standard library and `sepp.core`.

Why NamedTuple and not a frozen dataclass: replay must apply >= 300,000 events/s,
a budget of ~3 us per event. Building a 15-field frozen, slotted dataclass costs
~2 us in CPython 3.11 (every field goes through object.__setattr__); a NamedTuple
built with tuple.__new__ costs ~0.2 us. NamedTuples are immutable and slotted; code
that builds events writes keyword arguments by convention. (ARCHITECTURE.md notes
this departure from STYLE.md habit 7.)
"""

from __future__ import annotations

from typing import Any, ClassVar, NamedTuple

# Dead-letter causes; the integer values are the reference's enum values and are
# what the log stores.
CAUSE_ATTEMPTS_EXHAUSTED = 1
CAUSE_REJECTED = 2
CAUSE_LEASE_EXPIRED = 3
CAUSE_ADMIN = 4
CAUSE_NAMES = {
    CAUSE_ATTEMPTS_EXHAUSTED: "attempts_exhausted",
    CAUSE_REJECTED: "rejected",
    CAUSE_LEASE_EXPIRED: "lease_expired",
    CAUSE_ADMIN: "admin",
}


class _JobEnqueued(NamedTuple):
    job_id: str
    queue: str
    job_type: str
    payload_data: bytes | None
    payload_encoding: str | None
    priority: int
    max_attempts: int
    enqueued_at: int
    # The scheduled_at the producer asked for (kept for delivery), or None.
    scheduled_at: int | None
    # Set when the job starts Scheduled: the time the sweep promotes it.
    run_at: int | None
    idempotency_key: str | None
    # When the (queue, idempotency_key) dedup record lapses; None = no record.
    dedup_expires_at: int | None
    traceparent: str | None
    tracestate: str | None
    custom: dict[str, Any] | None


class JobEnqueued(_JobEnqueued):
    """A new job was stored: Ready, or Scheduled when `run_at` is set."""

    __slots__ = ()
    TYPE: ClassVar[int] = 1
    VERSION: ClassVar[int] = 1


class _JobReserved(NamedTuple):
    job_id: str
    attempt: int
    lease_expires_at: int
    worker_id: str | None


class JobReserved(_JobReserved):
    """A Ready job was leased to a worker until `lease_expires_at`."""

    __slots__ = ()
    TYPE: ClassVar[int] = 2
    VERSION: ClassVar[int] = 1


class _JobAcked(NamedTuple):
    job_id: str
    attempt: int
    worker_id: str | None


class JobAcked(_JobAcked):
    """The in-flight job finished; it is deleted."""

    __slots__ = ()
    TYPE: ClassVar[int] = 3
    VERSION: ClassVar[int] = 1


class _JobNacked(NamedTuple):
    job_id: str
    attempt: int
    run_at: int | None
    reason: str | None
    worker_id: str | None


class JobNacked(_JobNacked):
    """The in-flight attempt failed and the job goes back for attempt + 1:
    Ready at once when `run_at` is None, else Scheduled until `run_at`."""

    __slots__ = ()
    TYPE: ClassVar[int] = 4
    VERSION: ClassVar[int] = 1


class _JobLeaseExtended(NamedTuple):
    job_id: str
    attempt: int
    lease_expires_at: int
    worker_id: str | None


class JobLeaseExtended(_JobLeaseExtended):
    """The lease of an in-flight attempt now ends at `lease_expires_at`."""

    __slots__ = ()
    TYPE: ClassVar[int] = 5
    VERSION: ClassVar[int] = 1


class _JobLeaseExpired(NamedTuple):
    job_id: str
    attempt: int


class JobLeaseExpired(_JobLeaseExpired):
    """The lease lapsed with attempts left: Ready at once for attempt + 1."""

    __slots__ = ()
    TYPE: ClassVar[int] = 6
    VERSION: ClassVar[int] = 1


class _JobPromoted(NamedTuple):
    job_id: str


class JobPromoted(_JobPromoted):
    """A Scheduled job's time came: it is Ready."""

    __slots__ = ()
    TYPE: ClassVar[int] = 7
    VERSION: ClassVar[int] = 1


class _JobDeadLettered(NamedTuple):
    job_id: str
    attempt: int
    cause: int
    failed_at: int
    reason: str | None
    retained: bool


class JobDeadLettered(_JobDeadLettered):
    """The job died. `retained` says whether the dead-letter store keeps it
    (retention > 0) or it is dropped on the spot (retention = 0)."""

    __slots__ = ()
    TYPE: ClassVar[int] = 8
    VERSION: ClassVar[int] = 1


class _DeadLetterDrained(NamedTuple):
    job_id: str


class DeadLetterDrained(_DeadLetterDrained):
    """A dead-letter record was handed to a caller and deleted."""

    __slots__ = ()
    TYPE: ClassVar[int] = 9
    VERSION: ClassVar[int] = 1


class _DeadLetterExpired(NamedTuple):
    job_id: str


class DeadLetterExpired(_DeadLetterExpired):
    """A dead-letter record outlived the retention and was deleted."""

    __slots__ = ()
    TYPE: ClassVar[int] = 10
    VERSION: ClassVar[int] = 1


class _DedupExpired(NamedTuple):
    queue: str
    idempotency_key: str
    expires_at: int


class DedupExpired(_DedupExpired):
    """The dedup record of (queue, idempotency_key) that lapses at `expires_at`
    was deleted."""

    __slots__ = ()
    TYPE: ClassVar[int] = 11
    VERSION: ClassVar[int] = 1


class _DeadLetterRequeued(NamedTuple):
    job_id: str
    enqueued_at: int


class DeadLetterRequeued(_DeadLetterRequeued):
    """An operator put a dead-letter record back as a Ready job: same id,
    attempt 1, `enqueued_at` reset, no schedule."""

    __slots__ = ()
    TYPE: ClassVar[int] = 12
    VERSION: ClassVar[int] = 1


class _JobReleased(NamedTuple):
    job_id: str
    attempt: int
    worker_id: str | None


class JobReleased(_JobReleased):
    """The in-flight attempt was handed back unused (delivered to nobody): the
    job is Ready at once under the same attempt number, which is not counted
    against max_attempts."""

    __slots__ = ()
    TYPE: ClassVar[int] = 13
    VERSION: ClassVar[int] = 1


class _AdminAction(NamedTuple):
    action: str
    actor: str
    role: str
    reason: str | None
    queue: str | None
    job_ids: tuple[str, ...] | list[str]


class AdminAction(_AdminAction):
    """The audit header of an operator's command: who (`actor`, `role`) did what
    (`action`, one of ADMIN_ACTIONS) and why, to which queue and ids. It is the
    first event of every admin record and changes nothing; the events after it in
    the same record are the changes. `job_ids` lists the ids the action changed
    (in the record's order); empty for queue-level actions."""

    __slots__ = ()
    TYPE: ClassVar[int] = 14
    VERSION: ClassVar[int] = 1


class _JobCancelled(NamedTuple):
    job_id: str
    attempt: int


class JobCancelled(_JobCancelled):
    """An operator deleted a Ready or Scheduled job (cancel, purge): it is gone,
    no dead letter is kept."""

    __slots__ = ()
    TYPE: ClassVar[int] = 15
    VERSION: ClassVar[int] = 1


class _DeadLetterDeleted(NamedTuple):
    job_id: str


class DeadLetterDeleted(_DeadLetterDeleted):
    """An operator deleted a dead-letter record (nothing was handed out)."""

    __slots__ = ()
    TYPE: ClassVar[int] = 16
    VERSION: ClassVar[int] = 1


class _QueuePaused(NamedTuple):
    queue: str


class QueuePaused(_QueuePaused):
    """The queue delivers nothing until resumed (it still accepts enqueues)."""

    __slots__ = ()
    TYPE: ClassVar[int] = 17
    VERSION: ClassVar[int] = 1


class _QueueResumed(NamedTuple):
    queue: str


class QueueResumed(_QueueResumed):
    """A paused queue delivers again."""

    __slots__ = ()
    TYPE: ClassVar[int] = 18
    VERSION: ClassVar[int] = 1


class _QueueDefined(NamedTuple):
    queue: str
    overrides: dict[str, Any] | None


class QueueDefined(_QueueDefined):
    """An operator created or updated a queue at runtime: `overrides` (setting ->
    value, keys of sepp.core.state.QUEUE_OVERRIDE_KEYS) replace its previous
    runtime overrides; they win over the configuration file for this queue."""

    __slots__ = ()
    TYPE: ClassVar[int] = 19
    VERSION: ClassVar[int] = 1


class _QueueDeleted(NamedTuple):
    queue: str


class QueueDeleted(_QueueDeleted):
    """An operator deleted a runtime-defined queue: its runtime overrides are gone
    (the file's settings apply again; an undeclared queue is forgotten once it
    holds nothing)."""

    __slots__ = ()
    TYPE: ClassVar[int] = 20
    VERSION: ClassVar[int] = 1


# Schedules (issue 17). A schedule's ticks are decided by the sweep and logged in
# ScheduleAdvanced, in the same record as the JobEnqueued of each fired tick: a
# tick fires exactly once however the server crashes.


class _ScheduleDefined(NamedTuple):
    name: str
    queue: str
    job_type: str
    payload_data: bytes | None
    payload_encoding: str | None
    priority: int | None
    max_attempts: int | None
    custom: dict[str, Any] | None
    cron: str | None
    timezone: str
    # The zone table (sepp.core.schedules): start_utc_ms, offset_ms, ...
    zone: tuple[int, ...] | list[int]
    every_ms: int | None
    catch_up: str
    # The first tick not yet fired (the anchor: kept by an update that changes
    # no timing field).
    next_ms: int
    # When the schedule was first defined (kept by updates): part of its fired
    # jobs' ids, so a schedule deleted and created again never reuses one.
    created_at: int


class ScheduleDefined(_ScheduleDefined):
    """An operator (or the configuration) created or updated a schedule."""

    __slots__ = ()
    TYPE: ClassVar[int] = 21
    VERSION: ClassVar[int] = 1


class _SchedulePaused(NamedTuple):
    name: str


class SchedulePaused(_SchedulePaused):
    """The schedule fires nothing until resumed."""

    __slots__ = ()
    TYPE: ClassVar[int] = 22
    VERSION: ClassVar[int] = 1


class _ScheduleResumed(NamedTuple):
    name: str
    next_ms: int


class ScheduleResumed(_ScheduleResumed):
    """A paused schedule fires again from `next_ms` (its first tick after the
    resume: ticks while paused are not missed, they were paused)."""

    __slots__ = ()
    TYPE: ClassVar[int] = 23
    VERSION: ClassVar[int] = 1


class _ScheduleDeleted(NamedTuple):
    name: str


class ScheduleDeleted(_ScheduleDeleted):
    """The schedule is gone (jobs it fired stay)."""

    __slots__ = ()
    TYPE: ClassVar[int] = 24
    VERSION: ClassVar[int] = 1


class _ScheduleAdvanced(NamedTuple):
    name: str
    # The ticks fired (a JobEnqueued each, earlier in the same record).
    fired: tuple[int, ...] | list[int]
    # The ticks passed over (catch-up policy, a full queue, a key already used).
    skipped: int
    next_ms: int


class ScheduleAdvanced(_ScheduleAdvanced):
    """A sweep handled the schedule's due ticks: `next_ms` is its next tick."""

    __slots__ = ()
    TYPE: ClassVar[int] = 25
    VERSION: ClassVar[int] = 1


class _LeaderChanged(NamedTuple):
    # The epoch the new leader leads (the previous leader's + 1).
    epoch: int
    node_id: str
    # Where clients reach the new leader ("host:port").
    address: str


class LeaderChanged(_LeaderChanged):
    """Cluster mode: a node became the leader and appended this, fenced, before
    serving. It changes no job state; it marks the epoch in the log."""

    __slots__ = ()
    TYPE: ClassVar[int] = 26
    VERSION: ClassVar[int] = 1


# AdminAction.action values (stable: the log stores them).
ADMIN_DEAD_LETTER_JOBS = "jobs.dead_letter"
ADMIN_CANCEL_JOBS = "jobs.cancel"
ADMIN_REQUEUE_DEAD_LETTERS = "dead_letters.requeue"
ADMIN_DELETE_DEAD_LETTERS = "dead_letters.delete"
ADMIN_PAUSE_QUEUE = "queue.pause"
ADMIN_RESUME_QUEUE = "queue.resume"
ADMIN_PURGE_QUEUE = "queue.purge"
ADMIN_PUT_QUEUE = "queue.put"
ADMIN_DELETE_QUEUE = "queue.delete"
ADMIN_PUT_SCHEDULE = "schedule.put"
ADMIN_PAUSE_SCHEDULE = "schedule.pause"
ADMIN_RESUME_SCHEDULE = "schedule.resume"
ADMIN_DELETE_SCHEDULE = "schedule.delete"
ADMIN_ACTIONS = (
    ADMIN_DEAD_LETTER_JOBS,
    ADMIN_CANCEL_JOBS,
    ADMIN_REQUEUE_DEAD_LETTERS,
    ADMIN_DELETE_DEAD_LETTERS,
    ADMIN_PAUSE_QUEUE,
    ADMIN_RESUME_QUEUE,
    ADMIN_PURGE_QUEUE,
    ADMIN_PUT_QUEUE,
    ADMIN_DELETE_QUEUE,
    ADMIN_PUT_SCHEDULE,
    ADMIN_PAUSE_SCHEDULE,
    ADMIN_RESUME_SCHEDULE,
    ADMIN_DELETE_SCHEDULE,
)


Event = (
    JobEnqueued
    | JobReserved
    | JobAcked
    | JobNacked
    | JobLeaseExtended
    | JobLeaseExpired
    | JobPromoted
    | JobDeadLettered
    | DeadLetterDrained
    | DeadLetterExpired
    | DedupExpired
    | DeadLetterRequeued
    | JobReleased
    | AdminAction
    | JobCancelled
    | DeadLetterDeleted
    | QueuePaused
    | QueueResumed
    | QueueDefined
    | QueueDeleted
    | ScheduleDefined
    | SchedulePaused
    | ScheduleResumed
    | ScheduleDeleted
    | ScheduleAdvanced
    | LeaderChanged
)

EVENT_CLASSES: tuple[type[Any], ...] = (
    JobEnqueued,
    JobReserved,
    JobAcked,
    JobNacked,
    JobLeaseExtended,
    JobLeaseExpired,
    JobPromoted,
    JobDeadLettered,
    DeadLetterDrained,
    DeadLetterExpired,
    DedupExpired,
    DeadLetterRequeued,
    JobReleased,
    AdminAction,
    JobCancelled,
    DeadLetterDeleted,
    QueuePaused,
    QueueResumed,
    QueueDefined,
    QueueDeleted,
    ScheduleDefined,
    SchedulePaused,
    ScheduleResumed,
    ScheduleDeleted,
    ScheduleAdvanced,
    LeaderChanged,
)

# type id -> class; a list indexed by type id is the fastest dispatch in CPython.
_BY_TYPE: list[type[Any] | None] = [None] * (max(c.TYPE for c in EVENT_CLASSES) + 1)
for _cls in EVENT_CLASSES:
    if _BY_TYPE[_cls.TYPE] is not None:
        raise RuntimeError(f"duplicate event type id {_cls.TYPE}")
    _BY_TYPE[_cls.TYPE] = _cls
EVENT_BY_TYPE: tuple[type[Any] | None, ...] = tuple(_BY_TYPE)


class EventDecodeError(ValueError):
    """A stored event list does not match the catalogue (unknown type id, wrong
    version or wrong number of fields). Raised by `from_fields`."""


def to_fields(event: Event) -> list[Any]:
    """The stored form of an event: [type_id, version, field1, ..., fieldN]."""
    return [event.TYPE, event.VERSION, *event]


_new_tuple = tuple.__new__


def from_fields(fields: list[Any] | tuple[Any, ...]) -> Event:
    """Rebuild an event from its stored list. Checks the type id, the version and
    the arity; field *types* are checked by `log_format`'s catalogue validation
    (used by `sepp-log verify`), not on the hot replay path."""
    try:
        type_id = fields[0]
        version = fields[1]
    except (IndexError, TypeError, KeyError) as exc:
        raise EventDecodeError(f"malformed event {fields!r:.80}") from exc
    # `type(x) is int`: msgpack's booleans are ints to isinstance, never ids.
    if type(type_id) is not int or not 0 <= type_id < len(EVENT_BY_TYPE):
        raise EventDecodeError(f"unknown event type id {type_id!r:.40}")
    cls = EVENT_BY_TYPE[type_id]
    if cls is None:
        raise EventDecodeError(f"unknown event type id {type_id!r}")
    if type(version) is not int or version != cls.VERSION:
        raise EventDecodeError(
            f"{cls.__name__} version {version!r} is not supported (expected {cls.VERSION})"
        )
    if len(fields) - 2 != len(cls._fields):
        raise EventDecodeError(
            f"{cls.__name__} has {len(fields) - 2} fields, expected {len(cls._fields)}"
        )
    event: Event = _new_tuple(cls, fields[2:])
    return event
