"""The log's admin records (the audit trail): recognising and decoding one.

Owns: `AdminRecord` (one operator action: its record's seq and time, the action,
actor, role, reason, queue, the ids it affected, and the changes its record made),
`admin_record` (an envelope's AdminAction header decoded, or None) and
`command_kind_of` (a record body's command kind read from its first bytes, without
decoding the envelope).

Promises: one decoding for both readers of the audit trail, `sepp-log audit
--admin` (tools/audit.py) and the admin API's `GET /audit` (sepp/admin/audit.py).
A record is an admin action when its first event is an AdminAction header of the
catalogue's version and arity (FORMAT.md section 7); anything else -- an event
the catalogue does not describe included -- is None, never an exception.

Must not import: asyncio, sepp.server, sepp.admin, tools.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

from log_format import EVENT_SPECS_BY_TYPE, Envelope
from sepp.core.events import AdminAction

__all__ = ["ADMIN_COMMAND_KINDS", "AdminRecord", "admin_record", "command_kind_of"]

# Command kinds whose records may carry an AdminAction header: 12 (admin), and 9 / 10
# (dead_letter_jobs / requeue_dead_letters), which admin records borrowed before
# kind 12 existed (FORMAT.md, command kinds).
ADMIN_COMMAND_KINDS = frozenset((9, 10, 12))

_ADMIN_ACTION = AdminAction.TYPE
_ADMIN_SPEC = EVENT_SPECS_BY_TYPE[_ADMIN_ACTION]
# Bytes a msgpack unsigned integer takes after its type byte (0xcc..0xcf).
_UINT_BYTES = {0xCC: 1, 0xCD: 2, 0xCE: 4, 0xCF: 8}


class AdminRecord(NamedTuple):
    """One operator action: the AdminAction header of an admin record and what the
    record changed (event name -> count of the events after the header)."""

    seq: int
    time_ms: int
    action: str
    actor: str
    role: str
    reason: str | None
    queue: str | None
    job_ids: tuple[str, ...]
    changes: dict[str, int]


def command_kind_of(body: bytes | memoryview) -> int | None:
    """The command kind of an envelope (FORMAT.md section 6: `[version, time_ms,
    command_kind, ...]`) read from its first bytes, or None when they are not laid
    out as sepp writes them (the caller then decodes the envelope to know). A
    filter, not a check: the envelope is decoded before anything is believed."""
    if len(body) < 4 or body[0] not in (0x94, 0x95) or body[1] not in (1, 2):
        return None
    tag = body[2]
    pos = 3 if tag < 0x80 else 3 + _UINT_BYTES.get(tag, 64)
    if pos >= len(body):
        return None
    kind = body[pos]
    return kind if kind < 0x80 else None


def admin_record(seq: int, envelope: Envelope) -> AdminRecord | None:
    """The operator action of record `seq`, or None when its first event is not an
    AdminAction header the catalogue describes."""
    events = envelope.events
    if not events:
        return None
    header: list[Any] = events[0]
    if (
        header[0] != _ADMIN_ACTION
        or header[1] != _ADMIN_SPEC.version
        or len(header) - 2 != len(_ADMIN_SPEC.fields)
    ):
        return None
    action, actor, role, reason, queue, job_ids = header[2:]
    return AdminRecord(
        seq=seq,
        time_ms=envelope.time_ms,
        action=str(action),
        actor=str(actor),
        role=str(role),
        reason=reason,
        queue=queue,
        job_ids=tuple(job_ids),
        changes=dict(Counter(_event_name(event) for event in events[1:])),
    )


def _event_name(event: list[Any]) -> str:
    spec = EVENT_SPECS_BY_TYPE.get(event[0]) if type(event[0]) is int else None
    return spec.name if spec is not None else f"event type {event[0]!r:.20}"
