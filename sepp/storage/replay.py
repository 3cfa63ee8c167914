"""Replay: apply the events of a logged command record to a state.

Owns: `replay_record`, the one function that turns a record body back into state
changes; recovery, `sepp-log` and the tests all replay through it, so there is a
single replay path to trust and to make fast.

Promises: either every event of the record is applied, or `ReplayError` is raised
(the body does not decode, an event is unknown, or an event contradicts the state
— a corrupt log or a bug); callers treat that as fatal for the state they were
building.

Must not import: asyncio, sockets.
"""

from __future__ import annotations

from log_format import FormatError, decode_envelope
from sepp.core.apply import APPLY_TABLE, ApplyError
from sepp.core.events import EventDecodeError, from_fields
from sepp.core.state import State


class ReplayError(ValueError):
    """A checksummed record that cannot be replayed."""


def replay_record(state: State, body: bytes | memoryview) -> tuple[int, int]:
    """Apply one command record. Returns (time_ms of the record, events applied)."""
    try:
        envelope = decode_envelope(body)
        time_ms = envelope.time_ms
        if time_ms > state.clock_ms:
            state.clock_ms = time_ms
        table = APPLY_TABLE
        events = envelope.events
        for fields in events:
            event = from_fields(fields)
            table[event.TYPE](state, event)  # type: ignore[misc]
    except (FormatError, EventDecodeError, ApplyError) as exc:
        raise ReplayError(str(exc)) from exc
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        # A checksummed event whose fields have the wrong types (replay does not
        # type-check fields; `sepp-log verify` does, with the catalogue).
        raise ReplayError(f"event with malformed fields: {type(exc).__name__}: {exc}") from exc
    return time_ms, len(events)
