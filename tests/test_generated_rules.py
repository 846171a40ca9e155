"""Generated inputs (Hypothesis) for the rules that combine many inputs.

(a) Suppression: the one rule (preferences.suppression) against an independent oracle written from
    the raw inputs (channel, category and notification-type opt-outs, required types); then
    generated recipients in Postgres (with and without a preferences row, every combination of
    channel opt-outs, category opt-outs, quiet hours, contacts absent / present / marked invalid,
    SMS STOP, push devices active / inactive, stored zones valid or not) through the real fan-out
    (raw member query), the pre-launch reach and the send path's checks: all agree with the oracle,
    and fan-out never raises.
(b) Wall-clock instants over generated IANA zones and dates, DST transition days included:
    ``wall_time_to_utc`` (gap → end of the gap, fold → first occurrence) and quiet hours'
    ``window_end`` (inside the window until it ends, never a deferral loop).
"""

from __future__ import annotations

import functools
import zoneinfo
from collections import Counter
from datetime import UTC, date, datetime, time, timedelta
from unittest import mock
from zoneinfo import ZoneInfo

import pytest
from django.db import transaction
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from notifications.models import Reason
from preferences import suppression
from preferences.quiet_hours import in_window, window_end
from preferences.wallclock import wall_time_to_utc

CHANNELS = ("sms", "email", "push")
CATEGORIES = ("marketing", "news", "security")
TYPE_KEYS = ("order_shipped", "new_follower", "password_reset")
#: Zones that are not zones: stored before validation (or by SQL); they must fall back, never crash.
BAD_ZONES = ("America", "Mars/Olympus", "+03:00", "EST", "Etc/GMT+3", "America/Argentina", "")
ZONES = sorted(z for z in zoneinfo.available_timezones()
               if "/" in z and not z.startswith(("Etc/", "SystemV/", "posix", "right")))

# --- (a) suppression: the rule against an oracle ------------------------------------------------

contact_state = st.sampled_from(["absent", "valid", "invalid"])
#: Channel lists as stored: real channels, near-misses (a substring test would match them), junk.
channel_lists = st.lists(st.sampled_from([*CHANNELS, "smsx", "SMS", "e-mail", "pus"]), max_size=4)
#: Shapes the API refuses but a row written by SQL or an older release may hold: a bare channel
#: name, numbers, objects, nulls in a list. They must never crash a page, and mean the same everywhere.
junk = st.one_of(st.sampled_from(CHANNELS), st.integers(), st.just({"sms": True}),
                 st.lists(st.one_of(st.sampled_from(CHANNELS), st.integers(), st.none()), max_size=3))
stored_channels = st.one_of(channel_lists, junk)
stored_categories = st.one_of(st.dictionaries(st.sampled_from(CATEGORIES), stored_channels, max_size=3),
                              st.lists(st.sampled_from(CHANNELS), max_size=2), st.just("marketing"))
#: ``type_opt_outs`` as stored: keys of types, near misses (a category's name, another case), junk shapes.
stored_types = st.one_of(
    st.dictionaries(st.sampled_from([*TYPE_KEYS, "marketing", "Order_Shipped", "order"]), stored_channels,
                    max_size=4),
    st.lists(st.sampled_from(CHANNELS), max_size=2), st.just("order_shipped"), st.none())


def _names(stored) -> list:
    """Oracle's reading of a stored channel list: a list's strings, a bare string, else nothing."""
    if isinstance(stored, str):
        return [stored]
    return [v for v in stored if isinstance(v, str)] if isinstance(stored, list) else []


def oracle(channel: str, category: str, *, phone: str, email: str, devices: list[bool], stopped: bool,
           opt_outs, category_opt_outs, type_key: str = "", type_opt_outs=None, required: bool = False) -> str:
    """The expected suppression reason, written from the raw inputs (not from RecipientFacts).
    A ``required`` type skips every opt-out; its contacts still count."""
    per_category = category_opt_outs if isinstance(category_opt_outs, dict) else {}
    per_type = type_opt_outs if isinstance(type_opt_outs, dict) else {}
    candidates = [] if required else [
        (channel in _names(opt_outs), "opted_out_channel"),
        (bool(category) and channel in _names(per_category.get(category, [])), "opted_out_category"),
        (bool(type_key) and channel in _names(per_type.get(type_key, [])), "opted_out_type"),
    ]
    candidates += {
        "sms": [(phone == "absent", "no_phone"), (phone == "invalid", "phone_invalid"),
                (phone == "valid" and stopped, "sms_stopped")],
        "email": [(email == "absent", "no_email"), (email == "invalid", "email_invalid")],
        "push": [(True not in devices, "no_active_device")],
    }[channel]
    return next((reason for applies, reason in candidates if applies), "")


def test_every_reason_of_the_rule_is_a_notification_reason():
    assert set(suppression.REASONS) <= set(Reason.values)


@settings(max_examples=600, deadline=None)
@given(channel=st.sampled_from(CHANNELS), category=st.sampled_from([*CATEGORIES, ""]), phone=contact_state,
       email=contact_state, devices=st.lists(st.booleans(), max_size=3), stopped=st.booleans(),
       opt_outs=stored_channels, category_opt_outs=stored_categories,
       type_key=st.sampled_from([*TYPE_KEYS, ""]), type_opt_outs=stored_types, required=st.booleans())
@example(channel="push", category="news", phone="valid", email="valid", devices=[True], stopped=False, opt_outs=[],
         category_opt_outs={}, type_key="new_follower", type_opt_outs={"new_follower": ["push"]}, required=False)
@example(channel="sms", category="security", phone="valid", email="valid", devices=[], stopped=True,
         opt_outs=["sms"], category_opt_outs={"security": ["sms"]}, type_key="password_reset",
         type_opt_outs={"password_reset": ["sms"]}, required=True)
def test_rule_matches_the_oracle(channel, category, phone, email, devices, stopped, opt_outs, category_opt_outs,
                                 type_key, type_opt_outs, required):
    facts = suppression.RecipientFacts(
        has_phone=phone != "absent", phone_invalid=phone == "invalid", has_email=email != "absent",
        email_invalid=email == "invalid", has_active_device=True in devices,
        sms_stopped=stopped and phone != "absent", opt_outs=suppression.channels(opt_outs),
        category_opt_outs=suppression.category_channels(category_opt_outs),
        type_opt_outs=suppression.category_channels(type_opt_outs))
    expected = oracle(channel, category, phone=phone, email=email, devices=devices, stopped=stopped,
                      opt_outs=opt_outs, category_opt_outs=category_opt_outs, type_key=type_key,
                      type_opt_outs=type_opt_outs, required=required)
    assert suppression.suppression_reason(facts, channel, category, type_key, required) == expected
    # Without a type (a campaign or an untyped send) the rule is what it always was.
    assert suppression.suppression_reason(facts, channel, category) == oracle(
        channel, category, phone=phone, email=email, devices=devices, stopped=stopped, opt_outs=opt_outs,
        category_opt_outs=category_opt_outs)


# --- (a) suppression: generated recipients through fan-out, reach and send time -----------------

minute_times = st.builds(time, st.integers(0, 23), st.integers(0, 59))
quiet_hours = st.one_of(st.none(), st.tuples(minute_times, minute_times,
                                             st.sampled_from(["", "Asia/Tokyo", "America/New_York", *BAD_ZONES])))
preferences_rows = st.one_of(st.none(), st.fixed_dictionaries({
    "opt_outs": stored_channels,
    "category_opt_outs": stored_categories,
    "quiet": quiet_hours,
}))
members = st.lists(st.fixed_dictionaries({
    "phone": contact_state, "email": contact_state, "devices": st.lists(st.booleans(), max_size=3),
    "stopped": st.booleans(), "prefs": preferences_rows,
    "timezone": st.sampled_from(["Europe/Berlin", "Asia/Tokyo", "America/New_York", *BAD_ZONES]),
}), min_size=1, max_size=6)


def _is_zone(name: str) -> bool:
    return name in ("Europe/Berlin", "Asia/Tokyo", "America/New_York")


def _expected_send_time(member: dict, now: datetime, category: str) -> tuple[str, str, datetime | None]:
    """What the send path does with a queued row (standard priority): defer for quiet hours (until
    when) or go to the provider. Oracle on ordinary days (no offset change in the next 26 h).
    A category listed in ``QUIET_HOURS_BYPASS_CATEGORIES`` (``security``) is never deferred."""
    from django.conf import settings as django_settings

    prefs = member["prefs"]
    if not prefs or not prefs["quiet"] or category in django_settings.QUIET_HOURS_BYPASS_CATEGORIES:
        return "ready", "", None
    start, end, quiet_tz = prefs["quiet"]
    name = next((z for z in (quiet_tz, member["timezone"]) if _is_zone(z)), "UTC")
    local = now.astimezone(ZoneInfo(name))
    second = local.hour * 3600 + local.minute * 60 + local.second + local.microsecond / 1e6
    s, e = start.hour * 3600 + start.minute * 60, end.hour * 3600 + end.minute * 60
    inside = s != e and (s <= second < e if s < e else (second >= s or second < e))
    if not inside:
        return "ready", "", None
    return "scheduled", "quiet_hours", now + timedelta(seconds=(e - second) % 86400)


def _ordinary(zone_names, now: datetime) -> bool:
    return all(_offset(ZoneInfo(z), now) == _offset(ZoneInfo(z), now + timedelta(hours=26)) for z in zone_names)


def _create(members_: list[dict], tag: str) -> list[str]:
    from notifications.delivery.routing import sms_sender
    from preferences.models import SmsStop
    from tests.fanout_helpers import make_recipient

    user_ids = []
    for i, m in enumerate(members_):
        user_id, phone = f"g{tag}-{i}", f"+49151{i:02d}{tag}"
        prefs = None
        if m["prefs"] is not None:
            p = m["prefs"]
            prefs = {"opt_outs": p["opt_outs"], "category_opt_outs": p["category_opt_outs"]}
            if p["quiet"]:
                prefs.update(quiet_start=p["quiet"][0], quiet_end=p["quiet"][1], quiet_timezone=p["quiet"][2])
        make_recipient(user_id, phone="" if m["phone"] == "absent" else phone,
                       email="" if m["email"] == "absent" else f"{user_id}@example.com",
                       phone_invalid=m["phone"] == "invalid", email_invalid=m["email"] == "invalid",
                       devices=tuple(m["devices"]), timezone=m["timezone"], prefs=prefs)
        if m["stopped"] and m["phone"] != "absent":
            SmsStop.objects.create(phone=phone, sender=sms_sender(), source="twilio 21610")
        user_ids.append(user_id)
    return user_ids


class _Rollback(Exception):
    pass


@pytest.mark.django_db
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(members_=members, channel=st.sampled_from(CHANNELS), category=st.sampled_from(CATEGORIES),
       days_ahead=st.integers(1, 400), minute=st.integers(0, 24 * 60 - 1), second=st.integers(0, 59))
def test_fan_out_reach_and_send_time_agree_with_the_oracle(members_, channel, category, days_ahead, minute,
                                                           second):
    from campaigns.audience import reach
    from notifications.delivery.checks import suppression_reason
    from preferences.models import Device
    from tests.fanout_helpers import make_campaign, run_fan_out, send_time_outcome

    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    now = today + timedelta(days=days_ahead, minutes=minute, seconds=second)
    assume(_ordinary(["UTC", "Europe/Berlin", "Asia/Tokyo", "America/New_York"], now))
    expected = [oracle(channel, category, phone=m["phone"], email=m["email"], devices=m["devices"],
                       stopped=m["stopped"], opt_outs=m["prefs"]["opt_outs"] if m["prefs"] else [],
                       category_opt_outs=m["prefs"]["category_opt_outs"] if m["prefs"] else {})
                for m in members_]
    try:
        with mock.patch("core.clock.now", return_value=now), transaction.atomic():
            user_ids = _create(members_, f"{days_ahead:03d}{minute:04d}"[-6:])
            campaign = make_campaign(user_ids, channel=channel, category=category)
            before = reach(campaign, now)
            rows = run_fan_out(campaign)  # never raises

            by_user = {n.recipient_id: n for n in rows}
            assert sorted(by_user) == sorted(user_ids)  # every member gets exactly one row
            for user_id, member, reason in zip(user_ids, members_, expected, strict=True):
                n = by_user[user_id]
                assert (n.status, n.reason) == (("suppressed", reason) if reason else ("queued", "")), member
                at_send = suppression_reason(n)
                if not at_send and channel == "push" and not Device.objects.filter(
                        recipient_id=user_id, active=True).exists():
                    at_send = "no_active_device"
                assert at_send == reason, member  # send time decides as fan-out did
                if not reason:
                    status, why, until = _expected_send_time(member, now, category)
                    assert send_time_outcome(n.pk) == (status, why), member
                    if until is not None:
                        n.refresh_from_db()
                        assert n.due_at == until, member

            assert before.members == len(user_ids)
            assert before.eligible == sum(1 for r in expected if not r)
            assert before.suppressed_by_reason == dict(Counter(r for r in expected if r))
            raise _Rollback
    except _Rollback:
        pass


@pytest.mark.django_db
@settings(max_examples=25, deadline=None)
@given(zones=st.lists(st.one_of(st.sampled_from(BAD_ZONES), st.sampled_from(ZONES)), min_size=1, max_size=6),
       days_ahead=st.integers(2, 300), wall=minute_times)
def test_local_time_fan_out_gives_each_member_its_zones_instant_or_the_default(zones, days_ahead, wall):
    from campaigns.models import Campaign
    from preferences.validation import validate_iana_zone
    from tests.fanout_helpers import make_campaign, make_recipient, run_fan_out

    def valid(name):
        try:
            return validate_iana_zone(name) == name
        except Exception:
            return False

    day = (datetime.now(UTC) + timedelta(days=days_ahead)).date()
    try:
        with transaction.atomic():
            user_ids = [make_recipient(f"lz{i}", timezone=z).pk for i, z in enumerate(zones)]
            campaign = make_campaign(user_ids, channel="sms", local=(day, wall))
            rows = run_fan_out(campaign)
            assert {n.recipient_id: n.due_at for n in rows} == {
                u: wall_time_to_utc(day, wall, ZoneInfo(z if valid(z) else "UTC"))
                for u, z in zip(user_ids, zones, strict=True)}
            assert Campaign.objects.get(pk=campaign.pk).default_zone_count == sum(not valid(z) for z in zones)
            raise _Rollback
    except _Rollback:
        pass


# --- (b) wall-clock instants over generated zones and dates --------------------------------------

@functools.lru_cache(maxsize=4096)
def transitions(zone_name: str, year: int) -> tuple[datetime, ...]:
    """UTC instants (to the second) at which ``zone_name``'s UTC offset changes during ``year``."""
    tz = ZoneInfo(zone_name)
    found = []
    t = datetime(year, 1, 1, tzinfo=UTC)
    end = datetime(year + 1, 1, 1, tzinfo=UTC)
    step = timedelta(days=1)
    while t < end:
        nxt = t + step
        if _offset(tz, t) != _offset(tz, nxt):
            lo, hi = t, nxt  # offset(lo) != offset(hi): bisect to the second
            while hi - lo > timedelta(seconds=1):
                mid = lo + (hi - lo) / 2
                mid = mid.replace(microsecond=0)
                if _offset(tz, mid) == _offset(tz, lo):
                    lo = mid
                else:
                    hi = mid
            found.append(hi)
        t = nxt
    return tuple(found)


def _offset(tz: ZoneInfo, instant: datetime) -> timedelta:
    return instant.astimezone(tz).utcoffset()


@st.composite
def zone_and_day(draw, zones=ZONES):
    """A zone and a local date: often a day with a UTC offset change (DST or a rule change), else any
    date from 1900 to 2040."""
    name = draw(st.sampled_from(zones))
    year = draw(st.integers(1900, 2040))
    changes = transitions(name, year)
    if changes and draw(st.booleans()):
        instant = draw(st.sampled_from(changes))
        tz = ZoneInfo(name)
        day = draw(st.sampled_from(sorted({(instant - timedelta(seconds=1)).astimezone(tz).date(),
                                           instant.astimezone(tz).date()})))
        return name, day, instant
    return name, draw(st.dates(date(year, 1, 1), date(year, 12, 31))), None


wall_times = st.one_of(minute_times, st.times())  # HH:MM as the API takes them; any time as the admin may
#: Seconds from a UTC offset change: whole minutes (as walls are written) or any second.
near_change = st.one_of(st.integers(-180, 180).map(lambda m: m * 60), st.integers(-3 * 3600, 3 * 3600))


def _local(instant: datetime, tz: ZoneInfo) -> datetime:
    return instant.astimezone(tz).replace(tzinfo=None)


@settings(max_examples=400, deadline=None)
@given(zone_day=zone_and_day(), wall=wall_times, near=near_change)
# Found by this test: a wall time with seconds inside a gap resolved to the end of the gap plus those
# seconds (02:30:30 → 03:00:30), and transitions off the minute (Monrovia's -0:44:30 in 1972) to a
# non-transition instant: the old code stepped back whole minutes.
@example(zone_day=("Europe/Berlin", date(2026, 3, 29), None), wall=time(2, 30, 30), near=0)
@example(zone_day=("Africa/Monrovia", date(1972, 1, 7), None), wall=time(0, 20, 10), near=0)
@example(zone_day=("Pacific/Apia", date(2011, 12, 30), None), wall=time(10), near=0)  # a whole day skipped
@example(zone_day=("Australia/Lord_Howe", date(2026, 10, 4), None), wall=time(2, 15), near=0)  # 30 min gap
@example(zone_day=("Europe/Berlin", date(2026, 10, 25), None), wall=time(2, 30), near=0)  # fold
def test_wall_time_to_utc_resolves_gaps_to_their_end_and_folds_to_the_first_occurrence(zone_day, wall, near):
    name, day, change = zone_day
    tz = ZoneInfo(name)
    if change is not None:  # a wall time close to the change, where gaps and folds are
        shifted = _local(change, tz) + timedelta(seconds=near)
        day, wall = shifted.date(), shifted.time()
    naive = datetime.combine(day, wall)
    result = wall_time_to_utc(day, wall, tz)

    assert result.utcoffset() == timedelta(0)
    candidates = {naive.replace(tzinfo=tz, fold=fold).astimezone(UTC) for fold in (0, 1)}
    occurrences = sorted(c for c in candidates if _local(c, tz) == naive)
    if occurrences:  # the wall time exists: its first occurrence, which reads back as that wall time
        assert result == occurrences[0]
        assert _local(result, tz) == naive
    else:  # a gap: the instant the clock jumps, which reads as the end of the gap
        tick = timedelta(microseconds=1)
        assert _local(result - tick, tz) < naive < _local(result, tz)
        assert _offset(tz, result - tick) != _offset(tz, result)


@settings(max_examples=200, deadline=None)
@given(zone_day=zone_and_day(), walls=st.lists(minute_times, min_size=2, max_size=2))
def test_wall_time_to_utc_is_monotonic_in_the_wall_time(zone_day, walls):
    name, day, _ = zone_day
    tz = ZoneInfo(name)
    first, second = sorted(walls)
    assert wall_time_to_utc(day, first, tz) <= wall_time_to_utc(day, second, tz)


@settings(max_examples=400, deadline=None)
@given(zone_day=zone_and_day(), at=st.times(), start=wall_times, end=wall_times, near=near_change,
       end_near=st.one_of(st.none(), near_change))
def test_quiet_hours_window_end(zone_day, at, start, end, near, end_near):
    name, day, change = zone_day
    tz = ZoneInfo(name)
    if change is not None:
        now = change + timedelta(seconds=near)
        if end_near is not None:  # the window's end close to the change: inside a gap or a fold
            end = (_local(change, tz) + timedelta(seconds=end_near)).time()
    else:
        now = datetime.combine(day, at).replace(tzinfo=tz).astimezone(UTC)
    assume(start != end)
    result = window_end(now, start, end, tz)
    wall = _local(now, tz).time()
    if not in_window(wall, start, end):
        assert result is None
        return
    if result is None:
        # Only on a transition night: the end's wall time already passed in the other offset.
        assert _offset(tz, now - timedelta(days=1)) != _offset(tz, now + timedelta(days=1))
        return
    assert result > now
    # The window ends when the clock reads `end` (first occurrence), or at the end of a gap hiding it.
    local_day = _local(now, tz).date()
    assert result in {wall_time_to_utc(d, end, tz) for d in (local_day, local_day + timedelta(days=1))}
    # Deferred to `result`, the send is not deferred again to the same instant (no deferral loop).
    again = window_end(result, start, end, tz)
    assert again is None or again > result
    if _offset(tz, now) == _offset(tz, now + timedelta(hours=26)):
        # An ordinary day: the window ends exactly `end - wall` of wall-clock time later.
        seconds = lambda t: t.hour * 3600 + t.minute * 60 + t.second + t.microsecond / 1e6  # noqa: E731
        assert result == now + timedelta(seconds=(seconds(end) - seconds(wall)) % 86400)


def test_transitions_helper_finds_the_known_berlin_changes():
    assert transitions("Europe/Berlin", 2026) == (datetime(2026, 3, 29, 1, tzinfo=UTC),
                                                  datetime(2026, 10, 25, 1, tzinfo=UTC))
