"""Recurring campaigns (docs/RECURRING.md): the schedule rule over the API and its checks — frequency,
RFC 5545 ranges, a rule that never matches refused by one 400-year cycle, sub-daily intervals. Runs,
DST and the admin: test_campaign_recurring.py."""

from __future__ import annotations

from datetime import datetime

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from campaigns import recurrence
from campaigns.models import Campaign
from tests import test_campaign_recurring as recurring
from tests.test_campaign_recurring import NOW, fields, post, series_body, utc

pytestmark = pytest.mark.django_db
http = recurring.http  # the module's fixtures, shared
members = recurring.members


# --- the schedule rule ---------------------------------------------------------------------------

@pytest.mark.parametrize(("rrule", "expected"), [
    ("FREQ=SECONDLY", ("schedule.rrule", "too_frequent")),
    ("FREQ=MINUTELY;INTERVAL=30", ("schedule.rrule", "too_frequent")),
    # FREQ is daily, the expansion is not: two occurrences 30 minutes apart each day.
    ("FREQ=DAILY;BYHOUR=9;BYMINUTE=0,30", ("schedule.rrule", "too_frequent")),
    ("FREQ=YEARLY;BYHOUR=0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23;BYMINUTE=0,30",
     ("schedule.rrule", "too_frequent")),
    ("FREQ=DAILY;COUNT=1000000", ("schedule.rrule", "count_too_large")),
    ("FREQ=YEARLY;BYSETPOS=400", ("schedule.rrule", "invalid_rrule")),
    # dateutil's own extension: BYEASTER=1000 was a 500 (an IndexError deep in its expansion; hadv33).
    ("FREQ=YEARLY;BYEASTER=1000", ("schedule.rrule", "invalid_rrule")),
    ("FREQ=YEARLY;BYEASTER=262", ("schedule.rrule", "invalid_rrule")),
    ("FREQ=DAILY;X-NAME=1", ("schedule.rrule", "invalid_rrule")),
    ("every monday", ("schedule.rrule", "invalid_rrule")),
    ("FREQ=WEEKLY\nEXDATE:20270308T090000", ("schedule.rrule", "invalid_rrule")),
    ("FREQ=DAILY;UNTIL=20270401T000000Z", ("schedule.rrule", "invalid_rrule")),
    ("FREQ=DAILY;UNTIL=20270201T000000", ("schedule.rrule", "no_occurrence")),
    ("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", ("schedule.rrule", "no_occurrence")),
    # Never matches, hour by hour: tried over one 400-year cycle, never walked to year 9999.
    ("FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30", ("schedule.rrule", "no_occurrence")),
    ("FREQ=HOURLY;COUNT=5;BYMONTH=2;BYMONTHDAY=30", ("schedule.rrule", "no_occurrence")),
    # Whole days: every 25 days fits no cycle before 9999; walked there 25 days a step (0.3 s).
    ("FREQ=HOURLY;INTERVAL=600;BYMONTH=2;BYMONTHDAY=30", ("schedule.rrule", "no_occurrence")),
    ("FREQ=HOURLY;INTERVAL=23;BYMONTH=2;BYMONTHDAY=30", ("schedule.rrule", "irregular_interval")),
])
def test_hostile_or_broken_rules_are_422_naming_schedule_and_write_nothing(http, frozen, members, rrule, expected):
    r = post(http, "/v1/campaigns", series_body(members, rrule=rrule))
    assert r.status_code == 422, r.content
    assert fields(r) == {expected}
    assert not Campaign.objects.exists()


#: Rules dateutil reads but that break RFC 5545: each was a 500 (dateutil or datetime failing while the
#: rule was expanded) or silently meant something else (BYMONTHDAY=0 is dropped: yearly turns daily).
OUT_OF_RANGE = [
    ("FREQ=WEEKLY;INTERVAL=-1", "INTERVAL=-1"),
    ("FREQ=DAILY;INTERVAL=-5", "INTERVAL=-5"),
    ("FREQ=DAILY;INTERVAL=0", "INTERVAL=0"),
    ("FREQ=DAILY;COUNT=-1", "COUNT=-1"),
    ("FREQ=YEARLY;BYMONTHDAY=0", "BYMONTHDAY=0"),
    ("FREQ=MONTHLY;BYMONTHDAY=32", "BYMONTHDAY=32"),
    ("FREQ=YEARLY;BYYEARDAY=367", "BYYEARDAY=367"),
    ("FREQ=YEARLY;BYWEEKNO=54", "BYWEEKNO=54"),
    ("FREQ=YEARLY;BYMONTH=13", "BYMONTH=13"),
    ("FREQ=DAILY;BYHOUR=24", "BYHOUR=24"),
    ("FREQ=DAILY;BYMINUTE=60", "BYMINUTE=60"),
    ("FREQ=DAILY;BYSECOND=60", "BYSECOND=60"),
    ("FREQ=MONTHLY;BYDAY=+999MO", "BYDAY=+999MO"),
    ("FREQ=MONTHLY;BYDAY=0MO", "BYDAY=0MO"),
    ("FREQ=WEEKLY;BYDAY=+1MO", "BYDAY=+1MO"),
    ("FREQ=WEEKLY;BYDAY=MO,MO", "BYDAY=MO,MO"),
    ("FREQ=DAILY;BYHOUR=" + ",".join(["9"] * 25), "BYHOUR=9,9"),
]


@pytest.mark.parametrize(("rrule", "part"), OUT_OF_RANGE)
def test_a_part_outside_its_rfc_5545_range_is_422_invalid_rrule_naming_it(http, frozen, members, rrule, part):
    r = post(http, "/v1/campaigns", series_body(members, rrule=rrule))
    assert r.status_code == 422, r.content
    assert fields(r) == {("schedule.rrule", "invalid_rrule")}
    assert part in r.json()["error"]["fields"][0]["message"]
    assert not Campaign.objects.exists()


@pytest.mark.parametrize("rrule", [
    "FREQ=MONTHLY;BYDAY=-1FR,+2MO;BYMONTHDAY=-1,-2,1", "FREQ=YEARLY;BYDAY=20MO", "FREQ=YEARLY;BYWEEKNO=-53,1;BYDAY=MO",
    "FREQ=YEARLY;BYYEARDAY=-366,1,366;BYSETPOS=-1", "FREQ=DAILY;BYHOUR=0,23;BYMINUTE=59;BYSECOND=59"])
def test_rules_at_the_edges_of_the_ranges_are_accepted(http, frozen, members, rrule):
    r = post(http, "/v1/campaigns", series_body(members, rrule=rrule))
    assert r.status_code == 202, r.content


def test_any_error_while_expanding_a_rule_is_422_invalid_rrule_never_500(frozen, monkeypatch):
    """The last resort behind the range checks: dateutil or datetime failing on a rule read fine."""
    def overflow(*args, **kwargs):
        raise OverflowError("date value out of range")

    monkeypatch.setattr(recurrence.du.rrule, "replace", overflow)
    with pytest.raises(recurrence.ScheduleError) as caught:
        recurrence.parse("FREQ=WEEKLY", "2027-03-01T09:00:00", "Europe/Paris", now=NOW)
    assert (caught.value.field, caught.value.code) == ("schedule.rrule", "invalid_rrule")
    assert "date value out of range" in str(caught.value)


NEVER_MATCHING = ["FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", "FREQ=MONTHLY;BYMONTHDAY=31;BYMONTH=4",
                  "FREQ=DAILY;BYYEARDAY=366;BYMONTH=1", "FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30",
                  "FREQ=HOURLY;BYMONTH=2;BYMONTHDAY=30", "FREQ=YEARLY;BYWEEKNO=53;BYDAY=MO;BYMONTH=1",
                  "FREQ=MINUTELY;INTERVAL=90;BYMONTH=4;BYMONTHDAY=31",
                  "FREQ=SECONDLY;INTERVAL=43200;BYMONTH=2;BYMONTHDAY=30",
                  "FREQ=WEEKLY;INTERVAL=3;BYMONTH=4,6,9,11;BYMONTHDAY=31",
                  # From 2027 every fourth year is never a leap year: the INTERVAL's alignment is kept.
                  "FREQ=YEARLY;INTERVAL=4;BYMONTH=2;BYMONTHDAY=29"]


@pytest.mark.parametrize("rrule", NEVER_MATCHING)
def test_a_rule_that_never_matches_is_refused_by_one_cycle_not_a_walk_to_year_9999(frozen, monkeypatch, rrule):
    """dateutil walks a rule that never matches period by period to year 9999 (2.6 s of CPU daily, 4 s
    hourly): the refusal comes from the 400-year cycle before any other expansion runs."""
    walked = []
    monkeypatch.setattr(recurrence, "_check_bounds", lambda *a: walked.append(a))
    with pytest.raises(recurrence.ScheduleError) as caught:
        recurrence.parse(rrule, "2027-03-01T09:00:00", "Europe/Paris", now=NOW)
    assert (caught.value.field, caught.value.code) == ("schedule.rrule", "no_occurrence")
    assert "never matches" in str(caught.value)
    assert walked == []


@pytest.mark.parametrize(("freq", "interval", "span"), [
    (recurrence.du.YEARLY, 1, 400), (recurrence.du.YEARLY, 3, 1200), (recurrence.du.YEARLY, 8, 400),
    (recurrence.du.MONTHLY, 7, 2800), (recurrence.du.WEEKLY, 7, 2800),
    (recurrence.du.WEEKLY, 3, 400), (recurrence.du.DAILY, 2, 800),
    (recurrence.du.DAILY, 21, 400), (recurrence.du.HOURLY, 48, 800), (recurrence.du.MINUTELY, 90, 400)])
def test_the_cycle_probe_keeps_the_rule_aligned_and_ends_by_year_9999(freq, interval, span):
    start = datetime(2027, 3, 1, 9)
    rule = recurrence.du.rrule(freq, interval=interval, dtstart=start, count=5)
    probe = recurrence.cycle_probe(rule, start)
    moved = probe._dtstart.year - start.year
    assert moved % span == 0 and moved > 0
    assert probe._dtstart.year + span - 1 <= 9999 < probe._dtstart.year + 2 * span - 1
    assert probe._dtstart.replace(year=start.year) == start
    assert (probe._count, probe._until, probe._interval) == (None, None, interval)


@pytest.mark.parametrize("rrule", [
    "FREQ=HOURLY;INTERVAL=23;BYMONTH=2;BYMONTHDAY=30", "FREQ=MINUTELY;INTERVAL=61;BYMONTH=2;BYMONTHDAY=30",
    "FREQ=SECONDLY;INTERVAL=86399;BYMONTH=2;BYMONTHDAY=30", "FREQ=HOURLY;INTERVAL=5", "FREQ=HOURLY;INTERVAL=25",
    "FREQ=MINUTELY;INTERVAL=100"])
def test_a_sub_daily_interval_that_drifts_across_days_is_refused_before_any_walk(frozen, monkeypatch, rrule):
    """Every 23 h, the times of day drift: the rule repeats with the calendar only after 9,200 years and
    dateutil walks it day by day (10 s of CPU when it never matches). Refused from FREQ and INTERVAL."""
    monkeypatch.setattr(recurrence, "cycle_probe", lambda *a: pytest.fail("walked"))
    with pytest.raises(recurrence.ScheduleError) as caught:
        recurrence.parse(rrule, "2027-03-01T09:00:00", "Europe/Paris", now=NOW)
    assert (caught.value.field, caught.value.code) == ("schedule.rrule", "irregular_interval")
    assert "neither divides a day nor is whole days" in str(caught.value)


@pytest.mark.parametrize(("rrule", "first"), [
    ("FREQ=HOURLY;INTERVAL=6", datetime(2027, 3, 1, 9)), ("FREQ=MINUTELY;INTERVAL=90", datetime(2027, 3, 1, 9)),
    ("FREQ=SECONDLY;INTERVAL=7200;BYHOUR=11", datetime(2027, 3, 1, 11)),
    ("FREQ=HOURLY;INTERVAL=48;BYDAY=WE", datetime(2027, 3, 3, 9))])
def test_a_sub_daily_interval_dividing_a_day_or_whole_days_is_accepted(frozen, rrule, first):
    # UTC: in Paris, every 90 minutes meets the spring-forward gap (01:30, then 03:00, 30 min later).
    schedule = recurrence.parse(rrule, "2027-03-01T09:00:00", "UTC", now=NOW)
    assert next(schedule.occurrences()).wall == first


@hypothesis_settings(max_examples=300, deadline=None, derandomize=True)
@given(freq=st.sampled_from([recurrence.du.HOURLY, recurrence.du.MINUTELY, recurrence.du.SECONDLY]),
       interval=st.integers(1, 10 ** 7))
def test_every_accepted_sub_daily_interval_has_a_cycle_or_steps_whole_days(freq, interval):
    """What bounds a never-matching rule's walk: a cycle probe (at most 146,097 days, one step each),
    or, without one, steps of at least 20 days each to year 9999 (at most ~146,000 steps)."""
    start = datetime(2027, 3, 1, 9)
    rule = recurrence.du.rrule(freq, interval=interval, dtstart=start)
    try:
        recurrence._check_interval(rule)
    except recurrence.ScheduleError:
        return
    if recurrence.cycle_probe(rule, start) is None:
        seconds = recurrence._STEP_SECONDS[freq] * interval
        assert seconds % 86400 == 0
        assert (datetime(9999, 12, 31) - start).days // (seconds // 86400) <= 146097


def test_an_interval_too_large_for_a_cycle_before_9999_is_walked_whole():
    """DAILY every 25th day repeats with the calendar only after 10,000 years: no probe, and the plain
    walk to 9999 is shorter than one cycle of daily periods."""
    start = datetime(2027, 3, 1, 9)
    assert recurrence.cycle_probe(recurrence.du.rrule(recurrence.du.DAILY, interval=25, dtstart=start), start) is None


@hypothesis_settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(freq=st.sampled_from(["YEARLY", "MONTHLY"]), interval=st.integers(1, 6),
       months=st.sets(st.integers(1, 12), min_size=1, max_size=3), day=st.sampled_from([28, 29, 30, 31, -1, -30]),
       year=st.integers(2026, 2035))
def test_the_cycle_probe_agrees_with_dateutils_walk_to_9999(freq, interval, months, day, year):
    """The cycle argument, checked: the probe finds an occurrence exactly when dateutil's own walk
    from the start does (yearly and monthly rules, whose whole walk is cheap enough to run)."""
    text = f"FREQ={freq};INTERVAL={interval};BYMONTH={','.join(map(str, sorted(months)))};BYMONTHDAY={day}"
    start = datetime(year, 1, 1, 9)
    rule = recurrence.du.rrulestr(text, dtstart=start)
    probe = recurrence.cycle_probe(rule, start)
    assert probe is not None
    assert (next(iter(probe), None) is None) == (next(iter(rule), None) is None), text


def test_a_rule_bunching_only_in_a_later_leap_year_is_refused(http, frozen, members):
    """Dec 31 23:50 and Jan 1 00:10 are 20 min apart only after a leap year's day 366: in 2032, more than
    CAMPAIGN_SCHEDULE_CHECK_DAYS (731) from the start; a rule with BYYEARDAY is checked over 4 years."""
    frozen[0] = utc(2028, 12, 1)
    r = post(http, "/v1/campaigns", series_body(
        members, rrule="FREQ=DAILY;BYYEARDAY=1,366;BYHOUR=0,23;BYMINUTE=10,50;BYSETPOS=1,-1",
        start="2029-01-01T00:10:00", timezone="UTC"))
    assert r.status_code == 422, r.content
    assert fields(r) == {("schedule.rrule", "too_frequent")}
    assert "2032-12-31 23:50:00 and 2033-01-01 00:10:00 are 1200 s apart" in r.json()["error"]["message"]


@pytest.mark.parametrize(("schedule", "expected"), [
    ({"start": "2027-03-01 09:00"}, ("schedule.start", "invalid")),
    ({"start": "2027-03-01T09:00:00Z"}, ("schedule.start", "invalid")),
    ({"start": "1900-01-01T09:00:00"}, ("schedule.start", "too_far_past")),
    # The checked window runs past year 9999: an OverflowError (a 500) before the bound.
    ({"start": "9999-12-31T23:59:59"}, ("schedule.start", "too_far_ahead")),
    ({"start": "9998-01-01T00:00:00"}, ("schedule.start", "too_far_ahead")),
    ({"start": "2028-03-02T09:00:00"}, ("schedule.start", "too_far_ahead")),
    ({"timezone": "+01:00"}, ("schedule.timezone", "invalid_timezone")),
    ({"timezone": "Mars/Olympus"}, ("schedule.timezone", "invalid_timezone")),
])
def test_bad_start_or_zone_is_422_naming_the_field(http, frozen, members, schedule, expected):
    body = series_body(members)
    body["schedule"].update(schedule)
    r = post(http, "/v1/campaigns", body)
    assert r.status_code == 422
    assert fields(r) == {expected}
    assert not Campaign.objects.exists()


def test_schedule_with_scheduled_at_is_422(http, frozen, members):
    r = post(http, "/v1/campaigns", series_body(members, scheduled_at="2027-03-02T10:00:00Z"))
    assert r.status_code == 422
    assert fields(r) == {("schedule", "schedule_conflict")}


def test_the_minimum_interval_is_a_setting_checked_on_the_expansion(http, frozen, members, settings):
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "SCHEDULE_MIN_INTERVAL_SECONDS": 7 * 3600}
    r = post(http, "/v1/campaigns", series_body(members, rrule="FREQ=DAILY;BYHOUR=9,15"))
    assert r.status_code == 422
    assert fields(r) == {("schedule.rrule", "too_frequent")}
    assert "7 h" not in r.json()["error"]["message"] and "25200 s" in r.json()["error"]["message"]
    assert post(http, "/v1/campaigns", series_body(members, rrule="FREQ=DAILY;BYHOUR=9,17")).status_code == 202
