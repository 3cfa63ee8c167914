"""`verify` and `replay` read the log through the replay fast path
(`LogWalker(spans=True)`, `replay_run`, `check_run`); every record it does not take
goes the slow way, which makes the reports. Both must come to exactly what the
slow way alone (`fast_path=False`, the tools as they were) comes to: the same
problems in the same order, counters, verdicts and state -- on clean logs and on
logs damaged at random in every way the reports distinguish.

Also: the compiled catalogue checks agree with `validate_event`.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from log_format import (
    CATALOGUE,
    RECORD_HEADER_BYTES,
    FormatError,
    decode_envelope,
    validate_event,
)
from tests.storage.helpers import numbered_id
from tests.tools.helpers import (
    LiveLog,
    flip_bit,
    random_log,
    records_of,
    reencode,
    replace_record,
    scripted_log,
    segment_paths,
    splice,
)
from tools.datadir import open_data_dir
from tools.replay import ReplayResult, replay_to
from tools.verify import VerifyReport, compile_event_check, verify

# ---------------------------------------------------------------- the catalogue check

_VALUES: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    2**64 - 1,
    1.5,
    "",
    "text",
    b"",
    b"bytes",
    {},
    {"k": "v", "n": 1, "f": 0.5, "b": True},
    {"k": [1]},
    {1: "x"},
    {"k": None},
    [1],
    [],
    ["a", "b"],
]


def _accepted(event: list[Any]) -> bool:
    try:
        validate_event(event)
    except FormatError:
        return False
    return True


def _checked(check: Any, event: list[Any]) -> bool:
    try:
        return bool(check(event))
    except ValueError:  # wrong arity
        return False


@pytest.mark.parametrize("spec", CATALOGUE, ids=lambda spec: spec.name)
def test_each_field_type_is_checked_as_validate_event_checks_it(spec: Any) -> None:
    check = compile_event_check(spec)
    good = [spec.type_id, spec.version, *(_sample(f.type) for f in spec.fields)]
    assert _accepted(good) and check(good)
    for index in range(len(spec.fields)):
        for value in _VALUES:
            event = list(good)
            event[2 + index] = value
            assert _checked(check, event) == _accepted(event), (spec.name, index, value)
    for version in (spec.version + 1, True, float(spec.version), None):
        event = [spec.type_id, version, *good[2:]]
        assert _checked(check, event) == _accepted(event), version
    assert not _checked(check, good[:-1]) and not _checked(check, [*good, None])


def _sample(field_type: str) -> Any:
    return {
        "str": "s",
        "str?": None,
        "int": 7,
        "int?": 8,
        "bool": False,
        "bytes?": b"x",
        "map?": {"a": 1},
        "strs": ["a", "b"],
        "ints": [1, 2],
    }[field_type]


@given(st.data())
def test_compiled_checks_agree_with_validate_event(data: st.DataObject) -> None:
    spec = data.draw(st.sampled_from(CATALOGUE))
    fields = data.draw(
        st.lists(st.sampled_from(_VALUES), min_size=len(spec.fields), max_size=len(spec.fields))
    )
    event = [spec.type_id, spec.version, *fields]
    assert _checked(compile_event_check(spec), event) == _accepted(event)


# ---------------------------------------------------------------- fast == slow


def _verify_both(data_dir: Path) -> VerifyReport:
    fast = verify(open_data_dir(str(data_dir)))
    slow = verify(open_data_dir(str(data_dir)), fast_path=False, chunk_bytes=4096)
    assert fast.problems == slow.problems
    assert fast.snapshots == slow.snapshots
    for name in (
        "segments",
        "log_bytes",
        "records",
        "events",
        "first_seq",
        "last_seq",
        "first_time_ms",
        "last_time_ms",
        "replay_from",
        "replay_from_snapshot",
        "replayed_to",
        "replay_stopped",
    ):
        assert getattr(fast, name) == getattr(slow, name), name
    return fast


def _replay_both(data_dir: Path, until_seq: int | None) -> ReplayResult:
    fast = replay_to(open_data_dir(str(data_dir)), until_seq=until_seq)
    slow = replay_to(open_data_dir(str(data_dir)), until_seq=until_seq, fast_path=False)
    assert fast.problems == slow.problems
    assert (fast.seq, fast.time_ms, fast.records, fast.events) == (
        slow.seq,
        slow.time_ms,
        slow.records,
        slow.events,
    )
    assert fast.base_seq == slow.base_seq and fast.base_snapshot == slow.base_snapshot
    assert fast.pieces == slow.pieces
    assert (fast.state is None) == (slow.state is None)
    if fast.state is not None and slow.state is not None:
        assert _canonical(fast.state) == _canonical(slow.state)
    return fast


def _canonical(state: Any) -> Any:
    try:
        return state.canonical()
    except TypeError:  # a field changed to another type went in (replay does not check)
        return sorted(map(repr, state.jobs.items()))


def test_clean_logs_come_to_the_same_reports(tmp_path: Path, rng: random.Random) -> None:
    scripted = scripted_log(tmp_path / "scripted", snapshot_at=(10, 26))
    scripted.close()
    mixed = random_log(tmp_path / "mixed", rng, commands=300, snapshot_every=70)
    mixed.close()
    for live in (scripted, mixed):
        report = _verify_both(live.data_dir)
        assert report.ok and report.replayed_to == live.last_seq
        for until in (None, live.last_seq):
            assert _replay_both(live.data_dir, until).ok
        _replay_both(live.data_dir, rng.randrange(1, live.last_seq + 1))


def _damage(live: LiveLog, rng: random.Random) -> str:
    """One random change to the log, of a kind some report tells apart."""
    data_dir = live.data_dir
    seq = rng.randrange(1, live.last_seq + 1)
    try:
        path, record = next(
            (p, r) for p in segment_paths(data_dir) for r in records_of(p) if r.seq == seq
        )
    except StopIteration:
        return "nothing (record gone)"
    try:
        envelope = decode_envelope(record.body)
    except FormatError:
        return f"nothing ({seq} does not decode already)"
    events = [list(e) if type(e) is list else e for e in envelope.events]
    choice = rng.randrange(14)
    if choice == 0:
        flip_bit(path, record.offset + rng.randrange(RECORD_HEADER_BYTES + len(record.body)))
        return f"flip a bit of {seq}"
    if choice == 1:
        data = path.read_bytes()
        path.write_bytes(data[: rng.randrange(record.offset, len(data))])
        return f"truncate {path.name} in or after {seq}"
    if choice == 2:
        splice(path, record.offset, record.offset + RECORD_HEADER_BYTES + len(record.body))
        return f"cut {seq} out"
    if choice == 3:
        end = record.offset + RECORD_HEADER_BYTES + len(record.body)
        splice(path, end, end, path.read_bytes()[record.offset : end])
        return f"duplicate {seq}"
    if choice == 4:
        replace_record(data_dir, seq, b"\xc1")
        return f"{seq} does not decode"
    if choice == 5:
        reencode(data_dir, seq, time_ms=envelope.time_ms - rng.choice((1, 10_000)))
        return f"{seq} goes back in time"
    if choice == 6:
        reencode(data_dir, seq, time_ms=envelope.time_ms + rng.choice((1, 10**6)))
        return f"{seq} jumps ahead in time"
    if choice == 7:
        event = events[rng.randrange(len(events))] if events else [7, 1, "x"]
        if len(event) > 2:
            event[rng.randrange(2, len(event))] = rng.choice(_VALUES)
        reencode(data_dir, seq, events=events or [event])
        return f"a field of {seq} changed"
    if choice == 8:
        reencode(data_dir, seq, events=[*events, [3, 1, numbered_id(10**6), 1, None]])
        return f"{seq} acks a job that does not exist"
    if choice == 9:
        reencode(data_dir, seq, events=[])
        return f"{seq} holds no events"
    if choice == 10:
        enqueues = [e for e in events if type(e) is list and len(e) == 17 and e[:2] == [1, 1]]
        if not enqueues:
            return "nothing (no enqueue)"
        enqueues[0][16] = rng.choice(({"k": "v", "n": 2}, {"k": [1]}, {1: "x"}))
        reencode(data_dir, seq, events=events)
        return f"a custom map in {seq}"
    if choice == 12:
        kind: Any = rng.choice((True, float(envelope.command_kind)))
        replace_record(data_dir, seq, msgpack.packb([1, envelope.time_ms, kind, events]))
        return f"{seq}'s command kind is {kind!r}"
    if choice == 11:
        paths = segment_paths(data_dir)
        if len(paths) < 3:
            return "nothing (too few segments)"
        paths[rng.randrange(1, len(paths) - 1)].unlink()
        return "a middle segment deleted"
    reencode(data_dir, seq, events=[*events, [rng.choice((0, 13, 99, True)), 1, "x"]])
    return f"an unknown event type in {seq}"


@pytest.mark.parametrize("history", ["scripted", "mixed"])
def test_damaged_logs_come_to_the_same_reports(
    tmp_path: Path, rng: random.Random, history: str
) -> None:
    for case in range(25):
        data_dir = tmp_path / f"case{case}"
        if history == "scripted":
            live = scripted_log(data_dir, snapshot_at=(12, 30))
        else:
            live = random_log(data_dir, rng, commands=150, snapshot_every=50)
        live.close()
        what = [_damage(live, rng) for _ in range(rng.randrange(1, 4))]
        report = _verify_both(data_dir)
        assert report.records > 0, what
        for until in (None, rng.randrange(1, live.last_seq + 1)):
            _replay_both(data_dir, until)
