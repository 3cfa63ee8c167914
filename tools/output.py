"""What `sepp-log` prints and how: human text or JSON lines, a progress bar on a
terminal, and the time, size and duration formats every command shares.

Owns: `Emitter` (one object per run: a human line or one JSON object per item, never
both), `Progress` (a tiny progress bar drawn on stderr only when stderr is a
terminal), `UsageError` (exit code 2), and the formats: times are ISO-8601 UTC with
milliseconds (`2023-11-14T22:13:20.000Z`), sizes in binary units, durations as
`1h02m03s`.

Promises: with `--json` every line on stdout is one JSON object with a "type" key,
so a consumer can filter with `jq 'select(.type == "problem")'`; nothing but JSON
goes to stdout. The progress bar writes nothing at all unless stderr is a TTY, so a
piped run prints exactly its report.

Must not import: `sepp.server`, `sepp.client`.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, TextIO

__all__ = [
    "Emitter",
    "Progress",
    "UsageError",
    "format_bytes",
    "format_duration_ms",
    "format_time_ms",
    "parse_time",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class UsageError(Exception):
    """A bad command line or an argument the data cannot satisfy by its form (a
    time that does not parse, a target directory that is not empty): exit code 2."""


# ---------------------------------------------------------------- formats


def format_time_ms(ms: int) -> str:
    """`2023-11-14T22:13:20.000Z` for 1700000000000. Integer arithmetic, so no float
    rounding ever shifts a millisecond."""
    seconds, millis = divmod(ms, 1000)
    return f"{_second(seconds)}.{millis:03d}Z"


@lru_cache(maxsize=4096)
def _second(seconds: int) -> str:
    # A log's times cluster (a command batch shares one), and strftime is the
    # costliest part of a dump line: remember recent seconds.
    return (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")


def parse_time(text: str) -> int:
    """Milliseconds since the Unix epoch of an ISO-8601 time. A time without a zone
    is UTC (the log's times are UTC; an operator's local zone is a guess). Raises
    UsageError for anything else."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise UsageError(
            f"not an ISO-8601 time: {text!r} (e.g. 2024-05-01T12:00:00Z or 2024-05-01 12:00)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def format_bytes(size: int) -> str:
    """`512 B`, `4.0 KiB`, `1.5 GiB`."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f} {unit}"


def format_duration_ms(ms: int) -> str:
    """`850ms`, `12.5s`, `3m07s`, `2h05m`, `3d04h` (negative durations get a `-`)."""
    if ms < 0:
        return "-" + format_duration_ms(-ms)
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    seconds = ms // 1000
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    if seconds < 86_400:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 86_400}d{seconds % 86_400 // 3600:02d}h"


# ---------------------------------------------------------------- progress


class Progress:
    """A one-line progress bar on stderr: `verify [#####-----]  48%  1.2 GiB / 2.5 GiB  3s`.

    Drawn only when `enabled` (by default: stderr is a terminal). Redraws at most
    every `interval_s`, so calling `advance` once per chunk costs nothing. Units are
    bytes of log read: the one measure known up front for every command."""

    def __init__(
        self,
        label: str,
        total_bytes: int,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
        interval_s: float = 0.1,
        width: int = 30,
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.total = max(total_bytes, 1)
        self.done = 0
        self.interval_s = interval_s
        self.width = width
        self.started = time.monotonic()
        self._last_draw = 0.0
        self.shown = False

    def advance(self, nbytes: int) -> None:
        self.done += nbytes
        if self.enabled:
            now = time.monotonic()
            if now - self._last_draw >= self.interval_s:
                self._last_draw = now
                self._draw(now)

    def _draw(self, now: float) -> None:
        fraction = min(self.done / self.total, 1.0)
        filled = int(fraction * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        line = (
            f"{self.label} [{bar}] {fraction * 100:3.0f}%  "
            f"{format_bytes(self.done)} / {format_bytes(self.total)}  {now - self.started:.0f}s"
        )
        self.stream.write("\r\x1b[K" + line)
        self.stream.flush()
        self.shown = True

    def hide(self) -> None:
        """Erase the bar (before other output goes to the same terminal)."""
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.shown = False
            self._last_draw = 0.0

    def finish(self) -> None:
        self.hide()
        self.enabled = False


# ---------------------------------------------------------------- emitter


class Emitter:
    """Writes a run's output: human lines, or JSON lines when `json_lines`.

    `emit(kind, human, data)` prints `human` (a line or lines of text; None prints
    nothing) in human mode and `{"type": kind, **data}` in JSON mode. `note(text)`
    is for human-only remarks that have no JSON form (headings, blank lines)."""

    def __init__(
        self,
        *,
        json_lines: bool,
        stream: TextIO | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.json_lines = json_lines
        self.stream = stream if stream is not None else sys.stdout
        self.progress = progress

    def emit(self, kind: str, human: str | None, data: dict[str, Any]) -> None:
        if self.json_lines:
            self._write(json.dumps({"type": kind, **data}, ensure_ascii=False))
        elif human is not None:
            self._write(human)

    def note(self, text: str) -> None:
        if not self.json_lines:
            self._write(text)

    def _write(self, line: str) -> None:
        if self.progress is not None:
            self.progress.hide()
        self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()
