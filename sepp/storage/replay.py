"""Replay: apply logged command records to a state.

Owns: `replay_record` (one record body) and `replay_run` (the leading run of valid
records of a segment, through `log_format.ValidEnvelopes`) — the one replay path
that recovery, `sepp-log` and the tests all use, so there is a single replay
implementation to trust and to make fast — and `RunChecks`, the checks a caller
such as `sepp-log verify` can have `replay_run` make in the same pass (and
`check_run`, the same checks over records it does not replay).

Promises: either every event of a record is applied, or `ReplayError` is raised
(the body does not decode, an event is unknown or malformed, or an event
contradicts the state — a corrupt log or a bug); callers treat that as fatal for
the state they were building. `replay_run` stops quietly at the first record that
is not valid and leaves its classification to `log_format.scan_records`; with
`until_seq` it stops after that record, and with `RunChecks` it also stops (before
applying anything of it) at the first record that fails them, for the caller to
look at the slow way.

Must not import: asyncio, sockets.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from log_format import FormatError, ValidEnvelopes, decode_envelope
from sepp.core.apply import APPLY_TABLE, ApplyError
from sepp.core.events import EVENT_BY_TYPE, EventDecodeError, from_fields
from sepp.core.state import State
from sepp.storage.errors import ReplayError as ReplayError

_new_tuple = tuple.__new__
# type id -> (class, stored length = 2 + number of fields, version); replay's
# per-event check, the same one `events.from_fields` makes.
_SHAPES: list[tuple[Any, int, int] | None] = [
    None if cls is None else (cls, len(cls._fields) + 2, cls.VERSION) for cls in EVENT_BY_TYPE
]
# What a malformed checksummed event raises on its way through the apply loop.
_MALFORMED = (TypeError, ValueError, KeyError, IndexError, AttributeError)


def _reason(exc: Exception) -> str:
    """Why an event did not apply, as `replay_record` says it."""
    if isinstance(exc, EventDecodeError | ApplyError):
        return str(exc)
    # A checksummed event whose fields have the wrong types (replay does not
    # type-check fields; `sepp-log verify` does, with the catalogue).
    return f"event with malformed fields: {type(exc).__name__}: {exc}"


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
            or fields[1] != shape[2]
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
    except (EventDecodeError, ApplyError, *_MALFORMED) as exc:
        raise ReplayError(_reason(exc)) from exc


def replay_record(state: State, body: bytes | memoryview) -> tuple[int, int]:
    """Apply one command record. Returns (time_ms of the record, events applied)."""
    try:
        envelope = decode_envelope(body)
    except FormatError as exc:
        raise ReplayError(str(exc)) from exc
    return envelope.time_ms, _guarded(state, envelope.time_ms, envelope.events)


class RunResult:
    """What `replay_run` did: records and events applied, the newest record time,
    and where it stopped (offset and seq of the first record not applied). On a
    ReplayError (its `.result`): the records and events applied before the record
    that does not apply, and that record's offset and seq."""

    __slots__ = ("events", "last_time_ms", "offset", "records", "seq")

    def __init__(self, offset: int, seq: int) -> None:
        self.records = 0
        self.events = 0
        self.last_time_ms = 0
        self.offset = offset
        self.seq = seq


EventCheck = Callable[[list[Any]], bool]
# type id -> (class, version, the caller's check)
_Checked = tuple[Any, int, EventCheck]


class RunChecks:
    """Checks for `replay_run` (and `check_run`) to make on every record before
    applying it, in the same pass -- what `sepp-log verify` checks besides the
    replay:

    - `event_checks[type_id]`: a predicate over each stored event of that type
      (`[type_id, version, field...]`, whose type id and version replay already
      checked): false, or any exception, fails the record. A type without a
      predicate fails every record holding one;
    - record times: a record earlier than `last_time_ms` (the time of the record
      before the run; -1: none) fails. `last_time_ms` follows the run: after it,
      it is the time of the last record that passed.

    A record that fails stops the run before any of its events is applied; the
    run's `offset` / `seq` name it, for the caller to look at the slow way."""

    __slots__ = ("_table", "last_time_ms")

    def __init__(
        self, event_checks: Sequence[EventCheck | None], *, last_time_ms: int = -1
    ) -> None:
        table: list[_Checked | None] = []
        for type_id, shape in enumerate(_SHAPES):
            check = event_checks[type_id] if type_id < len(event_checks) else None
            table.append(None if shape is None or check is None else (shape[0], shape[2], check))
        self._table = table
        self.last_time_ms = last_time_ms


def _record_error(exc: Exception, run: ValidEnvelopes, result: RunResult) -> ReplayError:
    """The ReplayError for the record being applied when `exc` was raised: its
    `offset` / `seq`, `reason` (what `replay_record` would say) and `result` (the
    records applied before it)."""
    error = ReplayError(f"record does not replay: {exc}")
    error.offset = result.offset = run.offset  # type: ignore[attr-defined]
    error.seq = result.seq = run.seq  # type: ignore[attr-defined]
    error.reason = _reason(exc)  # type: ignore[attr-defined]
    error.result = result  # type: ignore[attr-defined]
    return error


def replay_run(
    state: State,
    buf: Any,
    *,
    start_offset: int,
    expected_seq: int,
    until_seq: int | None = None,
    checks: RunChecks | None = None,
) -> RunResult:
    """Apply every valid command record of `buf` from `start_offset` (whose first
    record must carry `expected_seq`) until the first one that is not valid, or
    that is past `until_seq`, or (with `checks`) that fails them.
    Raises ReplayError (with `.offset` / `.seq` of the record, `.reason` as
    `replay_record` words it and `.result`, the records applied before it) if a
    valid record does not apply."""
    run = ValidEnvelopes(
        buf, start_offset=start_offset, expected_seq=expected_seq, until_seq=until_seq
    )
    result = RunResult(start_offset, expected_seq)
    if checks is not None:
        return _checked_run(state, run, result, checks)
    records = events = 0
    last_time = 0
    # `_apply_events` inlined: this loop runs once per record of the whole log.
    table = APPLY_TABLE
    shapes = _SHAPES
    known = len(shapes)  # a type id past the table is unknown (from_fields says so)
    new = _new_tuple
    clock = state.clock_ms
    envelopes = iter(run)
    try:
        for envelope in envelopes:
            last_time = envelope[1]
            if last_time > clock:
                state.clock_ms = clock = last_time
            batch = envelope[3]
            for fields in batch:
                type_id = fields[0]
                shape = shapes[type_id] if type(type_id) is int and 0 <= type_id < known else None
                if (
                    shape is None
                    or type(fields) is not list
                    or fields[1] != shape[2]
                    or len(fields) != shape[1]
                ):
                    from_fields(fields)  # raises the precise EventDecodeError
                    raise EventDecodeError(f"malformed event {fields!r:.80}")  # pragma: no cover
                table[type_id](state, new(shape[0], fields[2:]))
            events += len(batch)
            records += 1
    except (EventDecodeError, ApplyError, *_MALFORMED) as exc:
        envelopes.close()  # run.offset / run.seq: the record being applied
        result.records, result.events, result.last_time_ms = records, events, last_time
        raise _record_error(exc, run, result) from exc
    result.records = records
    result.events = events
    result.last_time_ms = last_time
    result.offset = run.offset
    result.seq = run.seq
    return result


def _checked_run(
    state: State, run: ValidEnvelopes, result: RunResult, checks: RunChecks
) -> RunResult:
    """`replay_run` with `checks`: every event of a record is checked, and the
    record's time, before any of it is applied."""
    records = events = 0
    table = APPLY_TABLE
    checked = checks._table
    new = _new_tuple
    clock = state.clock_ms
    before = checks.last_time_ms  # the time of the last record that passed
    envelopes = iter(run)
    try:
        for envelope in envelopes:
            time_ms = envelope[1]
            batch = envelope[3]
            if time_ms < before:
                break
            if len(batch) == 1:
                # One event a record (the common case): check it, then apply it.
                fields = batch[0]
                try:
                    type_id = fields[0]
                    entry = checked[type_id] if type(type_id) is int and type_id >= 0 else None
                    if (
                        entry is None
                        or type(fields) is not list
                        or fields[1] != entry[1]
                        or not entry[2](fields)
                    ):
                        break
                except Exception:
                    break
                before = time_ms
                if time_ms > clock:
                    state.clock_ms = clock = time_ms
                table[type_id](state, new(entry[0], fields[2:]))
                events += 1
                records += 1
                continue
            failed = False
            try:
                for fields in batch:
                    type_id = fields[0]
                    entry = checked[type_id] if type(type_id) is int and type_id >= 0 else None
                    if (
                        entry is None
                        or type(fields) is not list
                        or fields[1] != entry[1]
                        or not entry[2](fields)
                    ):
                        failed = True
                        break
            except Exception:
                failed = True
            if failed:
                break  # this event failed: the caller looks at the record
            before = time_ms
            if time_ms > clock:
                state.clock_ms = clock = time_ms
            for fields in batch:
                type_id = fields[0]
                table[type_id](state, new(checked[type_id][0], fields[2:]))
            events += len(batch)
            records += 1
    except (ApplyError, *_MALFORMED) as exc:
        envelopes.close()  # run.offset / run.seq: the record being applied
        checks.last_time_ms = before
        result.records, result.events, result.last_time_ms = records, events, before
        raise _record_error(exc, run, result) from exc
    # After a break, the record that failed a check; else (a no-op) where the run ended.
    envelopes.close()
    checks.last_time_ms = before
    result.records = records
    result.events = events
    result.last_time_ms = before
    result.offset = run.offset
    result.seq = run.seq
    return result


def check_run(
    buf: Any,
    *,
    start_offset: int,
    expected_seq: int,
    until_seq: int | None = None,
    checks: RunChecks,
) -> RunResult:
    """`replay_run` with `checks`, without a state: the leading run of valid
    records that pass the checks (for the records a caller reads but does not
    replay, e.g. those a snapshot already holds). Never raises on a record."""
    run = ValidEnvelopes(
        buf, start_offset=start_offset, expected_seq=expected_seq, until_seq=until_seq
    )
    result = RunResult(start_offset, expected_seq)
    records = events = 0
    checked = checks._table
    before = checks.last_time_ms
    envelopes = iter(run)
    for envelope in envelopes:
        time_ms = envelope[1]
        batch = envelope[3]
        if time_ms < before:
            break
        failed = False
        try:
            for fields in batch:
                type_id = fields[0]
                entry = checked[type_id] if type(type_id) is int and type_id >= 0 else None
                if (
                    entry is None
                    or type(fields) is not list
                    or fields[1] != entry[1]
                    or not entry[2](fields)
                ):
                    failed = True
                    break
        except Exception:
            failed = True
        if failed:
            break
        before = time_ms
        events += len(batch)
        records += 1
    envelopes.close()
    checks.last_time_ms = before
    result.records = records
    result.events = events
    result.last_time_ms = before
    result.offset = run.offset
    result.seq = run.seq
    return result
