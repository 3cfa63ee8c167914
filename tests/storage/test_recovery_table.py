"""The recovery decision table of sepp/storage/recovery.py, one test per row.

Every damaged directory is built by byte surgery on files the real engine wrote
(on the fake file system): truncating, flipping bits, splicing records, removing
or renaming files. A refusal must name the file, offset, sequence number and reason
exactly, point at `sepp-log verify`, and leave the directory as it found it (a
second attempt refuses the same way).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    RECORD_KIND_COMMAND,
    SEGMENT_MAGIC,
    decode_envelope,
    encode_envelope,
    encode_record,
    encode_segment_header,
    encode_snapshot_header,
    scan_snapshot_records,
    segment_file_name,
)
from sepp.core import State
from sepp.storage import Engine, RealFileSystem, RecoveryError, StorageOptions, recovery
from sepp.storage.faultfs import FaultyFileSystem
from sepp.storage.snapshots import SnapshotError, load_snapshot
from tests.storage.helpers import (
    CONFIG,
    SNAP_DIR,
    T0,
    WAL_DIR,
    History,
    enqueue_one,
    inline_options,
    numbered_id,
    open_engine,
    segment_paths,
    segment_records,
    snapshot_paths,
)

ROW_ATTR = "recovery_table_rows"


def row(*numbers: int) -> Callable[[Any], Any]:
    """Mark a test as the test of these rows of the decision table."""

    def mark(fn: Any) -> Any:
        setattr(fn, ROW_ATTR, numbers)
        return fn

    return mark


# ~10 records of ~400 bytes per 4 KiB segment.
OPTIONS = inline_options(segment_bytes_max=4096, snapshots_kept=2)


@dataclass
class Built:
    fs: FaultyFileSystem
    history: History
    last_seq: int

    def segments(self) -> list[str]:
        return segment_paths(self.fs)

    def snapshots(self) -> list[str]:
        return snapshot_paths(self.fs)

    def records(self, path: str) -> list[Any]:
        return segment_records(self.fs.read(path))[1]


def build(records: int, *, snapshots_at: tuple[int, ...] = (), kept: int = 2) -> Built:
    """A data directory written by the real engine: `records` enqueues, one record
    each, flushed one by one; snapshots after the given sequence numbers."""
    fs = FaultyFileSystem()
    options = inline_options(segment_bytes_max=4096, snapshots_kept=kept)
    engine = open_engine(fs, options)
    history = History()
    for n in range(records):
        decision, barrier = engine.execute(enqueue_one(n, payload_bytes=300), T0 + 1_000 * n)
        history.executed(decision, barrier)
        engine.flush()
        if barrier in snapshots_at:
            assert engine.snapshot_now() == barrier
    engine.close()
    return Built(fs, history, records)


def assert_refuses(
    fs: FaultyFileSystem,
    *,
    path: str | None,
    offset: int | None,
    seq: int | None,
    reason: str,
    options: StorageOptions = OPTIONS,
) -> None:
    before = fs.durable_files()
    for _attempt in range(2):  # and again: a refusal repairs nothing
        with pytest.raises(RecoveryError) as info:
            open_engine(fs, options)
        error = info.value
        assert (error.path, error.offset, error.seq, error.reason) == (path, offset, seq, reason)
        assert "sepp-log verify" in str(error)
    assert fs.durable_files() == before


def assert_recovered(built: Built, seq: int, options: StorageOptions = OPTIONS) -> Any:
    engine = open_engine(built.fs, options)
    assert engine.appended_seq == engine.durable_seq == seq
    assert engine.recovery_report.last_seq == seq
    assert engine.state.canonical() == built.history.state_at(seq).canonical()
    return engine


def accepts_next_command(engine: Any, expected_seq: int) -> None:
    _decision, barrier = engine.execute(enqueue_one(10_000), T0 + 10**9)
    assert barrier == expected_seq
    assert engine.flush() == expected_seq
    engine.close()
    again = open_engine(engine.fs, engine.options)
    assert again.appended_seq == expected_seq
    assert numbered_id(10_000) in again.state.jobs


def put_bytes(fs: FaultyFileSystem, path: str, data: bytes) -> None:
    fs.put(path, data)


# ---------------------------------------------------------------- rows 1-3


@row(1)
def test_empty_directory_starts_fresh_at_seq_1() -> None:
    fs = FaultyFileSystem()
    engine = open_engine(fs, OPTIONS)
    report = engine.recovery_report
    assert (engine.appended_seq, engine.durable_seq, report.last_seq) == (0, 0, 0)
    assert report.snapshot_path is None and report.records_replayed == 0
    assert engine.state.canonical() == State(CONFIG).canonical()
    first = f"{WAL_DIR}/{segment_file_name(1)}"
    assert segment_paths(fs) == [first]
    assert fs.durable_files()[first] == encode_segment_header(1)
    _decision, barrier = engine.execute(enqueue_one(0), T0)
    assert barrier == 1


@row(2)
def test_log_from_seq_1_without_snapshot_is_replayed_entirely() -> None:
    built = build(25)
    assert len(built.segments()) >= 3 and built.snapshots() == []
    engine = assert_recovered(built, 25)
    report = engine.recovery_report
    assert report.snapshot_path is None
    assert report.records_replayed == 25 and report.events_replayed == 25
    assert report.truncated is None and report.removed_files == []
    accepts_next_command(engine, 26)


@row(3)
def test_snapshot_and_later_segments_load_the_snapshot_and_replay_the_rest() -> None:
    built = build(25, snapshots_at=(12,))
    snap = f"{SNAP_DIR}/{12:020d}.snap"
    assert built.snapshots() == [snap]
    engine = assert_recovered(built, 25)
    report = engine.recovery_report
    assert (report.snapshot_path, report.snapshot_seq) == (snap, 12)
    assert report.records_replayed == 13 and report.skipped_snapshots == []
    accepts_next_command(engine, 26)


# ---------------------------------------------------------------- row 4


def _cut_mid_header(data: bytes, last: Any) -> bytes:
    return data[: last.offset + RECORD_HEADER_BYTES // 2]


def _cut_mid_body(data: bytes, last: Any) -> bytes:
    return data[: last.offset + RECORD_HEADER_BYTES + len(last.body) // 2]


def _zero_last_record(data: bytes, last: Any) -> bytes:
    return data[: last.offset] + bytes(len(data) - last.offset)


def _flip_body_bit(data: bytes, last: Any) -> bytes:
    at = last.offset + RECORD_HEADER_BYTES + len(last.body) // 3
    return data[:at] + bytes([data[at] ^ 0x10]) + data[at + 1 :]


def _flip_header_bit(data: bytes, last: Any) -> bytes:
    at = last.offset + 9  # inside body_len, covered by the header checksum
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1 :]


def build_to_last_record() -> tuple[Built, str, bytes, Any]:
    """`build(25)`, its last segment's path and bytes, and that segment's last
    record (seq 25)."""
    built = build(25)
    path = built.segments()[-1]
    last = built.records(path)[-1]
    assert last.seq == 25
    return built, path, built.fs.read(path), last


TEARS = {
    "cut_mid_header": _cut_mid_header,
    "cut_mid_body": _cut_mid_body,
    "zero_filled": _zero_last_record,
    "flipped_bit_in_body": _flip_body_bit,
    "flipped_bit_in_header": _flip_header_bit,
}


@row(4)
@pytest.mark.parametrize("tear", sorted(TEARS))
def test_torn_record_at_tail_of_last_segment_is_truncated(tear: str) -> None:
    built, path, data, last = build_to_last_record()
    damaged = TEARS[tear](data, last)
    put_bytes(built.fs, path, damaged)
    engine = assert_recovered(built, 24)
    report = engine.recovery_report
    cut = (path, last.offset, len(damaged) - last.offset)
    if tear == "zero_filled":
        # Indistinguishable from the writer's preallocated zeros: cut, not "torn".
        assert report.truncated is None and report.zero_tail == cut
    else:
        assert report.truncated == cut and report.zero_tail is None
    assert built.fs.durable_files()[path] == data[: last.offset]
    # Seq 25 was never acknowledged: the next command takes its number.
    accepts_next_command(engine, 25)


@row(4)
def test_torn_record_at_tail_is_truncated_on_real_files(tmp_path: Any) -> None:
    fs = RealFileSystem()
    options = StorageOptions(snapshot_mode="inline")
    data_dir = str(tmp_path / "data")
    engine = Engine.open(data_dir, CONFIG, options, fs=fs)
    for n in range(5):
        engine.execute(enqueue_one(n), T0 + n)
        engine.flush()
    engine.close()
    path = tmp_path / "data" / "wal" / segment_file_name(1)
    data = path.read_bytes()
    last = segment_records(data)[1][-1]
    path.write_bytes(data[: last.offset + 30])
    engine = Engine.open(data_dir, CONFIG, options, fs=fs)
    assert engine.recovery_report.truncated == (str(path), last.offset, 30)
    assert path.read_bytes() == data[: last.offset]
    assert engine.appended_seq == 4
    engine.close()


# ---------------------------------------------------------------- row 5


TORN_HEADERS = {
    "empty": b"",
    "magic_prefix": SEGMENT_MAGIC[:5],
    "header_prefix": encode_segment_header(26)[:20],
    "zero_filled_header": bytes(FILE_HEADER_BYTES),
    "zero_filled_short": bytes(11),
    # Blocks allocated but never written (FORMAT.md 5.3: `zero-filled file`).
    "zero_filled_blocks": bytes(4096),
}


@row(5)
@pytest.mark.parametrize("content", sorted(TORN_HEADERS))
def test_torn_header_of_new_last_segment_is_removed(content: str) -> None:
    built = build(25)
    sealed = built.segments()
    torn = f"{WAL_DIR}/{segment_file_name(26)}"
    put_bytes(built.fs, torn, TORN_HEADERS[content])
    engine = assert_recovered(built, 25)
    assert engine.recovery_report.removed_files == [torn]
    assert torn not in built.fs.durable_files()  # removed, and the directory synced
    assert segment_paths(built.fs) == sealed
    accepts_next_command(engine, 26)


SEALED_END = "sealed segment ends in damage"
# Row 4's tears (and two more) in the last segment when a half-created one
# follows it: the refusal's reason, and whether it is at the end of the data
# (seq 26) rather than at the last record (seq 25).
HALF_CREATED_BEFORE: dict[str, tuple[str, bool]] = {
    "cut_mid_header": (f"{SEALED_END} (truncated record header)", False),
    "cut_mid_body": (f"{SEALED_END} (truncated record body)", False),
    "zero_filled": (f"{SEALED_END} (zero-filled tail)", False),
    "flipped_bit_in_body": (f"{SEALED_END} (bad body checksum)", False),
    "flipped_bit_in_header": (f"{SEALED_END} (bad header checksum)", False),
    "zeros_after_the_last_record": (f"{SEALED_END} (zero-filled tail)", True),
    # No damage, but seq 25 -- synced before the rotation began -- is gone.
    "last_record_missing": (
        "the log ends at seq 24, but the segment being created when the process stopped "
        "was to start at seq 26: records 25..25 are missing",
        False,
    ),
}
MORE_TEARS = {
    "zeros_after_the_last_record": lambda data, last: data + bytes(4096),
    "last_record_missing": lambda data, last: data[: last.offset],
}


@row(5, 6)
@pytest.mark.parametrize("damage", sorted(HALF_CREATED_BEFORE))
def test_the_segment_before_a_half_created_one_is_sealed(damage: str) -> None:
    # Rotation synced the segment whole and cut its preallocated zeros (durably)
    # before it created the next one: none of this is a crash mid-append.
    built, path, data, last = build_to_last_record()
    put_bytes(built.fs, path, {**TEARS, **MORE_TEARS}[damage](data, last))
    put_bytes(built.fs, f"{WAL_DIR}/{segment_file_name(26)}", b"")
    reason, at_end = HALF_CREATED_BEFORE[damage]
    offset = None if damage == "last_record_missing" else len(data) if at_end else last.offset
    assert_refuses(built.fs, path=path, offset=offset, seq=26 if at_end else 25, reason=reason)


# ---------------------------------------------------------------- row 6


@row(6)
@pytest.mark.parametrize("cut", ["mid_header", "mid_body"])
def test_torn_tail_of_sealed_segment_refuses_to_start(cut: str) -> None:
    built = build(25)
    path = built.segments()[0]
    data = built.fs.read(path)
    last = built.records(path)[-1]
    damaged = _cut_mid_header(data, last) if cut == "mid_header" else _cut_mid_body(data, last)
    put_bytes(built.fs, path, damaged)
    reason = "truncated record header" if cut == "mid_header" else "truncated record body"
    assert_refuses(
        built.fs,
        path=path,
        offset=last.offset,
        seq=last.seq,
        reason=f"sealed segment ends in damage ({reason})",
    )


@row(6)
@pytest.mark.parametrize("where", ["body", "header"])
def test_flipped_bit_in_sealed_segment_refuses_to_start(where: str) -> None:
    # The last record of a sealed segment: in the last segment this very damage
    # would be a torn tail (row 4); in a sealed one nothing may be cut.
    built = build(25)
    path = built.segments()[1]
    last = built.records(path)[-1]
    if where == "body":
        built.fs.flip_bit(path, last.offset + RECORD_HEADER_BYTES + 5, 3)
    else:
        built.fs.flip_bit(path, last.offset + 17, 0)  # inside seq
    assert_refuses(
        built.fs,
        path=path,
        offset=last.offset,
        seq=last.seq,
        reason=f"sealed segment ends in damage (bad {where} checksum)",
    )


# ---------------------------------------------------------------- row 7


@row(7)
@pytest.mark.parametrize("where", ["body", "header"])
def test_bad_record_followed_by_valid_ones_refuses_to_start(where: str) -> None:
    built = build(25)
    path = built.segments()[-1]
    records = built.records(path)
    assert len(records) >= 3
    bad = records[1]
    if where == "body":
        built.fs.flip_bit(path, bad.offset + RECORD_HEADER_BYTES + 7, 6)
    else:
        built.fs.flip_bit(path, bad.offset + 2, 1)  # inside the header checksum itself
    assert_refuses(
        built.fs,
        path=path,
        offset=bad.offset,
        seq=bad.seq,  # a bad header checksum hides the stored seq: the expected one
        reason=f"corrupt record (bad {where} checksum)",
    )


# ---------------------------------------------------------------- row 8


@row(8)
def test_gap_between_segments_refuses_to_start() -> None:
    built = build(35)
    segments = built.segments()
    assert len(segments) >= 4
    missing_first = built.records(segments[1])[0].seq
    resumes = built.records(segments[2])[0].seq
    built.fs.remove(segments[1])
    built.fs.fsync_dir(WAL_DIR)
    assert_refuses(
        built.fs,
        path=segments[2],
        offset=0,
        seq=missing_first,
        reason=(
            f"sequence gap between segments: expected seq {missing_first}, "
            f"segment starts at {resumes}"
        ),
    )


@row(8)
def test_overlapping_segments_refuse_to_start() -> None:
    # A stray copy of records 3.. named and headed as a segment starting at 3: the
    # log would repeat seqs 3..10.
    built = build(25)
    first = built.segments()[0]
    data = built.fs.read(first)
    third = built.records(first)[2]
    copy = f"{WAL_DIR}/{segment_file_name(3)}"
    put_bytes(built.fs, copy, encode_segment_header(3) + data[third.offset :])
    end_of_first = built.records(first)[-1].seq
    assert_refuses(
        built.fs,
        path=copy,
        offset=0,
        seq=end_of_first + 1,
        reason=f"sequence gap between segments: expected seq {end_of_first + 1}, segment starts at 3",
    )


@row(8)
def test_sequence_gap_inside_a_segment_refuses_to_start() -> None:
    built = build(25)
    path = built.segments()[-1]
    data = built.fs.read(path)
    records = built.records(path)
    gone, after = records[1], records[2]
    put_bytes(built.fs, path, data[: gone.offset] + data[after.offset :])
    assert_refuses(
        built.fs,
        path=path,
        offset=gone.offset,
        seq=after.seq,
        reason=f"corrupt record (sequence gap: expected {gone.seq}, found {after.seq})",
    )


@row(8)
def test_repeated_sequence_number_inside_a_segment_refuses_to_start() -> None:
    built = build(25)
    path = built.segments()[-1]
    data = built.fs.read(path)
    records = built.records(path)
    twice, after = records[0], records[1]
    copy = data[twice.offset : after.offset]
    put_bytes(built.fs, path, data[: after.offset] + copy + data[after.offset :])
    assert_refuses(
        built.fs,
        path=path,
        offset=after.offset,
        seq=twice.seq,
        reason=f"corrupt record (sequence repeat: expected {after.seq}, found {twice.seq})",
    )


# ---------------------------------------------------------------- row 9


@row(9)
@pytest.mark.parametrize(
    ("which", "at", "reason"),
    [
        ("sealed", 17, "bad header checksum"),  # first_seq
        ("sealed", 2, "bad magic"),
        ("sealed", 29, "nonzero reserved bytes"),  # not covered by the checksum
        ("last", 9, "bad header checksum"),  # version
    ],
)
def test_bad_segment_header_refuses_to_start(which: str, at: int, reason: str) -> None:
    built = build(25)
    path = built.segments()[0 if which == "sealed" else -1]
    built.fs.flip_bit(path, at, 2)
    assert_refuses(built.fs, path=path, offset=0, seq=None, reason=f"bad segment header: {reason}")


@row(5, 9)
def test_complete_but_damaged_header_of_empty_last_segment_refuses_to_start() -> None:
    # Row 5 removes only what a crash leaves (a prefix of a header, or zeros); a
    # whole header with a bad checksum is damage, as FORMAT.md 5.3 classifies it.
    built = build(25)
    path = f"{WAL_DIR}/{segment_file_name(26)}"
    header = bytearray(encode_segment_header(26))
    header[20] ^= 0x04
    put_bytes(built.fs, path, bytes(header))
    assert_refuses(
        built.fs, path=path, offset=0, seq=None, reason="bad segment header: bad header checksum"
    )


@row(9)
def test_segment_name_disagreeing_with_its_header_refuses_to_start() -> None:
    built = build(25)
    segments = built.segments()
    starts = built.records(segments[1])[0].seq
    renamed = f"{WAL_DIR}/{segment_file_name(starts + 1)}"
    built.fs.rename(segments[1], renamed)
    built.fs.fsync_dir(WAL_DIR)
    assert_refuses(
        built.fs,
        path=renamed,
        offset=0,
        seq=None,
        reason=f"segment header says first seq {starts}, its name says {starts + 1}",
    )


# ---------------------------------------------------------------- row 10


@row(10)
def test_snapshot_newer_than_log_refuses_to_start() -> None:
    built = build(25, snapshots_at=(25,))
    snap = f"{SNAP_DIR}/{25:020d}.snap"
    path = built.segments()[-1]
    records = built.records(path)
    cut = records[-3]  # keep the log up to seq 22
    put_bytes(built.fs, path, built.fs.read(path)[: cut.offset])
    assert_refuses(
        built.fs,
        path=snap,
        offset=None,
        seq=25,
        reason="snapshot at seq 25 is newer than the log, which ends at seq 22",
    )


@row(10)
def test_snapshot_without_any_segment_refuses_to_start() -> None:
    built = build(25, snapshots_at=(25,))
    for path in built.segments():
        built.fs.remove(path)
    built.fs.fsync_dir(WAL_DIR)
    assert_refuses(
        built.fs,
        path=f"{SNAP_DIR}/{25:020d}.snap",
        offset=None,
        seq=25,
        reason="a snapshot at seq 25 exists but the log is missing (no segment files)",
    )


# ---------------------------------------------------------------- rows 11, 12


def _snapshot_records(data: bytes) -> list[Any]:
    return [i for i in scan_snapshot_records(data) if hasattr(i, "kind")]


def damage_flipped_bit(fs: FaultyFileSystem, path: str) -> str:
    data = fs.read(path)
    first = _snapshot_records(data)[0]
    fs.flip_bit(path, first.offset + RECORD_HEADER_BYTES + 1, 5)
    return "bad body checksum"


def damage_missing_end(fs: FaultyFileSystem, path: str) -> str:
    data = fs.read(path)
    end = _snapshot_records(data)[-1]
    fs.put(path, data[: end.offset])
    return "incomplete snapshot: no end record"


def damage_forged_header(fs: FaultyFileSystem, path: str) -> str:
    data = fs.read(path)
    last_seq = int(path.rsplit("/", 1)[1].split(".")[0])
    fs.put(path, encode_snapshot_header(last_seq + 1) + data[FILE_HEADER_BYTES:])
    return f"last_seq {last_seq + 1} does not match file name"


def damage_header_bit(fs: FaultyFileSystem, path: str) -> str:
    fs.flip_bit(path, 18, 1)
    return "bad header: bad header checksum"


SNAPSHOT_DAMAGE = {
    "flipped_bit": damage_flipped_bit,
    "missing_end": damage_missing_end,
    "forged_header_last_seq": damage_forged_header,
    "flipped_header_bit": damage_header_bit,
}


@row(11)
@pytest.mark.parametrize("damage", sorted(SNAPSHOT_DAMAGE))
def test_damaged_newest_snapshot_falls_back_to_older_one(damage: str) -> None:
    built = build(28, snapshots_at=(10, 20))
    older, newest = built.snapshots()
    assert (older, newest) == (f"{SNAP_DIR}/{10:020d}.snap", f"{SNAP_DIR}/{20:020d}.snap")
    reason = SNAPSHOT_DAMAGE[damage](built.fs, newest)
    with pytest.raises(SnapshotError) as info:
        load_snapshot(built.fs, newest, CONFIG)
    assert info.value.reason == reason
    engine = assert_recovered(built, 28)
    report = engine.recovery_report
    assert (report.snapshot_path, report.snapshot_seq) == (older, 10)
    assert report.skipped_snapshots == [(newest, reason)]
    assert report.records_replayed == 18
    accepts_next_command(engine, 29)


def _trim_log_below(built: Built, seq: int) -> str:
    """Remove whole segments whose records all lie below `seq` (as retention
    would); return the new first segment."""
    for path in built.segments():
        records = built.records(path)
        if records and records[-1].seq < seq:
            built.fs.remove(path)
    built.fs.fsync_dir(WAL_DIR)
    return built.segments()[0]


@row(12)
def test_damaged_only_snapshot_and_log_not_starting_at_seq_1_refuses_to_start() -> None:
    built = build(28, snapshots_at=(20,), kept=1)
    (snap,) = built.snapshots()
    assert built.records(built.segments()[0])[0].seq > 1  # retention trimmed the log
    reason = damage_flipped_bit(built.fs, snap)
    assert_refuses(
        built.fs,
        path=snap,
        offset=None,
        seq=None,
        reason=f"no usable snapshot ({reason}) and the log does not start at seq 1",
    )


@row(12)
def test_no_snapshot_and_log_not_starting_at_seq_1_refuses_to_start() -> None:
    built = build(28)
    first = _trim_log_below(built, 12)
    starts = built.records(first)[0].seq
    assert starts > 1
    assert_refuses(
        built.fs,
        path=first,
        offset=None,
        seq=1,
        reason=f"log starts at seq {starts} and no snapshot covers seqs 1..{starts - 1}",
    )


@row(12)
def test_log_not_reaching_back_to_the_newest_snapshot_refuses_to_start() -> None:
    built = build(35, snapshots_at=(5,), kept=1)
    (snap,) = built.snapshots()
    first = _trim_log_below(built, 20)
    starts = built.records(first)[0].seq
    assert starts > 6
    assert_refuses(
        built.fs,
        path=snap,
        offset=None,
        seq=6,
        reason=(
            f"log starts at seq {starts} but the newest usable snapshot ends at seq 5: "
            f"records 6..{starts - 1} are missing"
        ),
    )


@row(11, 12)
def test_snapshot_whose_name_disagrees_with_its_header_is_not_used() -> None:
    # A valid snapshot of seq 10 under the name of seq 11, and a log that starts
    # at 12 (as retention would leave it for a snapshot at 11). Trusting the
    # header would replay 12.. on the state at 10 and silently lose record 11.
    built = build(28, snapshots_at=(10,), kept=1)
    (snap,) = built.snapshots()
    renamed = f"{SNAP_DIR}/{11:020d}.snap"
    built.fs.put(renamed, built.fs.read(snap))
    built.fs.remove(snap)
    first = _trim_log_below(built, 12)
    if built.records(first)[0].seq < 12:
        # Cut the log so that it starts exactly at 12.
        data = built.fs.read(first)
        at = next(r for r in built.records(first) if r.seq == 12)
        first = f"{WAL_DIR}/{segment_file_name(12)}"
        built.fs.put(first, encode_segment_header(12) + data[at.offset :])
        for path in built.segments():
            if path < first:
                built.fs.remove(path)
    assert built.records(built.segments()[0])[0].seq == 12
    reason = "last_seq 10 does not match file name"
    with pytest.raises(SnapshotError) as info:
        load_snapshot(built.fs, renamed, CONFIG)
    assert info.value.reason == reason
    assert_refuses(
        built.fs,
        path=renamed,
        offset=None,
        seq=None,
        reason=f"no usable snapshot ({reason}) and the log does not start at seq 1",
    )


# ---------------------------------------------------------------- row 13


def _envelope_error(body: bytes) -> str:
    try:
        decode_envelope(body)
    except ValueError as exc:
        return str(exc)
    raise AssertionError("the body decodes")


UNDECODABLE = {
    "not_msgpack": lambda: b"\xc1\xc1",
    "unknown_event_type": lambda: encode_envelope(T0, 4, [[0, 1, "x"]]),
    "wrong_event_version": lambda: encode_envelope(T0, 4, [[3, 7, numbered_id(0), 1, None]]),
    "event_does_not_apply": lambda: encode_envelope(T0, 4, [[3, 1, numbered_id(999), 1, None]]),
}
UNDECODABLE_REASONS = {
    "not_msgpack": lambda body: _envelope_error(body),
    "unknown_event_type": lambda body: "unknown event type id 0",
    "wrong_event_version": lambda body: "JobAcked version 7 is not supported (expected 1)",
    "event_does_not_apply": lambda body: f"JobAcked for {numbered_id(999)} attempt 1: job is None",
}


@row(13)
@pytest.mark.parametrize("body", sorted(UNDECODABLE))
def test_checksummed_record_that_does_not_replay_refuses_to_start(body: str) -> None:
    built = build(25)
    path = built.segments()[-1]
    data = built.fs.read(path)
    payload = UNDECODABLE[body]()
    put_bytes(built.fs, path, data + encode_record(26, RECORD_KIND_COMMAND, payload))
    assert_refuses(
        built.fs,
        path=path,
        offset=len(data),
        seq=26,
        reason=f"record does not replay: {UNDECODABLE_REASONS[body](payload)}",
    )


@row(13)
def test_undecodable_last_record_of_a_segment_below_the_snapshot_refuses_to_start() -> None:
    # Records a snapshot covers are checksummed, not replayed; but the last one of
    # each segment is decoded for the segment's age (log retention).
    built = build(25, snapshots_at=(25,), kept=5)
    options = inline_options(segment_bytes_max=4096, snapshots_kept=5)
    first = built.segments()[0]
    records = built.records(first)
    last = records[-1]
    data = built.fs.read(first)
    forged = encode_record(last.seq, RECORD_KIND_COMMAND, b"\xc1")
    put_bytes(built.fs, first, data[: last.offset] + forged)
    assert_refuses(
        built.fs,
        path=first,
        offset=last.offset,
        seq=last.seq,
        reason="record does not decode: " + _envelope_error(b"\xc1"),
        options=options,
    )


# ---------------------------------------------------------------- row 14


@row(14)
def test_leftover_snapshot_temp_file_is_deleted() -> None:
    built = build(25, snapshots_at=(10,))
    tmp = f"{SNAP_DIR}/{20:020d}.snap.tmp"
    put_bytes(built.fs, tmp, encode_snapshot_header(20) + b"half a snapshot")
    engine = assert_recovered(built, 25)
    assert engine.recovery_report.removed_files == [tmp]
    assert not built.fs.exists(tmp)
    assert tmp not in built.fs.durable_files()  # the removal was made durable
    assert engine.recovery_report.snapshot_seq == 10
    accepts_next_command(engine, 26)


# ---------------------------------------------------------------- rows 15-18: damaged history


def _segment_starting_at(built: Built, seq: int) -> str:
    path = f"{WAL_DIR}/{segment_file_name(seq)}"
    assert path in built.segments(), built.segments()
    return path


def _history_damage(built: Built, path: str, damage: str) -> tuple[int | None, int | None, str]:
    """Damage `path` as named; (offset, seq, reason) recovery must report."""
    records = built.records(path)
    if damage == "flipped_bit_in_a_middle_record":
        bad = records[3]
        built.fs.flip_bit(path, bad.offset + RECORD_HEADER_BYTES + 9, 2)
        return bad.offset, bad.seq, "corrupt record (bad body checksum)"
    if damage == "flipped_bit_in_the_last_record":
        last = records[-1]
        built.fs.flip_bit(path, last.offset + RECORD_HEADER_BYTES + 5, 3)
        return last.offset, last.seq, "sealed segment ends in damage (bad body checksum)"
    if damage == "cut_mid_record":
        last = records[-1]
        put_bytes(built.fs, path, _cut_mid_body(built.fs.read(path), last))
        return last.offset, last.seq, "sealed segment ends in damage (truncated record body)"
    if damage == "bad_header":
        built.fs.flip_bit(path, 17, 2)
        return 0, None, "bad segment header: bad header checksum"
    raise AssertionError(damage)


HISTORY_DAMAGE = (
    "flipped_bit_in_a_middle_record",
    "flipped_bit_in_the_last_record",
    "cut_mid_record",
    "bad_header",
)


@row(15)
@pytest.mark.parametrize("damage", HISTORY_DAMAGE)
def test_damage_wholly_below_the_snapshot_starts_with_every_job_and_reports_damaged_history(
    damage: str,
) -> None:
    # Snapshots at 22 and 35; retention kept segments 21..30, 31..40, 41..45.
    # Segment 21..30 is history: the snapshot at 35 holds the state after it.
    built = build(45, snapshots_at=(22, 35))
    path = _segment_starting_at(built, 21)
    offset, seq, reason = _history_damage(built, path, damage)
    damaged = built.fs.durable_files()[path]
    engine = assert_recovered(built, 45)
    report = engine.recovery_report
    assert (report.snapshot_seq, report.records_replayed) == (35, 10)
    assert report.damaged_history == [
        recovery.DamagedHistory(path, offset, seq, reason, 21, 30, 35)
    ]
    assert "records 21..30 are lost to audits" in report.damaged_history[0].describe()
    # Left in place, unchanged, for `sepp-log repair --set-aside-history`.
    assert built.fs.durable_files()[path] == damaged
    engine.close()
    again = open_engine(built.fs, OPTIONS)  # reported on every start, until set aside
    assert again.recovery_report.damaged_history == report.damaged_history
    accepts_next_command(again, 46)


@row(16)
@pytest.mark.parametrize("missing", ["a_whole_segment", "the_end_of_a_segment"])
def test_records_missing_wholly_below_the_snapshot_start_and_are_reported(missing: str) -> None:
    built = build(45, snapshots_at=(5, 25, 35), kept=3)
    eleven, twenty_one = _segment_starting_at(built, 11), _segment_starting_at(built, 21)
    if missing == "a_whole_segment":
        built.fs.remove(eleven)
        built.fs.fsync_dir(WAL_DIR)
        first_missing = 11
    else:  # cut at a record boundary: no torn record, just fewer of them
        cut = built.records(eleven)[7]
        put_bytes(built.fs, eleven, built.fs.read(eleven)[: cut.offset])
        first_missing = cut.seq
    engine = assert_recovered(built, 45)
    reason = f"sequence gap between segments: expected seq {first_missing}, segment starts at 21"
    assert engine.recovery_report.damaged_history == [
        recovery.DamagedHistory(twenty_one, 0, first_missing, reason, first_missing, 20, 35)
    ]
    accepts_next_command(engine, 46)


@row(17)
@pytest.mark.parametrize("where", ["segment_reaching_past_the_snapshot", "last_segment"])
def test_damage_in_a_segment_holding_records_after_the_snapshot_refuses_to_start(
    where: str,
) -> None:
    if where == "last_segment":
        # The snapshot covers every record, but the writer appends to this segment.
        built = build(25, snapshots_at=(25,))
        path = built.segments()[-1]
    else:
        built = build(45, snapshots_at=(22, 35))
        path = _segment_starting_at(built, 31)  # 31..40: 36..40 are after the snapshot
    bad = built.records(path)[3]
    assert bad.seq <= 35
    built.fs.flip_bit(path, bad.offset + RECORD_HEADER_BYTES + 9, 2)
    assert_refuses(
        built.fs,
        path=path,
        offset=bad.offset,
        seq=bad.seq,
        reason="corrupt record (bad body checksum)",
    )


@row(18)
def test_damage_covered_only_by_a_damaged_newest_snapshot_refuses_to_start() -> None:
    # Snapshot 35 is damaged: recovery falls back to 20 and needs records 21..35,
    # and segment 21..30 is damaged too. Both copies of those records are gone.
    built = build(45, snapshots_at=(20, 35))
    newest = f"{SNAP_DIR}/{35:020d}.snap"
    snapshot_reason = damage_flipped_bit(built.fs, newest)
    path = _segment_starting_at(built, 21)
    offset, seq, reason = _history_damage(built, path, "flipped_bit_in_a_middle_record")
    assert_refuses(
        built.fs,
        path=path,
        offset=offset,
        seq=seq,
        reason=(
            f"{reason}; only the snapshot {newest} covers it, and it is damaged "
            f"({snapshot_reason}): the records are lost in both"
        ),
    )


@row(11, 15)
def test_damage_below_the_older_snapshot_used_after_a_damaged_newest_one_is_history() -> None:
    built = build(45, snapshots_at=(5, 25, 35), kept=3)
    newest = f"{SNAP_DIR}/{35:020d}.snap"
    snapshot_reason = damage_flipped_bit(built.fs, newest)
    path = _segment_starting_at(built, 11)  # 11..20: below the snapshot at 25
    offset, seq, reason = _history_damage(built, path, "flipped_bit_in_the_last_record")
    engine = assert_recovered(built, 45)
    report = engine.recovery_report
    assert report.skipped_snapshots == [(newest, snapshot_reason)]
    assert report.damaged_history == [
        recovery.DamagedHistory(path, offset, seq, reason, 11, 20, 25)
    ]
    accepts_next_command(engine, 46)


# ---------------------------------------------------------------- rows 19, 20: unsynced holes


def build_with_last_batch(records: int, batch: int, *, snapshot: bool = False) -> Built:
    """`build(records)`, then `batch` more enqueues written and synced as one batch:
    each of them claims seq `records` synced (FORMAT.md 5.4), as it would if the
    power had failed before the batch's sync."""
    built = build(records)
    engine = open_engine(built.fs, OPTIONS)
    for n in range(records, records + batch):
        decision, barrier = engine.execute(enqueue_one(n, payload_bytes=300), T0 + 1_000 * n)
        built.history.executed(decision, barrier)
    engine.flush()
    if snapshot:
        engine.snapshot_now()
    engine.close()
    built.last_seq = records + batch
    return built


def _zero(data: bytes, start: int, end: int) -> bytes:
    return data[:start] + bytes(end - start) + data[end:]


HOLES = {
    # A lost page: two whole records read as zeros, the records after survived.
    "lost_page": lambda data, r: _zero(data, r[1].offset, r[3].offset),
    # A torn page: the first record's body cut short, the next one's header too.
    "torn_page": lambda data, r: _zero(
        data, r[1].offset + RECORD_HEADER_BYTES + 40, r[2].offset + 10
    ),
}


@row(19)
@pytest.mark.parametrize("hole", sorted(HOLES))
def test_hole_in_the_unsynced_tail_before_records_that_say_so_is_truncated(hole: str) -> None:
    built = build_with_last_batch(20, 6)
    path = built.segments()[-1]
    data = built.fs.read(path)
    batch = [r for r in built.records(path) if r.seq > 20]
    assert [r.seq for r in batch] == [21, 22, 23, 24, 25, 26]
    assert {decode_envelope(r.body).synced_seq for r in batch} == {20}
    put_bytes(built.fs, path, HOLES[hole](data, batch))
    engine = assert_recovered(built, 21)
    cut = len(data) - batch[1].offset
    # Seqs 24..26 were valid after the hole, and are cut with it: never synced.
    assert engine.recovery_report.unsynced_hole == (path, batch[1].offset, cut, 3)
    assert engine.recovery_report.truncated is None
    assert built.fs.durable_files()[path] == data[: batch[1].offset]
    accepts_next_command(engine, 22)


def _v1_envelopes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the engine write version 1 envelopes, as a sepp before them did."""
    from sepp.storage import engine as engine_module

    def v1(time_ms: object, kind: object, events: object, synced_seq: object = None) -> list[bytes]:
        return [encode_envelope(time_ms, kind, events)]

    monkeypatch.setattr(engine_module, "encode_envelope_parts", v1)


@row(20)
@pytest.mark.parametrize(
    "evidence",
    ["claims_it_synced", "claims_nothing", "snapshot_covers_it", "rotation_sealed_it"],
)
def test_hole_that_the_log_says_was_synced_refuses_to_start(
    evidence: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if evidence == "claims_it_synced":
        # Flushed one by one: seq 24 was written after seq 23's sync and says so.
        built = build(25)
        records = [r for r in built.records(built.segments()[-1]) if r.seq >= 22]
    else:
        if evidence == "claims_nothing":
            _v1_envelopes(monkeypatch)
        built = build_with_last_batch(20, 6, snapshot=evidence == "snapshot_covers_it")
        records = [r for r in built.records(built.segments()[-1]) if r.seq > 20]
    path = built.segments()[-1]
    data = built.fs.read(path)
    put_bytes(built.fs, path, HOLES["lost_page"](data, records))
    if evidence == "rotation_sealed_it":
        # A crash right after rotation created the next segment (row 5 removes
        # it): rotation syncs a segment before creating the next, so the batch
        # was synced however stale its claims are, and the damage is corruption.
        put_bytes(built.fs, f"{WAL_DIR}/{segment_file_name(built.last_seq + 1)}", b"")
    monkeypatch.undo()
    assert_refuses(
        built.fs,
        path=path,
        offset=records[1].offset,
        seq=records[1].seq,
        reason="corrupt record (bad header checksum)",
    )


# ---------------------------------------------------------------- the table itself


def _table_rows() -> set[int]:
    doc = recovery.__doc__ or ""
    return {int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", doc, re.MULTILINE)}


def test_every_row_of_the_decision_table_has_a_test() -> None:
    rows = _table_rows()
    assert rows == set(range(1, max(rows) + 1))
    module = sys.modules[__name__]
    covered = set()
    for name, value in vars(module).items():
        if name.startswith("test_"):
            covered.update(getattr(value, ROW_ATTR, ()))
    assert covered == rows


def test_refusal_message_names_file_offset_seq_and_the_verify_tool() -> None:
    error = RecoveryError("corrupt record (x)", path="/d/wal/1.log", offset=40, seq=7)
    text = str(error)
    assert "corrupt record (x)" in text and "/d/wal/1.log" in text
    assert "offset 40" in text and "seq 7" in text
    assert "sepp-log verify" in text


# ---------------------------------------------------------------- row 21


TEAR_REASONS = {
    "cut_mid_header": "truncated record header",
    "cut_mid_body": "truncated record body",
    "zero_filled": "zero-filled tail",
    "flipped_bit_in_body": "bad body checksum",
    "flipped_bit_in_header": "bad header checksum",
}


@row(21)
@pytest.mark.parametrize("tear", sorted(TEARS))
def test_torn_tail_a_snapshot_says_was_durable_refuses_to_start_and_cuts_nothing(
    tear: str,
) -> None:
    built = build(25, snapshots_at=(25,))
    path = built.segments()[-1]
    data = built.fs.read(path)
    last = built.records(path)[-1]
    assert last.seq == 25
    damaged = TEARS[tear](data, last)
    put_bytes(built.fs, path, damaged)
    assert_refuses(
        built.fs,
        path=path,
        offset=last.offset,
        seq=25,
        reason=f"the last segment ends in damage ({TEAR_REASONS[tear]}) at seq 25, "
        "which the snapshot at seq 25 says was durable",
    )
    assert built.fs.read(path) == damaged  # nothing was cut
