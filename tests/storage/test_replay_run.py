"""`replay_run`'s stops besides the first invalid record: `until_seq`, a record that
does not apply (what the ReplayError says), and `RunChecks` (a record that fails
them is not applied at all); `check_run`, the same checks without a state. Every
stop is compared with `replay_record` applied record by record."""

from __future__ import annotations

from typing import Any

import pytest

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    RECORD_KIND_COMMAND,
    encode_envelope,
    encode_record,
    encode_segment_header,
)
from sepp.core import State
from sepp.core.events import JobAcked, JobEnqueued, JobReserved, to_fields
from sepp.storage.replay import (
    ReplayError,
    RunChecks,
    check_run,
    replay_record,
    replay_run,
)
from tests.storage.helpers import numbered_id

T0 = 1_700_000_000_000


def enqueued(n: int) -> list[Any]:
    return to_fields(
        JobEnqueued(
            numbered_id(n), "q", "t", b"p", None, 4, 3, T0, None, None, None, None, None, None, None
        )
    )


def reserved(n: int) -> list[Any]:
    return to_fields(JobReserved(numbered_id(n), 1, T0 + 30_000, "w"))


def acked(n: int) -> list[Any]:
    return to_fields(JobAcked(numbered_id(n), 1, "w"))


def segment(records: list[tuple[int, list[list[Any]]]]) -> tuple[bytes, list[int], list[bytes]]:
    """A segment from seq 1 of records (time, events); its bytes, the offset of
    every record (and the end), and the bodies."""
    parts, offsets, bodies = [encode_segment_header(1)], [], []
    pos = FILE_HEADER_BYTES
    for seq, (time_ms, events) in enumerate(records, start=1):
        body = encode_envelope(time_ms, 1, events)
        offsets.append(pos)
        bodies.append(body)
        parts.append(encode_record(seq, RECORD_KIND_COMMAND, body))
        pos += RECORD_HEADER_BYTES + len(body)
    offsets.append(pos)
    return b"".join(parts), offsets, bodies


HISTORY = [
    (T0 + 1, [enqueued(1)]),
    (T0 + 2, [enqueued(2), enqueued(3)]),
    (T0 + 3, [reserved(1)]),
    (T0 + 3, [acked(1), reserved(2)]),
    (T0 + 9, [enqueued(4)]),
]


def slow(bodies: list[bytes], upto: int) -> State:
    state = State()
    for body in bodies[:upto]:
        replay_record(state, body)
    return state


def always(event: list[Any]) -> bool:
    return True


ACCEPT_ALL = [always] * 13


@pytest.mark.parametrize("until", [0, 1, 2, 4, 5, 9, None])
def test_until_seq_stops_after_that_record(until: int | None) -> None:
    data, offsets, bodies = segment(HISTORY)
    state = State()
    run = replay_run(state, data, start_offset=FILE_HEADER_BYTES, expected_seq=1, until_seq=until)
    done = min(until if until is not None else 99, len(HISTORY))
    assert (run.records, run.seq, run.offset) == (done, done + 1, offsets[done])
    assert run.events == sum(len(events) for _, events in HISTORY[:done])
    assert state.canonical() == slow(bodies, done).canonical()


@pytest.mark.parametrize("checks", [None, RunChecks(ACCEPT_ALL)])
def test_a_record_that_does_not_apply_is_named_as_replay_record_names_it(
    checks: RunChecks | None,
) -> None:
    history = [*HISTORY[:3], (T0 + 4, [acked(9)]), *HISTORY[3:]]
    data, offsets, bodies = segment(history)
    with pytest.raises(ReplayError) as info:
        replay_run(State(), data, start_offset=FILE_HEADER_BYTES, expected_seq=1, checks=checks)
    error: Any = info.value
    assert (error.offset, error.seq) == (offsets[3], 4)
    with pytest.raises(ReplayError) as reference:
        replay_record(slow(bodies, 3), bodies[3])
    assert error.reason == str(reference.value)
    assert str(error) == f"record does not replay: {reference.value}"
    assert (error.result.records, error.result.events) == (3, 4)


def test_a_record_that_fails_a_check_is_not_applied_at_all() -> None:
    data, offsets, bodies = segment(HISTORY)
    no_acks = list(ACCEPT_ALL)
    no_acks[3] = lambda event: False  # JobAcked: record 4 holds one, after a JobReserved
    checks = RunChecks(no_acks)
    state = State()
    run = replay_run(state, data, start_offset=FILE_HEADER_BYTES, expected_seq=1, checks=checks)
    assert (run.records, run.events, run.seq, run.offset) == (3, 4, 4, offsets[3])
    assert state.canonical() == slow(bodies, 3).canonical()
    assert checks.last_time_ms == T0 + 3
    # A check that raises fails the record too; so does a type without a check.
    for broken in ([*ACCEPT_ALL[:3], lambda event: event[99], *ACCEPT_ALL[4:]], ACCEPT_ALL[:3]):
        state = State()
        run = replay_run(
            state, data, start_offset=FILE_HEADER_BYTES, expected_seq=1, checks=RunChecks(broken)
        )
        assert (run.records, run.seq) == (3, 4)
        assert state.canonical() == slow(bodies, 3).canonical()


def test_a_record_earlier_than_the_one_before_stops_the_run() -> None:
    history = [*HISTORY[:2], (T0 + 1, [reserved(1)]), *HISTORY[3:]]
    data, offsets, bodies = segment(history)
    checks = RunChecks(ACCEPT_ALL)
    state = State()
    run = replay_run(state, data, start_offset=FILE_HEADER_BYTES, expected_seq=1, checks=checks)
    assert (run.records, run.seq, run.offset, run.last_time_ms) == (2, 3, offsets[2], T0 + 2)
    assert checks.last_time_ms == T0 + 2
    # The caller takes that record the slow way and goes on from the next one.
    replay_record(state, bodies[2])
    checks.last_time_ms = T0 + 1
    run = replay_run(
        state, data, start_offset=offsets[3], expected_seq=4, checks=checks, until_seq=4
    )
    assert (run.records, run.seq, checks.last_time_ms) == (1, 5, T0 + 3)
    assert state.canonical() == slow(bodies, 4).canonical()
    # The time of the record before the run counts too.
    run = replay_run(
        State(),
        data,
        start_offset=FILE_HEADER_BYTES,
        expected_seq=1,
        checks=RunChecks(ACCEPT_ALL, last_time_ms=T0 + 2),
    )
    assert run.records == 0


def test_check_run_stops_where_replay_run_stops_without_a_state() -> None:
    history = [*HISTORY[:3], (T0 + 2, [acked(1)]), *HISTORY[4:]]
    data, offsets, _bodies = segment(history)
    checks = RunChecks(ACCEPT_ALL)
    run = check_run(data, start_offset=FILE_HEADER_BYTES, expected_seq=1, checks=checks)
    assert (run.records, run.events, run.seq, run.offset) == (3, 4, 4, offsets[3])
    assert checks.last_time_ms == T0 + 3
    run = check_run(
        data, start_offset=offsets[4], expected_seq=5, checks=RunChecks(ACCEPT_ALL), until_seq=4
    )
    assert (run.records, run.seq) == (0, 5)
    no_enqueues = list(ACCEPT_ALL)
    no_enqueues[1] = lambda event: False
    run = check_run(
        data, start_offset=FILE_HEADER_BYTES, expected_seq=1, checks=RunChecks(no_enqueues)
    )
    assert (run.records, run.seq, run.offset) == (0, 1, FILE_HEADER_BYTES)
