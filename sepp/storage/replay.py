"""Replay: apply logged command records to a state.

Owns: `replay_record` (one record body) and `replay_run` (the leading run of valid
records of a segment, through `log_format.ValidEnvelopes`) — the one replay path
that recovery, `sepp-log` and the tests all use, so there is a single replay
implementation to trust and to make fast.

Promises: either every event of a record is applied, or `ReplayError` is raised
(the body does not decode, an event is unknown or malformed, or an event
contradicts the state — a corrupt log or a bug); callers treat that as fatal for
the state they were building. `replay_run` stops quietly at the first record that
is not valid and leaves its classification to `log_format.scan_records`.

Must not import: asyncio, sockets.
"""

from __future__ import annotations

from typing import Any

from log_format import FormatError, ValidEnvelopes, decode_envelope
from sepp.core.apply import APPLY_TABLE, ApplyError
from sepp.core.events import EVENT_BY_TYPE, EventDecodeError, from_fields
from sepp.core.state import State

_new_tuple = tuple.__new__
# type id -> (class, stored length = 2 + number of fields); replay's per-event
# check, the same one `events.from_fields` makes.
_SHAPES: list[tuple[Any, int] | None] = [
    None if cls is None else (cls, len(cls._fields) + 2) for cls in EVENT_BY_TYPE
]


class ReplayError(ValueError):
    """A checksummed record that cannot be replayed."""


def _apply_events(state: State, events: list[Any]) -> int:
    table = APPLY_TABLE
    shapes = _SHAPES
    for fields in events:
        # Inline from_fields: a known type id (not a bool), its version, its arity.
        try:
            type_id = fields[0]
            shape = shapes[type_id] if type(type_id) is int and type_id >= 0 else None
        except (IndexError, TypeError, KeyError):
            shape = None
        if (
            shape is None
            or type(fields) is not list
            or fields[1] != shape[0].VERSION
            or len(fields) != shape[1]
        ):
            from_fields(fields)  # raises the precise EventDecodeError
            raise EventDecodeError(f"malformed event {fields!r:.80}")  # pragma: no cover
        table[type_id](state, _new_tuple(shape[0], fields[2:]))
    return len(events)


def _guarded(state: State, time_ms: int, events: list[Any]) -> int:
    try:
        if time_ms > state.clock_ms:
            state.clock_ms = time_ms
        return _apply_events(state, events)
    except (EventDecodeError, ApplyError) as exc:
        raise ReplayError(str(exc)) from exc
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        # A checksummed event whose fields have the wrong types (replay does not
        # type-check fields; `sepp-log verify` does, with the catalogue).
        raise ReplayError(f"event with malformed fields: {type(exc).__name__}: {exc}") from exc


def replay_record(state: State, body: bytes | memoryview) -> tuple[int, int]:
    """Apply one command record. Returns (time_ms of the record, events applied)."""
    try:
        envelope = decode_envelope(body)
    except FormatError as exc:
        raise ReplayError(str(exc)) from exc
    return envelope.time_ms, _guarded(state, envelope.time_ms, envelope.events)


class RunResult:
    """What `replay_run` did: records and events applied, the newest record time,
    and where it stopped (offset and seq of the first record not applied)."""

    __slots__ = ("events", "last_time_ms", "offset", "records", "seq")

    def __init__(self, offset: int, seq: int) -> None:
        self.records = 0
        self.events = 0
        self.last_time_ms = 0
        self.offset = offset
        self.seq = seq


def replay_run(state: State, buf: Any, *, start_offset: int, expected_seq: int) -> RunResult:
    """Apply every valid command record of `buf` from `start_offset` (whose first
    record must carry `expected_seq`) until the first one that is not valid.
    Raises ReplayError (with `.offset` / `.seq` of the record) if a valid record
    does not apply."""
    run = ValidEnvelopes(buf, start_offset=start_offset, expected_seq=expected_seq)
    result = RunResult(start_offset, expected_seq)
    records = events = 0
    last_time = 0
    # `_apply_events` inlined: this loop runs once per record of the whole log.
    table = APPLY_TABLE
    shapes = _SHAPES
    new = _new_tuple
    clock = state.clock_ms
    envelopes = iter(run)
    try:
        for envelope in envelopes:
            last_time = envelope[1]
            if last_time > clock:
                state.clock_ms = clock = last_time
            for fields in envelope[3]:
                type_id = fields[0]
                shape = shapes[type_id] if type(type_id) is int and type_id >= 0 else None
                if (
                    shape is None
                    or type(fields) is not list
                    or fields[1] != shape[0].VERSION
                    or len(fields) != shape[1]
                ):
                    from_fields(fields)  # raises the precise EventDecodeError
                    raise EventDecodeError(f"malformed event {fields!r:.80}")  # pragma: no cover
                table[type_id](state, new(shape[0], fields[2:]))
                events += 1
            records += 1
    except (
        EventDecodeError,
        ApplyError,
        TypeError,
        ValueError,
        KeyError,
        IndexError,
        AttributeError,
    ) as exc:
        envelopes.close()  # run.offset / run.seq: the record being applied
        error = ReplayError(f"record does not replay: {exc}")
        error.offset = run.offset  # type: ignore[attr-defined]
        error.seq = run.seq  # type: ignore[attr-defined]
        raise error from exc
    result.records = records
    result.events = events
    result.last_time_ms = last_time
    result.offset = run.offset
    result.seq = run.seq
    return result
