"""Quiet hours: is an instant inside a recipient's local quiet window, and when does it end?

A window is a local wall-clock ``start`` (inclusive) and ``end`` (exclusive) in an IANA zone. When
``start > end`` it crosses midnight (22:00–07:00). ``start == end`` means no window. All
arithmetic is on wall-clock times in the zone (``zoneinfo``), so a window means the same local
hours on a DST transition night:

* an ``end`` that does not exist that night (spring forward gap, e.g. 02:30 in Europe/Berlin on
  the last Sunday of March) ends the window at the first instant after the gap (03:00 local);
* an ``end`` that occurs twice (fall back fold) ends it at its first occurrence (``fold=0``).
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from zoneinfo import ZoneInfo

from preferences.validation import stored_zone
from preferences.wallclock import wall_time_to_utc


def in_window(local: time, start: time, end: time) -> bool:
    """True if the wall-clock time ``local`` is inside [start, end), crossing midnight if start > end."""
    if start == end:
        return False
    if start < end:
        return start <= local < end
    return local >= start or local < end


def window_end(now_utc: datetime, start: time, end: time, tz: ZoneInfo) -> datetime | None:
    """If ``now_utc`` is inside the quiet window, the UTC instant the window ends; else ``None``.

    Args:
        now_utc: an aware datetime (any zone; compared as an instant).
        start, end: local wall-clock bounds, naive ``time`` values (start inclusive, end exclusive).
        tz: the recipient's zone.
    """
    local = now_utc.astimezone(tz)
    wall = local.time().replace(tzinfo=None)
    if not in_window(wall, start, end):
        return None
    day = local.date()
    if start > end and wall >= start:
        day = day + timedelta(days=1)  # the window crosses midnight; it ends tomorrow
    result = wall_time_to_utc(day, end, tz)
    if result <= now_utc:
        # Only possible on a fold/gap night where the end wall time already passed in "the other"
        # offset; the window is effectively over.
        return None
    return result


def quiet_zone(quiet_timezone: str, recipient_timezone: str) -> tuple[ZoneInfo, list[str]]:
    """The zone a quiet window is in: ``quiet_timezone``, else the recipient's zone, else UTC.

    A stored name that is not a valid IANA zone (``America``, ``+03:00``: see
    :func:`preferences.validation.validate_iana_zone`) counts as empty and the next one is used.
    Returns ``(zone, invalid_names)``: the names skipped as invalid, for the caller to count. Never
    raises.
    """
    invalid = []
    for name in (quiet_timezone, recipient_timezone):
        if name:
            zone, fell_back = stored_zone(name)
            if not fell_back:
                return zone, invalid
            invalid.append(name)
    return ZoneInfo("UTC"), invalid
