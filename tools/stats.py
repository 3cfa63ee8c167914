"""`sepp-log stats DATA_DIR`: what the log holds, counted.

Owns: `collect_stats` (`LogStats`: segments, bytes, records, events by type and by
command, the seq and time ranges, events per minute) and `histogram_rows`, the
per-minute event-rate histogram drawn with `#` in the terminal.

Promises: one streaming pass (decoding envelopes, no replay); memory grows with the
number of distinct minutes that hold a record, never with the number of records.
The walk goes on after damage (the problems are reported, exit code 1) so the
counts cover every readable record.

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from log_format import COMMAND_KIND_NAMES, FormatError, Record, decode_envelope

from .datadir import ERROR, DataDir, Problem
from .events import event_name
from .output import Emitter, format_bytes, format_duration_ms, format_time_ms
from .segments import CHUNK_BYTES, LogWalker, SegmentStart

__all__ = [
    "MINUTE_MS",
    "LogStats",
    "collect_stats",
    "emit_stats",
    "histogram_rows",
    "minute_label",
]

MINUTE_MS = 60_000


@dataclass
class LogStats:
    segments: int = 0
    log_bytes: int = 0
    snapshots: list[tuple[int, int]] = field(default_factory=list)  # (last_seq, bytes)
    records: int = 0
    events: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    first_time_ms: int | None = None
    last_time_ms: int | None = None
    by_type: Counter[str] = field(default_factory=Counter)
    by_command: Counter[str] = field(default_factory=Counter)
    per_minute: Counter[int] = field(default_factory=Counter)  # minute index -> events
    problems: list[Problem] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if any(p.severity == ERROR for p in self.problems) else 0


def collect_stats(
    data_dir: DataDir,
    *,
    on_bytes: Callable[[int], None] | None = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> LogStats:
    stats = LogStats(log_bytes=data_dir.log_bytes)
    stats.snapshots = [(snap.last_seq, snap.size) for snap in data_dir.snapshots]
    walker = LogWalker(data_dir, resync=True, chunk_bytes=chunk_bytes, on_bytes=on_bytes)
    rel = ""
    by_type = stats.by_type
    by_command = stats.by_command
    per_minute = stats.per_minute
    for item in walker.walk():
        if type(item) is Record:
            try:
                envelope = decode_envelope(item.body)
            except FormatError as exc:
                stats.problems.append(
                    Problem(ERROR, "decode", rel, item.offset, item.seq, exc.reason)
                )
                continue
            stats.records += 1
            events = envelope.events
            stats.events += len(events)
            for event in events:
                by_type[event_name(event)] += 1
            by_command[
                COMMAND_KIND_NAMES.get(envelope.command_kind, str(envelope.command_kind))
            ] += 1
            time_ms = envelope.time_ms
            per_minute[time_ms // MINUTE_MS] += len(events)
            if stats.first_time_ms is None:
                stats.first_time_ms = time_ms
            stats.last_time_ms = time_ms
        elif type(item) is SegmentStart:
            stats.segments += 1
            rel = item.segment.rel
        elif type(item) is Problem:
            stats.problems.append(item)
    stats.first_seq = walker.first_seq
    stats.last_seq = walker.last_seq
    return stats


def histogram_rows(
    per_minute: Counter[int], *, rows_max: int = 60, bar_width: int = 40
) -> list[tuple[int, int, float, str]]:
    """Rows of the event-rate histogram: (start minute index, minutes per row,
    events per minute, bar). One row per minute when the time range spans at most
    `rows_max` minutes (empty minutes included: a gap in traffic shows), else rows of
    several minutes each, with the average rate."""
    if not per_minute:
        return []
    first, last = min(per_minute), max(per_minute)
    span = last - first + 1
    width = -(-span // rows_max)  # minutes per row, rounded up
    rows = []
    for start in range(first, last + 1, width):
        total = sum(
            per_minute.get(minute, 0) for minute in range(start, min(start + width, last + 1))
        )
        rows.append((start, width, total / width))
    peak = max(rate for _s, _w, rate in rows) or 1.0
    out = []
    for start, minutes, rate in rows:
        filled = round(rate / peak * bar_width)
        bar = "#" * filled if filled or not rate else "."
        out.append((start, minutes, rate, bar))
    return out


def minute_label(minute: int) -> str:
    """`2023-11-14T22:13Z` for a minute index."""
    return format_time_ms(minute * MINUTE_MS)[:16] + "Z"


def emit_stats(stats: LogStats, out: Emitter, *, rows_max: int = 60) -> None:
    """The counts, the histogram (human) or one object plus one per minute (JSON)."""
    seqs = f", seqs {stats.first_seq}..{stats.last_seq}" if stats.first_seq is not None else ""
    out.note(f"segments:  {stats.segments} ({format_bytes(stats.log_bytes)}){seqs}")
    snap_bytes = sum(size for _seq, size in stats.snapshots)
    at = ", ".join(str(seq) for seq, _size in stats.snapshots)
    out.note(
        f"snapshots: {len(stats.snapshots)} ({format_bytes(snap_bytes)})"
        + (f" at seqs {at}" if at else "")
    )
    out.note(f"records:   {stats.records}, events: {stats.events}")
    if stats.first_time_ms is not None and stats.last_time_ms is not None:
        out.note(
            f"time:      {format_time_ms(stats.first_time_ms)} .. "
            f"{format_time_ms(stats.last_time_ms)} "
            f"({format_duration_ms(stats.last_time_ms - stats.first_time_ms)})"
        )
    for title, counter in (
        ("events by type", stats.by_type),
        ("records by command", stats.by_command),
    ):
        if counter:
            out.note(f"{title}:")
            width = max(len(name) for name in counter)
            for name, count in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0])):
                out.note(f"  {name:<{width}}  {count:>10}")
    rows = histogram_rows(stats.per_minute, rows_max=rows_max)
    if rows:
        minutes = rows[0][1]
        out.note(
            "events per minute"
            + (f" (averaged over {minutes} minutes a row)" if minutes > 1 else "")
            + ":"
        )
        for start, _minutes, rate, bar in rows:
            out.note(f"  {minute_label(start)}  {rate:>10.1f}  {bar}")
    out.emit(
        "stats",
        None,
        {
            "segments": stats.segments,
            "bytes": stats.log_bytes,
            "snapshots": [{"seq": seq, "bytes": size} for seq, size in stats.snapshots],
            "records": stats.records,
            "events": stats.events,
            "first_seq": stats.first_seq,
            "last_seq": stats.last_seq,
            "first_time": format_time_ms(stats.first_time_ms)
            if stats.first_time_ms is not None
            else None,
            "last_time": format_time_ms(stats.last_time_ms)
            if stats.last_time_ms is not None
            else None,
            "events_by_type": dict(sorted(stats.by_type.items())),
            "records_by_command": dict(sorted(stats.by_command.items())),
        },
    )
    for minute, count in sorted(stats.per_minute.items()):
        out.emit("minute", None, {"minute": format_time_ms(minute * MINUTE_MS), "events": count})
