"""Commands: what a caller asks the state machine to do (imperative names).

Owns: the command classes handed to `decide`, their `KIND` numbers (stored in each
log record's envelope so tools can say which command produced a record), and the
retry directive of a nack.

Promises: commands carry every input that is not state or time — job ids are chosen
at the edge (UUID strings), so `decide` needs no random source.

Must not import: anything outside the standard library and `sepp.core`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, NamedTuple

# Custom-map values: the reference's primitives (string, double, 64-bit int, bool).
Primitive = str | int | float | bool

RETRY_DEFAULT = "default"
RETRY_DELAY = "delay"
RETRY_DEAD_LETTER = "dead_letter"


class NewJob(NamedTuple):
    """One job as a producer submits it, with its id already assigned.

    A NamedTuple (immutable, slotted) rather than a frozen dataclass: a batch
    enqueue builds 256 of them per request, and construction cost shows (see
    events.py). Build it with keywords."""

    job_id: str
    queue: str
    job_type: str
    payload_data: bytes | None = None
    payload_encoding: str | None = None
    idempotency_key: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    scheduled_at: int | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    custom: Mapping[str, Primitive] | None = None
    # Set by the edge when the job arrived malformed (a field of the wrong type):
    # decide rejects it with InvalidRequest(invalid), in its place in the batch.
    invalid: str | None = None


class _EnqueueFields(NamedTuple):
    jobs: tuple[NewJob, ...]
    atomic: bool = False


class Enqueue(_EnqueueFields):
    """Store a batch of jobs. Best effort: each job succeeds or is rejected on its
    own. Atomic: all jobs are stored or none is. (A NamedTuple like the worker's
    commands below: one is built per enqueue request.)"""

    __slots__ = ()

    @property
    def kind(self) -> int:
        return 2 if self.atomic else 1


# The four commands of the worker's hot path (one per request) are NamedTuples,
# like NewJob: built once per request, they cost a fifth of a frozen dataclass.
# Each is a NamedTuple of its fields plus a subclass carrying the KIND number.


class _ReserveFields(NamedTuple):
    queues: tuple[str, ...]
    lease_ms: int
    max_jobs: int = 1
    worker_id: str | None = None
    # Stop adding jobs once their payloads total more than this (the edge sets it
    # from its frame limit); one job is always delivered. None = no cap.
    max_bytes: int | None = None
    # ORDER_STRICT: the queues in the order given; ORDER_FAIR: weighted round
    # robin over those with ready jobs (issue 17, decide._pick_fair).
    order: str = "strict"


ORDER_STRICT = "strict"
ORDER_FAIR = "fair"
RESERVE_ORDERS = (ORDER_STRICT, ORDER_FAIR)


class Reserve(_ReserveFields):
    """Lease up to `max_jobs` Ready jobs from `queues`: tried in the order given,
    or in fair order (weighted round robin, `order` ORDER_FAIR)."""

    __slots__ = ()
    KIND: ClassVar[int] = 3

    @property
    def kind(self) -> int:
        return self.KIND


# The fencing token of the worker's commands: `enqueued_at` is the job's
# enqueued_at (ms) as the delivery carried it, optional. The attempt alone does
# not tell deliveries apart after an operator requeue (attempt back to 1), and
# the requeue always moves enqueued_at forward: a holder of a lease from before
# the requeue sends the old value and is fenced (AttemptMismatch). None keeps the
# attempt-only fence (clients that do not send it). Never logged: the log holds
# events only (FORMAT.md section 6), so adding it changed no format.


class _AckFields(NamedTuple):
    job_id: str
    attempt: int
    worker_id: str | None = None
    enqueued_at: int | None = None


class Ack(_AckFields):
    """The in-flight attempt succeeded. Fenced by `attempt` and, when given,
    `enqueued_at` (see above)."""

    __slots__ = ()
    KIND: ClassVar[int] = 4

    @property
    def kind(self) -> int:
        return self.KIND


class _NackFields(NamedTuple):
    job_id: str
    attempt: int
    retry: str = RETRY_DEFAULT
    delay_ms: int | None = None
    reason: str | None = None
    worker_id: str | None = None
    enqueued_at: int | None = None


class Nack(_NackFields):
    """Report a failed attempt. `retry` is RETRY_DEFAULT (the queue's retry policy),
    RETRY_DELAY (retry after `delay_ms`) or RETRY_DEAD_LETTER (give up now)."""

    __slots__ = ()
    KIND: ClassVar[int] = 5

    @property
    def kind(self) -> int:
        return self.KIND


class _ExtendFields(NamedTuple):
    job_id: str
    attempt: int
    lease_ms: int
    worker_id: str | None = None
    enqueued_at: int | None = None


class Extend(_ExtendFields):
    """Move the lease deadline to now + `lease_ms` (clamped)."""

    __slots__ = ()
    KIND: ClassVar[int] = 6

    @property
    def kind(self) -> int:
        return self.KIND


class _ReleaseFields(NamedTuple):
    job_id: str
    attempt: int
    worker_id: str | None = None


class Release(_ReleaseFields):
    """Hand an in-flight attempt back unused: the job was delivered to nobody (the
    reserve that leased it was abandoned, or its answer could not be written).
    The job is Ready again at once and the attempt does not count against
    max_attempts (the next delivery carries the same attempt number)."""

    __slots__ = ()
    KIND: ClassVar[int] = 11

    @property
    def kind(self) -> int:
        return self.KIND


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainDeadLetters:
    """Return and delete up to `max_records` dead letters, oldest first."""

    queue: str | None = None
    max_records: int = 1
    # Stop adding records once their answer bytes would pass this (the edge sets
    # it from its frame limit); a record larger than it alone is never taken.
    # None = no cap.
    max_bytes: int | None = None
    KIND: ClassVar[int] = 7

    @property
    def kind(self) -> int:
        return self.KIND


@dataclass(frozen=True, slots=True, kw_only=True)
class Sweep:
    """Do everything that has fallen due: promote scheduled jobs, expire leases,
    dedup records and dead letters. The server submits it on a timer; it is logged
    like any other command, so replay never needs a clock."""

    KIND: ClassVar[int] = 8

    @property
    def kind(self) -> int:
        return self.KIND


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetterJobs:
    """Operator action: dead-letter live Ready or Scheduled jobs (cause `admin`)."""

    job_ids: tuple[str, ...]
    reason: str | None = None
    KIND: ClassVar[int] = 9

    @property
    def kind(self) -> int:
        return self.KIND


@dataclass(frozen=True, slots=True, kw_only=True)
class RequeueDeadLetters:
    """Operator action: put dead letters back as Ready jobs (same id, attempt 1)."""

    job_ids: tuple[str, ...]
    KIND: ClassVar[int] = 10

    @property
    def kind(self) -> int:
        return self.KIND


# ---------------------------------------------------------------------------
# Admin commands (issue 15). Each names its `actor` and `role` (the edge's auth
# decision: the core records them, it does not check them) and an optional
# `reason`; each logs an AdminAction header followed by its changes.

# Ids one admin call may name (over it the whole call is refused).
ADMIN_IDS_PER_CALL_MAX = 1000
# Jobs one filtered admin call (by queue / cause, or a purge) changes at most:
# the reply says how many remain, the caller repeats.
ADMIN_JOBS_PER_CHUNK_MAX = 1000
# The envelope command kind of every admin command (log_format COMMAND_ADMIN);
# the record's first event, AdminAction, names the action.
ADMIN_COMMAND_KIND = 12
# The roles an admin key may have (issue 15: viewer < operator < admin); a
# viewer may only read, so decide refuses its commands (PermissionDenied).
ADMIN_ROLES = ("viewer", "operator", "admin")
ADMIN_ROLES_THAT_CHANGE = ("operator", "admin")
# An actor name (an admin key's name, `local`) in UTF-8 bytes.
ADMIN_ACTOR_BYTES_MAX = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminCommand:
    actor: str
    role: str
    reason: str | None = None

    @property
    def kind(self) -> int:
        return ADMIN_COMMAND_KIND


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminDeadLetterJobs(AdminCommand):
    """Dead-letter live Ready or Scheduled jobs by id (cause `admin`)."""

    job_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelJobs(AdminCommand):
    """Delete live Ready or Scheduled jobs by id (no dead letter kept)."""

    job_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class AdminRequeueDeadLetters(AdminCommand):
    """Put dead letters back as Ready jobs (same id, attempt 1): by `job_ids`, or,
    when none are given, up to `max_jobs` of those matching `queue` and / or
    `cause` (oldest first; at least one of them is required)."""

    job_ids: tuple[str, ...] = ()
    queue: str | None = None
    cause: int | None = None
    max_jobs: int = ADMIN_JOBS_PER_CHUNK_MAX


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteDeadLetters(AdminCommand):
    """Delete dead letters: by ids or by filter, like AdminRequeueDeadLetters."""

    job_ids: tuple[str, ...] = ()
    queue: str | None = None
    cause: int | None = None
    max_jobs: int = ADMIN_JOBS_PER_CHUNK_MAX


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseQueue(AdminCommand):
    """Stop delivering from `queue` (enqueues still land). Durable."""

    queue: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeQueue(AdminCommand):
    """Deliver from a paused `queue` again."""

    queue: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PurgeQueue(AdminCommand):
    """Delete up to `max_jobs` of the Ready and Scheduled jobs of `queue` (oldest
    first); In-flight jobs and dead letters are untouched."""

    queue: str
    max_jobs: int = ADMIN_JOBS_PER_CHUNK_MAX


@dataclass(frozen=True, slots=True, kw_only=True)
class PutQueue(AdminCommand):
    """Create `queue` at runtime, or update it: `overrides` (setting -> value, keys
    of sepp.core.state.QUEUE_OVERRIDE_KEYS) replace its runtime overrides and win
    over the configuration file for this queue, key by key. Durable (logged,
    in snapshots)."""

    queue: str
    overrides: Mapping[str, int | str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteQueue(AdminCommand):
    """Remove a runtime queue definition. Refused while the queue has in-flight
    jobs, and for a queue only the configuration file defines. A queue the file
    does not declare loses its Ready and Scheduled jobs too (at most
    ADMIN_JOBS_PER_CHUNK_MAX: purge a bigger one first); dead letters stay until
    drained, deleted or expired."""

    queue: str


# ---------------------------------------------------------------------------
# Schedules (issue 17): admin commands like the queue ones (actor, role, reason).


@dataclass(frozen=True, slots=True, kw_only=True)
class PutSchedule(AdminCommand):
    """Create schedule `name`, or update it. Exactly one of `cron` (5 fields, read
    in `timezone`, whose offsets `zone` carries: see sepp.core.schedules) and
    `every_ms`. An update that changes no timing field (cron, timezone, zone,
    every_ms) keeps the schedule's next tick (its anchor); the same definition
    again changes nothing."""

    name: str
    queue: str
    job_type: str
    payload_data: bytes | None = None
    payload_encoding: str | None = None
    priority: int | None = None
    max_attempts: int | None = None
    custom: Mapping[str, Primitive] | None = None
    cron: str | None = None
    timezone: str = "UTC"
    zone: tuple[int, ...] = (-(2**62), 0)
    every_ms: int | None = None
    catch_up: str = "one"


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseSchedule(AdminCommand):
    """Stop firing schedule `name` (durable)."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeSchedule(AdminCommand):
    """Fire a paused schedule again, from its first tick after now."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteSchedule(AdminCommand):
    """Remove schedule `name` (the jobs it fired stay)."""

    name: str


# Cluster mode (issue 19): the envelope command kind of ChangeLeader
# (log_format COMMAND_LEADER_CHANGE).
LEADER_CHANGE_COMMAND_KIND = 13


@dataclass(frozen=True, slots=True, kw_only=True)
class ChangeLeader:
    """Cluster mode: the node `node_id`, reachable at `address`, leads `epoch`
    from now on. A new leader appends it (fenced) before it serves anything."""

    epoch: int
    node_id: str
    address: str
    KIND: ClassVar[int] = LEADER_CHANGE_COMMAND_KIND

    @property
    def kind(self) -> int:
        return self.KIND


Command = (
    Enqueue
    | Reserve
    | Ack
    | Nack
    | Extend
    | DrainDeadLetters
    | Sweep
    | DeadLetterJobs
    | RequeueDeadLetters
    | Release
    | AdminDeadLetterJobs
    | CancelJobs
    | AdminRequeueDeadLetters
    | DeleteDeadLetters
    | PauseQueue
    | ResumeQueue
    | PurgeQueue
    | PutQueue
    | DeleteQueue
    | PutSchedule
    | PauseSchedule
    | ResumeSchedule
    | DeleteSchedule
    | ChangeLeader
)

COMMAND_KIND_NAMES = {
    1: "enqueue",
    2: "enqueue_atomic",
    3: "reserve",
    4: "ack",
    5: "nack",
    6: "extend",
    7: "drain_dead_letters",
    8: "sweep",
    9: "dead_letter_jobs",
    10: "requeue_dead_letters",
    11: "release",
    13: "leader_change",
}
