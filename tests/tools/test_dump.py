"""`sepp-log dump`: every event, in log order, with each filter and their
combinations, in human and JSON form; `--follow` on a log that a live engine keeps
appending to (and rotating); damage stops the dump with a report.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from log_format import RECORD_HEADER_BYTES, decode_envelope
from sepp.core import Enqueue, Reserve
from tests.storage.helpers import numbered_id
from tests.tools.helpers import (
    T0,
    LiveLog,
    all_records,
    flip_bit,
    job,
    locate,
    scripted_log,
    segment_paths,
)
from tools.datadir import ERROR, Problem, open_data_dir
from tools.dump import DumpFilter, EventLine, dump
from tools.events import parse_types
from tools.output import UsageError


def _dump(
    data_dir: Path, filt: DumpFilter | None = None, **kwargs: object
) -> tuple[list[EventLine], list[Problem]]:
    lines: list[EventLine] = []
    problems: list[Problem] = []
    dump(
        open_data_dir(str(data_dir)),
        filt or DumpFilter(),
        on_event=lines.append,
        on_problem=problems.append,
        **kwargs,  # type: ignore[arg-type]
    )
    return lines, problems


def _seqs(lines: list[EventLine]) -> list[int]:
    return [line.seq for line in lines]


def test_dump_prints_every_event_in_log_order(scripted: LiveLog) -> None:
    lines, problems = _dump(scripted.data_dir)
    assert problems == []
    expected = [
        (record.seq, index, event)
        for _path, record in all_records(scripted.data_dir)
        for index, event in enumerate(decode_envelope(record.body).events)
    ]
    assert [(line.seq, line.index, line.event) for line in lines] == expected
    assert lines[24].human() == (
        "25 2023-11-14T22:13:45.000Z reserve JobReserved "
        f"job_id={numbered_id(0)} attempt=1 lease_expires_at=2023-11-14T22:14:15.000Z "
        "worker_id=w1"
    )
    assert lines[27].human() == (
        "28 2023-11-14T22:13:48.000Z nack JobNacked "
        f"job_id={numbered_id(2)} attempt=1 run_at=2023-11-14T22:13:48.157Z "
        'reason="smtp down" worker_id=w2'
    )


def test_dump_json_has_every_field(scripted: LiveLog) -> None:
    lines, _problems = _dump(scripted.data_dir, DumpFilter(from_seq=1, to_seq=1))
    data = json.loads(json.dumps(lines[0].data()))
    path, record = locate(scripted.data_dir, 1)
    assert data == {
        "seq": 1,
        "time": "2023-11-14T22:13:21.000Z",
        "time_ms": T0 + 1000,
        "command": "enqueue",
        "file": "wal/00000000000000000001.log",
        "offset": record.offset,
        "index": 0,
        "event": "JobEnqueued",
        "fields": {
            "job_id": numbered_id(0),
            "queue": "emails",
            "job_type": "send",
            "payload_data": base64.b64encode(job(0).payload_data or b"").decode(),
            "payload_encoding": "raw",
            "priority": 0,
            "max_attempts": 2,
            "enqueued_at": T0 + 1000,
            "scheduled_at": None,
            "run_at": None,
            "idempotency_key": None,
            "dedup_expires_at": None,
            "traceparent": None,
            "tracestate": None,
            "custom": None,
        },
    }
    assert path.name == "00000000000000000001.log"


def test_dump_filters_by_seq_range(scripted: LiveLog) -> None:
    lines, _ = _dump(scripted.data_dir, DumpFilter(from_seq=11, to_seq=14))
    assert _seqs(lines) == [11, 12, 13, 14]
    lines, _ = _dump(scripted.data_dir, DumpFilter(from_seq=39))
    assert _seqs(lines) == [39, 39, 39, 40]


def test_dump_filters_by_time(scripted: LiveLog) -> None:
    lines, _ = _dump(scripted.data_dir, DumpFilter(since_ms=T0 + 38_000, until_ms=T0 + 44_000))
    assert _seqs(lines) == [38, 39, 39, 39]
    lines, _ = _dump(scripted.data_dir, DumpFilter(since_ms=T0 + 12_500, until_ms=T0 + 14_000))
    assert _seqs(lines) == [13, 14]


def test_dump_filters_by_job(scripted: LiveLog) -> None:
    lines, _ = _dump(scripted.data_dir, DumpFilter(job=numbered_id(2)))
    assert _seqs(lines) == [3, 27, 28, 29, 30, 31, 32, 37]
    assert [line.event[0] for line in lines] == [1, 2, 4, 7, 2, 5, 8, 9]


def test_dump_filters_by_queue_including_events_that_name_only_a_job(scripted: LiveLog) -> None:
    lines, _ = _dump(scripted.data_dir, DumpFilter(queue="reports", from_seq=25))
    # Reserve of jobs 1 and 3 (one record, two events), ack of 1, dead letter of 3.
    assert [(line.seq, line.index) for line in lines] == [(33, 0), (33, 1), (34, 0), (40, 0)]
    lines, _ = _dump(scripted.data_dir, DumpFilter(queue="emails", from_seq=35))
    # seq 39: lease expiry of job 6, dedup expiry of welcome-24, dead letter 4 expired.
    assert [(line.seq, line.index) for line in lines] == [
        (35, 0),
        (36, 0),
        (37, 0),
        (38, 0),
        (39, 0),
        (39, 1),
        (39, 2),
    ]


def test_dump_filters_by_type(scripted: LiveLog) -> None:
    lines, _ = _dump(scripted.data_dir, DumpFilter(types=parse_types("jobnacked,JobAcked")))
    # The nack at seq 32 exhausted the attempts: a JobDeadLettered, not a JobNacked.
    assert [(line.seq, line.event[0]) for line in lines] == [(26, 3), (28, 4), (34, 3)]
    with pytest.raises(UsageError, match="unknown event type 'JobFrobbed'"):
        parse_types("JobFrobbed")
    assert parse_types("3, JobPromoted") == frozenset({3, 7})


def test_dump_filters_combine(scripted: LiveLog) -> None:
    filt = DumpFilter(
        queue="emails", types=parse_types("JobReserved"), since_ms=T0 + 26_000, to_seq=37
    )
    lines, _ = _dump(scripted.data_dir, filt)
    assert _seqs(lines) == [27, 30]


def test_dump_by_queue_knows_jobs_from_the_snapshot_when_the_head_is_gone(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(24,))
    live.close()
    for path in segment_paths(live.data_dir)[:2]:
        path.unlink()
    lines, problems = _dump(live.data_dir, DumpFilter(queue="reports"))
    assert problems == []
    assert [(line.seq, line.index) for line in lines] == [(33, 0), (33, 1), (34, 0), (40, 0)]


def test_dump_stops_at_corruption_and_reports_it(scripted: LiveLog) -> None:
    path, record = locate(scripted.data_dir, 20)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 1)
    lines, problems = _dump(scripted.data_dir)
    assert _seqs(lines) == list(range(1, 20))
    assert problems == [
        Problem(
            ERROR,
            "corruption",
            "wal/00000000000000000013.log",
            record.offset,
            20,
            "bad body checksum",
        )
    ]


def test_dump_follows_a_live_log_across_segments(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data")
    seen: list[int] = []
    rounds = iter(range(6))
    next_job = iter(range(100, 10_000))

    def follow() -> bool:
        # Called each time the dump has caught up: the "server" writes more,
        # enough to rotate into a new segment every other round.
        round_ = next(rounds, None)
        if round_ is None:
            return False
        for _ in range(8 if round_ % 2 else 1):
            n = next(next_job)
            live.run(Enqueue(jobs=(job(n),)), T0 + 100_000 + n)
        return True

    try:
        lines, problems = _dump(
            live.data_dir,
            DumpFilter(from_seq=38),
            follow=follow,
        )
        seen = _seqs(lines)
    finally:
        live.close()
    assert problems == []
    assert seen == [38, 39, 39, 39, 40, *range(41, live.last_seq + 1)]
    assert len(segment_paths(live.data_dir)) > 3  # it did follow a rotation


def test_dump_follow_waits_for_a_record_being_appended(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data")
    segment = segment_paths(live.data_dir)[-1]
    calls = 0

    def follow() -> bool:
        nonlocal calls
        calls += 1
        if calls == 1:
            # Half a record is in the file: not an error, just not there yet.
            with open(segment, "ab") as handle:
                handle.write(b"\x00\x11\x22")
            return True
        if calls == 2:
            with open(segment, "r+b") as handle:  # the "server" rewrites its tail
                handle.truncate(segment.stat().st_size - 3)
            live.run(Reserve(queues=("emails",), lease_ms=1000), T0 + 200_000)
            return True
        return False

    try:
        lines, problems = _dump(live.data_dir, DumpFilter(from_seq=40), follow=follow)
    finally:
        live.close()
    assert problems == []
    assert _seqs(lines) == [40, 41]


def test_dump_to_seq_stops_reading(scripted: LiveLog) -> None:
    # Damage after the range is never read.
    path, record = locate(scripted.data_dir, 30)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 1)
    lines, problems = _dump(scripted.data_dir, DumpFilter(to_seq=29))
    assert problems == []
    assert _seqs(lines)[-1] == 29
