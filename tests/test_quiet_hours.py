"""Quiet-hours arithmetic on wall-clock time, including DST transition nights."""

from datetime import UTC, datetime, time
from zoneinfo import ZoneInfo

import pytest

from preferences.quiet_hours import in_window, window_end

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


@pytest.mark.parametrize(
    ("local", "start", "end", "inside"),
    [
        (time(22, 0), time(22), time(7), True),   # start inclusive
        (time(6, 59), time(22), time(7), True),
        (time(7, 0), time(22), time(7), False),   # end exclusive
        (time(12, 0), time(22), time(7), False),
        (time(13, 0), time(12), time(14), True),  # same-day window
        (time(14, 0), time(12), time(14), False),
        (time(3, 0), time(5), time(5), False),    # empty window
    ],
)
def test_in_window(local, start, end, inside):
    assert in_window(local, start, end) is inside


def test_window_crossing_midnight_ends_next_morning():
    now = datetime(2026, 6, 1, 21, 30, tzinfo=UTC)  # 23:30 in Berlin (CEST, +2)
    assert window_end(now, time(22), time(7), BERLIN) == datetime(2026, 6, 2, 5, 0, tzinfo=UTC)


def test_window_after_midnight_ends_same_morning():
    now = datetime(2026, 6, 1, 1, 0, tzinfo=UTC)  # 03:00 in Berlin
    assert window_end(now, time(22), time(7), BERLIN) == datetime(2026, 6, 1, 5, 0, tzinfo=UTC)


def test_outside_window_is_none():
    assert window_end(datetime(2026, 6, 1, 10, 0, tzinfo=UTC), time(22), time(7), BERLIN) is None


def test_berlin_spring_forward_end_in_gap_ends_when_gap_ends():
    # 2026-03-29 02:00 CET → 03:00 CEST; 02:30 does not exist; the window ends at 03:00 CEST = 01:00 UTC.
    now = datetime(2026, 3, 28, 23, 0, tzinfo=UTC)  # 00:00 CET
    assert window_end(now, time(22), time(2, 30), BERLIN) == datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


def test_berlin_spring_forward_night_window_is_shorter_in_utc():
    now = datetime(2026, 3, 28, 21, 30, tzinfo=UTC)  # 22:30 CET
    # 07:00 CEST on the 29th = 05:00 UTC: an 8.5 h window lasts 7.5 real hours that night.
    assert window_end(now, time(22), time(7), BERLIN) == datetime(2026, 3, 29, 5, 0, tzinfo=UTC)


def test_berlin_fall_back_end_in_fold_uses_first_occurrence():
    # 2026-10-25 03:00 CEST → 02:00 CET; 02:30 happens twice; the first is 00:30 UTC.
    now = datetime(2026, 10, 24, 22, 30, tzinfo=UTC)  # 00:30 CEST
    assert window_end(now, time(22), time(2, 30), BERLIN) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)


def test_new_york_spring_forward_gap():
    # 2026-03-08 02:00 EST → 03:00 EDT at 07:00 UTC; 02:15 does not exist.
    now = datetime(2026, 3, 8, 5, 0, tzinfo=UTC)  # 00:00 EST
    assert window_end(now, time(23), time(2, 15), NEW_YORK) == datetime(2026, 3, 8, 7, 0, tzinfo=UTC)


def test_new_york_fall_back_night_window_is_longer_in_utc():
    # 2026-11-01 02:00 EDT → 01:00 EST. 22:00 EDT (02:00 UTC) to 07:00 EST (12:00 UTC) = 10 real hours.
    now = datetime(2026, 11, 1, 2, 0, tzinfo=UTC)
    assert window_end(now, time(22), time(7), NEW_YORK) == datetime(2026, 11, 1, 12, 0, tzinfo=UTC)
