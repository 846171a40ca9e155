"""A recurring campaign's schedule (docs/RECURRING.md): one RFC 5545 RRULE over local wall times,
its start (DTSTART, a wall time) and the zone they are read in: one IANA zone, or ``"recipient"``
(each recipient's own, as a local-time campaign does).

:func:`parse` is the one rule a schedule must pass (API, admin form, launch): a rule dateutil's
``rrulestr`` reads, at least ``CAMPAIGN_SCHEDULE_MIN_INTERVAL_SECONDS`` between any two occurrences
of its expansion (not only its FREQ), a bounded COUNT and a bounded number of times per day, and an
occurrence still ahead. :func:`occurrences` expands it into instants (DST rule of
:func:`preferences.wallclock.wall_time_to_utc`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import islice
from math import gcd
from zoneinfo import ZoneInfo

from dateutil import rrule as du
from django.conf import settings
from django.core.exceptions import ValidationError

from notifications.api.serializers import MAX_SCHEDULE_AHEAD, MAX_SCHEDULE_BEHIND
from preferences.validation import validate_iana_zone
from preferences.wallclock import MAX_UTC_OFFSET, earliest_instant, wall_time_to_utc

log = logging.getLogger(__name__)

#: ``schedule.timezone`` for "at the wall time in each recipient's zone".
RECIPIENT_ZONE = "recipient"
START_FORMAT = "%Y-%m-%dT%H:%M:%S"
#: More times of day than this cannot keep the minimum interval (and would make dateutil build huge sets).
MAX_TIMES_PER_DAY = 24
_DAY_SECONDS = 86400
_STEP_SECONDS = {du.HOURLY: 3600, du.MINUTELY: 60, du.SECONDLY: 1}
_FREQ_NAMES = {du.HOURLY: "HOURLY", du.MINUTELY: "MINUTELY", du.SECONDLY: "SECONDLY"}
#: RFC 5545 §3.3.10 ranges of the numeric list parts: (low, high, signed: -high..-low allowed too).
PART_RANGES = {"BYSECOND": (0, 59, False), "BYMINUTE": (0, 59, False), "BYHOUR": (0, 23, False),
               "BYMONTHDAY": (1, 31, True), "BYYEARDAY": (1, 366, True), "BYWEEKNO": (1, 53, True),
               "BYMONTH": (1, 12, False), "BYSETPOS": (1, 366, True)}
_WEEKDAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
#: The parts of an RFC 5545 RRULE (§3.3.10). dateutil reads more (BYEASTER, its own extension, whose
#: large values fail deep inside an expansion): refused by name.
RFC_PARTS = frozenset({"FREQ", "UNTIL", "COUNT", "INTERVAL", "WKST", "BYDAY", *PART_RANGES})
#: Parts whose matches can bunch up only every few years (a leap year's day 366, 31st of a month):
#: a rule with one is checked over at least 4 years and a day, past the next leap year.
_SPARSE_PARTS = ("_byyearday", "_bymonthday", "_bynmonthday", "_bysetpos", "_byweekno")
_LEAP_CYCLE_DAYS = 4 * 366 + 1
#: Periods of each FREQ in one Gregorian cycle (400 years = 146,097 days = 20,871 weeks): the calendar,
#: weekdays included, repeats after it, so a rule that matches nowhere in one aligned cycle never does.
_CYCLE_YEARS = 400
_PERIODS_PER_CYCLE = {du.YEARLY: 400, du.MONTHLY: 4800, du.WEEKLY: 20871, du.DAILY: 146097,
                      du.HOURLY: 146097 * 24, du.MINUTELY: 146097 * 1440, du.SECONDLY: 146097 * 86400}


def conf(name: str) -> int:
    return settings.CAMPAIGNS[name]


class ScheduleError(ValueError):
    """A schedule the rule refuses: ``field`` (``schedule.rrule``, ``schedule.start``,
    ``schedule.timezone``), ``code`` and the message naming the rule."""

    def __init__(self, field: str, code: str, message: str) -> None:
        super().__init__(message)
        self.field, self.code = field, code


@dataclass(frozen=True)
class Occurrence:
    """One occurrence: its local wall time and its instant (UTC). For a recipient-zone schedule the
    instant is when the earliest zone (UTC+14) reaches the wall time: the run's fan-out starts then."""

    wall: datetime
    at: datetime


@dataclass(frozen=True)
class Schedule:
    rule: str
    start: datetime
    timezone: str
    parsed: du.rrule

    @property
    def per_recipient(self) -> bool:
        return self.timezone == RECIPIENT_ZONE

    def instant(self, wall: datetime) -> datetime:
        """The UTC instant of a wall time: in the schedule's zone (a wall time in a spring-forward gap is
        the end of the gap; one that occurs twice, its first occurrence), or at UTC+14."""
        if self.per_recipient:
            return earliest_instant(wall.date(), wall.time())
        return wall_time_to_utc(wall.date(), wall.time(), ZoneInfo(self.timezone))

    def wall_at_or_before(self, instant: datetime) -> datetime:
        """A wall time no later than any wall time whose instant is ``instant`` or later."""
        if self.per_recipient:
            return (instant + MAX_UTC_OFFSET).replace(tzinfo=None)
        return instant.astimezone(ZoneInfo(self.timezone)).replace(tzinfo=None) - timedelta(hours=3)

    def occurrences(self, *, from_instant: datetime | None = None) -> Iterator[Occurrence]:
        """The occurrences in order (from the first at or after ``from_instant``), each instant once."""
        walls: Iterator[datetime] = iter(self.parsed)
        if from_instant is not None:
            walls = self.parsed.xafter(self.wall_at_or_before(from_instant), inc=True)
        last = None
        for wall in walls:
            at = self.instant(wall)
            if (from_instant is not None and at < from_instant) or at == last:
                continue  # two wall times of one instant (a gap's end): one occurrence
            last = at
            yield Occurrence(wall, at)

    def next_after(self, instant: datetime, n: int = 1) -> list[Occurrence]:
        """The next ``n`` occurrences strictly after ``instant``."""
        return list(islice((o for o in self.occurrences(from_instant=instant) if o.at > instant), n))


def parse(rule: str, start: str | datetime, timezone: str, *, now: datetime) -> Schedule:
    """The schedule, or :class:`ScheduleError` naming the field and the rule it breaks."""
    if isinstance(start, str):
        try:
            start = datetime.strptime(start, START_FORMAT)
        except ValueError:
            raise ScheduleError("schedule.start", "invalid", "a local wall time YYYY-MM-DDTHH:MM:SS, without a "
                                                             "zone (schedule.timezone says where)") from None
    if start.tzinfo is not None:
        raise ScheduleError("schedule.start", "invalid", "a local wall time without a zone or offset "
                                                         "(schedule.timezone says where)")
    if now.replace(tzinfo=None) - start > MAX_SCHEDULE_BEHIND:
        # Each expansion walks from the start: an hourly rule started in 1900 would cost a million steps.
        raise ScheduleError("schedule.start", "too_far_past", f"at most {MAX_SCHEDULE_BEHIND.days} days in the past")
    if start - now.replace(tzinfo=None) > MAX_SCHEDULE_AHEAD:
        # As scheduled_at; also keeps the checked window (start + CHECK_DAYS) far from year 9999.
        raise ScheduleError("schedule.start", "too_far_ahead", f"at most {MAX_SCHEDULE_AHEAD.days} days ahead")
    if timezone != RECIPIENT_ZONE:
        try:
            validate_iana_zone(timezone)
        except ValidationError as exc:
            raise ScheduleError("schedule.timezone", "invalid_timezone",
                                f'an IANA zone such as "Europe/Paris", or "{RECIPIENT_ZONE}": '
                                f'{" ".join(exc.messages)}') from None
    text = re.sub(r"^RRULE:", "", rule.strip(), flags=re.IGNORECASE)
    if not text or any(c in text for c in ":\r\n"):
        raise ScheduleError("schedule.rrule", "invalid_rrule", "one RRULE line such as FREQ=WEEKLY;BYDAY=MO (no "
                                                               "DTSTART, EXDATE or other property: the start is "
                                                               "schedule.start)")
    if re.search(r"UNTIL=\d{8}T\d{6}Z", text, flags=re.IGNORECASE):
        raise ScheduleError("schedule.rrule", "invalid_rrule", "UNTIL is a local wall time such as 20261231T235959, "
                                                               "without Z: the rule is read in schedule.timezone")
    _check_parts(text)
    try:
        parsed = du.rrulestr(text, dtstart=start)
    except Exception as exc:  # dateutil raises several types for bad input
        raise ScheduleError("schedule.rrule", "invalid_rrule", f"not an RFC 5545 RRULE (NAME=VALUE parts joined by "
                                                               f"';', e.g. FREQ=WEEKLY;BYDAY=MO): {exc}") from None
    if not isinstance(parsed, du.rrule):
        raise ScheduleError("schedule.rrule", "invalid_rrule", "one RRULE, not a set")
    schedule = Schedule(text, start, timezone, parsed)
    try:
        _check_interval(parsed)
        _check_ever_matches(parsed, start)
        _check_bounds(schedule, now)
    except ScheduleError:
        raise
    except Exception as exc:  # dateutil or datetime giving up while expanding (any type): never a 500
        raise ScheduleError("schedule.rrule", "invalid_rrule", f"the rule cannot be expanded from "
                                                               f"{start:%Y-%m-%dT%H:%M:%S}: {exc}") from None
    return schedule


def _invalid_part(message: str) -> ScheduleError:
    return ScheduleError("schedule.rrule", "invalid_rrule", message)


def _check_parts(text: str) -> None:
    """RFC 5545 ranges that dateutil does not enforce (it reads BYMONTHDAY=0 as "no BYMONTHDAY", so a
    yearly rule turns daily): INTERVAL and COUNT at least 1, each BY* value in its range, no value twice,
    a BYDAY ordinal (±1..53) only with FREQ=MONTHLY or YEARLY. Before dateutil, to name the part."""
    parts = dict(part.split("=", 1) for part in text.upper().split(";") if "=" in part)
    for name in parts:
        if name not in RFC_PARTS:
            raise _invalid_part(f"{name}: not a part of an RFC 5545 RRULE (FREQ, UNTIL, COUNT, INTERVAL, WKST, "
                                f"BYSECOND, BYMINUTE, BYHOUR, BYDAY, BYMONTHDAY, BYYEARDAY, BYWEEKNO, BYMONTH, "
                                f"BYSETPOS)")
    for name in ("INTERVAL", "COUNT"):
        if name in parts and not (parts[name].isdigit() and int(parts[name]) >= 1):
            raise _invalid_part(f"{name}={parts[name]}: {name} is a whole number of at least 1")
    for name, (low, high, signed) in PART_RANGES.items():
        if name not in parts:
            continue
        values = parts[name].split(",")
        for value in values:
            try:
                number = int(value)
            except ValueError:
                raise _invalid_part(f"{name}={parts[name]}: {value!r} is not a whole number") from None
            if not (low <= number <= high or (signed and -high <= number <= -low)):
                allowed = f"±{low}..{high}" if signed else f"{low}..{high}"
                raise _invalid_part(f"{name}={parts[name]}: {value} is outside {allowed} (RFC 5545)")
        if len({int(v) for v in values}) != len(values):
            raise _invalid_part(f"{name}={parts[name]}: a value is given twice")
    if "BYDAY" in parts:
        days = parts["BYDAY"].split(",")
        for day in days:
            ordinal = day[:-2]
            if day[-2:] not in _WEEKDAYS or not re.fullmatch(r"([+-]?\d{1,3})?", ordinal):
                raise _invalid_part(f"BYDAY={parts['BYDAY']}: {day!r} is not a weekday such as MO, +1MO or -1FR")
            if ordinal and not 1 <= abs(int(ordinal)) <= 53:
                raise _invalid_part(f"BYDAY={parts['BYDAY']}: the ordinal of {day} is outside ±1..53 (RFC 5545)")
            if ordinal and parts.get("FREQ") not in ("MONTHLY", "YEARLY"):
                raise _invalid_part(f"BYDAY={parts['BYDAY']}: an ordinal such as {day} only with FREQ=MONTHLY or "
                                    "FREQ=YEARLY (RFC 5545)")
        if len({re.sub(r"^\+", "", d) for d in days}) != len(days):
            raise _invalid_part(f"BYDAY={parts['BYDAY']}: a day is given twice")


def cycle_probe(r: du.rrule, start: datetime) -> du.rrule | None:
    """The rule tried over one cycle in which the calendar and its INTERVAL both repeat (400 × k
    years, k = INTERVAL ÷ its gcd with the cycle's periods), placed to end by year 9999 where dateutil
    stops, without COUNT or UNTIL; ``None`` when the walk from ``start`` to 9999 is shorter than that (an
    INTERVAL of many days: dateutil steps a period at a time; :func:`_check_interval` refuses the
    sub-daily rules it would walk day by day)."""
    periods = _PERIODS_PER_CYCLE[r._freq]
    span = _CYCLE_YEARS * (r._interval // gcd(r._interval, periods))
    last_start = datetime.max.year - span + 1  # a cycle starting then still ends by 9999
    if last_start <= start.year:
        return None
    year = start.year + (last_start - start.year) // span * span
    return r.replace(dtstart=start.replace(year=year), count=None, until=None)  # 29 Feb: same leap cycle


def _check_interval(r: du.rrule) -> None:
    """A sub-daily FREQ × INTERVAL at least the minimum interval, and dividing a day or whole days:
    then its times of day are the same every day (or every INTERVAL days), so the calendar and the
    rule repeat together within one :func:`cycle_probe` cycle. One that drifts (every 23 h) repeats
    only after 400 × INTERVAL years, longer than dateutil's calendar, which it walks day by day
    (seconds of CPU for a rule that never matches: docs/RECURRING.md)."""
    step = _STEP_SECONDS.get(r._freq)
    if step is None:
        return
    seconds, name = step * r._interval, f"FREQ={_FREQ_NAMES[r._freq]};INTERVAL={r._interval}"
    if seconds < conf("SCHEDULE_MIN_INTERVAL_SECONDS"):
        raise _too_frequent(f"{name} repeats every {seconds} s")
    if _DAY_SECONDS % seconds and seconds % _DAY_SECONDS:
        raise ScheduleError("schedule.rrule", "irregular_interval",
                            f"{name} repeats every {seconds} s, which neither divides a day nor is whole days: "
                            "its times of day would drift from one day to the next (use an INTERVAL such as 1, "
                            "2, 3, 4, 6, 8 or 12 hours or 90 minutes, or whole days)")


def _check_ever_matches(r: du.rrule, start: datetime) -> None:
    """Refuse a rule with no occurrence at all (``FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30``), for which
    dateutil walks period by period to year 9999 (seconds of CPU): tried over :func:`cycle_probe`'s
    cycle instead, at most ~146,000 days. A rule that matches there matches in every such cycle, so
    each later expansion of it finds its next occurrence within one cycle too (docs/RECURRING.md)."""
    probe = cycle_probe(r, start)
    if probe is not None and next(iter(probe), None) is None:
        raise ScheduleError("schedule.rrule", "no_occurrence", "the rule never matches a date (e.g. a "
                                                               "BYMONTHDAY that none of its BYMONTH months "
                                                               "has): it has no occurrence in any year")


def _too_frequent(detail: str) -> ScheduleError:
    minimum = conf("SCHEDULE_MIN_INTERVAL_SECONDS")
    return ScheduleError("schedule.rrule", "too_frequent",
                         f"{detail}: occurrences must be at least {minimum} s apart "
                         f"(CAMPAIGN_SCHEDULE_MIN_INTERVAL_SECONDS)")


def _check_bounds(schedule: Schedule, now: datetime) -> None:
    """The bounds, cheapest first: FREQ × INTERVAL, COUNT, times per day, then the expansion itself
    (the first ``CAMPAIGN_SCHEDULE_CHECK_OCCURRENCES`` occurrences within ``CAMPAIGN_SCHEDULE_CHECK_DAYS``
    of the start or of now), which must keep the minimum interval and have an occurrence after now."""
    r = schedule.parsed
    minimum = conf("SCHEDULE_MIN_INTERVAL_SECONDS")
    if r._count is not None and r._count > conf("SCHEDULE_MAX_COUNT"):
        raise ScheduleError("schedule.rrule", "count_too_large",
                            f"COUNT={r._count}; at most {conf('SCHEDULE_MAX_COUNT')} (CAMPAIGN_SCHEDULE_MAX_COUNT)")
    times = 1
    for values in (r._byhour, r._byminute, r._bysecond):
        times *= len(values) if values else 1
    if times > MAX_TIMES_PER_DAY:
        raise _too_frequent(f"{times} times of day (BYHOUR × BYMINUTE × BYSECOND)")
    days = conf("SCHEDULE_CHECK_DAYS")
    if any(getattr(r, name, None) for name in _SPARSE_PARTS):
        days = max(days, _LEAP_CYCLE_DAYS)
    horizon = max(schedule.start, schedule.wall_at_or_before(now)) + timedelta(days=days)
    # COUNT left out (dateutil refuses COUNT with UNTIL): it only cuts the expansion, taken below.
    bounded = r.replace(count=None, until=min(r._until, horizon) if r._until else horizon)
    examined = conf("SCHEDULE_CHECK_OCCURRENCES") if r._count is None else min(r._count,
                                                                               conf("SCHEDULE_CHECK_OCCURRENCES"))
    previous, ahead = None, False
    for wall in islice(bounded, examined):
        at = schedule.instant(wall)
        if previous is not None and (at - previous[1]).total_seconds() < minimum:
            raise _too_frequent(f"{previous[0]:%Y-%m-%d %H:%M:%S} and {wall:%Y-%m-%d %H:%M:%S} are "
                                f"{int((at - previous[1]).total_seconds())} s apart")
        previous, ahead = (wall, at), ahead or at >= now
    if not ahead and (r._count is None or r._count > examined):
        later = islice(bounded.xafter(schedule.wall_at_or_before(now), inc=True), 10)
        ahead = any(schedule.instant(wall) >= now for wall in later)
    if not ahead:
        raise ScheduleError("schedule.rrule", "no_occurrence", f"the rule has no occurrence from now to "
                                                               f"{conf('SCHEDULE_CHECK_DAYS')} days ahead "
                                                               "(its UNTIL or COUNT has passed, or it never matches)")


def stored(campaign) -> Schedule:
    """The schedule of a series as stored (already checked when it was saved)."""
    start = datetime.strptime(campaign.schedule_start, START_FORMAT)
    return Schedule(campaign.schedule_rule, start, campaign.schedule_timezone,
                    du.rrulestr(campaign.schedule_rule, dtstart=start))



def upcoming(campaign, n: int, now: datetime) -> list[Occurrence]:
    """A series' next ``n`` occurrences as the API and the admin show them: from its ``next_run_at``
    while scheduled, from ``now`` while a draft or paused (what a launch or a resume now would send);
    none once its last run is made, completed or cancelled."""
    if campaign.status not in ("draft", "scheduled", "paused"):
        return []
    if campaign.status == "scheduled" and campaign.next_run_at is None:
        return []  # its last run is still going (docs/RECURRING.md)
    if campaign.status == "scheduled" and campaign.next_run_at is not None:
        now = campaign.next_run_at - timedelta(microseconds=1)
    try:
        return stored(campaign).next_after(now, n)
    except Exception:  # a rule stored before a check refused it: its page and the list still answer
        log.exception("campaign %s: its schedule cannot be expanded", campaign.pk)
        return []
