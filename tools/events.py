"""Events as the tools show them: names and fields from the format's catalogue,
human and JSON renderings, and the small index from job id to queue that filters
by queue without holding the whole state.

Owns: `human_fields`, `json_fields`, `parse_types`, `JobQueues`; `event_name`,
`event_fields` and `job_id_of` are sepp.storage.events_view's (the server's job
timeline decodes events with the same functions).

Promises: names come from `log_format`'s catalogue (FORMAT.md section 7), so the
tools show exactly what the format documents; an event the catalogue does not know
is shown raw, never dropped. Times (`*_at` fields) are printed as ISO-8601 UTC in
human output and kept as integer milliseconds in JSON; bytes are printed as their
length in human output and as base64 in JSON.

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

from log_format import CATALOGUE, EVENT_SPECS_BY_TYPE
from sepp.core.events import CAUSE_NAMES
from sepp.core.state import State
from sepp.storage.events_view import event_fields, event_name, job_id_of
from sepp.storage.events_view import spec_fits as _spec_fits

from .output import UsageError, format_time_ms

__all__ = [
    "DEAD_LETTER_CAUSES",
    "JobQueues",
    "event_fields",
    "event_name",
    "human_fields",
    "job_id_of",
    "json_fields",
    "parse_types",
]

DEAD_LETTER_CAUSES = CAUSE_NAMES

# Type ids of the events that touch one job's life (all but DedupExpired carry a
# job_id as their first field).
_ENQUEUED = 1
_ACKED = 3
_DEAD_LETTERED = 8
_DRAINED = 9
_DEAD_LETTER_EXPIRED = 10
_DEDUP_EXPIRED = 11
# Admin events (issue 15): the AdminAction header names a queue (or none) and
# several job ids; QueuePaused / QueueResumed name a queue; JobCancelled and
# DeadLetterDeleted end a job.
_ADMIN_ACTION = 14
_CANCELLED = 15
_DEAD_LETTER_DELETED = 16
_QUEUE_PAUSED = 17
_QUEUE_RESUMED = 18
_QUEUE_DEFINED = 19
_QUEUE_DELETED = 20
# Events about a queue (their first field is its name), not one job.
_QUEUE_EVENTS = (_DEDUP_EXPIRED, _QUEUE_PAUSED, _QUEUE_RESUMED, _QUEUE_DEFINED, _QUEUE_DELETED)
# Events whose first field is not a job id: sepp.storage.events_view's
# NOT_ABOUT_ONE_JOB (job_id_of); _QUEUE_EVENTS and the AdminAction header.


def _human_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and name.endswith("_at"):
        return format_time_ms(value)
    if name == "cause" and isinstance(value, int):
        return DEAD_LETTER_CAUSES.get(value, str(value))
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, str):
        if value and value.isprintable() and not any(c in value for c in ' "='):
            return value
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict | list):
        return json.dumps(_jsonable(value), ensure_ascii=False, separators=(",", ":"))
    return str(value)


def human_fields(event: list[Any]) -> str:
    """`job_id=... attempt=1 lease_expires_at=2023-11-14T22:14:15.000Z worker_id=w1`:
    the fields that hold a value (nil fields are left out)."""
    return " ".join(
        f"{name}={_human_value(name, value)}"
        for name, value in event_fields(event).items()
        if value is not None
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def json_fields(event: list[Any]) -> dict[str, Any]:
    """The fields, JSON-ready: bytes as base64, times as integer milliseconds."""
    out: dict[str, Any] = _jsonable(event_fields(event))
    return out


def parse_types(text: str) -> frozenset[int]:
    """Event type ids from `JobAcked,JobNacked` (names are case-insensitive; ids are
    accepted too). UsageError for an unknown name."""
    by_name = {spec.name.lower(): spec.type_id for spec in CATALOGUE}
    ids = set()
    for part in text.split(","):
        word = part.strip().lower()
        if not word:
            continue
        if word.isdigit() and int(word) in EVENT_SPECS_BY_TYPE:
            ids.add(int(word))
        elif word in by_name:
            ids.add(by_name[word])
        else:
            known = ", ".join(spec.name for spec in CATALOGUE)
            raise UsageError(f"unknown event type {part.strip()!r} (one of: {known})")
    if not ids:
        raise UsageError("--type needs at least one event type")
    return frozenset(ids)


class JobQueues:
    """job id -> queue, for the jobs that still exist (live or dead-lettered), so
    events that carry only a job id can be filtered by queue.

    Memory grows with the number of jobs alive at once, not with the log: a job is
    forgotten when it is acked, drained, expires from the dead letters or is dropped
    when dead-lettered. A job that was alive before the first record read (the log
    starts after seq 1) is known only if `seed` was given the state it started from."""

    def __init__(self) -> None:
        self._queues: dict[str, str] = {}
        self.unknown_jobs = 0

    def seed(self, state: State) -> None:
        for job in state.jobs.values():
            self._queues[job.job_id] = job.queue
        for record in state.dead.values():
            self._queues[record.job.job_id] = record.job.queue

    def queue_of(self, event: list[Any]) -> str | None:
        """The queue an event concerns, as it was before the event."""
        if event[0] == _ENQUEUED and _spec_fits(event):
            return str(event[3])
        if event[0] in _QUEUE_EVENTS and _spec_fits(event):
            return str(event[2])
        if event[0] == _ADMIN_ACTION and _spec_fits(event):
            return None if event[6] is None else str(event[6])
        job_id = job_id_of(event)
        if job_id is None:
            return None
        queue = self._queues.get(job_id)
        if queue is None:
            self.unknown_jobs += 1
        return queue

    def update(self, events: Iterable[list[Any]]) -> None:
        queues = self._queues
        for event in events:
            type_id = event[0]
            if type_id == _ENQUEUED and _spec_fits(event):
                queues[event[2]] = event[3]
            elif type_id in (
                _ACKED,
                _DRAINED,
                _DEAD_LETTER_EXPIRED,
                _CANCELLED,
                _DEAD_LETTER_DELETED,
            ):
                job_id = job_id_of(event)
                if job_id is not None:
                    queues.pop(job_id, None)
            elif type_id == _DEAD_LETTERED and _spec_fits(event) and event[7] is False:
                queues.pop(event[2], None)  # dropped on the spot (retention 0)

    def __len__(self) -> int:
        return len(self._queues)
