"""Log events by the format's catalogue: a name, the fields by name, the job.

Owns: `event_name`, `event_fields`, `job_id_of`, `spec_fits`: the one decoding of an event's
list form (FORMAT.md section 7) shared by the offline tools (`sepp-log dump` and
`sepp-log audit`, tools/events.py) and the server's job timeline
(sepp/server/job_timeline.py, the web console's job page).

Promises: names come from `log_format`'s catalogue, so both readers show exactly
what the format documents; an event the catalogue does not describe (unknown
type, other version or arity) is shown raw, never dropped, never an exception.

Must not import: asyncio, sepp.server, sepp.admin, tools.
"""

from __future__ import annotations

from typing import Any

from log_format import EVENT_SPECS_BY_TYPE

__all__ = ["NOT_ABOUT_ONE_JOB", "event_fields", "event_name", "job_id_of", "spec_fits"]

# Events whose first field is not a job id: DedupExpired (11), the AdminAction
# header (14: a queue and several job ids), QueuePaused / QueueResumed (17, 18),
# QueueDefined / QueueDeleted (19, 20).
NOT_ABOUT_ONE_JOB = frozenset((11, 14, 17, 18, 19, 20))


def spec_fits(event: list[Any]) -> bool:
    """Whether the catalogue describes `event` (its type, version and arity)."""
    spec = EVENT_SPECS_BY_TYPE.get(event[0]) if type(event[0]) is int else None
    return spec is not None and event[1] == spec.version and len(event) - 2 == len(spec.fields)


def event_name(event: list[Any]) -> str:
    """`JobEnqueued`, or `event type <id>` for a type the catalogue does not know."""
    spec = EVENT_SPECS_BY_TYPE.get(event[0]) if type(event[0]) is int else None
    return spec.name if spec is not None else f"event type {event[0]!r:.20}"


def event_fields(event: list[Any]) -> dict[str, Any]:
    """The fields by catalogue name; `{"version", "raw": [...]}` for an event the
    catalogue does not describe (unknown type, other version or arity)."""
    if not spec_fits(event):
        return {"version": event[1], "raw": event[2:]}
    spec = EVENT_SPECS_BY_TYPE[event[0]]
    return {f.name: value for f, value in zip(spec.fields, event[2:], strict=False)}


def job_id_of(event: list[Any]) -> str | None:
    """The job an event is about (its first field), or None."""
    if event[0] in NOT_ABOUT_ONE_JOB or len(event) < 3 or type(event[2]) is not str:
        return None
    return event[2]
