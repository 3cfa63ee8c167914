"""The event catalogue as data: every event type the log may hold, field by field.

Owns: `CATALOGUE` (type id, name, version, meaning and the ordered, typed fields of
each event), the small field-type language, and `validate_event`, which checks one
stored event list `[type_id, version, field1..fieldN]` against it.

Promises: the catalogue states the same facts as `sepp.core.events` (type ids,
versions, field names in order); `tests/test_format_catalogue.py` fails the moment
the two disagree, and FORMAT.md's catalogue section is checked against this data
too. `validate_event` accepts every event `sepp.core.events.to_fields` produces and
raises `FormatError` with a precise reason for anything else. It is used by
`sepp-log verify`, not on the replay path (where it would cost microseconds per
event).

Field types:
  "str"    a msgpack str (UTF-8)          "str?"   a str or nil
  "int"    a msgpack int (never a bool)   "int?"   an int or nil
  "bool"   a msgpack bool                 "bytes?" a msgpack bin or nil
  "map?"   nil, or a map from str to str / int / float / bool
  "strs"   a msgpack array of str (possibly empty)
  "ints"   a msgpack array of int (possibly empty)
Every integer the log stores fits a msgpack int (-2**63 .. 2**64-1); times are
wall-clock milliseconds since the Unix epoch.

Must not import: anything but the standard library and `log_format` -- in
particular not `sepp.core.events`, whose facts are copied here on purpose: the
format document must not depend on code that can change under it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from log_format.errors import FormatError

__all__ = [
    "CATALOGUE",
    "EVENT_SPECS_BY_TYPE",
    "FIELD_TYPES",
    "EventSpec",
    "FieldSpec",
    "validate_event",
]


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of an event: its name, its type (see FIELD_TYPES), what it means."""

    name: str
    type: str
    meaning: str


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One event type: stable type id, class name, version, meaning, fields in the
    order they are stored."""

    type_id: int
    name: str
    version: int
    meaning: str
    fields: tuple[FieldSpec, ...]


def _f(name: str, type_: str, meaning: str) -> FieldSpec:
    return FieldSpec(name=name, type=type_, meaning=meaning)


_JOB_ID = _f("job_id", "str", "The job's id (a UUID string chosen at the edge).")
_ATTEMPT = _f("attempt", "int", "The attempt this event concerns (>= 1).")
_WORKER_ID = _f("worker_id", "str?", "The worker that sent the command, if it said.")

CATALOGUE: tuple[EventSpec, ...] = (
    EventSpec(
        type_id=1,
        name="JobEnqueued",
        version=1,
        meaning="A new job was stored: Ready, or Scheduled when `run_at` is set.",
        fields=(
            _JOB_ID,
            _f("queue", "str", "The queue the job belongs to."),
            _f("job_type", "str", "The job's type name."),
            _f("payload_data", "bytes?", "The payload bytes (opaque), or nil: no payload."),
            _f(
                "payload_encoding",
                "str?",
                "The payload's encoding hint (e.g. a MIME type), or nil.",
            ),
            _f("priority", "int", "The resolved priority, 0..9 (9 is served first)."),
            _f("max_attempts", "int", "The resolved maximum number of attempts (>= 1)."),
            _f("enqueued_at", "int", "When the job was stored (ms)."),
            _f(
                "scheduled_at",
                "int?",
                "The scheduled_at the producer asked for (ms; kept for delivery), or nil.",
            ),
            _f(
                "run_at",
                "int?",
                "Set when the job starts Scheduled: the time the sweep promotes it (ms).",
            ),
            _f("idempotency_key", "str?", "The producer's idempotency key, or nil."),
            _f(
                "dedup_expires_at",
                "int?",
                "When the (queue, idempotency_key) dedup record lapses (ms); nil = no record.",
            ),
            _f("traceparent", "str?", "W3C traceparent of the producer's trace context, or nil."),
            _f("tracestate", "str?", "W3C tracestate, or nil."),
            _f("custom", "map?", "The job's custom map (str -> str/int/float/bool), or nil."),
        ),
    ),
    EventSpec(
        type_id=2,
        name="JobReserved",
        version=1,
        meaning="A Ready job was leased to a worker until `lease_expires_at`.",
        fields=(
            _JOB_ID,
            _f("attempt", "int", "The attempt that starts now (>= 1)."),
            _f("lease_expires_at", "int", "When the lease ends unless extended (ms)."),
            _WORKER_ID,
        ),
    ),
    EventSpec(
        type_id=3,
        name="JobAcked",
        version=1,
        meaning="The in-flight job finished; it is deleted.",
        fields=(_JOB_ID, _ATTEMPT, _WORKER_ID),
    ),
    EventSpec(
        type_id=4,
        name="JobNacked",
        version=1,
        meaning=(
            "The in-flight attempt failed and the job goes back for attempt + 1: "
            "Ready at once when `run_at` is nil, else Scheduled until `run_at`."
        ),
        fields=(
            _JOB_ID,
            _ATTEMPT,
            _f("run_at", "int?", "When the retry becomes Ready (ms), or nil: at once."),
            _f("reason", "str?", "The worker's failure reason (kept as last_reason), or nil."),
            _WORKER_ID,
        ),
    ),
    EventSpec(
        type_id=5,
        name="JobLeaseExtended",
        version=1,
        meaning="The lease of an in-flight attempt now ends at `lease_expires_at`.",
        fields=(
            _JOB_ID,
            _ATTEMPT,
            _f("lease_expires_at", "int", "The new end of the lease (ms)."),
            _WORKER_ID,
        ),
    ),
    EventSpec(
        type_id=6,
        name="JobLeaseExpired",
        version=1,
        meaning="The lease lapsed with attempts left: Ready at once for attempt + 1.",
        fields=(_JOB_ID, _f("attempt", "int", "The attempt whose lease lapsed.")),
    ),
    EventSpec(
        type_id=7,
        name="JobPromoted",
        version=1,
        meaning="A Scheduled job's time came: it is Ready.",
        fields=(_JOB_ID,),
    ),
    EventSpec(
        type_id=8,
        name="JobDeadLettered",
        version=1,
        meaning=(
            "The job died. `retained` says whether the dead-letter store keeps it "
            "(retention > 0) or it is dropped on the spot (retention = 0)."
        ),
        fields=(
            _JOB_ID,
            _f("attempt", "int", "The attempt that ended the job."),
            _f(
                "cause",
                "int",
                "Why: 1 attempts_exhausted, 2 rejected, 3 lease_expired, 4 admin.",
            ),
            _f("failed_at", "int", "When the job died (ms)."),
            _f("reason", "str?", "The last failure reason, or nil."),
            _f("retained", "bool", "True: kept in the dead-letter store; false: dropped."),
        ),
    ),
    EventSpec(
        type_id=9,
        name="DeadLetterDrained",
        version=1,
        meaning="A dead-letter record was handed to a caller and deleted.",
        fields=(_JOB_ID,),
    ),
    EventSpec(
        type_id=10,
        name="DeadLetterExpired",
        version=1,
        meaning="A dead-letter record outlived the retention and was deleted.",
        fields=(_JOB_ID,),
    ),
    EventSpec(
        type_id=11,
        name="DedupExpired",
        version=1,
        meaning=(
            "The dedup record of (queue, idempotency_key) that lapses at `expires_at` was deleted."
        ),
        fields=(
            _f("queue", "str", "The queue of the dedup record."),
            _f("idempotency_key", "str", "The idempotency key of the dedup record."),
            _f("expires_at", "int", "The lapse time of the record being deleted (ms)."),
        ),
    ),
    EventSpec(
        type_id=12,
        name="DeadLetterRequeued",
        version=1,
        meaning=(
            "An operator put a dead-letter record back as a Ready job: same id, "
            "attempt 1, `enqueued_at` reset, no schedule."
        ),
        fields=(_JOB_ID, _f("enqueued_at", "int", "The new enqueue time (ms).")),
    ),
    EventSpec(
        type_id=13,
        name="JobReleased",
        version=1,
        meaning=(
            "The in-flight attempt was handed back unused (delivered to nobody): the "
            "job is Ready at once under the same attempt number, which is not counted "
            "against max_attempts."
        ),
        fields=(
            _JOB_ID,
            _f("attempt", "int", "The attempt handed back (the next delivery reuses it)."),
            _WORKER_ID,
        ),
    ),
    EventSpec(
        type_id=14,
        name="AdminAction",
        version=1,
        meaning=(
            "The audit header of an operator's command, first event of its record; "
            "changes nothing (the events after it are the changes)."
        ),
        fields=(
            _f(
                "action",
                "str",
                "What was done: jobs.dead_letter, jobs.cancel, dead_letters.requeue, "
                "dead_letters.delete, queue.pause, queue.resume, queue.purge, queue.put, "
                "queue.delete.",
            ),
            _f("actor", "str", "Who did it (an admin key's name, `local`, ...)."),
            _f("role", "str", "The actor's role: viewer, operator or admin."),
            _f("reason", "str?", "The operator's reason, or nil."),
            _f("queue", "str?", "The queue acted on, or nil (an action by ids)."),
            _f("job_ids", "strs", "The ids the action changed, in the record's order."),
        ),
    ),
    EventSpec(
        type_id=15,
        name="JobCancelled",
        version=1,
        meaning=(
            "An operator deleted a Ready or Scheduled job (cancel, purge): it is gone, "
            "no dead letter is kept."
        ),
        fields=(_JOB_ID, _f("attempt", "int", "The job's attempt number when cancelled.")),
    ),
    EventSpec(
        type_id=16,
        name="DeadLetterDeleted",
        version=1,
        meaning="An operator deleted a dead-letter record (nothing was handed out).",
        fields=(_JOB_ID,),
    ),
    EventSpec(
        type_id=17,
        name="QueuePaused",
        version=1,
        meaning="The queue delivers nothing until resumed (it still accepts enqueues).",
        fields=(_f("queue", "str", "The queue paused."),),
    ),
    EventSpec(
        type_id=18,
        name="QueueResumed",
        version=1,
        meaning="A paused queue delivers again.",
        fields=(_f("queue", "str", "The queue resumed."),),
    ),
    EventSpec(
        type_id=19,
        name="QueueDefined",
        version=1,
        meaning=(
            "An operator created or updated a queue at runtime: `overrides` replace its "
            "previous runtime overrides and win over the configuration file for this queue."
        ),
        fields=(
            _f("queue", "str", "The queue defined."),
            _f(
                "overrides",
                "map?",
                "Setting name -> value (scalar per-queue settings, dedup_window_ms "
                "excepted); nil or empty: the file's settings.",
            ),
        ),
    ),
    EventSpec(
        type_id=20,
        name="QueueDeleted",
        version=1,
        meaning=(
            "An operator deleted a runtime-defined queue: its runtime overrides are gone "
            "(an undeclared queue is forgotten once it holds nothing)."
        ),
        fields=(_f("queue", "str", "The queue deleted."),),
    ),
    EventSpec(
        type_id=21,
        name="ScheduleDefined",
        version=1,
        meaning="An operator (or the configuration) created or updated a schedule (issue 17).",
        fields=(
            _f("name", "str", "The schedule's name."),
            _f("queue", "str", "The queue its jobs go to."),
            _f("job_type", "str", "Its jobs' type."),
            _f("payload_data", "bytes?", "Its jobs' payload, or nil."),
            _f("payload_encoding", "str?", "The payload's encoding, or nil."),
            _f("priority", "int?", "Its jobs' priority; nil: the queue's default."),
            _f("max_attempts", "int?", "Its jobs' max attempts; nil: the queue's default."),
            _f("custom", "map?", "Its jobs' custom map (schedule keys added at firing)."),
            _f("cron", "str?", "A 5-field cron expression, or nil (then every_ms is set)."),
            _f("timezone", "str", "The IANA time-zone name the cron is read in."),
            _f(
                "zone",
                "ints",
                "The zone's UTC offsets: start_utc_ms, offset_ms pairs, starts increasing, "
                "the first -2^62 (resolved from the name at the edge).",
            ),
            _f("every_ms", "int?", "A fixed interval (ms), or nil (then cron is set)."),
            _f("catch_up", "str", "none, one or all: ticks missed while down."),
            _f("next_ms", "int", "The first tick not yet fired (the anchor)."),
            _f("created_at", "int", "When first defined (kept by updates)."),
        ),
    ),
    EventSpec(
        type_id=22,
        name="SchedulePaused",
        version=1,
        meaning="The schedule fires nothing until resumed.",
        fields=(_f("name", "str", "The schedule paused."),),
    ),
    EventSpec(
        type_id=23,
        name="ScheduleResumed",
        version=1,
        meaning="A paused schedule fires again from next_ms (its first tick after the resume).",
        fields=(
            _f("name", "str", "The schedule resumed."),
            _f("next_ms", "int", "Its next tick."),
        ),
    ),
    EventSpec(
        type_id=24,
        name="ScheduleDeleted",
        version=1,
        meaning="The schedule is gone (the jobs it fired stay).",
        fields=(_f("name", "str", "The schedule deleted."),),
    ),
    EventSpec(
        type_id=25,
        name="ScheduleAdvanced",
        version=1,
        meaning=(
            "A sweep handled a schedule's due ticks; the JobEnqueued of each fired tick "
            "precedes it in the same record."
        ),
        fields=(
            _f("name", "str", "The schedule."),
            _f("fired", "ints", "The ticks fired, in order."),
            _f("skipped", "int", "Ticks passed over (catch-up policy, full queue, key in use)."),
            _f("next_ms", "int", "Its next tick."),
        ),
    ),
    EventSpec(
        type_id=26,
        name="LeaderChanged",
        version=1,
        meaning=(
            "Cluster mode: a node became the leader; it appends this record (fenced) "
            "before serving. No job state changes."
        ),
        fields=(
            _f("epoch", "int", "The epoch it leads (the previous leader's + 1)."),
            _f("node_id", "str", "The new leader's node id."),
            _f("address", "str", "Where clients reach it (host:port)."),
        ),
    ),
)

EVENT_SPECS_BY_TYPE: Mapping[int, EventSpec] = MappingProxyType(
    {spec.type_id: spec for spec in CATALOGUE}
)
if len(EVENT_SPECS_BY_TYPE) != len(CATALOGUE):  # not assert: must hold under -O
    raise RuntimeError("duplicate event type id in the catalogue")

_MAP_VALUE_TYPES = (str, int, float, bool)


def _is_custom_map(value: Any) -> bool:
    return type(value) is dict and all(
        type(key) is str and type(item) in _MAP_VALUE_TYPES for key, item in value.items()
    )


# type name -> predicate. `type(v) is int` and not isinstance(v, int): a bool is an
# int subclass and msgpack keeps them apart, so the catalogue does too.
_CHECKS = {
    "str": lambda v: type(v) is str,
    "str?": lambda v: v is None or type(v) is str,
    "int": lambda v: type(v) is int,
    "int?": lambda v: v is None or type(v) is int,
    "bool": lambda v: type(v) is bool,
    "bytes?": lambda v: v is None or type(v) is bytes,
    "map?": lambda v: v is None or _is_custom_map(v),
    "strs": lambda v: type(v) in (list, tuple) and all(type(x) is str for x in v),
    "ints": lambda v: type(v) in (list, tuple) and all(type(x) is int for x in v),
}
FIELD_TYPES: tuple[str, ...] = tuple(_CHECKS)

for _spec in CATALOGUE:
    for _field in _spec.fields:
        if _field.type not in _CHECKS:
            raise RuntimeError(f"{_spec.name}.{_field.name}: unknown field type {_field.type!r}")


def validate_event(ev: Sequence[Any]) -> None:
    """Check one stored event `[type_id, version, field...]` against the catalogue.

    Raises FormatError with reason "event is not an array", "unknown event type id
    N", "<Name> version V is not supported (expected W)", "<Name> has N fields,
    expected M" or "<Name> field <name> is not <type>"."""
    if type(ev) not in (list, tuple) or len(ev) < 2:
        raise FormatError("event is not an array of at least 2 elements")
    type_id, version = ev[0], ev[1]
    spec = EVENT_SPECS_BY_TYPE.get(type_id) if type(type_id) is int else None
    if spec is None:
        raise FormatError(f"unknown event type id {type_id!r:.40}")
    if type(version) is not int or version != spec.version:
        raise FormatError(
            f"{spec.name} version {version!r:.40} is not supported (expected {spec.version})"
        )
    if len(ev) - 2 != len(spec.fields):
        raise FormatError(f"{spec.name} has {len(ev) - 2} fields, expected {len(spec.fields)}")
    for field, value in zip(spec.fields, ev[2:]):
        if not _CHECKS[field.type](value):
            raise FormatError(f"{spec.name} field {field.name} is not {field.type}")
