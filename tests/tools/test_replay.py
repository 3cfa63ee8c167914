"""`sepp-log replay`: the state at a point of the log equals the state the live
system had at that sequence number, and `--into` writes a data directory that the
engine starts from with exactly that state (point-in-time recovery).

The live states are captured while the log is written (tests/tools/helpers.py,
`LiveLog.canonical`), so the comparison is with the running system, not with
another replay.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from log_format import RECORD_HEADER_BYTES
from sepp.core import Enqueue
from sepp.storage import Engine
from tests.tools.helpers import (
    CONFIG,
    T0,
    LiveLog,
    flip_bit,
    job,
    locate,
    options,
    scripted_log,
    segment_paths,
    snapshot_paths,
    tree,
)
from tools.datadir import ERROR, WARNING, Problem, open_data_dir
from tools.output import UsageError, parse_time
from tools.replay import (
    QueueSummary,
    check_copy,
    queue_summaries,
    replay_to,
    seq_at_time,
    write_into,
)


def _points(live: LiveLog, rng: random.Random, count: int) -> list[int]:
    """Seqs to check: the ends, every segment boundary, every snapshot, and a
    random sample."""
    seqs = set(live.canonical)
    first = min(seqs)
    points = {first, max(seqs)}
    for path in segment_paths(live.data_dir):
        start = int(path.stem)
        points.update(s for s in (start - 1, start) if s in seqs)
    points.update(int(p.stem) for p in snapshot_paths(live.data_dir) if int(p.stem) in seqs)
    points.update(rng.sample(sorted(seqs), min(count, len(seqs))))
    return sorted(points)


def test_replay_to_a_seq_equals_the_live_state_at_that_seq(
    scripted: LiveLog, rng: random.Random
) -> None:
    data_dir = open_data_dir(str(scripted.data_dir))
    for seq in range(0, 41):
        result = replay_to(data_dir, until_seq=seq)
        assert result.state is not None
        assert result.seq == seq
        assert result.state.canonical() == scripted.canonical[seq], seq


def test_replay_from_snapshots_equals_the_live_state(mixed: LiveLog, rng: random.Random) -> None:
    data_dir = open_data_dir(str(mixed.data_dir))
    oldest = int(snapshot_paths(mixed.data_dir)[0].stem)
    for seq in _points(mixed, rng, 20):
        if seq < oldest:
            continue  # before the oldest snapshot the log is gone (retention)
        result = replay_to(data_dir, until_seq=seq)
        assert result.state is not None, (seq, result.problems)
        assert result.state.canonical() == mixed.canonical[seq], seq
        # Recovery starts from the newest snapshot at or before the point.
        assert result.base_seq == max(
            int(p.stem) for p in snapshot_paths(mixed.data_dir) if int(p.stem) <= seq
        )


def test_replay_before_the_head_of_the_log_is_refused(mixed: LiveLog) -> None:
    first = int(segment_paths(mixed.data_dir)[0].stem)
    result = replay_to(open_data_dir(str(mixed.data_dir)), until_seq=first - 2)
    assert result.state is None
    assert [p.kind for p in result.problems] == ["log-start"]


def test_replay_until_time_stops_after_the_last_record_at_or_before_it(
    scripted: LiveLog,
) -> None:
    data_dir = open_data_dir(str(scripted.data_dir))
    # seq s was logged at T0 + s seconds; seq 39 at T0 + 44 s.
    assert seq_at_time(data_dir, T0 + 17_000) == (17, [])
    assert seq_at_time(data_dir, T0 + 17_999) == (17, [])
    assert seq_at_time(data_dir, T0 + 43_000) == (38, [])
    assert seq_at_time(data_dir, T0 + 999_000) == (40, [])
    assert seq_at_time(data_dir, T0) == (0, [])
    assert seq_at_time(data_dir, parse_time("2023-11-14T22:13:33Z")) == (13, [])


def test_replay_past_the_end_of_the_log_is_refused(scripted: LiveLog) -> None:
    result = replay_to(open_data_dir(str(scripted.data_dir)), until_seq=41)
    assert result.state is None
    assert result.problems == [
        Problem(
            ERROR, "log-end", None, None, 41, "the log ends at seq 40, before the seq asked for"
        )
    ]


def test_damage_after_the_point_does_not_matter(scripted: LiveLog) -> None:
    path, record = locate(scripted.data_dir, 30)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 4)
    data_dir = open_data_dir(str(scripted.data_dir))
    result = replay_to(data_dir, until_seq=29)
    assert result.problems == []
    assert result.state is not None
    assert result.state.canonical() == scripted.canonical[29]
    broken = replay_to(data_dir, until_seq=30)
    assert broken.state is None
    # persist_mode buffer: seqs 25..40 were never synced and say so, so damage among
    # them reads as a hole in the unsynced tail (FORMAT.md 5.4) that recovery cuts.
    assert [(p.kind, p.seq, p.reason.split(":")[0]) for p in broken.problems] == [
        ("torn-tail", 30, "unsynced hole (bad body checksum)"),
        ("log-end", 30, "the log ends at seq 29, before the seq asked for"),
    ]


def test_queue_summary_counts_jobs_leases_and_ages(scripted: LiveLog) -> None:
    result = replay_to(open_data_dir(str(scripted.data_dir)), until_seq=33)
    assert result.state is not None
    # At seq 33 (T0 + 33 s): emails had jobs 0, 2 gone or dead, 4..22 ready;
    # reports has jobs 1 and 3 leased by w3 until T0 + 63 s.
    assert queue_summaries(result.state) == [
        QueueSummary(
            queue="emails",
            ready=10,
            scheduled=0,
            in_flight=0,
            dead=1,
            oldest_ready_enqueued_at=T0 + 5_000,
            oldest_ready_age_ms=28_000,
            leases_outstanding=0,
            leases_overdue=0,
            next_lease_expiry=None,
        ),
        QueueSummary(
            queue="reports",
            ready=10,
            scheduled=0,
            in_flight=2,
            dead=0,
            oldest_ready_enqueued_at=T0 + 6_000,
            oldest_ready_age_ms=27_000,
            leases_outstanding=2,
            leases_overdue=0,
            next_lease_expiry=T0 + 63_000,
        ),
    ]
    at_38 = replay_to(open_data_dir(str(scripted.data_dir)), until_seq=38).state
    assert at_38 is not None
    # Job 6's lease (1 s from T0 + 38 s) is still running at the state's clock.
    emails = queue_summaries(at_38)[0]
    assert (emails.leases_outstanding, emails.leases_overdue) == (1, 0)
    assert emails.next_lease_expiry == T0 + 39_000


# ---------------------------------------------------------------- --into


def _check_into(live: LiveLog, seq: int, target: Path) -> dict[str, int]:
    """Write the log cut after `seq` into `target` and start an engine from it;
    returns the sizes of the files written."""
    data_dir = open_data_dir(str(live.data_dir))
    before = tree(live.data_dir)
    result = replay_to(data_dir, until_seq=seq)
    assert result.state is not None, result.problems
    write_into(result, str(target))
    assert check_copy(result, str(target)) is None
    assert tree(live.data_dir) == before
    written = {
        str(p.relative_to(target)): p.stat().st_size for p in target.rglob("*") if p.is_file()
    }
    # Private like a data directory sepp creates (issue 13 §6).
    modes = {str(p.relative_to(target)): oct(p.stat().st_mode & 0o777) for p in target.rglob("*")}
    assert modes == {name: "0o700" if (target / name).is_dir() else "0o600" for name in modes}
    engine = Engine.open(str(target), CONFIG, options())
    try:
        assert engine.recovery_report.last_seq == seq
        assert engine.state.canonical() == live.canonical[seq]
        # The server goes on from there: the next command gets seq + 1.
        _decision, barrier = engine.execute(Enqueue(jobs=(job(500),)), T0 + 10**6)
        assert barrier == seq + 1
    finally:
        engine.close()
    return written


def test_into_writes_a_directory_the_engine_starts_from_at_the_cut(
    tmp_path: Path, scripted: LiveLog
) -> None:
    written = {
        seq: _check_into(scripted, seq, tmp_path / f"into-{seq}")
        for seq in (0, 1, 11, 12, 13, 30, 40)
    }
    # Whole segments below the cut are copied byte for byte; the last one is cut
    # right after record 30.
    _path, record31 = locate(scripted.data_dir, 31)
    sizes = {
        name: (scripted.data_dir / name).stat().st_size
        for name in ("wal/" + f"{n:020d}.log" for n in (1, 13))
    }
    assert written[30] == {**sizes, f"wal/{25:020d}.log": record31.offset}
    assert written[0] == {}


def test_into_from_a_log_whose_head_is_gone_copies_the_snapshot(
    tmp_path: Path, mixed: LiveLog, rng: random.Random
) -> None:
    oldest = int(snapshot_paths(mixed.data_dir)[0].stem)
    points = [s for s in _points(mixed, rng, 6) if s >= oldest]
    for seq in points:
        _check_into(mixed, seq, tmp_path / f"into-{seq}")


def test_into_at_a_snapshot_that_starts_a_segment(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(24,))
    live.close()
    for path in segment_paths(live.data_dir)[:2]:
        path.unlink()  # as retention does once the snapshot at 24 covers them
    # The new log holds the snapshot and the header of the segment after it: no
    # record at or before the cut, but the log still reaches back to the snapshot.
    snap = f"snapshots/{24:020d}.snap"
    assert _check_into(live, 24, tmp_path / "into") == {
        snap: (live.data_dir / snap).stat().st_size,
        f"wal/{25:020d}.log": 32,
    }


def test_into_refuses_a_directory_that_is_not_empty(tmp_path: Path, scripted: LiveLog) -> None:
    target = tmp_path / "busy"
    target.mkdir()
    (target / "keep").write_text("mine")
    result = replay_to(open_data_dir(str(scripted.data_dir)), until_seq=5)
    with pytest.raises(UsageError, match="not an empty directory"):
        write_into(result, str(target))
    assert (target / "keep").read_text() == "mine"


def test_into_an_empty_existing_directory_is_allowed(tmp_path: Path, scripted: LiveLog) -> None:
    (tmp_path / "empty").mkdir()
    _check_into(scripted, 20, tmp_path / "empty")


def test_replay_ignores_the_torn_tail_of_a_live_log(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data")
    try:
        segment = segment_paths(live.data_dir)[-1]
        with open(segment, "ab") as handle:
            handle.write(b"\x01\x02\x03")  # an append under way
        result = replay_to(open_data_dir(str(live.data_dir)))
        assert result.seq == 40
        assert result.state is not None
        assert result.state.canonical() == live.canonical[40]
        assert [(p.severity, p.kind) for p in result.problems] == [("warning", "torn-tail")]
    finally:
        with open(segment, "r+b") as handle:
            handle.truncate(segment.stat().st_size - 3)
        live.close()


def test_a_damaged_newest_snapshot_is_skipped_as_recovery_skips_it(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(10, 30))
    live.close()
    newest = snapshot_paths(live.data_dir)[-1]
    flip_bit(newest, 32 + RECORD_HEADER_BYTES + 3)
    result = replay_to(open_data_dir(str(live.data_dir)))
    assert result.problems == [
        Problem(
            WARNING,
            "snapshot-unusable",
            f"snapshots/{newest.name}",
            32,
            30,
            "bad body checksum (skipped)",
        )
    ]
    assert result.base_seq == 10
    assert result.state is not None
    assert result.state.canonical() == live.canonical[40]
    engine = Engine.open(str(live.data_dir), CONFIG, options())
    try:
        assert engine.recovery_report.snapshot_seq == 10
    finally:
        engine.close()
