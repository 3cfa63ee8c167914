"""IANA time zones as zone tables for the core (issue 17 schedules).

Owns: `zone_table(name)`: the UTC offsets of an IANA zone (zoneinfo) from
ZONE_TABLE_FROM_YEAR to ZONE_TABLE_TO_YEAR as the flat `(start_utc_ms, offset_ms,
...)` tuple sepp.core.schedules reads. The core may not import datetime or
zoneinfo: time-zone rules enter it as data, carried by the schedule's command and
logged in its ScheduleDefined event (so a tzdata upgrade never changes what the
log means; re-putting the schedule, as a reload does, picks the new rules up).

Promises: the same table for the same name and tzdata (a fixed range, not one
relative to now: a reload must not see a change where there is none). An unknown
name raises UnknownTimeZone.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from sepp.core.schedules import ZONE_START_MS

ZONE_TABLE_FROM_YEAR = 2020
ZONE_TABLE_TO_YEAR = 2100
_SAMPLE = timedelta(days=1)


class UnknownTimeZone(ValueError):
    pass


def _offset_ms(zone: ZoneInfo, at: datetime) -> int:
    delta = at.astimezone(zone).utcoffset()
    return 0 if delta is None else int(delta.total_seconds() * 1000)


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


@lru_cache(maxsize=256)
def zone_table(name: str) -> tuple[int, ...]:
    if name == "UTC":
        return (ZONE_START_MS, 0)
    try:
        zone = ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise UnknownTimeZone(f"unknown time zone {name!r}") from exc
    at = datetime(ZONE_TABLE_FROM_YEAR, 1, 1, tzinfo=UTC)
    end = datetime(ZONE_TABLE_TO_YEAR, 1, 1, tzinfo=UTC)
    current = _offset_ms(zone, at)
    out = [ZONE_START_MS, current]
    while at < end:
        nxt = at + _SAMPLE
        off = _offset_ms(zone, nxt)
        if off != current:
            # Bisect to the minute (transitions fall on whole minutes... or
            # seconds in old history: bisect to the second).
            lo, hi = at, nxt
            while hi - lo > timedelta(seconds=1):
                mid = lo + (hi - lo) / 2
                if _offset_ms(zone, mid) == current:
                    lo = mid
                else:
                    hi = mid
            out.extend((_ms(hi.replace(microsecond=0)), off))
            current = off
        at = nxt
    return tuple(out)
