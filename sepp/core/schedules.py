"""Schedules (issue 17): cron expressions, time-zone offsets as data, and tick times.

Owns: `parse_cron` (5-field cron, our own parser: see below), the zone table (UTC
offsets as a list of `(start_utc_ms, offset_ms)` segments), `next_tick` (the first
tick strictly after a time), `Schedule` (a schedule's state: its defining event, its
pause flag and its next tick), and the limits of all of it.

Promises: pure integer arithmetic. Time-zone rules are an *input*, like time: the
edge resolves the IANA name (zoneinfo, sepp.server.timezones) into a zone table
that the schedule's command carries and its ScheduleDefined event logs, so decide
needs no tz database and a tzdata upgrade never changes what the log means.

The DST rules are ours (decided here, tested in tests/core/test_schedules.py):
- a local time that does not exist (the spring-forward gap) fires once, at the
  first valid local minute after the gap;
- a local time that exists twice (the autumn fold) fires once, at its first
  occurrence.

Why our own parser and not croniter: croniter's maintainers announced that it
would become unmaintained and be removed from PyPI from March 2025 (as quoted in
python-crontab's issue 116); it works on `datetime`, which the core may not
import; and the DST rules above are ours either way. Five fields of integers are
a page of code with full tests.

Must not import: anything outside the standard library and `sepp.core` (no
datetime, no zoneinfo: the layering test forbids them here).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, NamedTuple

MINUTE_MS = 60_000
HOUR_MS = 3_600_000
DAY_MS = 86_400_000
# The zone table's first segment starts here (any time before it has its offset).
ZONE_START_MS = -(2**62)
# A zone table holds at most this many segments (a DST zone has ~2 per year; the
# edge builds 2020..2100, ~160).
ZONE_SEGMENTS_MAX = 512
# |UTC offset| at most this (real zones stay within -12h..+14h).
ZONE_OFFSET_MS_MAX = 26 * HOUR_MS
# A cron search looks this far ahead for a match; none: the expression never fires
# (e.g. `0 0 30 2 *`), refused at definition.
CRON_SEARCH_MS_MAX = 5 * 366 * DAY_MS
# every_ms bounds: one second (a sweep per second per schedule at most) .. one year.
SCHEDULE_EVERY_MS_MIN = 1_000
SCHEDULE_EVERY_MS_MAX = 366 * DAY_MS
# A schedule name in UTF-8 bytes; a time-zone name.
SCHEDULE_NAME_BYTES_MAX = 200
TIMEZONE_NAME_BYTES_MAX = 64
# Schedules one server holds.
SCHEDULES_MAX = 100_000
# catch_up = "none": a tick fires only if the sweep sees it at most this late
# (an idle server fires within ~100 ms; a tick missed while the server was down
# is older than this and is skipped).
SCHEDULE_ON_TIME_MS = 1_000
# Ticks a sweep walks forward from a cron schedule's anchor to find the newest
# due one (catch-up none / one); further behind, it looks back from now instead.
CATCH_UP_SCAN_MAX = 1_000
CATCH_UP_NONE = "none"
CATCH_UP_ONE = "one"
CATCH_UP_ALL = "all"
CATCH_UP_POLICIES = (CATCH_UP_NONE, CATCH_UP_ONE, CATCH_UP_ALL)
CATCH_UP_DEFAULT = CATCH_UP_ONE
# The custom-map keys a fired job carries.
CUSTOM_SCHEDULE = "schedule"
CUSTOM_TICK = "schedule_tick_ms"

UTC_ZONE: tuple[int, ...] = (ZONE_START_MS, 0)


class CronError(ValueError):
    """A cron expression that does not parse (the message says where)."""


# ---------------------------------------------------------------------------
# Civil calendar (Howard Hinnant's algorithms): days since 1970-01-01 <-> y, m, d.


def days_from_civil(y: int, m: int, d: int) -> int:
    y -= m <= 2
    era = (y if y >= 0 else y - 399) // 400
    yoe = y - era * 400
    doy = (153 * (m + (-3 if m > 2 else 9)) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


def civil_from_days(z: int) -> tuple[int, int, int]:
    z += 719468
    era = (z if z >= 0 else z - 146096) // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    y = yoe + era * 400
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + (3 if mp < 10 else -9)
    return (y + (m <= 2), m, d)


# ---------------------------------------------------------------------------
# Cron


_MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_DAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
# (name, low, high, names offset by low)
_FIELDS: tuple[tuple[str, int, int, tuple[str, ...]], ...] = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 7, _DAYS),
)


class Cron(NamedTuple):
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 = Sunday
    # Both day fields restricted: a day matches if either does (Vixie cron).
    day_or: bool
    sorted_minutes: tuple[int, ...]


def _value(text: str, low: int, names: tuple[str, ...], what: str) -> int:
    lowered = text.lower()
    if names and lowered in names:
        return names.index(lowered) + (1 if low == 1 else 0)
    if not text.isdigit():
        raise CronError(f"{what}: {text!r} is not a number")
    return int(text)


def _parse_field(text: str, low: int, high: int, names: tuple[str, ...], what: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        if not part:
            raise CronError(f"{what}: empty list item")
        step = 1
        if "/" in part:
            part, _, step_text = part.partition("/")
            if not step_text.isdigit() or int(step_text) == 0:
                raise CronError(f"{what}: step {step_text!r} must be a positive number")
            step = int(step_text)
        if part == "*":
            first, last = low, high
        elif "-" in part:
            a, _, b = part.partition("-")
            first, last = _value(a, low, names, what), _value(b, low, names, what)
        else:
            first = _value(part, low, names, what)
            last = high if step > 1 else first
        if not (low <= first <= high and low <= last <= high):
            raise CronError(f"{what}: {part!r} is outside {low}..{high}")
        if first > last:
            raise CronError(f"{what}: range {part!r} runs backwards")
        out.update(range(first, last + 1, step))
    return out


def parse_cron(expression: str) -> Cron:
    """A 5-field cron expression: minute hour day-of-month month day-of-week, each
    `*`, a number, `a-b`, a list `a,b`, any of them with `/step`; month and weekday
    names (jan, mon) allowed; weekday 0 and 7 are Sunday."""
    parts = expression.split()
    if len(parts) != 5:
        raise CronError(f"a cron expression has 5 fields, got {len(parts)}")
    sets = [
        _parse_field(p, lo, hi, names, what) for p, (what, lo, hi, names) in zip(parts, _FIELDS)
    ]
    weekdays = {d % 7 for d in sets[4]}
    day_or = not parts[2].startswith("*") and not parts[4].startswith("*")
    return Cron(
        minutes=frozenset(sets[0]),
        hours=frozenset(sets[1]),
        days=frozenset(sets[2]),
        months=frozenset(sets[3]),
        weekdays=frozenset(weekdays),
        day_or=day_or,
        sorted_minutes=tuple(sorted(sets[0])),
    )


def _day_matches(cron: Cron, days: int, d: int) -> bool:
    weekday = (days + 4) % 7  # 1970-01-01 was a Thursday
    if cron.day_or:
        return d in cron.days or weekday in cron.weekdays
    return d in cron.days and weekday in cron.weekdays


# ---------------------------------------------------------------------------
# Zone tables: a flat tuple (start0, offset0, start1, offset1, ...), starts
# strictly increasing, the first ZONE_START_MS.


def zone_error(zone: object) -> str | None:
    if type(zone) not in (tuple, list):
        return "zone must be a list of integers"
    items: Any = zone
    if not items or len(items) % 2 or len(items) > 2 * ZONE_SEGMENTS_MAX:
        return f"zone must hold 1..{ZONE_SEGMENTS_MAX} (start, offset) pairs"
    if not all(type(x) is int for x in items):
        return "zone must be a list of integers"
    if items[0] != ZONE_START_MS:
        return "zone's first segment must start at ZONE_START_MS"
    for i in range(0, len(items), 2):
        if i and items[i] <= items[i - 2]:
            return "zone's segment starts must increase"
        if abs(items[i + 1]) > ZONE_OFFSET_MS_MAX:
            return "zone offsets must be within 26 hours"
    return None


def offset_at(zone: tuple[int, ...], utc_ms: int) -> int:
    starts = zone[0::2]
    i = bisect_right(starts, utc_ms) - 1
    return zone[2 * max(i, 0) + 1]


def _utc_of_local(zone: tuple[int, ...], local_ms: int) -> int | None:
    """The earliest UTC instant whose local time is `local_ms`; None in a gap."""
    best: int | None = None
    n = len(zone) // 2
    starts = zone[0::2]
    i = max(bisect_right(starts, local_ms - ZONE_OFFSET_MS_MAX) - 1, 0)
    while i < n:
        start = zone[2 * i]
        if start > local_ms + ZONE_OFFSET_MS_MAX:
            break
        u = local_ms - zone[2 * i + 1]
        end = zone[2 * i + 2] if i + 1 < n else None
        if u >= start and (end is None or u < end) and (best is None or u < best):
            best = u
        i += 1
    return best


def _resolve(zone: tuple[int, ...], local_ms: int) -> int:
    """A matching local minute's firing instant: its first occurrence, or for a
    skipped time the first valid local minute after the gap."""
    for _ in range(ZONE_OFFSET_MS_MAX // MINUTE_MS + 1):
        u = _utc_of_local(zone, local_ms)
        if u is not None:
            return u
        local_ms += MINUTE_MS
    raise ValueError("zone table has a gap longer than 26 hours")


def next_cron_tick(cron: Cron, zone: tuple[int, ...], after_ms: int) -> int | None:
    """The first tick of `cron` in `zone` strictly after `after_ms` (UTC ms), or
    None if none within CRON_SEARCH_MS_MAX."""
    # Start at the local minute of `after_ms`: no tick after `after_ms` has an
    # earlier local time (a fold's second occurrence shows local times whose
    # first occurrence is already past: the UTC check below skips them; a gap's
    # candidates resolve to its end, which is after `after_ms` only if the gap is).
    local = after_ms + offset_at(zone, after_ms)
    lm = local - local % MINUTE_MS
    limit = lm + CRON_SEARCH_MS_MAX
    while lm <= limit:
        days = lm // DAY_MS
        y, m, d = civil_from_days(days)
        if m not in cron.months:
            ny, nm = (y + 1, 1) if m == 12 else (y, m + 1)
            lm = days_from_civil(ny, nm, 1) * DAY_MS
            continue
        if not _day_matches(cron, days, d):
            lm = (days + 1) * DAY_MS
            continue
        of_day = (lm - days * DAY_MS) // MINUTE_MS
        h, mi = divmod(of_day, 60)
        if h not in cron.hours:
            lm = days * DAY_MS + (h + 1) * HOUR_MS
            continue
        if mi not in cron.minutes:
            nxt = next((x for x in cron.sorted_minutes if x > mi), None)
            lm = days * DAY_MS + h * HOUR_MS + (nxt * MINUTE_MS if nxt is not None else HOUR_MS)
            continue
        u = _resolve(zone, lm)
        if u > after_ms:
            return u
        lm += MINUTE_MS
    return None


# ---------------------------------------------------------------------------
# A schedule's state


class Schedule:
    """One schedule: `spec` is its ScheduleDefined event (what to enqueue and
    when), `paused`, and `next_ms`, the next tick not yet fired (its anchor)."""

    __slots__ = ("cron", "next_ms", "paused", "spec")

    def __init__(self, spec: Any, paused: bool, next_ms: int) -> None:
        self.spec = spec
        self.paused = paused
        self.next_ms = next_ms
        self.cron: Cron | None = parse_cron(spec.cron) if spec.cron is not None else None

    def next_after(self, after_ms: int) -> int | None:
        """The first tick strictly after `after_ms`."""
        every: int | None = self.spec.every_ms
        if every is not None:
            anchor = self.next_ms
            if after_ms < anchor:
                return anchor
            return anchor + ((after_ms - anchor) // every + 1) * every
        cron = self.cron
        if cron is None:  # not assert: must hold under -O
            raise ValueError(f"schedule {self.spec.name} has neither cron nor every_ms")
        return next_cron_tick(cron, tuple(self.spec.zone), after_ms)


def first_tick(
    cron: str | None, zone: tuple[int, ...], every_ms: int | None, now: int
) -> int | None:
    """A new schedule's first tick: `now + every_ms`, or its cron's first tick
    after `now`."""
    if every_ms is not None:
        return now + every_ms
    if cron is None:
        return None
    return next_cron_tick(parse_cron(cron), zone, now)
