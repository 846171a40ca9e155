"""One IANA zone rule everywhere (finding 11): the validator, the admin's recipient form, and
stored zones that predate it (fan-out and quiet hours fall back and count, never crash)."""

from __future__ import annotations

from datetime import UTC, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from campaigns.models import Campaign
from core import clock
from preferences.models import Recipient
from preferences.quiet_hours import quiet_zone
from preferences.validation import stored_zone, validate_iana_zone
from preferences.wallclock import wall_time_to_utc
from tests.fanout_helpers import make_campaign, make_recipient, run_fan_out, send_time_outcome

NOT_ZONES = [
    ("America", "'America' is a region of the tz database, not a zone"),
    ("Mars/Olympus", "'Mars/Olympus' is not in the IANA time zone database"),
    ("+03:00", "'+03:00' is a UTC offset, not a zone (an offset does not follow daylight saving time)"),
    ("", "no zone given (empty)"),
    ("EST", "'EST' is a legacy abbreviation or alias, not an Area/Location zone name"),
    ("Etc/GMT+3", "'Etc/GMT+3' is a fixed-offset zone (it does not follow daylight saving time)"),
    ("America/Argentina", "'America/Argentina' is a region of the tz database, not a zone"),
]


@pytest.mark.parametrize(("value", "message"), NOT_ZONES)
def test_validator_refuses_what_is_not_a_zone_saying_why(value, message):
    with pytest.raises(ValidationError) as caught:
        validate_iana_zone(value)
    assert caught.value.code == "invalid_timezone"
    assert caught.value.messages == [f"{message}; give an IANA time zone name such as 'Europe/Berlin'"]


@pytest.mark.parametrize("value", ["Europe/Berlin", "America/Argentina/Buenos_Aires", "UTC", "Asia/Kolkata"])
def test_validator_accepts_zones(value):
    assert validate_iana_zone(value) == value


@pytest.mark.parametrize(("value", "_"), NOT_ZONES)
def test_a_stored_bad_zone_falls_back_to_the_default(value, _):
    assert stored_zone(value, "Europe/Lisbon") == (ZoneInfo("Europe/Lisbon"), True)
    assert stored_zone("Asia/Tokyo", "Europe/Lisbon") == (ZoneInfo("Asia/Tokyo"), False)


def test_quiet_hours_zone_skips_invalid_names_to_the_recipients_zone_then_utc():
    assert quiet_zone("America", "Asia/Tokyo") == (ZoneInfo("Asia/Tokyo"), ["America"])
    assert quiet_zone("", "+03:00") == (ZoneInfo("UTC"), ["+03:00"])
    assert quiet_zone("Mars/Olympus", "America") == (ZoneInfo("UTC"), ["Mars/Olympus", "America"])
    assert quiet_zone("Europe/Paris", "America") == (ZoneInfo("Europe/Paris"), [])


def recipient_add_post(**fields) -> dict:
    data = {"user_id": "zoned", "email": "", "phone": "", "timezone": "", "locale": "", "attributes": "{}",
            "email_invalid_reason": "", "phone_invalid_reason": "",
            "preferences-TOTAL_FORMS": "0", "preferences-INITIAL_FORMS": "0", "preferences-MIN_NUM_FORMS": "0",
            "preferences-MAX_NUM_FORMS": "1", "devices-TOTAL_FORMS": "0", "devices-INITIAL_FORMS": "0",
            "notifications-TOTAL_FORMS": "0", "notifications-INITIAL_FORMS": "0"}
    data.update(fields)
    return data



@pytest.mark.django_db
@pytest.mark.parametrize(("value", "message"), [z for z in NOT_ZONES if z[0]])
def test_admin_recipient_form_refuses_what_the_api_refuses(admin_client, fast_password_hashing, value, message):
    r = admin_client.post(reverse("admin:preferences_recipient_add"), recipient_add_post(timezone=value))
    assert r.status_code == 200
    assert r.context["adminform"].form.errors == {
        "timezone": [f"{message}; give an IANA time zone name such as 'Europe/Berlin'"]}
    assert not Recipient.objects.filter(pk="zoned").exists()


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["Europe/Berlin", ""])
def test_admin_recipient_form_accepts_a_zone_or_none(admin_client, fast_password_hashing, value):
    r = admin_client.post(reverse("admin:preferences_recipient_add"), recipient_add_post(timezone=value))
    assert r.status_code == 302, r.context and r.context["adminform"].form.errors
    assert Recipient.objects.get(pk="zoned").timezone == value


@pytest.mark.django_db
def test_fan_out_of_a_local_time_campaign_survives_bad_stored_zones_and_counts_them(settings):
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "DEFAULT_TIMEZONE": "Europe/Lisbon"}
    zones = {"z-0": "America", "z-1": "Mars/Olympus", "z-2": "+03:00", "z-3": "", "z-4": "Asia/Tokyo",
             "z-5": "America/New_York"}
    for user_id, zone in zones.items():
        make_recipient(user_id, timezone=zone)
    day, wall = (clock.now() + timedelta(days=3)).date(), time(10)
    campaign = make_campaign(list(zones), channel="sms", local=(day, wall))
    rows = run_fan_out(campaign)
    expected = {u: wall_time_to_utc(day, wall, ZoneInfo(z if "/" in z and z != "Mars/Olympus" else "Europe/Lisbon"))
                for u, z in zones.items()}
    assert {n.recipient_id: (n.status, n.due_at) for n in rows} == {u: ("scheduled", at) for u, at in expected.items()}
    campaign.refresh_from_db()
    assert (campaign.status, campaign.default_zone_count) == ("sending", 4)


@pytest.mark.django_db
@pytest.mark.parametrize(("quiet_tz", "recipient_tz", "window_zone"), [
    ("America", "Asia/Tokyo", "Asia/Tokyo"), ("", "America", "UTC"), ("+03:00", "Mars/Olympus", "UTC")])
def test_quiet_hours_with_a_bad_stored_zone_defer_in_the_fallback_zone(quiet_tz, recipient_tz, window_zone):
    now = clock.now()
    local = now.astimezone(ZoneInfo(window_zone))
    start, end = (local - timedelta(hours=1)).time().replace(microsecond=0), (local + timedelta(hours=1)).time()
    end = end.replace(second=0, microsecond=0)
    make_recipient("quiet", timezone=recipient_tz, devices=(True,),
                   prefs={"quiet_start": start, "quiet_end": end, "quiet_timezone": quiet_tz})
    rows = run_fan_out(make_campaign(["quiet"], channel="push"))
    assert [(n.status, n.reason) for n in rows] == [("queued", "")]
    assert send_time_outcome(rows[0].pk) == ("scheduled", "quiet_hours")
    rows[0].refresh_from_db()
    expected = wall_time_to_utc((local + timedelta(hours=1)).date(), end, ZoneInfo(window_zone))
    assert rows[0].due_at == expected and rows[0].due_at.tzinfo is not None
    assert Campaign.objects.get(pk=rows[0].campaign_id).default_zone_count == 0  # not a local-time campaign
    assert rows[0].due_at > now.astimezone(UTC)


@pytest.mark.parametrize(("value", "errors"), [
    ("Europe/Lisbon", []),
    ("America", ["CAMPAIGN_DEFAULT_TIMEZONE: 'America' is a region of the tz database, not a zone; give an IANA "
                 "time zone name such as 'Europe/Berlin'"])])
def test_the_default_campaign_zone_is_checked_at_start(settings, value, errors):
    from campaigns.apps import check_default_timezone

    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "DEFAULT_TIMEZONE": value}
    assert [e.msg for e in check_default_timezone()] == errors
