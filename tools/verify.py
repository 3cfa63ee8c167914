"""`sepp-log verify DATA_DIR`: check everything a data directory holds, read-only.

Owns: `verify()`, `VerifyReport` and the compiled catalogue checks
(`compile_event_check`). The checks, in one pass over the log:

- every segment header; both checksums of every record, the sequence numbers
  inside each segment and across segments (`tools.segments.LogWalker`, which goes
  on after damage so that every problem is reported, not only the first);
- every envelope decodes and every event matches the catalogue (`validate_event`);
  record times never go backwards;
- a full replay through `sepp.storage.replay` -- the one replay path -- from seq 1
  (or, when retention has removed the head of the log, from the oldest snapshot
  the log continues), followed by the state's invariants;
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
an error (exit 1). Damage wholly below the snapshot recovery starts from (rows 15,
16: `tools.history`) is `ERROR damaged-history`: recovery starts past it, but the
disk damaged the log all the same (as `snapshot-unusable` for a snapshot recovery
falls back from); the replay then goes on from that snapshot, as recovery's does.

Speed: the log is read through the replay fast path (`LogWalker(spans=True)`):
`replay_run` decodes, checks and applies each run of good records in one pass,
with `RunChecks` -- the catalogue as one compiled check per event type (straight
`type(v) is T` tests, a few tenths of a microsecond an event) and the record
times. Every record the fast path stops at (one that does not decode, fails a
check or does not apply, or follows a gap) is looked at the slow way, record by
record, which makes the reports: the fast path only takes records on which the
slow way reports nothing, so the report is the slow way's (`fast_path=False`
checks the whole log the slow way; tests compare the two on damaged logs). The
replay stops at the first record it cannot apply in order; the other checks go
on.

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from log_format import (
    EVENT_SPECS_BY_TYPE,
    RECORD_HEADER_BYTES,
    EventSpec,
    FormatError,
    Record,
    ValidEnvelopes,
    decode_envelope,
    validate_event,
)
from sepp.core.invariants import InvariantViolation, check_invariants
from sepp.core.state import State
from sepp.storage.replay import (
    ReplayError,
    RunChecks,
    RunResult,
    check_run,
    replay_record,
    replay_run,
)

from .datadir import ERROR, INFO, WARNING, DataDir, Problem, SnapshotFile
from .history import HISTORY_KINDS, HistoryJudge, RecoveryBase, recovery_base
from .output import Emitter, format_bytes, format_time_ms
from .segments import CHUNK_BYTES, LogWalker, SegmentStart, Span
from .states import (
    SnapshotError,
    choose_base,
    comparable,
    describe_difference,
    load_snapshot_file,
    paused_gc,
    snapshot_problem,
)

__all__ = [
    "SnapshotVerdict",
    "VerifyReport",
    "catalogue_checks",
    "compile_event_check",
    "emit_report",
    "verify",
]

_BODY_LEN = struct.Struct("<I")  # at offset 8 of a record header


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


# ---------------------------------------------------------------- the catalogue check

# How each field type of the catalogue (`log_format.FIELD_TYPES`) is checked in the
# compiled per-type checks: the same tests as `validate_event`'s, as expressions.
# A map's entries are looked at by `validate_event` itself.
_FIELD_TESTS = {
    "str": "type({v}) is str",
    "str?": "({v} is None or type({v}) is str)",
    "int": "type({v}) is int",
    "int?": "({v} is None or type({v}) is int)",
    "bool": "type({v}) is bool",
    "bytes?": "({v} is None or type({v}) is bytes)",
    "map?": "({v} is None or _valid(event))",
    "strs": "_valid(event)",
    "ints": "_valid(event)",
}


def _valid(event: list[Any]) -> bool:
    try:
        validate_event(event)
    except FormatError:
        return False
    return True


def compile_event_check(spec: EventSpec) -> Callable[[list[Any]], bool]:
    """`validate_event` for the events of one type, as straight-line code: true when
    the event (a list whose type id is `spec.type_id`) is valid. Raises ValueError
    for an event of the wrong length. A few tenths of a microsecond per event,
    against several for `validate_event`: verify checks every event of the log."""
    names = [f"f{i}" for i in range(len(spec.fields))]
    tests = [f"type(version) is int and version == {spec.version!r}"]
    tests += [_FIELD_TESTS[f.type].format(v=name) for f, name in zip(spec.fields, names)]
    source = (
        f"def check_{spec.name}(event):\n"
        f"    {', '.join(['_type_id', 'version', *names])}, = event\n"
        f"    return {' and '.join(tests)}\n"
    )
    namespace: dict[str, Any] = {"_valid": _valid}
    exec(source, namespace)  # the source is built above from the catalogue's own data
    check: Callable[[list[Any]], bool] = namespace[f"check_{spec.name}"]
    return check


def catalogue_checks() -> list[Callable[[list[Any]], bool] | None]:
    """`compile_event_check` for every type of the catalogue, by type id."""
    checks: list[Callable[[list[Any]], bool] | None] = [None] * (
        max(EVENT_SPECS_BY_TYPE, default=0) + 1
    )
    for type_id, spec in EVENT_SPECS_BY_TYPE.items():
        checks[type_id] = compile_event_check(spec)
    return checks


_EVENT_CHECKS = catalogue_checks()


def _first_problem(events: list[Any]) -> str | None:
    """The catalogue's verdict on the first invalid event of a record, if any."""
    for index, event in enumerate(events):
        try:
            validate_event(event)
        except FormatError as exc:
            return f"event {index}: {exc.reason}"
    return None


def verify(
    data_dir: DataDir,
    *,
    on_problem: Callable[[Problem], None] | None = None,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
    fast_path: bool = True,
) -> VerifyReport:
    """Check `data_dir` (see the module docstring). Problems are passed to
    `on_problem` as they are found, and collected in the report.

    `fast_path=False` checks every record the slow way, read in `chunk_bytes`
    chunks: the reference the fast path is tested against (same report)."""
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

    walker = LogWalker(
        data_dir, resync=True, chunk_bytes=chunk_bytes, on_bytes=on_bytes, spans=fast_path
    )
    log = _LogPass(report, state, base.seq, pending)
    judge: HistoryJudge | None = None
    # The newest snapshot's seq, damaged or not: the log was durable up to it.
    snap_seq = max((snap.last_seq for snap in data_dir.snapshots), default=0)
    with paused_gc():
        for item in walker.walk():
            if type(item) is Span:
                log.span(item)
            elif type(item) is Record:
                log.record(item)
            elif type(item) is Problem:
                if item.severity == ERROR and item.kind in HISTORY_KINDS:
                    # Damage wholly below the snapshot recovery starts from is
                    # history (recovery rows 15, 16): said so, and the replay
                    # goes on from that snapshot, as recovery's does.
                    if judge is None:
                        judge = HistoryJudge(data_dir, recovery_base(data_dir))
                    if judge.is_history(item):
                        item = judge.describe(item)
                        log.rebase(judge.base)
                elif item.kind == "torn-tail" and item.seq is not None and item.seq <= snap_seq:
                    # Recovery row 21: a snapshot is published only once the log
                    # under it is synced, so no crash tore this record: damage.
                    item = Problem(
                        ERROR,
                        "corruption",
                        item.file,
                        item.offset,
                        item.seq,
                        f"{item.reason.split(':')[0]} at seq {item.seq}, which the snapshot "
                        f"at seq {snap_seq} says was durable: recovery refuses to start",
                    )
                report.add(item)
            elif type(item) is SegmentStart:
                report.segments += 1
                log.segment_rel = item.segment.rel
    pending = log.pending
    replaying = log.next_apply != _NEVER
    if replaying:
        report.replayed_to = log.next_apply - 1
    base_seq = base.seq
    applied = report.replayed_to if report.replayed_to is not None else base_seq
    report.records = log.records
    report.events = log.events
    report.first_time_ms = log.first_time
    report.last_time_ms = log.checks.last_time_ms if log.first_time is not None else None
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


_NEVER = -1  # `_LogPass.next_apply` once the replay stopped (or could not start)


class _LogPass:
    """The checks of the log, record after record: runs of good records through the
    fast path (`span`), every other valid record the slow way (`record`, which makes
    the reports). Both leave the same counters and verdicts behind; the fast path
    only ever takes records on which the slow way would report nothing."""

    def __init__(
        self, report: VerifyReport, state: State | None, base_seq: int, pending: list[SnapshotFile]
    ) -> None:
        self.report = report
        self.state = state
        self.base_seq = base_seq
        self.pending = pending
        # The seq the replay applies next; _NEVER once it stopped.
        self.next_apply = base_seq + 1 if state is not None else _NEVER
        self.next_snapshot = pending[0].last_seq if pending else _NEVER
        self.records = 0
        self.events = 0
        self.first_time: int | None = None
        # Record times, the catalogue: `checks.last_time_ms` is the time of the last
        # record that passed (-1: none yet).
        self.checks = RunChecks(_EVENT_CHECKS)
        self.segment_rel = ""

    def rebase(self, base: RecoveryBase) -> None:
        """Damaged history below `base` (the snapshot recovery starts from): the
        replay restarts from that snapshot unless it is there already."""
        if base.snapshot is None or base.state is None or self.base_seq >= base.seq:
            return
        report = self.report
        self.state = base.state
        self.base_seq = base.seq
        self.next_apply = base.seq + 1
        report.replay_from = base.seq
        report.replay_from_snapshot = base.snapshot.rel
        report.replay_stopped = None
        report.replayed_to = None
        while self.pending and self.pending[0].last_seq <= base.seq:
            snap = self.pending.pop(0)
            if snap.rel == base.snapshot.rel:
                _check_alone(
                    report,
                    snap,
                    "the replay restarts from this snapshot after damaged history: only its "
                    "internal consistency was checked",
                    loaded=base.state,
                    verdict="base",
                )
            else:
                _check_alone(
                    report, snap, "not compared with the log: damaged history lies before it"
                )
        self.next_snapshot = self.pending[0].last_seq if self.pending else _NEVER

    def stop(self, why: str) -> None:
        if self.next_apply != _NEVER:
            self.report.replayed_to = self.next_apply - 1
            self.report.replay_stopped = (
                f"{why}; the replay stopped after seq {self.next_apply - 1}"
            )
        self.next_apply = _NEVER

    def _snapshot_due(self, seq: int) -> None:
        if seq == self.next_snapshot and self.state is not None:
            self.pending = _compare_due(self.report, self.pending, self.state, seq)
            self.next_snapshot = self.pending[0].last_seq if self.pending else _NEVER

    def record(self, item: Record) -> None:
        """One record, the slow way: decode, catalogue, time, replay."""
        report, seq = self.report, item.seq
        self.records += 1
        try:
            envelope = decode_envelope(item.body)
        except FormatError as exc:
            report.add(Problem(ERROR, "decode", self.segment_rel, item.offset, seq, exc.reason))
            self.stop(f"record {seq} does not decode")
            return
        events = envelope.events
        self.events += len(events)
        invalid = _first_problem(events)
        if invalid is not None:
            report.add(Problem(ERROR, "event", self.segment_rel, item.offset, seq, invalid))
            self.stop(f"record {seq} has an invalid event")
            return
        time_ms = envelope.time_ms
        last_time = self.checks.last_time_ms
        if time_ms < last_time:
            report.add(
                Problem(
                    ERROR,
                    "time",
                    self.segment_rel,
                    item.offset,
                    seq,
                    f"time goes backwards: {format_time_ms(time_ms)} after "
                    f"{format_time_ms(last_time)}",
                )
            )
        self.checks.last_time_ms = time_ms
        if self.first_time is None:
            self.first_time = time_ms
        if seq == self.next_apply and self.state is not None:
            try:
                replay_record(self.state, item.body)
            except ReplayError as exc:
                report.add(Problem(ERROR, "apply", self.segment_rel, item.offset, seq, str(exc)))
                self.stop(f"record {seq} does not apply")
                return
            self.next_apply = seq + 1
            self._snapshot_due(seq)
        elif self.next_apply != _NEVER and seq > self.base_seq:
            missing = self.next_apply
            self.stop(
                f"record {missing} is missing"
                if seq == missing + 1
                else f"records {missing}..{seq - 1} are missing"
            )

    def span(self, span: Span) -> None:
        """The good records from `span.offset` on, through the fast path: replayed
        (and checked) from the seq the replay applies next, only checked before it
        or once the replay stopped. Stops at the first record the slow way must
        look at: one that is not valid, fails a check, or does not follow on from
        the replay (a gap: `record` says what is missing)."""
        buf = span.buf
        while True:
            offset, seq = span.offset, span.seq
            first_time = self.first_time
            if first_time is None:
                # The time of the run's first record, if the run takes it.
                first = next(
                    iter(ValidEnvelopes(buf, start_offset=offset, expected_seq=seq, until_seq=seq)),
                    None,
                )
                first_time = first[1] if first is not None else None
            until: int | None
            if self.next_apply == _NEVER or seq <= self.base_seq:
                until = self.base_seq if self.next_apply != _NEVER else None
                run = check_run(
                    buf, start_offset=offset, expected_seq=seq, until_seq=until, checks=self.checks
                )
            elif seq != self.next_apply:
                return  # records are missing: `record` words it
            else:
                until = self.next_snapshot if self.next_snapshot >= seq else None
                state = self.state
                assert state is not None  # replaying
                try:
                    run = replay_run(
                        state,
                        buf,
                        start_offset=offset,
                        expected_seq=seq,
                        until_seq=until,
                        checks=self.checks,
                    )
                except ReplayError as exc:
                    self._apply_failed(span, exc, first_time)
                    continue
                self.next_apply = run.seq
                if run.records:
                    self._snapshot_due(run.seq - 1)
            self.records += run.records
            self.events += run.events
            if run.records and self.first_time is None:
                self.first_time = first_time
            span.offset, span.seq = run.offset, run.seq
            if not (run.records and until is not None and run.seq == until + 1):
                return  # stopped at something else than a seq it was asked to stop at

    def _apply_failed(self, span: Span, exc: ReplayError, first_time: int | None) -> None:
        """A record that passed the checks does not apply: what `record` says of it,
        and the span goes on after it."""
        done: RunResult = exc.result  # type: ignore[attr-defined]
        offset, seq = exc.offset, exc.seq  # type: ignore[attr-defined]
        body_len = _BODY_LEN.unpack_from(span.buf, offset + 8)[0]
        end = offset + RECORD_HEADER_BYTES + body_len
        envelope = decode_envelope(span.buf[offset + RECORD_HEADER_BYTES : end])
        self.records += done.records + 1
        self.events += done.events + len(envelope.events)
        if self.first_time is None:
            self.first_time = first_time
        self.report.add(
            Problem(ERROR, "apply", self.segment_rel, offset, seq, exc.reason)  # type: ignore[attr-defined]
        )
        self.next_apply = seq
        self.stop(f"record {seq} does not apply")
        span.offset, span.seq = end, seq + 1


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
