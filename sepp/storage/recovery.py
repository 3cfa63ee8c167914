"""Crash recovery: rebuild the state from the newest usable snapshot plus the log
after it, following a decision table.

Owns: `recover()`, `RecoveryReport`, `RecoveryError` and the table below. Each row
has a test named after it (tests/storage/test_recovery_table.py).

| # | What recovery finds | Decision |
|---|---|---|
| 1 | no segments and no snapshot | fresh start at seq 1 |
| 2 | segments from seq 1, no snapshot | replay everything |
| 3 | a snapshot at S and segments covering S+1.. | load it, replay records > S |
| 4 | a torn record or a zero-filled tail (the writer's preallocated space) at the end of the **last** segment | truncate it (a crash mid-append, never acknowledged) |
| 5 | a last segment whose header is torn (a prefix of the magic) and holds nothing else, or that is all zeros | remove it (a crash mid-rotation, before any record), once the rest checks out; the segment before it counts as **sealed** (rotation synced it whole first): it must end undamaged with the record just before the removed one's first seq (rows 6, 20) |
| 6 | damage (torn or not) in a **sealed** segment | refuse to start |
| 7 | a bad record followed by valid ones, anywhere (but row 19) | refuse to start |
| 8 | a sequence gap or repeat, inside a segment or between segments | refuse to start |
| 9 | a bad segment header (not rows 5) or a name/header mismatch | refuse to start |
| 10 | a snapshot newer than the log | refuse to start |
| 11 | newest snapshot damaged or incomplete, an older one + the log cover | use the older one, rename the damaged file `*.damaged` and report it |
| 12 | no usable snapshot and the log does not start at seq 1 | refuse to start |
| 13 | a checksummed record that does not decode or apply | refuse to start |
| 14 | leftover snapshot temp files | delete them |
| 15 | damage (rows 6, 7, an inner sequence gap, a bad header as in row 9) in a **sealed** segment wholly below the snapshot recovery starts from (the next segment starts at or below that snapshot's seq + 1) | start: it is damaged *history*, the snapshot holds the state; report it (`damaged_history`), leave the file for `sepp-log repair --set-aside-history` |
| 16 | records missing between two segments, wholly below the snapshot recovery starts from | start and report it as damaged history (row 15) |
| 17 | damage in a segment that also holds records after the snapshot recovery starts from, or in the **last** segment (the one appended to) | refuse to start (rows 6-9): those records are state |
| 18 | newest snapshot damaged (row 11), the older one used, and log damage above the older snapshot (covered only by the damaged one) | refuse to start: the records are lost in both copies; the refusal names the damaged snapshot |
| 19 | a record with a bad checksum in the **last** segment, above every snapshot, followed by valid records that all say it was never synced (version 2 envelopes whose `synced_seq` is below its seq): a hole that out-of-order writeback of the unsynced tail leaves at a power loss | truncate at the hole and report it (`unsynced_hole`): nothing from the hole on was acknowledged through a sync |
| 20 | the same, but a valid record after the hole claims its seq synced, or claims nothing (a version 1 envelope), or the hole is at or below a snapshot (even a damaged one), or a half-created segment (row 5) follows, which proves rotation synced this one whole | refuse to start (row 7): synced data is gone, or nothing shows it was not |
| 21 | a torn record or zeros at the end of the **last** segment where a snapshot (even a damaged one) says the log was durable: its seq is at or below the snapshot's | refuse to start, naming the file and offset, and cut nothing: row 4's crash cannot tear a synced record, so this is damage |

A refusal raises `RecoveryError` with the file, byte offset, sequence number and
reason, and points the operator at `sepp-log verify`. Nothing is ever skipped
silently: one lost JobAcked or JobEnqueued would corrupt everything after it.

Rows 15-18: records at or below the snapshot recovery starts from are never
replayed (row 3), so damage wholly below it loses history (audits, `sepp-log
dump`), not state. Which snapshot that is comes first (rows 3, 11, 12: the newest
that loads and that the log continues), then the log is judged against it: damage
between a damaged newest snapshot and the older one used is not history (row 18).
A segment is wholly below the snapshot when the *next* segment's name says it
starts at or below the snapshot's seq + 1: the damage itself may hide where the
damaged segment's records end. The last segment is never history (row 17): the
writer appends to it, after the damage.

Must not import: asyncio, sockets.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

from log_format import (
    FILE_HEADER_BYTES,
    RECORD_HEADER_BYTES,
    SEGMENT_MAGIC,
    Corruption,
    FormatError,
    Record,
    SegmentHeader,
    TornTail,
    decode_envelope,
    decode_segment_header,
    parse_segment_file_name,
    parse_snapshot_file_name,
    scan_records,
    unsynced_hole,
)
from log_format._bytes import all_zero, byte_view
from sepp.core.config import CoreConfig
from sepp.core.state import State
from sepp.storage.fs import FileSystem
from sepp.storage.replay import ReplayError, replay_run
from sepp.storage.snapshots import SnapshotError, load_snapshot
from sepp.storage.wal import Segment

WAL_DIR = "wal"
SNAPSHOT_DIR = "snapshots"
SNAPSHOT_TMP_SUFFIX = ".tmp"
DAMAGED_SUFFIX = ".damaged"


class RecoveryError(RuntimeError):
    """The data directory cannot be recovered without an operator."""

    def __init__(
        self,
        reason: str,
        *,
        path: str | None = None,
        offset: int | None = None,
        seq: int | None = None,
    ) -> None:
        parts = [reason]
        if path is not None:
            parts.append(f"file {path}")
        if offset is not None:
            parts.append(f"offset {offset}")
        if seq is not None:
            parts.append(f"seq {seq}")
        super().__init__(
            "; ".join(parts) + ". sepp refuses to start rather than lose acknowledged data: run "
            "`sepp-log verify DATA_DIR` for a full report"
        )
        self.reason = reason
        self.path = path
        self.offset = offset
        self.seq = seq


@dataclass
class RecoveryReport:
    snapshot_path: str | None = None
    snapshot_seq: int = 0
    skipped_snapshots: list[tuple[str, str]] = field(default_factory=list)
    records_replayed: int = 0
    events_replayed: int = 0
    truncated: tuple[str, int, int] | None = None  # (path, offset, bytes cut)
    # The last segment's zero-filled tail, cut: (path, offset, bytes cut).
    zero_tail: tuple[str, int, int] | None = None
    # Row 19: a hole in the unsynced tail, cut with everything after it: (path,
    # offset, bytes cut, valid records cut after the hole).
    unsynced_hole: tuple[str, int, int, int] | None = None
    removed_files: list[str] = field(default_factory=list)
    ignored_files: list[str] = field(default_factory=list)
    last_seq: int = 0
    snapshot_load_s: float = 0.0
    replay_s: float = 0.0
    # Rows 15, 16: damage wholly below the snapshot used, started past.
    damaged_history: list[DamagedHistory] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class DamagedHistory:
    """Damage in (or records missing before) a sealed segment wholly below the
    snapshot recovery started from: records `first_seq..last_seq` (what the segment
    should hold) are lost to audits, not to the state (`snapshot_seq` holds it)."""

    path: str
    offset: int | None
    seq: int | None
    reason: str
    first_seq: int
    last_seq: int
    snapshot_seq: int

    def describe(self) -> str:
        where = [self.path]
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        if self.seq is not None:
            where.append(f"seq {self.seq}")
        return (
            f"damaged history in {' '.join(where)}: {self.reason}; records "
            f"{self.first_seq}..{self.last_seq} are lost to audits, but the snapshot at seq "
            f"{self.snapshot_seq} holds the state"
        )


@dataclass
class Recovered:
    state: State
    segments: list[Segment]
    next_seq: int
    report: RecoveryReport


def is_segment_being_created(data: bytes) -> bool:
    """Whether a last segment's bytes are what a crash while creating it leaves
    (row 5: recovery removes it). `sepp-log verify` asks the same question, so
    both judge the segment before it alike."""
    return _header(data) is None


def half_created_mismatch(expected: int, created_seq: int) -> str:
    """Why the log before a half-created segment (row 5) does not end where that
    segment was to start: recovery refuses it and `sepp-log verify` reports it
    in these words."""
    missing = (
        f": records {expected}..{created_seq - 1} are missing" if expected < created_seq else ""
    )
    return (
        f"the log ends at seq {expected - 1}, but the segment being created when the "
        f"process stopped was to start at seq {created_seq}{missing}"
    )


def _header(data: bytes) -> SegmentHeader | str | None:
    """The segment header, a reason it is bad, or None if it is torn (a prefix of
    a header or zeros: what a crash while creating the segment leaves)."""
    try:
        return decode_segment_header(data)
    except FormatError as exc:
        head = data[: min(len(data), FILE_HEADER_BYTES)]
        # A strict prefix of a header (the magic so far) or a file of zeros of any
        # length (blocks allocated, never written) is torn; a 32-byte header that
        # fails its checks amid other bytes is damage (FORMAT.md 5.3), not a crash.
        if not any(data):
            return None
        if len(data) < FILE_HEADER_BYTES and SEGMENT_MAGIC.startswith(head[: len(SEGMENT_MAGIC)]):
            return None
        return exc.reason


def _record_time(path: str, record: Record) -> int:
    """The time of a checksummed record (a segment's age, for log retention)."""
    try:
        return decode_envelope(record.body).time_ms
    except FormatError as exc:
        raise RecoveryError(
            f"record does not decode: {exc}", path=path, offset=record.offset, seq=record.seq
        ) from exc


def _history(
    report: RecoveryReport,
    segments: list[Segment],
    path: str,
    size: int,
    first_seq: int,
    last_seq: int,
    base_seq: int,
    offset: int | None,
    seq: int | None,
    reason: str,
) -> None:
    """Rows 15, 16: started past, reported, and the file kept as a segment of the
    log (retention deletes it in its turn; its age is its last readable record's,
    0 -- old -- when none is)."""
    report.damaged_history.append(
        DamagedHistory(path, offset, seq, reason, first_seq, last_seq, base_seq)
    )
    segments.append(Segment(first_seq, path, size, last_seq))


def _covering_note(report: RecoveryReport, seq: int) -> str:
    """Row 18: a refusal of damage that a skipped (damaged) snapshot would have
    covered says so: the records are lost in both copies."""
    for path, reason in report.skipped_snapshots:
        snap_seq = parse_snapshot_file_name(os.path.basename(path))
        if snap_seq is not None and seq <= snap_seq:
            return (
                f"; only the snapshot {path} covers it, and it is damaged ({reason}): "
                "the records are lost in both"
            )
    return ""


def list_snapshots(fs: FileSystem, snap_dir: str) -> list[tuple[int, str]]:
    out = []
    for name in fs.listdir(snap_dir):
        seq = parse_snapshot_file_name(name)
        if seq is not None:
            out.append((seq, os.path.join(snap_dir, name)))
    return sorted(out)


def recover(fs: FileSystem, data_dir: str, config: CoreConfig) -> Recovered:
    report = RecoveryReport()
    wal_dir = os.path.join(data_dir, WAL_DIR)
    snap_dir = os.path.join(data_dir, SNAPSHOT_DIR)
    if not (fs.exists(wal_dir) and fs.exists(snap_dir)):
        # A new directory entry is durable only once its parent is synced: without
        # this a power loss right after the first start could lose the whole log.
        fs.makedirs(wal_dir)
        fs.makedirs(snap_dir)
        fs.fsync_dir(data_dir)
        parent = os.path.dirname(os.path.abspath(data_dir))
        if parent != os.path.abspath(data_dir):
            fs.fsync_dir(parent)

    # Row 14: a temp file is a snapshot whose publication never finished.
    for name in fs.listdir(snap_dir):
        if name.endswith(SNAPSHOT_TMP_SUFFIX):
            fs.remove(os.path.join(snap_dir, name))
            report.removed_files.append(os.path.join(snap_dir, name))
    seg_files: list[tuple[int, str]] = []
    for name in fs.listdir(wal_dir):
        seq = parse_segment_file_name(name)
        if seq is None:
            report.ignored_files.append(os.path.join(wal_dir, name))
        else:
            seg_files.append((seq, os.path.join(wal_dir, name)))
    seg_files.sort()
    if report.removed_files:
        fs.fsync_dir(snap_dir)

    # Row 5: a last segment that was being created when the process died. It is
    # removed only once the rest checks out: it is evidence. Rotation seals
    # (syncs) a segment before it creates the next one, so the segment before a
    # half-created one was synced whole, and damage in it is never an unsynced
    # hole (row 19) -- on this start or, after a refusal, on the next.
    half_created: tuple[int, str] | None = None
    if seg_files and is_segment_being_created(fs.read(seg_files[-1][1])):
        half_created = seg_files.pop()

    first_log_seq = seg_files[0][0] if seg_files else None

    # Rows 3, 11, 12: the newest snapshot that loads and that the log continues.
    state: State | None = None
    base_seq = 0
    for snap_seq, path in reversed(list_snapshots(fs, snap_dir)):
        if first_log_seq is not None and first_log_seq > snap_seq + 1:
            # The log no longer reaches back to this snapshot; older ones even less.
            if state is None:
                raise RecoveryError(
                    f"log starts at seq {first_log_seq} but the newest usable snapshot "
                    f"ends at seq {snap_seq}: records {snap_seq + 1}..{first_log_seq - 1} are missing",
                    path=path,
                    seq=snap_seq + 1,
                )
            break
        started = time.perf_counter()
        try:
            state, base_seq = load_snapshot(fs, path, config)
        except SnapshotError as exc:
            report.skipped_snapshots.append((path, exc.reason))
            continue
        report.snapshot_load_s = time.perf_counter() - started
        report.snapshot_path = path
        report.snapshot_seq = base_seq
        break
    if state is None:
        if report.skipped_snapshots and (first_log_seq is None or first_log_seq > 1):
            path, reason = report.skipped_snapshots[0]
            raise RecoveryError(
                f"no usable snapshot ({reason}) and the log does not start at seq 1", path=path
            )
        if first_log_seq is not None and first_log_seq != 1:
            raise RecoveryError(
                f"log starts at seq {first_log_seq} and no snapshot covers seqs 1..{first_log_seq - 1}",
                path=seg_files[0][1],
                seq=1,
            )
        state = State(config)

    started = time.perf_counter()
    snapshots_seq = max((seq for seq, _path in list_snapshots(fs, snap_dir)), default=0)
    segments: list[Segment] = []
    expected = seg_files[0][0] if seg_files else base_seq + 1
    for index, (name_seq, path) in enumerate(seg_files):
        is_last = index == len(seg_files) - 1
        # Synced whole, ending with its last record: every segment but the last,
        # and the last too when a half-created one follows it (row 5).
        sealed = not is_last or half_created is not None
        # Rows 15-17: the last seq this segment should hold, by the next segment's
        # name; at or below the snapshot, damage in the segment is history.
        history_end = base_seq + 1
        if not is_last and seg_files[index + 1][0] - 1 <= base_seq:
            history_end = seg_files[index + 1][0] - 1
        is_history = history_end <= base_seq and name_seq >= expected
        data = fs.read(path)
        header = _header(data)
        if not isinstance(header, SegmentHeader):
            reason = f"bad segment header: {header or 'torn'}"
            if is_history:
                _history(
                    report,
                    segments,
                    path,
                    len(data),
                    expected,
                    history_end,
                    base_seq,
                    0,
                    None,
                    reason,
                )
                segments[-1].first_seq = name_seq
                expected = history_end + 1
                continue
            raise RecoveryError(reason + _covering_note(report, name_seq), path=path, offset=0)
        if header.first_seq != name_seq:
            raise RecoveryError(
                f"segment header says first seq {header.first_seq}, its name says {name_seq}",
                path=path,
                offset=0,
            )
        if header.first_seq != expected:
            reason = (
                f"sequence gap between segments: expected seq {expected}, segment starts at "
                f"{header.first_seq}"
            )
            if expected < header.first_seq <= base_seq + 1:
                # Row 16: the missing records are all below the snapshot.
                report.damaged_history.append(
                    DamagedHistory(
                        path, 0, expected, reason, expected, header.first_seq - 1, base_seq
                    )
                )
                expected = header.first_seq
            else:
                raise RecoveryError(
                    reason + _covering_note(report, expected),
                    path=path,
                    offset=0,
                    seq=expected,
                )
        segment = Segment(header.first_seq, path, len(data), header.first_seq - 1)
        last_time = 0
        last_record: Record | None = None
        offset = FILE_HEADER_BYTES
        terminal: Any = None
        # Records at or below the snapshot: only checksummed.
        if expected <= base_seq:
            for item in scan_records(data, start_offset=offset, expected_seq=expected):
                if type(item) is not Record:
                    terminal = item
                    break
                last_record = item
                segment.last_seq = item.seq
                expected = item.seq + 1
                offset = item.offset + RECORD_HEADER_BYTES + len(item.body)
                if item.seq == base_seq:
                    break
        # Records after it: replayed through the fast path, which stops at the
        # first record that is not valid; scan_records then says what that is.
        if terminal is None:
            try:
                run = replay_run(state, data, start_offset=offset, expected_seq=expected)
            except ReplayError as exc:
                raise RecoveryError(
                    str(exc),
                    path=path,
                    offset=getattr(exc, "offset", None),
                    seq=getattr(exc, "seq", None),
                ) from exc
            if run.records:
                last_time = run.last_time_ms
                last_record = None
                report.records_replayed += run.records
                report.events_replayed += run.events
                segment.last_seq = run.seq - 1
                expected = run.seq
            terminal = next(
                iter(scan_records(data, start_offset=run.offset, expected_seq=expected))
            )
            if type(terminal) is Record:
                # Checksums good, but the envelope did not decode.
                try:
                    decode_envelope(terminal.body)
                    reason = "record does not replay"
                except FormatError as exc:
                    reason = f"record does not replay: {exc}"
                raise RecoveryError(reason, path=path, offset=terminal.offset, seq=terminal.seq)
        if is_history and (type(terminal) is TornTail or type(terminal) is Corruption):
            # Row 15: damage in a sealed segment the snapshot wholly covers.
            damage_seq = expected
            if type(terminal) is Corruption and terminal.seq is not None:
                damage_seq = terminal.seq
            _history(
                report,
                segments,
                path,
                len(data),
                header.first_seq,
                history_end,
                base_seq,
                terminal.offset,
                damage_seq,
                f"{'sealed segment ends in damage' if type(terminal) is TornTail else 'corrupt record'} "
                f"({terminal.reason})",
            )
            segments[-1].last_time_ms = (
                _record_time(path, last_record) if last_record is not None else 0
            )
            expected = history_end + 1
            continue
        hole = None
        if type(terminal) is Corruption and not sealed and expected > snapshots_seq:
            # Rows 19, 20: the records after the damage say whether it was synced
            # (a snapshot, even a damaged one, says its seq was: it is published
            # only once the log under it is synced).
            hole = unsynced_hole(data, offset=terminal.offset, seq=expected)
        if hole is not None:
            cut = len(data) - hole.offset
            fs.truncate(path, hole.offset)
            segment.size = hole.offset
            report.unsynced_hole = (path, hole.offset, cut, hole.records)
        elif type(terminal) is TornTail:
            if sealed:
                raise RecoveryError(
                    f"sealed segment ends in damage ({terminal.reason})"
                    + _covering_note(report, expected),
                    path=path,
                    offset=terminal.offset,
                    seq=expected,
                )
            if expected <= snapshots_seq:
                # Row 21: a snapshot is published only once the log under it is
                # synced, so this record was durable: damage, not a torn append.
                raise RecoveryError(
                    f"the last segment ends in damage ({terminal.reason}) at seq {expected}, "
                    f"which the snapshot at seq {snapshots_seq} says was durable"
                    + _covering_note(report, expected),
                    path=path,
                    offset=terminal.offset,
                    seq=expected,
                )
            cut = len(data) - terminal.offset
            fs.truncate(path, terminal.offset)
            segment.size = terminal.offset
            if all_zero(byte_view(data), terminal.offset, len(data)):
                # The writer's preallocated zeros (or an append whose data never
                # reached the disk): nothing torn to report.
                report.zero_tail = (path, terminal.offset, cut)
            else:
                report.truncated = (path, terminal.offset, cut)
        elif type(terminal) is Corruption:
            seq = terminal.seq if terminal.seq is not None else expected
            raise RecoveryError(
                f"corrupt record ({terminal.reason})" + _covering_note(report, seq),
                path=path,
                offset=terminal.offset,
                seq=seq,
            )
        if last_record is not None and last_time == 0:
            # Records at or below the snapshot are only checksummed, not decoded;
            # log retention still needs the segment's age, from its last record.
            last_time = _record_time(path, last_record)
        segment.last_time_ms = last_time
        segments.append(segment)
    report.replay_s = time.perf_counter() - started

    last_log_seq = expected - 1
    if base_seq > 0 and not seg_files:
        raise RecoveryError(
            f"a snapshot at seq {base_seq} exists but the log is missing (no segment files)",
            path=report.snapshot_path,
            seq=base_seq,
        )
    if base_seq > last_log_seq:
        raise RecoveryError(
            f"snapshot at seq {base_seq} is newer than the log, which ends at seq {last_log_seq}",
            path=report.snapshot_path,
            seq=base_seq,
        )
    next_seq = max(expected, base_seq + 1)
    report.last_seq = next_seq - 1
    if half_created is not None:
        created_seq, created_path = half_created
        if seg_files and expected != created_seq:
            # Rotation names the new segment after the last record of the one
            # it sealed: records it had synced are missing.
            raise RecoveryError(
                half_created_mismatch(expected, created_seq) + _covering_note(report, expected),
                path=seg_files[-1][1],
                seq=expected,
            )
        fs.remove(created_path)
        fs.fsync_dir(wal_dir)
        report.removed_files.append(created_path)
    # Row 11, once everything else checked out: a damaged snapshot newer than the
    # one used is set aside (renamed *.damaged, kept for the operator), so it
    # neither counts as the newest snapshot nor toward the snapshots kept.
    moved = False
    for path, _reason in report.skipped_snapshots:
        if fs.exists(path):
            fs.rename(path, path + DAMAGED_SUFFIX)
            report.removed_files.append(path)
            moved = True
    if moved:
        fs.fsync_dir(snap_dir)
    return Recovered(state, segments, next_seq, report)
