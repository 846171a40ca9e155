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
    time does not exist (DST gap), the end of the gap."""
    naive = datetime.combine(day, wall.replace(tzinfo=None))
    candidate = naive.replace(tzinfo=tz, fold=0)
    as_utc = candidate.astimezone(UTC)
    if as_utc.astimezone(tz).replace(tzinfo=None) == naive:
        return as_utc
    # Non-existent wall time: zoneinfo resolved it with the pre-transition offset, which lands
    # after the gap. The first instant whose wall time is >= the requested one is the transition
    # itself: step back minute by minute (gaps are at most a few hours; transitions fall on
    # whole minutes) while the previous minute still reads >= the requested wall time.
    t = as_utc
    while (t - timedelta(minutes=1)).astimezone(tz).replace(tzinfo=None) >= naive:
        t -= timedelta(minutes=1)
    return t
