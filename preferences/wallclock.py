"""Local wall-clock time → UTC instant, with one documented rule for DST transitions.

* A wall time that does not exist that day (spring-forward gap, e.g. 02:30 in Europe/Berlin on the
  last Sunday of March) resolves to the first instant after the gap (03:00 local).
* A wall time that occurs twice (fall-back fold, e.g. 02:30 on the last Sunday of October) resolves
  to its first occurrence (``fold=0``, the earlier UTC instant).

Used by quiet hours (when a window ends) and by local-time campaigns (when each recipient is due).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo


def wall_time_to_utc(day: date, wall: time, tz: ZoneInfo) -> datetime:
    """The UTC instant at which the clock in ``tz`` first reads ``wall`` on ``day``, or, if that wall
    time does not exist (DST gap), the end of the gap: the instant the clock jumps.

    Args:
        day, wall: the local date and wall-clock time (``wall`` naive; seconds and microseconds
            count: 02:30:30 in a 02:00–03:00 gap resolves to 03:00:00, not 03:00:30).
        tz: the zone.
    Returns: an aware UTC datetime. Never raises for a date Python can represent (a gap of a whole
    day, such as Pacific/Apia's 30 December 2011, resolves to the next midnight).
    """
    naive = datetime.combine(day, wall.replace(tzinfo=None))
    earlier, later = sorted(naive.replace(tzinfo=tz, fold=fold).astimezone(UTC) for fold in (0, 1))
    for candidate in (earlier, later):  # first occurrence (fold), else the only one
        if _wall(candidate, tz) == naive:
            return candidate
    # A gap: zoneinfo gave the wall time the offsets on both sides of the jump, so the clock reads
    # before `naive` at `earlier` and after it at `later`. The end of the gap is the first instant
    # that reads `naive` or later; bisect to the microsecond (a few dozen steps for a day-long gap).
    lo, hi = earlier, later
    while hi - lo > _TICK:
        mid = lo + (hi - lo) // 2
        if _wall(mid, tz) >= naive:
            hi = mid
        else:
            lo = mid
    return hi


_TICK = timedelta(microseconds=1)

#: The earliest any zone reaches a given wall time: UTC+14 (Pacific/Kiritimati).
MAX_UTC_OFFSET = timedelta(hours=14)


def earliest_instant(day: date, wall: time) -> datetime:
    """The first instant any zone's clock reads ``wall`` on ``day`` (in UTC+14): when a local-time
    campaign, or a recurring one in each recipient's zone, starts fanning out."""
    return datetime.combine(day, wall.replace(tzinfo=None), tzinfo=UTC) - MAX_UTC_OFFSET


def _wall(instant: datetime, tz: ZoneInfo) -> datetime:
    """The naive wall-clock reading of ``instant`` in ``tz``."""
    return instant.astimezone(tz).replace(tzinfo=None)
