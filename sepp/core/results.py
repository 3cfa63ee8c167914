"""What `decide` answers: per-job rejections (values), whole-command errors and
the replies of each command.

Owns: the rejection catalogue of sepp-semantics.md §13 (one class per reason, with
the reference's fields and metric label), the whole-command error classes (§15:
invalid_argument, not_found, failed_precondition) and the reply classes.

Promises: a rejection or an error never comes with events — nothing is logged and
no other command is affected. Replies are immutable snapshots, safe to hand to
another thread while the state moves on.

Must not import: anything outside the standard library and `sepp.core`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

# ---------------------------------------------------------------------------
# Per-job rejections (§13). `reason` is the stable label; `transient` says a
# retry may succeed later without changing the job.


@dataclass(frozen=True, slots=True)
class UnknownQueue:
    queue: str
    reason: ClassVar[str] = "unknown_queue"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"queue {self.queue!r} is not declared and strict_queues is on"


@dataclass(frozen=True, slots=True)
class PayloadTooLarge:
    limit: int
    actual: int
    reason: ClassVar[str] = "payload_too_large"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"payload is {self.actual} bytes, the limit is {self.limit}"


@dataclass(frozen=True, slots=True)
class EncodingNotAllowed:
    encoding: str
    allowed: tuple[str, ...]
    reason: ClassVar[str] = "encoding_not_allowed"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"encoding {self.encoding!r} is not one of {list(self.allowed)}"


@dataclass(frozen=True, slots=True)
class JobTypeNotAllowed:
    job_type: str
    allowed: tuple[str, ...]
    reason: ClassVar[str] = "job_type_not_allowed"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"job type {self.job_type!r} is not one of {list(self.allowed)}"


@dataclass(frozen=True, slots=True)
class CustomEntriesTooMany:
    limit: int
    actual: int
    reason: ClassVar[str] = "custom_entries_too_many"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"custom map has {self.actual} entries, the limit is {self.limit}"


@dataclass(frozen=True, slots=True)
class CustomMapTooLarge:
    limit: int
    actual: int
    reason: ClassVar[str] = "custom_map_too_large"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"custom map is {self.actual} bytes, the limit is {self.limit}"


@dataclass(frozen=True, slots=True)
class CustomKeyTooLong:
    key: str
    limit: int
    actual: int
    reason: ClassVar[str] = "custom_key_too_long"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"custom key {self.key[:40]!r} is {self.actual} bytes, the limit is {self.limit}"


@dataclass(frozen=True, slots=True)
class QueueNameTooLong:
    limit: int
    actual: int
    reason: ClassVar[str] = "queue_name_too_long"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"queue name is {self.actual} bytes, the limit is {self.limit}"


@dataclass(frozen=True, slots=True)
class JobTypeNameTooLong:
    limit: int
    actual: int
    reason: ClassVar[str] = "job_type_name_too_long"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"job type is {self.actual} bytes, the limit is {self.limit}"


@dataclass(frozen=True, slots=True)
class IdempotencyKeyTooLong:
    limit: int
    actual: int
    reason: ClassVar[str] = "idempotency_key_too_long"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"idempotency key is {self.actual} bytes, the limit is {self.limit}"


@dataclass(frozen=True, slots=True)
class ScheduledTooFar:
    horizon_ms: int
    actual: int
    reason: ClassVar[str] = "scheduled_too_far"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return f"scheduled_at {self.actual} is beyond the horizon of {self.horizon_ms} ms"


@dataclass(frozen=True, slots=True)
class InvalidRequest:
    message: str
    reason: ClassVar[str] = "invalid_request"
    transient: ClassVar[bool] = False

    def describe(self) -> str:
        return self.message


@dataclass(frozen=True, slots=True)
class QueueFull:
    queue: str
    limit: int
    reason: ClassVar[str] = "queue_full"
    transient: ClassVar[bool] = True

    def describe(self) -> str:
        return f"queue {self.queue!r} holds its maximum of {self.limit} live jobs"


@dataclass(frozen=True, slots=True)
class QueueClosing:
    """Part of the catalogue for wire compatibility; this server has no queue
    deletion yet, so it never produces it."""

    queue: str
    reason: ClassVar[str] = "queue_closing"
    transient: ClassVar[bool] = True

    def describe(self) -> str:
        return f"queue {self.queue!r} is being deleted"


Rejection = (
    UnknownQueue
    | PayloadTooLarge
    | EncodingNotAllowed
    | JobTypeNotAllowed
    | CustomEntriesTooMany
    | CustomMapTooLarge
    | CustomKeyTooLong
    | QueueNameTooLong
    | JobTypeNameTooLong
    | IdempotencyKeyTooLong
    | ScheduledTooFar
    | InvalidRequest
    | QueueFull
    | QueueClosing
)

REJECTION_CLASSES: tuple[type[Any], ...] = (
    UnknownQueue,
    PayloadTooLarge,
    EncodingNotAllowed,
    JobTypeNotAllowed,
    CustomEntriesTooMany,
    CustomMapTooLarge,
    CustomKeyTooLong,
    QueueNameTooLong,
    JobTypeNameTooLong,
    IdempotencyKeyTooLong,
    ScheduledTooFar,
    InvalidRequest,
    QueueFull,
    QueueClosing,
)

# ---------------------------------------------------------------------------
# Whole-command errors (§15). `code` is the error class name of the reference.


@dataclass(frozen=True, slots=True)
class CommandError:
    message: str
    code: ClassVar[str] = "internal"


@dataclass(frozen=True, slots=True)
class InvalidArgument(CommandError):
    code: ClassVar[str] = "invalid_argument"


@dataclass(frozen=True, slots=True)
class RecordTooLarge(InvalidArgument):
    """The command's log record would exceed what one log message holds (cluster
    mode: the replicated log's message size); nothing was done."""


@dataclass(frozen=True, slots=True)
class NotFound(CommandError):
    """There is no in-flight job with this id (fencing)."""

    code: ClassVar[str] = "not_found"


@dataclass(frozen=True, slots=True)
class AttemptMismatch(CommandError):
    """The job is in flight under another attempt: the lease was reassigned."""

    current_attempt: int = 0
    code: ClassVar[str] = "failed_precondition"


@dataclass(frozen=True, slots=True)
class FailedPrecondition(CommandError):
    """Strict mode: a reserve named queues that are not declared."""

    queues: tuple[str, ...] = ()
    code: ClassVar[str] = "failed_precondition"


@dataclass(frozen=True, slots=True)
class TooManyIds(InvalidArgument):
    """An admin call named more ids than ADMIN_IDS_PER_CALL_MAX."""

    limit: int = 0
    actual: int = 0


@dataclass(frozen=True, slots=True)
class PermissionDenied(CommandError):
    """The actor's role may not do this (a viewer asked for a change)."""

    code: ClassVar[str] = "permission_denied"


@dataclass(frozen=True, slots=True)
class QueueNotFound(CommandError):
    """An admin read or command named a queue the server does not know."""

    queue: str = ""
    code: ClassVar[str] = "not_found"


@dataclass(frozen=True, slots=True)
class QueueInUse(CommandError):
    """A queue cannot be deleted now: it has in-flight jobs (or more Ready and
    Scheduled ones than one command deletes: purge it first)."""

    queue: str = ""
    code: ClassVar[str] = "failed_precondition"


@dataclass(frozen=True, slots=True)
class InvalidCursor(InvalidArgument):
    """A listing cursor that this server did not hand out, or one from before
    a restart (the status indexes are rebuilt at start-up): start over."""


# ---------------------------------------------------------------------------
# Replies. NamedTuples, like events: several are built per command on the hot
# path, where a frozen dataclass costs several times more to construct.


class Accepted(NamedTuple):
    """One job of an enqueue was stored (or matched an earlier one by its key)."""

    job_id: str
    deduplicated: bool


class EnqueueResult(NamedTuple):
    """Best effort: one entry per job, in request order. Atomic success: every
    entry is Accepted."""

    results: tuple[Accepted | Rejection, ...]


class AtomicRejected(NamedTuple):
    """Atomic enqueue failure: nothing was stored; every failing job is listed
    with its index in the request."""

    failures: tuple[tuple[int, Rejection], ...]


class JobView(NamedTuple):
    """A job as a worker or an operator sees it."""

    job_id: str
    queue: str
    job_type: str
    payload_data: bytes | None
    payload_encoding: str | None
    priority: int
    max_attempts: int
    attempt: int
    enqueued_at: int
    scheduled_at: int | None
    lease_expires_at: int | None
    traceparent: str | None
    tracestate: str | None
    custom: Mapping[str, Any] | None


class ReserveResult(NamedTuple):
    jobs: tuple[JobView, ...]


class AckResult(NamedTuple):
    job_id: str


class ReleaseResult(NamedTuple):
    job_id: str


class NackResult(NamedTuple):
    job_id: str
    dead_lettered: bool


class ExtendResult(NamedTuple):
    job_id: str
    lease_expires_at: int


class DeadLetterView(NamedTuple):
    job: JobView
    cause: int
    failed_at: int
    final_attempt: int
    last_reason: str | None


class DrainResult(NamedTuple):
    records: tuple[DeadLetterView, ...]
    # (job id, answer bytes) of records no answer within the cap could carry:
    # left in the store, never deleted by a drain (PROTOCOL.md 5.6).
    too_large: tuple[tuple[str, int], ...] = ()


class SweepResult(NamedTuple):
    promoted: int = 0
    redelivered: int = 0
    dead_lettered: int = 0
    dedup_expired: int = 0
    dead_letters_expired: int = 0
    # Schedule ticks fired (a job each) and passed over (issue 17).
    schedule_ticks_fired: int = 0
    schedule_ticks_skipped: int = 0


class AdminResult(NamedTuple):
    """Ids the operator action changed, and per-id refusals."""

    affected: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]


# Per-id outcomes of an admin command (AdminOutcomes.outcomes).
OUTCOME_DONE = "done"
OUTCOME_NOT_FOUND = "not_found"
# The job exists but is not in a state the action applies to (e.g. in flight).
OUTCOME_WRONG_STATE = "wrong_state"


class AdminOutcomes(NamedTuple):
    """What an admin command did to each id: (job id, OUTCOME_*), in the order
    asked (by-id calls) or taken (filtered calls); `remaining`: for a filtered
    call, how many more match (repeat the call); 0 for a by-id call."""

    outcomes: tuple[tuple[str, str], ...]
    remaining: int = 0

    @property
    def done(self) -> tuple[str, ...]:
        return tuple(jid for jid, outcome in self.outcomes if outcome == OUTCOME_DONE)


class QueueAdminResult(NamedTuple):
    """Pause / resume: `changed` is False when the queue already was so (nothing
    was logged)."""

    queue: str
    paused: bool
    changed: bool


class PutQueueResult(NamedTuple):
    queue: str
    # The queue was not defined at runtime before (it may be declared in the file).
    created: bool
    # False: the same overrides were already in force (nothing was logged).
    changed: bool
    # The queue's effective settings now.
    policy: Any


class DeleteQueueResult(NamedTuple):
    queue: str
    # Ready and Scheduled jobs deleted with it.
    cancelled: int
    # The configuration file declares it: only its runtime overrides were removed.
    declared_by_file: bool


class PurgeResult(NamedTuple):
    queue: str
    purged: int
    # Ready + Scheduled jobs still in the queue (repeat the purge while > 0).
    remaining: int


@dataclass(frozen=True, slots=True)
class ScheduleNotFound(CommandError):
    """A schedule command named a schedule the server does not hold."""

    name: str = ""
    code: ClassVar[str] = "not_found"


class ScheduleResult(NamedTuple):
    """A schedule command's answer: `changed` False when nothing was logged;
    `next_ms` the schedule's next tick (None once deleted)."""

    name: str
    created: bool
    changed: bool
    paused: bool
    next_ms: int | None


class LeaderChangeResult(NamedTuple):
    """ChangeLeader: the epoch now led."""

    epoch: int


Reply = (
    EnqueueResult
    | AtomicRejected
    | ReserveResult
    | AckResult
    | NackResult
    | ReleaseResult
    | ExtendResult
    | DrainResult
    | SweepResult
    | AdminResult
    | AdminOutcomes
    | QueueAdminResult
    | PurgeResult
    | PutQueueResult
    | DeleteQueueResult
    | ScheduleResult
    | LeaderChangeResult
)
