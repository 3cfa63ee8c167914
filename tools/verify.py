"""`sepp-log verify DATA_DIR`: check everything a data directory holds, read-only.

Owns: `verify()` and `VerifyReport`. The checks, in one pass over the log:

- every segment header; both checksums of every record, the sequence numbers
  inside each segment and across segments (`tools.segments.LogWalker`, which goes
  on after damage so that every problem is reported, not only the first);
- every envelope decodes (`decode_envelope`) and every event matches the catalogue
  (`validate_event`); record times never go backwards;
- a full replay through `sepp.storage.replay.replay_record` -- the one replay path
  -- from seq 1 (or, when retention has removed the head of the log, from the
  oldest snapshot the log continues), followed by the state's invariants;
- every snapshot: loaded by the storage layer's reader, and compared with the
  replayed state at its sequence number. A snapshot older than the start of the
  log can only be checked on its own (it loads, its counts add up, its state keeps
  the invariants); the report says so.

Verdicts follow the recovery decision table (`sepp/storage/recovery.py`), without
its side effects: a torn tail of the last segment -- which recovery truncates, and
which a live server's append in progress looks like -- is a warning (exit 0);
leftover snapshot temp files and stray files are warnings; everything recovery
refuses (corruption, a damaged sealed segment, gaps, bad headers, a snapshot newer
than the log or disagreeing with it, a record that does not decode or apply) is
an error (exit 1).

Speed: decoding and replay dominate; catalogue validation is memoised by event
shape (see `_EventChecker`). The replay stops at the first record it cannot apply
in order (a gap, an undecodable record); the checks of the bytes go on.

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from log_format import FormatError, Record, decode_envelope, validate_event
from sepp.core.invariants import InvariantViolation, check_invariants
from sepp.core.state import State
from sepp.storage.replay import ReplayError, replay_record
from tools.datadir import ERROR, INFO, WARNING, DataDir, Problem, SnapshotFile
from tools.output import Emitter, format_bytes, format_time_ms
from tools.segments import CHUNK_BYTES, LogWalker, SegmentStart
from tools.states import (
    SnapshotError,
    choose_base,
    comparable,
    describe_difference,
    load_snapshot_file,
    paused_gc,
    snapshot_problem,
)

__all__ = ["SnapshotVerdict", "VerifyReport", "emit_report", "verify"]


@dataclass(frozen=True, slots=True)
class SnapshotVerdict:
    """What verify could say about one snapshot: `match` (equal to the replay at its
    seq), `base` (the replay started from it), `alone` (checked on its own only),
    or `bad` (a problem was reported)."""

    file: str
    seq: int
    verdict: str


@dataclass
class VerifyReport:
    data_dir: str
    problems: list[Problem] = field(default_factory=list)
    snapshots: list[SnapshotVerdict] = field(default_factory=list)
    segments: int = 0
    log_bytes: int = 0
    records: int = 0
    events: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    first_time_ms: int | None = None
    last_time_ms: int | None = None
    replay_from: int | None = None
    replay_from_snapshot: str | None = None
    replayed_to: int | None = None
    replay_stopped: str | None = None
    on_problem: Callable[[Problem], None] | None = None

    def add(self, problem: Problem) -> None:
        self.problems.append(problem)
        if self.on_problem is not None:
            self.on_problem(problem)

    def count(self, severity: str) -> int:
        return sum(1 for p in self.problems if p.severity == severity)

    @property
    def ok(self) -> bool:
        return self.count(ERROR) == 0

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


class _EventChecker:
    """`validate_event`, memoised. Its verdict depends only on the type id, the
    version and the Python type of every field -- except for a map (`custom`), whose
    entries it inspects -- so an event whose shape already passed, and which holds no
    map, needs no second look. A log holds a handful of shapes; this makes the
    catalogue check cost a tuple and a set lookup per event."""

    def __init__(self) -> None:
        self._good: set[tuple[Any, ...]] = set()

    def first_problem(self, events: list[list[Any]]) -> str | None:
        good = self._good
        for index, event in enumerate(events):
            type_id, version = event[0], event[1]
            shape: tuple[Any, ...] | None = None
            # Only an int type id and version make a shape worth keeping (and
            # hashable: a malformed event may hold a map there).
            if type(type_id) is int and type(version) is int:
                shape = (type_id, version, *map(type, event))
                if shape in good:
                    continue
            try:
                validate_event(event)
            except FormatError as exc:
                return f"event {index}: {exc.reason}"
            if shape is not None and dict not in shape:
                good.add(shape)
        return None


def verify(
    data_dir: DataDir,
    *,
    on_problem: Callable[[Problem], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> VerifyReport:
    """Check `data_dir` (see the module docstring). Problems are passed to
    `on_problem` as they are found, and collected in the report."""
    report = VerifyReport(data_dir.root, on_problem=on_problem)
    report.log_bytes = data_dir.log_bytes
    for problem in data_dir.listing_problems():
        report.add(problem)

    base = choose_base(data_dir, newest=False)
    for problem in base.problems:
        report.add(problem)
    reported = {p.file for p in base.problems if p.kind == "snapshot-unusable"}
    state = base.state
    log_first = data_dir.segments[0].first_seq if data_dir.segments else None

    pending: list[SnapshotFile] = []
    for snap in data_dir.snapshots:
        if snap.rel in reported:
            report.snapshots.append(SnapshotVerdict(snap.rel, snap.last_seq, "bad"))
        elif base.snapshot is not None and snap.rel == base.snapshot.rel:
            _check_alone(
                report,
                snap,
                "the replay starts from this snapshot: only its internal consistency was checked",
                loaded=state,
                verdict="base",
            )
        elif log_first is not None and snap.last_seq + 1 < log_first:
            _check_alone(
                report,
                snap,
                f"older than the start of the log (seq {log_first}): "
                "only its internal consistency was checked",
            )
        elif state is None:
            _check_alone(
                report,
                snap,
                "not compared with the log: no replay was possible (see the log-start error)",
            )
        else:
            pending.append(snap)

    if state is not None:
        report.replay_from = base.seq
        report.replay_from_snapshot = base.snapshot.rel if base.snapshot else None
        pending = _compare_due(report, pending, state, base.seq)

    first_problem = _EventChecker().first_problem
    walker = LogWalker(data_dir, resync=True, chunk_bytes=chunk_bytes, on_bytes=on_bytes)
    segment_rel = ""
    # The hot loop keeps its counters in locals (attribute stores cost as much as
    # the checks). `next_apply` is the seq the replay applies next; `never` once it
    # stopped (or could not start).
    never = -1
    base_seq = base.seq
    next_apply = base_seq + 1 if state is not None else never
    next_snapshot = pending[0].last_seq if pending else never
    records = events_seen = 0
    first_time: int | None = None
    last_time = -1
    record_cls = Record

    def stop(why: str) -> int:
        if next_apply != never:
            report.replayed_to = next_apply - 1
            report.replay_stopped = f"{why}; the replay stopped after seq {next_apply - 1}"
        return never

    with paused_gc():
        for item in walker.walk():
            if type(item) is record_cls:
                seq = item.seq
                records += 1
                try:
                    envelope = decode_envelope(item.body)
                except FormatError as exc:
                    report.add(Problem(ERROR, "decode", segment_rel, item.offset, seq, exc.reason))
                    next_apply = stop(f"record {seq} does not decode")
                    continue
                events = envelope.events
                events_seen += len(events)
                invalid = first_problem(events)
                if invalid is not None:
                    report.add(Problem(ERROR, "event", segment_rel, item.offset, seq, invalid))
                    next_apply = stop(f"record {seq} has an invalid event")
                    continue
                time_ms = envelope.time_ms
                if time_ms < last_time:
                    report.add(
                        Problem(
                            ERROR,
                            "time",
                            segment_rel,
                            item.offset,
                            seq,
                            f"time goes backwards: {format_time_ms(time_ms)} after "
                            f"{format_time_ms(last_time)}",
                        )
                    )
                last_time = time_ms
                if first_time is None:
                    first_time = time_ms
                if seq == next_apply and state is not None:
                    try:
                        replay_record(state, item.body)
                    except ReplayError as exc:
                        report.add(Problem(ERROR, "apply", segment_rel, item.offset, seq, str(exc)))
                        next_apply = stop(f"record {seq} does not apply")
                        continue
                    next_apply = seq + 1
                    if seq == next_snapshot:
                        pending = _compare_due(report, pending, state, seq)
                        next_snapshot = pending[0].last_seq if pending else never
                elif next_apply != never and seq > base_seq:
                    missing = next_apply
                    next_apply = stop(
                        f"record {missing} is missing"
                        if seq == missing + 1
                        else f"records {missing}..{seq - 1} are missing"
                    )
            elif type(item) is Problem:
                report.add(item)
            elif type(item) is SegmentStart:
                report.segments += 1
                segment_rel = item.segment.rel
    replaying = next_apply != never
    if replaying:
        report.replayed_to = next_apply - 1
    applied = report.replayed_to if report.replayed_to is not None else base_seq
    report.records = records
    report.events = events_seen
    report.first_time_ms = first_time
    report.last_time_ms = last_time if first_time is not None else None
    report.first_seq = walker.first_seq
    report.last_seq = walker.last_seq

    log_end = walker.last_seq
    if log_end is None:
        log_end = log_first - 1 if log_first is not None else 0
    for snap in pending:
        if snap.last_seq > log_end:
            report.add(
                Problem(
                    ERROR,
                    "snapshot-ahead",
                    snap.rel,
                    None,
                    snap.last_seq,
                    f"snapshot is newer than the log, which ends at seq {log_end}; "
                    "recovery refuses to start",
                )
            )
            report.snapshots.append(SnapshotVerdict(snap.rel, snap.last_seq, "bad"))
        else:
            _check_alone(
                report, snap, f"not compared with the log: the replay stopped at seq {applied}"
            )
    if replaying and state is not None:
        try:
            check_invariants(state)
        except InvariantViolation as exc:
            report.add(
                Problem(
                    ERROR,
                    "invariant",
                    None,
                    None,
                    applied,
                    f"the replayed state breaks an invariant: {exc}",
                )
            )
    return report


def _compare_due(
    report: VerifyReport, pending: list[SnapshotFile], state: State, seq: int
) -> list[SnapshotFile]:
    """Compare every pending snapshot at `seq` with `state`; the rest stay pending."""
    replayed: dict[str, Any] | None = None
    while pending and pending[0].last_seq <= seq:
        snap = pending.pop(0)
        if snap.last_seq < seq:  # pragma: no cover - pending is sorted and checked at each seq
            raise RuntimeError(f"snapshot {snap.rel} was skipped")
        try:
            snap_state = load_snapshot_file(snap)
        except SnapshotError as exc:
            report.add(snapshot_problem(snap, exc))
            report.snapshots.append(SnapshotVerdict(snap.rel, snap.last_seq, "bad"))
            continue
        except FileNotFoundError:
            report.add(_vanished(snap))
            continue
        if replayed is None:
            replayed = comparable(state.canonical())
        held = comparable(snap_state.canonical())
        if held != replayed:
            report.add(
                Problem(
                    ERROR,
                    "snapshot-mismatch",
                    snap.rel,
                    None,
                    snap.last_seq,
                    f"differs from the log replayed to seq {seq}: "
                    f"{describe_difference(held, replayed)}",
                )
            )
            report.snapshots.append(SnapshotVerdict(snap.rel, snap.last_seq, "bad"))
        else:
            report.snapshots.append(SnapshotVerdict(snap.rel, snap.last_seq, "match"))
    return pending


def _check_alone(
    report: VerifyReport,
    snap: SnapshotFile,
    note: str,
    *,
    loaded: State | None = None,
    verdict: str = "alone",
) -> None:
    """Check a snapshot on its own: it loads (checksums, structure, counts) and its
    state keeps the invariants."""
    state = loaded
    if state is None:
        try:
            state = load_snapshot_file(snap)
        except SnapshotError as exc:
            report.add(snapshot_problem(snap, exc))
            report.snapshots.append(SnapshotVerdict(snap.rel, snap.last_seq, "bad"))
            return
        except FileNotFoundError:
            report.add(_vanished(snap))
            return
    try:
        check_invariants(state)
    except InvariantViolation as exc:
        report.add(
            Problem(
                ERROR,
                "invariant",
                snap.rel,
                None,
                snap.last_seq,
                f"the snapshot's state breaks an invariant: {exc}",
            )
        )
        report.snapshots.append(SnapshotVerdict(snap.rel, snap.last_seq, "bad"))
        return
    report.add(Problem(INFO, "snapshot-unchecked", snap.rel, None, snap.last_seq, note))
    report.snapshots.append(SnapshotVerdict(snap.rel, snap.last_seq, verdict))


def _vanished(snap: SnapshotFile) -> Problem:
    return Problem(
        WARNING,
        "io",
        snap.rel,
        None,
        snap.last_seq,
        "snapshot deleted while verifying (a live server's retention): not checked",
    )


# ---------------------------------------------------------------- output


def emit_report(report: VerifyReport, out: Emitter) -> None:
    """The summary (problems were emitted as they were found)."""
    if report.first_seq is not None and report.last_seq is not None:
        span = f"seqs {report.first_seq}..{report.last_seq}"
    else:
        span = "no records"
    times = ""
    if report.first_time_ms is not None and report.last_time_ms is not None:
        times = f", {format_time_ms(report.first_time_ms)} .. {format_time_ms(report.last_time_ms)}"
    out.note(
        f"log:       {report.segments} segments, {format_bytes(report.log_bytes)}, "
        f"{report.records} records, {report.events} events, {span}{times}"
    )
    if report.replay_from is None:
        out.note("replay:    not possible (see above)")
    else:
        start = (
            f"snapshot {report.replay_from_snapshot}"
            if report.replay_from_snapshot
            else "the empty state"
        )
        line = f"replay:    from {start} (seq {report.replay_from}) to seq {report.replayed_to}"
        if report.replay_stopped:
            line += f" -- stopped: {report.replay_stopped}"
        out.note(line)
    matched = [s for s in report.snapshots if s.verdict == "match"]
    out.note(
        f"snapshots: {len(report.snapshots)}, {len(matched)} equal to the replayed log"
        + (f" ({', '.join(s.file for s in matched)})" if matched else "")
    )
    errors, warnings = report.count(ERROR), report.count(WARNING)
    verdict = "OK" if report.ok else "FAILED"
    out.note(f"{verdict}: {errors} errors, {warnings} warnings")
    for snap in report.snapshots:
        out.emit("snapshot", None, {"file": snap.file, "seq": snap.seq, "verdict": snap.verdict})
    out.emit(
        "summary",
        None,
        {
            "ok": report.ok,
            "errors": errors,
            "warnings": warnings,
            "segments": report.segments,
            "bytes": report.log_bytes,
            "records": report.records,
            "events": report.events,
            "first_seq": report.first_seq,
            "last_seq": report.last_seq,
            "first_time": _iso(report.first_time_ms),
            "last_time": _iso(report.last_time_ms),
            "replay_from": report.replay_from,
            "replay_from_snapshot": report.replay_from_snapshot,
            "replayed_to": report.replayed_to,
            "replay_stopped": report.replay_stopped,
        },
    )


def _iso(ms: int | None) -> str | None:
    return format_time_ms(ms) if ms is not None else None
