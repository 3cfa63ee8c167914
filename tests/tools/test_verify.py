"""`sepp-log verify`: every kind of damage gets its exact report -- file, offset,
sequence number and reason -- and the verdicts agree with the recovery decision
table (sepp/storage/recovery.py): what recovery truncates is a warning, what it
refuses is an error.

Data directories are written by the real storage engine (tests/tools/helpers.py)
and damaged by byte surgery.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    RECORD_KIND_COMMAND,
    decode_envelope,
    encode_envelope,
    encode_record,
    snapshot_file_name,
)
from sepp.core import CoreConfig, Enqueue
from sepp.storage import Engine, RealFileSystem, RecoveryError
from sepp.storage.replay import ReplayError, replay_record
from sepp.storage.snapshots import write_snapshot_file
from tests.storage.helpers import numbered_id
from tests.tools.helpers import (
    CONFIG,
    T0,
    LiveLog,
    flip_bit,
    job,
    locate,
    options,
    reencode,
    rel,
    replace_record,
    scripted_log,
    segment_paths,
    snapshot_paths,
    splice,
    tree,
)
from tools.datadir import ERROR, INFO, WARNING, Problem, open_data_dir
from tools.replay import replay_to
from tools.verify import VerifyReport, verify

SEG1, SEG13, SEG25 = (f"wal/{n:020d}.log" for n in (1, 13, 25))


def run(data_dir: Path) -> VerifyReport:
    return verify(open_data_dir(str(data_dir)))


def errors_and_warnings(report: VerifyReport) -> list[Problem]:
    return [p for p in report.problems if p.severity != INFO]


def offset_of(data_dir: Path, seq: int) -> int:
    return locate(data_dir, seq)[1].offset


# ---------------------------------------------------------------- clean logs


def test_clean_log_verifies_with_a_full_replay_and_no_problems(scripted: LiveLog) -> None:
    report = run(scripted.data_dir)
    assert report.problems == []
    assert report.exit_code == 0
    assert (report.segments, report.records, report.events) == (3, 40, 43)
    assert (report.first_seq, report.last_seq) == (1, 40)
    assert (report.replay_from, report.replayed_to, report.replay_stopped) == (0, 40, None)


def test_every_snapshot_is_compared_with_the_replayed_log(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(10, 26, 40))
    live.close()
    report = run(live.data_dir)
    assert report.problems == []
    assert [(s.file, s.verdict) for s in report.snapshots] == [
        (f"snapshots/{snapshot_file_name(seq)}", "match") for seq in (10, 26, 40)
    ]


def test_mixed_workload_with_retention_verifies_from_its_oldest_snapshot(
    mixed: LiveLog,
) -> None:
    report = run(mixed.data_dir)
    snaps = snapshot_paths(mixed.data_dir)
    oldest = f"snapshots/{snaps[0].name}"
    assert errors_and_warnings(report) == []
    assert report.replay_from_snapshot == oldest
    assert report.replayed_to == mixed.last_seq
    assert [s.verdict for s in report.snapshots] == ["base"] + ["match"] * (len(snaps) - 1)
    assert report.problems == [
        Problem(
            INFO,
            "snapshot-unchecked",
            oldest,
            None,
            int(snaps[0].stem),
            "the replay starts from this snapshot: only its internal consistency was checked",
        )
    ]


# ---------------------------------------------------------------- damage


def test_flipped_bit_in_a_sealed_segment_is_corruption(scripted: LiveLog) -> None:
    path, record = locate(scripted.data_dir, 5)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 10)
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(ERROR, "corruption", SEG1, record.offset, 5, "bad body checksum")
    ]
    assert report.replay_stopped == "record 5 is missing; the replay stopped after seq 4"
    assert report.records == 39  # the scan resynchronised after the damage
    assert report.exit_code == 1


def test_flipped_bit_in_a_record_header_is_corruption_at_the_expected_seq(
    scripted: LiveLog,
) -> None:
    path, record = locate(scripted.data_dir, 17)
    flip_bit(path, record.offset + 9)  # body_len
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(ERROR, "corruption", SEG13, record.offset, 17, "bad header checksum")
    ]


def test_torn_tail_of_the_last_segment_is_a_warning_recovery_would_truncate(
    scripted: LiveLog,
) -> None:
    path, record = locate(scripted.data_dir, 40)
    size = path.stat().st_size
    splice(path, size - 5, size)
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(
            WARNING,
            "torn-tail",
            SEG25,
            record.offset,
            40,
            "truncated record body: recovery would truncate the last "
            f"{size - 5 - record.offset} bytes (a crash mid-append, or a live server's "
            "record in progress)",
        )
    ]
    assert report.exit_code == 0
    assert report.replayed_to == 39


def _zero_records(data_dir: Path, first: int, last: int) -> tuple[Path, int]:
    """Zeros where records first..last were (a page lost at a power cut)."""
    path, start = locate(data_dir, first)
    end = offset_of(data_dir, last + 1)
    splice(path, start.offset, end, bytes(end - start.offset))
    return path, start.offset


def test_unsynced_hole_in_the_last_segment_is_a_warning_recovery_would_truncate(
    scripted: LiveLog,
) -> None:
    # persist_mode buffer: records 25..40 were written after the last sync (the
    # rotation at seq 25), and each says so: a hole among them is unsynced tail.
    path, offset = _zero_records(scripted.data_dir, 33, 34)
    size = path.stat().st_size
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(
            WARNING,
            "torn-tail",
            SEG25,
            offset,
            33,
            "unsynced hole (bad header checksum): recovery would truncate the last "
            f"{size - offset} bytes -- the 6 valid record(s) after it were written before "
            "seq 33 was synced (claimed synced up to seq 24): out-of-order writeback of "
            "the unsynced tail at a power loss",
        )
    ]
    assert report.exit_code == 0
    assert report.replayed_to == 32


def test_hole_that_later_records_and_a_snapshot_say_was_synced_is_corruption(
    tmp_path: Path,
) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(38,))
    live.close()
    _path, offset = _zero_records(live.data_dir, 33, 34)
    report = run(live.data_dir)
    assert [p for p in report.problems if p.severity == ERROR][:1] == [
        Problem(ERROR, "corruption", SEG25, offset, 33, "bad header checksum")
    ]
    assert report.exit_code == 1


def test_torn_tail_in_a_sealed_segment_is_corruption(scripted: LiveLog) -> None:
    path, record = locate(scripted.data_dir, 24)
    size = path.stat().st_size
    splice(path, size - 3, size)
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(
            ERROR,
            "corruption",
            SEG13,
            record.offset,
            24,
            "truncated record body at the end of a sealed segment",
        ),
    ]
    assert report.replay_stopped == "record 24 is missing; the replay stopped after seq 23"


def test_deleted_middle_segment_is_a_sequence_gap(scripted: LiveLog) -> None:
    (scripted.data_dir / SEG13).unlink()
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(
            ERROR,
            "sequence-gap",
            SEG25,
            0,
            13,
            "sequence gap between segments: expected seq 13, segment starts at seq 25",
        )
    ]
    assert report.replay_stopped == "records 13..24 are missing; the replay stopped after seq 12"


def test_record_cut_out_of_a_segment_is_a_sequence_gap(scripted: LiveLog) -> None:
    path, record = locate(scripted.data_dir, 5)
    next_offset = offset_of(scripted.data_dir, 6)
    splice(path, record.offset, next_offset)
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(ERROR, "sequence-gap", SEG1, record.offset, 6, "sequence gap: expected 5, found 6")
    ]
    assert report.replay_stopped == "record 5 is missing; the replay stopped after seq 4"
    assert report.records == 39


def test_duplicated_record_is_a_sequence_repeat(scripted: LiveLog) -> None:
    path, record = locate(scripted.data_dir, 5)
    end = offset_of(scripted.data_dir, 6)
    data = path.read_bytes()
    path.write_bytes(data[:end] + data[record.offset : end] + data[end:])
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(ERROR, "sequence-gap", SEG1, end, 5, "sequence repeat: expected 6, found 5")
    ]
    # The repeat is skipped; the records after it follow on, so the replay goes on.
    assert (report.replayed_to, report.replay_stopped) == (40, None)


def test_bad_segment_header_is_reported_once(scripted: LiveLog) -> None:
    flip_bit(scripted.data_dir / SEG13, 17)  # first_seq
    report = run(scripted.data_dir)
    assert report.problems == [Problem(ERROR, "bad-header", SEG13, 0, 13, "bad header checksum")]
    assert report.replay_stopped == "records 13..24 are missing; the replay stopped after seq 12"


def test_torn_header_of_the_last_segment_is_a_warning(scripted: LiveLog) -> None:
    (scripted.data_dir / "wal" / f"{41:020d}.log").write_bytes(b"SEPPWAL\x00\x01\x00")
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(
            WARNING,
            "torn-tail",
            f"wal/{41:020d}.log",
            0,
            41,
            "truncated header: recovery would remove this file (a crash while the segment "
            "was being created)",
        )
    ]
    assert report.exit_code == 0


def test_record_that_does_not_decode_is_reported_and_stops_the_replay(scripted: LiveLog) -> None:
    _path, offset = replace_record(scripted.data_dir, 30, b"\xc1")
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(ERROR, "decode", SEG25, offset, 30, "envelope is not valid msgpack")
    ]
    assert report.replay_stopped == "record 30 does not decode; the replay stopped after seq 29"


@pytest.mark.parametrize(
    ("seq", "field", "value", "reason"),
    [
        (26, 3, "1", "event 0: JobAcked field attempt is not int"),
        # A priority that is not an int would make apply index a list with a str:
        # checked against the catalogue before the replay ever sees it.
        (5, 7, "high", "event 0: JobEnqueued field priority is not int"),
        (5, 16, {"n": [1]}, "event 0: JobEnqueued field custom is not map?"),
        (28, 1, 2, "event 0: JobNacked version 2 is not supported (expected 1)"),
    ],
)
def test_event_that_breaks_the_catalogue_is_reported(
    scripted: LiveLog, seq: int, field: int, value: object, reason: str
) -> None:
    _path, record = locate(scripted.data_dir, seq)
    event = list(decode_envelope(record.body).events[0])
    event[field] = value
    path, offset = reencode(scripted.data_dir, seq, events=[event])
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(ERROR, "event", rel(path, scripted.data_dir), offset, seq, reason)
    ]
    assert report.replay_stopped == (
        f"record {seq} has an invalid event; the replay stopped after seq {seq - 1}"
    )


def test_event_that_does_not_apply_is_reported(scripted: LiveLog) -> None:
    stranger = numbered_id(99)
    _path, offset = reencode(scripted.data_dir, 26, events=[[3, 1, stranger, 1, "w1"]])
    report = run(scripted.data_dir)
    # The reason is the replay's own, word for word (the apply layer words it).
    before = replay_to(open_data_dir(str(scripted.data_dir)), until_seq=25).state
    assert before is not None
    with pytest.raises(ReplayError) as replayed:
        replay_record(before, locate(scripted.data_dir, 26)[1].body)
    reason = str(replayed.value)
    assert reason.startswith(f"JobAcked for {stranger}") and reason.endswith("job is None")
    assert report.problems == [Problem(ERROR, "apply", SEG25, offset, 26, reason)]
    assert report.replay_stopped == "record 26 does not apply; the replay stopped after seq 25"


def test_time_going_backwards_is_reported(scripted: LiveLog) -> None:
    earlier = scripted.times[29] - 1
    _path, offset = reencode(scripted.data_dir, 30, time_ms=earlier)
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(
            ERROR,
            "time",
            SEG25,
            offset,
            30,
            "time goes backwards: 2023-11-14T22:13:48.999Z after 2023-11-14T22:13:49.000Z",
        )
    ]


def test_every_problem_is_reported_not_only_the_first(scripted: LiveLog) -> None:
    path1, record5 = locate(scripted.data_dir, 5)
    flip_bit(path1, record5.offset + RECORD_HEADER_BYTES + 3)
    _path, offset = replace_record(scripted.data_dir, 30, b"\xc1")
    (scripted.data_dir / "snapshots" / "00000000000000000007.snap.tmp").write_bytes(b"x")
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(
            WARNING,
            "temp-file",
            "snapshots/00000000000000000007.snap.tmp",
            None,
            None,
            "leftover snapshot temp file (a snapshot that was never published); recovery deletes it",
        ),
        Problem(ERROR, "corruption", SEG1, record5.offset, 5, "bad body checksum"),
        Problem(ERROR, "decode", SEG25, offset, 30, "envelope is not valid msgpack"),
    ]


# ---------------------------------------------------------------- snapshots


def test_snapshot_that_does_not_match_its_log_is_reported(scripted: LiveLog) -> None:
    state = replay_to(open_data_dir(str(scripted.data_dir)), until_seq=30).state
    assert state is not None
    state.jobs[numbered_id(2)].worker_id = "intruder"
    name = snapshot_file_name(30)
    write_snapshot_file(RealFileSystem(), str(scripted.data_dir / "snapshots" / name), state, 30)
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(
            ERROR,
            "snapshot-mismatch",
            f"snapshots/{name}",
            None,
            30,
            "differs from the log replayed to seq 30: jobs: 1 differ (first "
            f"{numbered_id(2)}: worker_id 'intruder' in the snapshot, 'w1' in the log)",
        )
    ]


def test_nan_in_a_custom_map_does_not_make_a_snapshot_differ_from_its_log(
    tmp_path: Path,
) -> None:
    # NaN != NaN: compared as Python values, a snapshot holding a job whose custom
    # map has a NaN (any producer may send one) was reported as corrupt (issue 13
    # §7). Floats are compared as the format stores them, bit for bit.
    live = LiveLog.open(tmp_path / "data", snapshot_at=(2,))
    nan = float("nan")
    live.run(Enqueue(jobs=(job(0, custom={"score": nan, "n": 1}),)), T0 + 1_000)
    live.run(Enqueue(jobs=(job(1, custom={"zero": -0.0, "x": 1.5}),)), T0 + 2_000)
    live.close()
    report = run(live.data_dir)
    assert report.problems == []
    assert [s.verdict for s in report.snapshots] == ["match"]


def test_a_float_that_differs_in_a_custom_map_is_still_a_mismatch(scripted: LiveLog) -> None:
    state = replay_to(open_data_dir(str(scripted.data_dir)), until_seq=30).state
    assert state is not None
    state.jobs[numbered_id(8)].custom = {"score": float("nan")}
    name = snapshot_file_name(30)
    write_snapshot_file(RealFileSystem(), str(scripted.data_dir / "snapshots" / name), state, 30)
    report = run(scripted.data_dir)
    assert [(p.kind, p.seq) for p in report.problems] == [("snapshot-mismatch", 30)]
    assert "custom" in report.problems[0].reason


def test_snapshot_newer_than_the_log_is_an_error(scripted: LiveLog) -> None:
    state = replay_to(open_data_dir(str(scripted.data_dir))).state
    assert state is not None
    name = snapshot_file_name(50)
    write_snapshot_file(RealFileSystem(), str(scripted.data_dir / "snapshots" / name), state, 50)
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(
            ERROR,
            "snapshot-ahead",
            f"snapshots/{name}",
            None,
            50,
            "snapshot is newer than the log, which ends at seq 40; recovery refuses to start",
        )
    ]


def test_damaged_snapshot_is_unusable(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(20,))
    live.close()
    snap = snapshot_paths(live.data_dir)[0]
    flip_bit(snap, FILE_HEADER_BYTES + RECORD_HEADER_BYTES + 5)
    report = run(live.data_dir)
    assert report.problems == [
        Problem(
            ERROR,
            "snapshot-unusable",
            f"snapshots/{snap.name}",
            FILE_HEADER_BYTES,
            20,
            "bad body checksum",
        )
    ]


def test_snapshot_older_than_the_log_is_only_checked_on_its_own(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data", snapshot_at=(10, 20, 30))
    live.close()
    (live.data_dir / SEG1).unlink()  # as retention would, keeping the older snapshot
    report = run(live.data_dir)
    snap10, snap20, snap30 = (f"snapshots/{snapshot_file_name(s)}" for s in (10, 20, 30))
    assert report.problems == [
        Problem(
            INFO,
            "snapshot-unchecked",
            snap10,
            None,
            10,
            "older than the start of the log (seq 13): only its internal consistency was checked",
        ),
        Problem(
            INFO,
            "snapshot-unchecked",
            snap20,
            None,
            20,
            "the replay starts from this snapshot: only its internal consistency was checked",
        ),
    ]
    assert [(s.file, s.verdict) for s in report.snapshots] == [
        (snap10, "alone"),
        (snap20, "base"),
        (snap30, "match"),
    ]
    assert (report.replay_from, report.replayed_to, report.exit_code) == (20, 40, 0)


def test_log_whose_head_is_gone_without_a_snapshot_cannot_be_replayed(scripted: LiveLog) -> None:
    (scripted.data_dir / SEG1).unlink()
    report = run(scripted.data_dir)
    assert report.problems == [
        Problem(
            ERROR,
            "log-start",
            SEG13,
            0,
            1,
            "the log starts at seq 13 and no usable snapshot covers seqs 1..12",
        )
    ]
    assert report.replay_from is None
    assert report.records == 28  # the bytes are still checked


# ---------------------------------------------------------------- agreement


def _damage_cases() -> dict[str, object]:
    def flipped_sealed(d: Path) -> None:
        path, record = locate(d, 5)
        flip_bit(path, record.offset + RECORD_HEADER_BYTES + 10)

    def torn_tail(d: Path) -> None:
        path = d / SEG25
        size = path.stat().st_size
        splice(path, size - 5, size)

    def zeroed_tail(d: Path) -> None:
        path, record = locate(d, 38)
        size = path.stat().st_size
        splice(path, record.offset, size, bytes(size - record.offset))

    def deleted_middle(d: Path) -> None:
        (d / SEG13).unlink()

    def gap_in_segment(d: Path) -> None:
        path, record = locate(d, 5)
        splice(path, record.offset, offset_of(d, 6))

    def bad_header(d: Path) -> None:
        flip_bit(d / SEG13, 17)

    def torn_new_segment(d: Path) -> None:
        (d / "wal" / f"{41:020d}.log").write_bytes(bytes(10))

    def undecodable(d: Path) -> None:
        replace_record(d, 30, b"\xc1")

    def unappliable(d: Path) -> None:
        reencode(d, 26, events=[[3, 1, numbered_id(99), 1, "w1"]])

    def head_gone(d: Path) -> None:
        (d / SEG1).unlink()

    def unsynced_hole(d: Path) -> None:
        _zero_records(d, 33, 34)

    def hole_in_sealed_segment(d: Path) -> None:
        _zero_records(d, 15, 16)

    return {name: fn for name, fn in locals().items() if callable(fn)}


@pytest.mark.parametrize("damage", sorted(_damage_cases()))
def test_verify_agrees_with_recovery(tmp_path: Path, damage: str) -> None:
    live = scripted_log(tmp_path / "data")
    live.close()
    _damage_cases()[damage](live.data_dir)  # type: ignore[operator]
    before = tree(live.data_dir)
    report = run(live.data_dir)
    assert tree(live.data_dir) == before, "verify changed the data directory"
    copy = tmp_path / "copy"
    shutil.copytree(live.data_dir, copy)
    try:
        engine = Engine.open(str(copy), CONFIG, options())
    except RecoveryError:
        assert report.exit_code == 1, report.problems
        return
    recovered = engine.recovery_report
    engine.close()
    assert report.exit_code == 0, report.problems
    torn = [p for p in report.problems if p.kind == "torn-tail"]
    cut = recovered.truncated or recovered.zero_tail
    if recovered.unsynced_hole is not None:
        cut = recovered.unsynced_hole[:3]
    if cut is not None:
        path, offset, _cut = cut
        assert [(str(copy / p.file), p.offset) for p in torn] == [(path, offset)]
    elif recovered.removed_files:
        assert [str(copy / p.file) for p in torn] == recovered.removed_files
    else:
        assert torn == []
    assert engine.state.canonical() == live.canonical[report.replayed_to or 0]


def test_verify_reads_a_live_directory_while_a_record_is_being_appended(
    tmp_path: Path, rng: random.Random
) -> None:
    live = scripted_log(tmp_path / "data")
    segment = segment_paths(live.data_dir)[-1]
    path, last = locate(live.data_dir, 40)
    assert path == segment
    # The engine is open: its records end here, its file may go on with zeros
    # (the writer's preallocated space).
    size = last.offset + RECORD_HEADER_BYTES + len(last.body)
    original = segment.read_bytes()
    try:
        # Half of the next record is in the file, as while a write is under way.
        record = encode_record(41, RECORD_KIND_COMMAND, encode_envelope(1, 8, [[7, 1, "x"]]))
        with open(segment, "r+b") as handle:
            handle.seek(size)
            handle.write(record[: rng.randrange(1, len(record))])
        before = tree(live.data_dir)
        report = run(live.data_dir)
        assert tree(live.data_dir) == before
        assert [(p.severity, p.kind, p.file, p.offset, p.seq) for p in report.problems] == [
            (WARNING, "torn-tail", SEG25, size, 41)
        ]
        assert (report.replayed_to, report.exit_code) == (40, 0)
    finally:
        segment.write_bytes(original)
        live.close()


def test_a_running_servers_preallocated_zeros_are_a_line_not_a_warning(tmp_path: Path) -> None:
    live = scripted_log(tmp_path / "data")  # the engine is open, as in a running server
    try:
        path, last = locate(live.data_dir, 40)
        end = last.offset + RECORD_HEADER_BYTES + len(last.body)
        assert path.stat().st_size > end  # the writer's zeros after the last record
        report = run(live.data_dir)
        assert errors_and_warnings(report) == []
        (line,) = [p for p in report.problems if p.kind == "torn-tail"]
        assert (line.severity, line.file, line.offset) == (INFO, SEG25, end)
        assert "preallocated space" in line.reason
        assert (report.replayed_to, report.exit_code) == (40, 0)
    finally:
        live.close()


def test_empty_data_directory_verifies(tmp_path: Path) -> None:
    engine = Engine.open(str(tmp_path / "data"), CoreConfig(), options())
    engine.close()
    report = run(tmp_path / "data")
    assert report.problems == []
    assert (report.records, report.replayed_to) == (0, 0)


def test_a_torn_tail_a_snapshot_says_was_durable_is_corruption_as_recovery_says(
    tmp_path: Path,
) -> None:
    # Recovery row 21: the snapshot at 40 was published only once seq 40 was
    # synced, so a bad last record at seq 40 is damage, not a torn append.
    live = scripted_log(tmp_path / "data", snapshot_at=(40,))
    live.close()
    path, record = locate(live.data_dir, 40)
    flip_bit(path, record.offset + RECORD_HEADER_BYTES + 2)
    report = run(live.data_dir)
    corruption = [p for p in report.problems if p.kind == "corruption"]
    assert [(p.severity, p.file, p.offset, p.seq) for p in corruption] == [
        (ERROR, SEG25, record.offset, 40)
    ]
    assert "which the snapshot at seq 40 says was durable" in corruption[0].reason
    assert not [p for p in report.problems if p.kind == "torn-tail"]
    with pytest.raises(RecoveryError):
        Engine.open(str(live.data_dir), CONFIG, options())
