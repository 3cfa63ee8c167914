"""`sepp-log dump DATA_DIR`: the records of the log and their events, streamed.

Owns: `DumpFilter`, `dump()` and the record/event lines it prints.

Promises:
- Constant memory: records stream from `tools.segments` (bounded chunks) to the
  output one event at a time; nothing is kept per record. Only `--queue` keeps
  something -- the queue of each job still alive (`tools.events.JobQueues`), since
  most events name only a job id -- which grows with the jobs alive at once, never
  with the length of the log.
- Filters: `--from-seq/--to-seq` (inclusive), `--since/--until` (record times,
  inclusive), `--queue`, `--job`, `--type` (event names, comma-separated). An event
  is printed when it passes every filter given. Record times never go backwards
  (FORMAT.md section 6; `verify` checks it), so `--until` and `--to-seq` stop the
  read, and `--since` / `--from-seq` skip whole segments unread (judged by the seq
  and time of the next segment's first record) unless `--queue` needs the history.
- `--follow` keeps reading the last segment as a live server appends to it, and
  moves to the next segment when one appears, like `tail -f`: a record being
  appended (a torn tail) is waited for, never reported.

Output: one line per event (`seq time command Event field=value ...`), or with
`--json` one object per event: {"type": "event", "seq", "time", "time_ms",
"command", "file", "offset", "index", "event", "fields"}. Problems go to stderr
(human) or to stdout as {"type": "problem"} objects (JSON).

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from log_format import (
    COMMAND_KIND_NAMES,
    FILE_HEADER_BYTES,
    BadHeader,
    CleanEnd,
    Corruption,
    FormatError,
    Record,
    TornTail,
    decode_envelope,
    segment_file_name,
)
from sepp.storage.recovery import WAL_DIR

from .datadir import ERROR, WARNING, DataDir, Problem
from .events import JobQueues, event_name, human_fields, job_id_of, json_fields
from .output import format_time_ms
from .segments import (
    CHUNK_BYTES,
    LogWalker,
    SegmentStart,
    read_header,
    record_end,
    scan_segment_file,
)
from .states import choose_base

__all__ = ["DumpFilter", "DumpResult", "EventLine", "dump"]


@dataclass(frozen=True, slots=True)
class DumpFilter:
    from_seq: int | None = None
    to_seq: int | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    queue: str | None = None
    job: str | None = None
    types: frozenset[int] | None = None


@dataclass(frozen=True, slots=True)
class EventLine:
    """One event printed by dump: where it is, when, and what."""

    seq: int
    time_ms: int
    command_kind: int
    file: str
    offset: int
    index: int
    event: list[Any]

    def human(self) -> str:
        command = COMMAND_KIND_NAMES.get(self.command_kind, str(self.command_kind))
        fields = human_fields(self.event)
        return f"{self.seq} {format_time_ms(self.time_ms)} {command} {event_name(self.event)}" + (
            f" {fields}" if fields else ""
        )

    def data(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "time": format_time_ms(self.time_ms),
            "time_ms": self.time_ms,
            "command": COMMAND_KIND_NAMES.get(self.command_kind, self.command_kind),
            "file": self.file,
            "offset": self.offset,
            "index": self.index,
            "event": event_name(self.event),
            "fields": json_fields(self.event),
        }


@dataclass
class DumpResult:
    records: int = 0
    events: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(p.severity == ERROR for p in self.problems) else 0


class _Stop(Exception):
    """A filter's upper bound was passed: nothing later can match."""


class _Dumper:
    def __init__(
        self,
        data_dir: DataDir,
        filt: DumpFilter,
        on_event: Callable[[EventLine], None],
        on_problem: Callable[[Problem], None],
    ) -> None:
        self.data_dir = data_dir
        self.filt = filt
        self.on_event = on_event
        self.on_problem = on_problem
        self.result = DumpResult()
        self.queues: JobQueues | None = JobQueues() if filt.queue is not None else None
        # Where the follower goes on: the segment being read, the offset after its
        # last good record, and the next seq.
        self.segment_path: str | None = None
        self.offset = FILE_HEADER_BYTES
        self.next_seq: int | None = None

    def problem(self, problem: Problem) -> None:
        self.result.problems.append(problem)
        self.on_problem(problem)

    def record(self, rel: str, record: Record) -> None:
        """Print the events of `record` that pass the filters (raises _Stop past
        the upper bounds)."""
        filt = self.filt
        seq = record.seq
        self.next_seq = seq + 1
        self.offset = record_end(record)
        if filt.to_seq is not None and seq > filt.to_seq:
            raise _Stop
        queues = self.queues
        before = filt.from_seq is not None and seq < filt.from_seq
        if before and queues is None:
            return
        try:
            envelope = decode_envelope(record.body)
        except FormatError as exc:
            self.problem(Problem(ERROR, "decode", rel, record.offset, seq, exc.reason))
            return
        events = envelope.events
        time_ms = envelope.time_ms
        if filt.until_ms is not None and time_ms > filt.until_ms:
            raise _Stop
        self.result.records += 1
        skip = before or (filt.since_ms is not None and time_ms < filt.since_ms)
        if not skip:
            for index, event in enumerate(events):
                if filt.types is not None and event[0] not in filt.types:
                    continue
                if filt.job is not None and job_id_of(event) != filt.job:
                    continue
                if queues is not None and queues.queue_of(event) != filt.queue:
                    continue
                self.result.events += 1
                self.on_event(
                    EventLine(seq, time_ms, envelope.command_kind, rel, record.offset, index, event)
                )
        if queues is not None:
            queues.update(events)
        if filt.to_seq is not None and seq >= filt.to_seq:
            raise _Stop  # nothing after it can match: do not even read it


def dump(
    data_dir: DataDir,
    filt: DumpFilter,
    *,
    on_event: Callable[[EventLine], None],
    on_problem: Callable[[Problem], None],
    follow: Callable[[], bool] | None = None,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> DumpResult:
    """Stream the events of `data_dir` that pass `filt` to `on_event`.

    With `follow`, keep reading as the log grows: `follow()` is called whenever
    everything written so far has been read; it waits (the CLI sleeps a poll
    interval) and returns False to stop."""
    dumper = _Dumper(data_dir, filt, on_event, on_problem)
    if dumper.queues is not None:
        base = choose_base(data_dir, newest=False)
        if base.state is not None and base.seq > 0:
            dumper.queues.seed(base.state)
    walker = LogWalker(data_dir, chunk_bytes=chunk_bytes, on_bytes=on_bytes)
    rel = ""
    try:
        for item in walker.walk(from_seq=_start_seq(data_dir, filt, chunk_bytes)):
            if type(item) is Record:
                dumper.record(rel, item)
            elif type(item) is SegmentStart:
                rel = item.segment.rel
                dumper.segment_path = item.segment.path
                dumper.offset = FILE_HEADER_BYTES
                dumper.next_seq = item.first_seq
            elif type(item) is Problem:
                if follow is not None and item.kind == "torn-tail":
                    continue  # a record being appended: the follower waits for it
                dumper.problem(item)
                if item.severity == ERROR:
                    return dumper.result
        if follow is not None:
            _follow(dumper, follow, chunk_bytes)
    except _Stop:
        pass
    if dumper.queues is not None and dumper.queues.unknown_jobs:
        dumper.problem(
            Problem(
                WARNING,
                "log-start",
                None,
                None,
                None,
                f"{dumper.queues.unknown_jobs} events concern jobs whose queue is unknown "
                "(enqueued before the start of the log, with no snapshot to tell): "
                "they were left out",
            )
        )
    return dumper.result


def _start_seq(data_dir: DataDir, filt: DumpFilter, chunk_bytes: int) -> int | None:
    """The first seq worth reading: segments wholly before --from-seq / --since are
    skipped (not with --queue, whose index needs every record)."""
    if filt.queue is not None:
        return None
    start = filt.from_seq
    if filt.since_ms is not None:
        segments = data_dir.segments
        chosen = segments[0].first_seq if segments else None
        for index in range(len(segments) - 1):
            first_time = _first_time(
                segments[index + 1].path, segments[index + 1].first_seq, chunk_bytes
            )
            if first_time is None or first_time >= filt.since_ms:
                break
            chosen = segments[index + 1].first_seq
        if chosen is not None:
            start = max(start or 0, chosen)
    return start


def _first_time(path: str, first_seq: int, chunk_bytes: int) -> int | None:
    """The time of a segment's first record, or None (unreadable: read it)."""
    try:
        items = scan_segment_file(path, expected_seq=first_seq, chunk_bytes=chunk_bytes)
        first = next(items)
        if type(first) is Record:
            return decode_envelope(first.body).time_ms
    except (OSError, FormatError):
        pass
    return None


def _follow(dumper: _Dumper, follow: Callable[[], bool], chunk_bytes: int) -> None:
    """Read what a live server appends, from where the walk stopped."""
    wal_dir = os.path.join(dumper.data_dir.root, WAL_DIR)
    if dumper.segment_path is None:
        # No segment was readable yet (a fresh directory): wait for the first one.
        first = dumper.next_seq or 1
        dumper.segment_path = os.path.join(wal_dir, segment_file_name(first))
        dumper.next_seq = first
        dumper.offset = 0
    while True:
        progressed = _read_on(dumper, chunk_bytes)
        if progressed is None:
            return  # an error was reported
        if not progressed:
            next_seq = dumper.next_seq or 1
            following = os.path.join(wal_dir, segment_file_name(next_seq))
            if following != dumper.segment_path and os.path.exists(following):
                # The writer seals a segment before it creates the next: read the
                # current one once more, then move on.
                if _read_on(dumper, chunk_bytes):
                    continue
                dumper.segment_path = following
                dumper.offset = 0
                continue
            if not follow():
                return


def _read_on(dumper: _Dumper, chunk_bytes: int) -> bool | None:
    """Read the records appended to the current segment since the last call. True
    if any, False if none (yet), None after an error (reported)."""
    path = dumper.segment_path
    if path is None:  # pragma: no cover - _follow sets it first
        raise RuntimeError("no segment to follow")
    rel = dumper.data_dir.rel(path)
    expected = dumper.next_seq or 1
    if dumper.offset == 0:
        try:
            header = read_header(path)
        except FileNotFoundError:
            return False
        if isinstance(header, TornTail):
            return False  # being created
        if isinstance(header, BadHeader):
            dumper.problem(Problem(ERROR, "bad-header", rel, 0, expected, header.reason))
            return None
        if header.first_seq != expected:
            dumper.problem(
                Problem(
                    ERROR,
                    "sequence-gap",
                    rel,
                    0,
                    expected,
                    f"sequence gap between segments: expected seq {expected}, "
                    f"segment starts at seq {header.first_seq}",
                )
            )
            return None
        dumper.offset = FILE_HEADER_BYTES
    progressed = False
    items: Iterator[Any] = scan_segment_file(
        path, start_offset=dumper.offset, expected_seq=expected, chunk_bytes=chunk_bytes
    )
    for item in items:
        if type(item) is Record:
            dumper.record(rel, item)
            progressed = True
        elif type(item) is Corruption:
            seq = item.seq if item.seq is not None else dumper.next_seq
            kind = "sequence-gap" if item.reason.startswith("sequence ") else "corruption"
            dumper.problem(Problem(ERROR, kind, rel, item.offset, seq, item.reason))
            return None
        elif type(item) in (CleanEnd, TornTail):
            break
    return progressed
