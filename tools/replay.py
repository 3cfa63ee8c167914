"""`sepp-log replay DATA_DIR [--until-seq N | --until-time T] [--into NEW_DIR]`:
the state at a point of the log, and point-in-time recovery.

Owns: `replay_to` (rebuild the state after record N, or after the last record at or
before time T), `queue_summaries` (per queue: ready, scheduled, in flight, dead,
the oldest ready job's age, leases outstanding and overdue) and `write_into` (a new
data directory holding the log cut after record N).

Promises:
- One replay path: records are applied with `sepp.storage.replay.replay_run` (the
  fast path, a run of valid records at a time; `replay_record` for a record it
  does not take), from the newest usable snapshot at or before N that the log
  continues (as recovery chooses), else from the empty state when the log starts
  at seq 1.
- Read-only over DATA_DIR; records after N are never read, so a log damaged after
  the point of interest can still be recovered up to it.
- `--into NEW_DIR` (NEW_DIR absent or empty) writes a directory that `sepp serve`
  (`Engine.open`) starts from with exactly the replayed state: the snapshot the
  replay started from (if any), the segment holding that snapshot's seq (or seq 1)
  and every later segment up to the cut, each copied byte for byte up to the end of
  its last record, the last one cut right after record N. Everything copied was
  checksummed on the way. The new directory is then replayed again by the same
  code and compared with the state at N before success is reported.
- "Ages" are measured at the state's own clock (the time of the last record
  applied), not the wall clock: the state at a point in the past is described as
  it was then.

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from log_format import FILE_HEADER_BYTES, FormatError, Record, ValidEnvelopes, decode_envelope
from sepp.core.state import IN_FLIGHT, State
from sepp.storage.fs import RealFileSystem, make_private_dirs, private_opener
from sepp.storage.recovery import SNAPSHOT_DIR, WAL_DIR
from sepp.storage.replay import ReplayError, replay_record, replay_run

from .datadir import ERROR, DataDir, Problem, SegmentFile, SnapshotFile, open_data_dir
from .output import Emitter, UsageError, format_duration_ms, format_time_ms
from .segments import (
    CHUNK_BYTES,
    LogWalker,
    SegmentStart,
    Span,
    record_end,
    scan_segment_file,
)
from .states import as_fallback, choose_base, comparable, describe_difference, paused_gc

__all__ = [
    "QueueSummary",
    "ReplayResult",
    "check_copy",
    "check_target",
    "emit_state",
    "format_table",
    "queue_summaries",
    "replay_to",
    "seq_at_time",
    "write_into",
]

_FS = RealFileSystem()


@dataclass
class ReplayResult:
    """The state after record `seq` (None if the replay was impossible: see
    `problems`). `pieces` are the segments read, each with the offset right after
    its last record at or before `seq` -- what `write_into` copies."""

    state: State | None
    seq: int
    time_ms: int | None = None
    base_seq: int = 0
    base_snapshot: SnapshotFile | None = None
    records: int = 0
    events: int = 0
    problems: list[Problem] = field(default_factory=list)
    pieces: list[tuple[SegmentFile, int]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state is not None and not any(p.severity == ERROR for p in self.problems)


def seq_at_time(
    data_dir: DataDir, until_ms: int, *, chunk_bytes: int = CHUNK_BYTES
) -> tuple[int | None, list[Problem]]:
    """The seq of the last record at or before `until_ms` (0 or first_seq - 1 when
    every record is later). Record times never go backwards, so only the segment
    whose first record is the last one at or before the time is read in full."""
    segments = data_dir.segments
    if not segments:
        return 0, []
    start = segments[0].first_seq
    for segment in segments[1:]:
        first_time = _first_record_time(segment, chunk_bytes)
        if first_time is None or first_time > until_ms:
            break
        start = segment.first_seq
    walker = LogWalker(data_dir, chunk_bytes=chunk_bytes)
    found = segments[0].first_seq - 1
    problems: list[Problem] = []
    rel: str | None = None
    for item in walker.walk(from_seq=start):
        if type(item) is Record:
            try:
                time_ms = decode_envelope(item.body).time_ms
            except FormatError as exc:
                problems.append(Problem(ERROR, "decode", rel, item.offset, item.seq, exc.reason))
                return None, problems
            if time_ms > until_ms:
                break
            found = item.seq
        elif type(item) is SegmentStart:
            rel = item.segment.rel
        elif type(item) is Problem and item.severity == ERROR:
            problems.append(item)
            return None, problems
    return found, problems


def _first_record_time(segment: SegmentFile, chunk_bytes: int) -> int | None:
    try:
        first = next(
            scan_segment_file(segment.path, expected_seq=segment.first_seq, chunk_bytes=chunk_bytes)
        )
        if type(first) is Record:
            return decode_envelope(first.body).time_ms
    except (OSError, FormatError):
        pass
    return None


def replay_to(
    data_dir: DataDir,
    *,
    until_seq: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    fast_path: bool = True,
) -> ReplayResult:
    """The state after record `until_seq` (None: the last record of the log).

    `fast_path=False` applies every record with `replay_record`, read in
    `chunk_bytes` chunks: the reference the fast path is tested against."""
    base = choose_base(data_dir, target_seq=until_seq, newest=True)
    result = ReplayResult(base.state, base.seq, base_seq=base.seq, base_snapshot=base.snapshot)
    state = base.state
    if state is None:
        result.problems.extend(base.problems)
        return result
    result.problems.extend(as_fallback(base.problems))
    if base.seq > 0 and not data_dir.segments:
        return _fail(
            result,
            "snapshot-ahead",
            base.snapshot,
            base.seq,
            "a snapshot exists but the log is missing (no segment files); recovery refuses",
        )
    if until_seq == 0:
        return result
    applied = base.seq
    base_seq = base.seq
    limit = until_seq if until_seq is not None else 2**64
    walker = LogWalker(data_dir, chunk_bytes=chunk_bytes, on_bytes=on_bytes, spans=fast_path)
    segment: SegmentFile | None = None
    # The end of the last record read at or before the cut, in `segment`.
    last_end: int | None = None
    records = events = 0
    time_ms: int | None = None

    def failed(offset: int, seq: int, reason: str) -> ReplayResult:
        result.problems.append(
            Problem(
                ERROR,
                "apply",
                segment.rel if segment else None,
                offset,
                seq,
                f"record does not replay: {reason}",
            )
        )
        result.state = None
        return result

    # Read from the record the start holds (its segment is the first one copied by
    # --into, so that the log reaches back to the snapshot), apply what follows it.
    with paused_gc():
        for item in walker.walk(from_seq=max(base_seq, 1)):
            if type(item) is Span:
                seq = item.seq
                if seq <= base_seq:
                    # Records the start already holds: read (checksums, envelopes), not applied.
                    skipped = ValidEnvelopes(
                        item.buf,
                        start_offset=item.offset,
                        expected_seq=seq,
                        until_seq=min(base_seq, limit),
                    )
                    for _envelope in skipped:
                        pass
                    if skipped.seq > seq:
                        last_end = skipped.offset
                    item.offset, item.seq = skipped.offset, skipped.seq
                    seq = skipped.seq
                    if seq > limit:
                        break
                    if seq <= base_seq:
                        continue  # stopped short of the start: the walk says why
                try:
                    run = replay_run(
                        state,
                        item.buf,
                        start_offset=item.offset,
                        expected_seq=seq,
                        until_seq=until_seq,
                    )
                except ReplayError as exc:
                    return failed(exc.offset, exc.seq, exc.reason)  # type: ignore[attr-defined]
                if run.records:
                    applied = run.seq - 1
                    records += run.records
                    events += run.events
                    time_ms = run.last_time_ms
                    last_end = run.offset
                item.offset, item.seq = run.offset, run.seq
                if run.seq > limit:
                    break
            elif type(item) is Record:
                # A valid record the fast path did not take (its envelope does not
                # decode), or any record without the fast path.
                seq = item.seq
                if seq > limit:
                    break
                if seq > base_seq:
                    try:
                        time_ms, count = replay_record(state, item.body)
                    except ReplayError as exc:
                        return failed(item.offset, seq, str(exc))
                    applied = seq
                    records += 1
                    events += count
                last_end = record_end(item)
                if seq >= limit:
                    break
            elif type(item) is SegmentStart:
                if segment is not None and last_end is not None:
                    result.pieces.append((segment, last_end))
                segment, last_end = item.segment, None
            elif type(item) is Problem:
                result.problems.append(item)
                if item.severity == ERROR:
                    result.state = None
                    return result
    result.records, result.events, result.time_ms = records, events, time_ms
    if segment is not None and (last_end is not None or not result.pieces):
        # The first segment may start right after the snapshot and hold nothing
        # at or before the cut: its header alone keeps the log reaching back.
        result.pieces.append((segment, last_end if last_end is not None else FILE_HEADER_BYTES))
    result.seq = applied
    log_end = walker.last_seq
    if log_end is None:
        log_end = data_dir.segments[0].first_seq - 1 if data_dir.segments else 0
    if until_seq is not None and applied < until_seq:
        return _fail(
            result,
            "log-end",
            None,
            until_seq,
            f"the log ends at seq {log_end}, before the seq asked for",
        )
    if base.seq > log_end:
        return _fail(
            result,
            "snapshot-ahead",
            base.snapshot,
            base.seq,
            f"snapshot is newer than the log, which ends at seq {log_end}; recovery refuses",
        )
    if result.time_ms is None and state.clock_ms:
        result.time_ms = state.clock_ms
    return result


def _fail(
    result: ReplayResult, kind: str, snapshot: SnapshotFile | None, seq: int, reason: str
) -> ReplayResult:
    result.problems.append(
        Problem(ERROR, kind, snapshot.rel if snapshot else None, None, seq, reason)
    )
    result.state = None
    return result


# ---------------------------------------------------------------- summaries


@dataclass(frozen=True, slots=True)
class QueueSummary:
    queue: str
    ready: int
    scheduled: int
    in_flight: int
    dead: int
    oldest_ready_enqueued_at: int | None
    oldest_ready_age_ms: int | None
    # In-flight jobs whose lease still runs at the state's clock, and those whose
    # lease has lapsed but that no sweep has expired yet.
    leases_outstanding: int
    leases_overdue: int
    next_lease_expiry: int | None

    def data(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "ready": self.ready,
            "scheduled": self.scheduled,
            "in_flight": self.in_flight,
            "dead": self.dead,
            "oldest_ready_enqueued_at": _iso(self.oldest_ready_enqueued_at),
            "oldest_ready_age_ms": self.oldest_ready_age_ms,
            "leases_outstanding": self.leases_outstanding,
            "leases_overdue": self.leases_overdue,
            "next_lease_expiry": _iso(self.next_lease_expiry),
        }


def _iso(ms: int | None) -> str | None:
    return format_time_ms(ms) if ms is not None else None


def queue_summaries(state: State) -> list[QueueSummary]:
    """One summary per queue the state knows, by name."""
    clock = state.clock_ms
    leases: dict[str, list[int]] = {}
    for job in state.jobs.values():
        if job.status == IN_FLIGHT:
            leases.setdefault(job.queue, []).append(job.due_ms)
    out = []
    for name in sorted(state.queues):
        q = state.queues[name]
        oldest = state.oldest_ready_enqueued_at(name)
        deadlines = leases.get(name, [])
        running = [d for d in deadlines if d > clock]
        out.append(
            QueueSummary(
                queue=name,
                ready=q.ready_count,
                scheduled=q.scheduled_count,
                in_flight=q.in_flight_count,
                dead=len(q.dead),
                oldest_ready_enqueued_at=oldest,
                oldest_ready_age_ms=clock - oldest if oldest is not None else None,
                leases_outstanding=len(running),
                leases_overdue=len(deadlines) - len(running),
                next_lease_expiry=min(running) if running else None,
            )
        )
    return out


def format_table(summaries: list[QueueSummary]) -> list[str]:
    headers = (
        "queue",
        "ready",
        "scheduled",
        "in_flight",
        "dead",
        "oldest_ready_age",
        "leases",
        "overdue",
        "next_lease_expiry",
    )
    rows = [
        (
            s.queue,
            str(s.ready),
            str(s.scheduled),
            str(s.in_flight),
            str(s.dead),
            format_duration_ms(s.oldest_ready_age_ms) if s.oldest_ready_age_ms is not None else "-",
            str(s.leases_outstanding),
            str(s.leases_overdue),
            format_time_ms(s.next_lease_expiry) if s.next_lease_expiry is not None else "-",
        )
        for s in summaries
    ]
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]
    lines = []
    for row in (headers, *rows):
        cells = [
            cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row)
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def emit_state(result: ReplayResult, state: State, out: Emitter) -> None:
    """The state line and the per-queue table (or JSON objects)."""
    start = (
        f"snapshot {result.base_snapshot.rel} (seq {result.base_seq})"
        if result.base_snapshot is not None
        else "the empty state"
    )
    when = format_time_ms(result.time_ms) if result.time_ms is not None else None
    out.emit(
        "state",
        f"state after seq {result.seq}"
        + (f" ({when})" if when else "")
        + f": from {start} + {result.records} records, {result.events} events",
        {
            "seq": result.seq,
            "time": when,
            "time_ms": result.time_ms,
            "base_seq": result.base_seq,
            "base_snapshot": result.base_snapshot.rel if result.base_snapshot else None,
            "records": result.records,
            "events": result.events,
            "jobs": len(state.jobs),
            "dead": len(state.dead),
            "dedup": len(state.dedup),
        },
    )
    summaries = queue_summaries(state)
    if summaries:
        for line in format_table(summaries):
            out.note(line)
    else:
        out.note("no queues")
    for summary in summaries:
        out.emit("queue", None, summary.data())


# ---------------------------------------------------------------- --into


def check_target(target: str) -> None:
    """UsageError unless `target` is absent or an empty directory."""
    if os.path.lexists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise UsageError(f"{target}: exists and is not an empty directory")


def write_into(result: ReplayResult, target: str) -> list[str]:
    """Write a new data directory holding the log cut after `result.seq` (see the
    module docstring). Returns the files written, relative to `target`."""
    if result.state is None:
        raise ValueError("no state to write")
    check_target(target)
    wal_dir = os.path.join(target, WAL_DIR)
    snap_dir = os.path.join(target, SNAPSHOT_DIR)
    make_private_dirs(wal_dir)
    make_private_dirs(snap_dir)
    written = []
    if result.base_snapshot is not None and result.base_seq > 0:
        name = os.path.basename(result.base_snapshot.path)
        _copy(result.base_snapshot.path, os.path.join(snap_dir, name), None)
        written.append(os.path.join(SNAPSHOT_DIR, name))
    for segment, end in result.pieces:
        name = os.path.basename(segment.path)
        _copy(segment.path, os.path.join(wal_dir, name), end)
        written.append(os.path.join(WAL_DIR, name))
    for directory in (wal_dir, snap_dir, target):
        _FS.fsync_dir(directory)
    return written


def _copy(source: str, target: str, length: int | None) -> None:
    """Copy `length` bytes (all if None) of `source` to a new file, synced."""
    with open(source, "rb") as src, open(target, "xb", opener=private_opener) as dst:
        if length is None:
            shutil.copyfileobj(src, dst, CHUNK_BYTES)
        else:
            remaining = length
            while remaining:
                block = src.read(min(CHUNK_BYTES, remaining))
                if not block:
                    raise OSError(f"{source} is shorter than {length} bytes")
                dst.write(block)
                remaining -= len(block)
        dst.flush()
        os.fsync(dst.fileno())


def check_copy(result: ReplayResult, target: str) -> Problem | None:
    """Replay the new directory and compare with the state it was cut from."""
    if result.state is None:
        raise ValueError("no state to compare")
    again = replay_to(open_data_dir(target), until_seq=result.seq)
    if again.state is None:
        problem = next((p for p in again.problems if p.severity == ERROR), None)
        reason = problem.human() if problem else "no state"
        return Problem(
            ERROR, "into", target, None, result.seq, f"the new directory does not replay: {reason}"
        )
    a, b = comparable(again.state.canonical()), comparable(result.state.canonical())
    if a != b:
        return Problem(
            ERROR,
            "into",
            target,
            None,
            result.seq,
            f"the new directory replays to a different state: {describe_difference(a, b)}",
        )
    return None
