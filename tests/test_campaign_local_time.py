"""Local-time campaigns whose wall time has passed (issue 10 #4): the creation/launch rule (422 / refused
launch), each ``missed_policy`` at fan-out, and the admin's before-launch count.

In-process: fan-out pages run as functions against the test database with the platform clock fixed.
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.test import Client
from django.urls import reverse
from hypothesis import given, settings
from hypothesis import strategies as st

from campaigns import fanout, services
from campaigns.models import Campaign, CampaignShard, CampaignStatus, MissedPolicy
from notifications.models import APIClient, Notification, Reason, Status
from preferences.models import Recipient
from preferences.wallclock import wall_time_to_utc
from tests.conftest import MARKETING_SCOPES

NOW = datetime(2030, 1, 10, 11, 30, tzinfo=UTC)
GRACE = timedelta(seconds=600)




# --- the API rule: a local_time must still be ahead in the earliest zone (UTC+14) ------------------

@pytest.fixture
def http(db):
    _, key = APIClient.objects.create_key(name="marketing-tool", scopes=MARKETING_SCOPES)
    services.upsert_segment("vip", name="VIPs")
    return Client(headers={"Authorization": f"Api-Key {key}"})


def post(http, body, key="k1"):
    return http.post("/v1/campaigns", data=json.dumps(body), content_type="application/json",
                     headers={"Idempotency-Key": key})


def body(**over):
    return {"segment_id": "vip", "channel": "sms", "content": {"body": "Sale!"}, **over}


@pytest.mark.parametrize(("local", "now_there"), [
    ({"date": "2029-12-10", "time": "10:00"}, "2030-01-11 01:30"),  # a month in the past
    ({"date": "2030-01-10", "time": "20:00"}, "2030-01-11 01:30"),  # ahead in UTC, passed in UTC+14
    ({"date": "2030-01-11", "time": "01:30"}, "2030-01-11 01:30"),  # reached this very minute in UTC+14
])
def test_local_time_already_reached_in_the_earliest_zone_is_422_and_writes_nothing(http, frozen, local, now_there):
    r = post(http, body(local_time=local))
    assert r.status_code == 422, r.content
    error = r.json()["error"]
    assert [(f["field"], f["code"]) for f in error["fields"]] == [("local_time", "local_time_passed")]
    assert error["fields"][0]["message"] == (
        f"{local['date']} {local['time']} has already been reached in the earliest zone (UTC+14, where it is "
        f"now {now_there}): a local_time must still be in the future in every zone")
    assert not Campaign.objects.exists()


def test_local_time_still_ahead_in_the_earliest_zone_is_accepted_with_its_missed_policy(http, frozen):
    r = post(http, body(local_time={"date": "2030-01-11", "time": "01:31"}, missed_policy="next_day"))
    assert r.status_code == 202, r.content
    c = Campaign.objects.get()
    assert (c.missed_policy, c.fanout_at) == ("next_day", datetime(2030, 1, 10, 11, 31, tzinfo=UTC))
    detail = http.get(f"/v1/campaigns/{c.pk}").json()
    assert (detail["missed_policy"], detail["missed_count"]) == ("next_day", 0)
    r = post(http, body(local_time={"date": "2030-01-12", "time": "09:00"}), key="k2")
    assert Campaign.objects.get(pk=r.json()["id"]).missed_policy == "skip"  # the default


@pytest.mark.parametrize(("over", "expected"), [
    ({"missed_policy": "send_now"}, ("missed_policy", "local_time_only")),
    ({"missed_policy": "later", "local_time": {"date": "2030-02-01", "time": "09:00"}},
     ("missed_policy", "invalid_choice")),
])
def test_bad_missed_policy_is_422(http, frozen, over, expected):
    r = post(http, body(**over))
    assert r.status_code == 422, r.content
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [expected]
    assert not Campaign.objects.exists()


# --- each policy at fan-out -------------------------------------------------------------------------

# 10:00 local on 2030-01-10; fan-out page runs at NOW (11:30 UTC), grace 10 min.
MEMBERS = {
    "kiri": "Pacific/Kiritimati",  # UTC+14: 2030-01-09 20:00 UTC, passed 15.5 h ago
    "berlin": "Europe/Berlin",     # UTC+1: 09:00 UTC, passed 2.5 h ago
    "azores": "Atlantic/Azores",   # UTC-1: 11:00 UTC... 30 min ago: passed
    "noronha": "America/Noronha",  # UTC-2: 12:00 UTC, ahead
    "ny": "America/New_York",      # UTC-5: 15:00 UTC, ahead
}


def fanning_out(policy: str) -> Campaign:
    segment, _ = services.upsert_segment("zones", name="Zones")
    for user_id, zone in MEMBERS.items():
        Recipient.objects.create(user_id=user_id, phone="+4915112345678", timezone=zone)
    Recipient.objects.create(user_id="nophone", timezone="Pacific/Kiritimati")  # suppressed first: no phone
    services.change_members(segment, add=[*MEMBERS, "nophone"], remove=[])
    c = services.create_campaign(client=None, idempotency_key=None, segment=segment, channel="sms", body="hi",
                                 local_date=date(2030, 1, 10), local_time=time(10, 0),
                                 missed_policy=policy).campaign
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.FANNING_OUT, snapshot_at=NOW, snapshot_kind="list",
                                            started_at=NOW, member_count=6)
    CampaignShard.objects.create(campaign=c, number=0, heartbeat_at=NOW)
    return c


def rows(c) -> dict:
    return {n.recipient_id: (n.status, n.reason, n.scheduled_at, n.due_at)
            for n in Notification.objects.filter(campaign_id=c.pk)}


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


ON_TIME = {
    "noronha": (Status.SCHEDULED, "", utc(2030, 1, 10, 12), utc(2030, 1, 10, 12)),
    "ny": (Status.SCHEDULED, "", utc(2030, 1, 10, 15), utc(2030, 1, 10, 15)),
    "nophone": (Status.SUPPRESSED, Reason.NO_PHONE, utc(2030, 1, 9, 20), None),
}


@pytest.mark.django_db
def test_skip_suppresses_members_whose_local_time_passed_with_a_reason_and_counts_them(frozen):
    c = fanning_out(MissedPolicy.SKIP)
    assert fanout.fan_out_page(str(c.pk), 0) == "done"
    assert rows(c) == {
        "kiri": (Status.SUPPRESSED, Reason.LOCAL_TIME_PASSED, utc(2030, 1, 9, 20), None),
        "berlin": (Status.SUPPRESSED, Reason.LOCAL_TIME_PASSED, utc(2030, 1, 10, 9), None),
        "azores": (Status.SUPPRESSED, Reason.LOCAL_TIME_PASSED, utc(2030, 1, 10, 11), None),
        **ON_TIME,
    }
    c.refresh_from_db()
    assert (c.missed_count, c.status) == (3, CampaignStatus.SENDING)
    assert Reason.LOCAL_TIME_PASSED.label == ("The campaign's local send time had already passed in the "
                                              "recipient's zone when it fanned out (missed_policy skip)")
    fanout.fan_out_page(str(c.pk), 0)  # nothing left to do: counted once
    c.refresh_from_db()
    assert c.missed_count == 3


@pytest.mark.django_db
def test_send_now_queues_missed_members_due_now(frozen):
    c = fanning_out(MissedPolicy.SEND_NOW)
    fanout.fan_out_page(str(c.pk), 0)
    assert rows(c) == {
        "kiri": (Status.QUEUED, "", NOW, None),
        "berlin": (Status.QUEUED, "", NOW, None),
        "azores": (Status.QUEUED, "", NOW, None),
        **ON_TIME,
    }
    c.refresh_from_db()
    assert c.missed_count == 3


@pytest.mark.django_db
def test_next_day_schedules_missed_members_at_the_same_wall_time_the_next_day(frozen):
    c = fanning_out(MissedPolicy.NEXT_DAY)
    fanout.fan_out_page(str(c.pk), 0)
    assert rows(c) == {
        "kiri": (Status.SCHEDULED, "", utc(2030, 1, 10, 20), utc(2030, 1, 10, 20)),
        "berlin": (Status.SCHEDULED, "", utc(2030, 1, 11, 9), utc(2030, 1, 11, 9)),
        "azores": (Status.SCHEDULED, "", utc(2030, 1, 11, 11), utc(2030, 1, 11, 11)),
        **ON_TIME,
    }
    c.refresh_from_db()
    assert c.missed_count == 3


@pytest.mark.django_db
def test_a_member_within_the_grace_is_sent_at_once_whatever_the_policy(frozen):
    frozen[0] = utc(2030, 1, 10, 11, 9)  # Azores' 11:00 passed 9 minutes ago: normal fan-out pace
    c = fanning_out(MissedPolicy.SKIP)
    fanout.fan_out_page(str(c.pk), 0)
    assert rows(c)["azores"] == (Status.QUEUED, "", utc(2030, 1, 10, 11), None)
    c.refresh_from_db()
    assert c.missed_count == 2  # kiri, berlin


ZONES = ["Pacific/Kiritimati", "Pacific/Apia", "Asia/Kathmandu", "Europe/Berlin", "Europe/London",
         "America/Sao_Paulo", "America/New_York", "America/St_Johns", "Pacific/Pago_Pago", "Australia/Lord_Howe",
         "", "Not/AZone", "America"]


@settings(max_examples=300, deadline=None)
@given(zone=st.sampled_from(ZONES), day=st.dates(date(2029, 1, 1), date(2031, 12, 31)),
       wall=st.times().map(lambda t: t.replace(second=0, microsecond=0)),
       lateness=st.integers(-3 * 86400, 5 * 86400), spread=st.integers(0, 7200),
       policy=st.sampled_from(list(MissedPolicy)))
def test_plan_rule_over_generated_zones_dates_and_lateness(zone, day, wall, lateness, spread, policy):
    """Missed iff the member's instant is more than the grace before now; skip → suppressed with the
    reason, send_now → due now, next_day → the wall time on a later day, not missed; never a due time
    in the past beyond the grace for a row that will be sent."""
    campaign = Campaign(local_date=day, local_time=wall, missed_policy=policy, spread_seconds=spread)
    tz = ZoneInfo(zone) if zone in ZONES[:10] else ZoneInfo("UTC")
    offset = timedelta(seconds=spread // 2)
    instant = wall_time_to_utc(day, wall, tz) + offset
    now = instant + timedelta(seconds=lateness)
    planner = fanout._Planner(campaign, now)
    plan = planner.plan(zone, instant, offset, "")
    missed = instant < now - GRACE
    assert plan.missed == missed
    if not missed:
        assert (plan.due, plan.reason) == (instant, "")
        assert plan.status == (Status.SCHEDULED if instant > now else Status.QUEUED)
    elif policy == MissedPolicy.SKIP:
        assert (plan.status, plan.reason, plan.due) == (Status.SUPPRESSED, Reason.LOCAL_TIME_PASSED, instant)
    elif policy == MissedPolicy.SEND_NOW:
        assert (plan.status, plan.reason, plan.due) == (Status.QUEUED, "", now)
    else:
        assert plan.reason == "" and plan.due >= now - GRACE
        local = (plan.due - offset).astimezone(tz)
        assert local.date() > day
        assert plan.due - offset == wall_time_to_utc(local.date(), wall, tz)
        before = wall_time_to_utc(local.date() - timedelta(days=1), wall, tz) + offset
        assert before < now - GRACE  # the first day not missed, not a later one
    assert planner.plan(zone, instant, offset, Reason.NO_PHONE) == (Status.SUPPRESSED, Reason.NO_PHONE, instant,
                                                                    False)


# --- admin: before launch -----------------------------------------------------------------------------

def draft(local_date: date, local_time: time) -> Campaign:
    segment, _ = services.upsert_segment("zones", name="Zones")
    for user_id, zone in [("kiri", "Pacific/Kiritimati"), ("berlin", "Europe/Berlin"), ("ny", "America/New_York"),
                          ("nozone", "")]:
        Recipient.objects.create(user_id=user_id, phone="+4915112345678", timezone=zone)
    services.change_members(segment, add=["kiri", "berlin", "ny", "nozone"], remove=[])
    return services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.DRAFT, segment=segment,
                                    channel="sms", body="hi", local_date=local_date, local_time=local_time).campaign


@pytest.mark.django_db
def test_admin_draft_shows_how_many_members_are_already_past_and_refuses_the_launch(admin_client, frozen,
                                                                                     fast_password_hashing):
    c = draft(date(2030, 1, 10), time(10, 0))  # saved earlier; by NOW 10:00 passed in Kiritimati, Berlin, UTC
    url = reverse("admin:campaigns_campaign_change", args=[c.pk])
    page = admin_client.get(url).content.decode()
    assert ("<strong>3 of 4 members</strong>\n      are in zones where 2030-01-10 10:00 has already passed "
            "(now 2030-01-10 11:30:00 UTC);") in page
    assert "members whose time has passed when fan-out reaches them: Skip them (suppressed, reason " \
           "local_time_passed)." in page
    assert "Cannot launch: 2030-01-10 10:00 has already been reached in the earliest zone" in page
    assert 'value="Launch campaign"' not in page
    r = admin_client.post(reverse("admin:campaigns_campaign_launch", args=[c.pk]), follow=True)
    assert [str(m) for m in r.context["messages"]] == [
        "Not launched: 2030-01-10 10:00 has already been reached in the earliest zone (UTC+14, where it is now "
        "2030-01-11 01:30): a local_time must still be in the future in every zone. Change the local date or time."]
    c.refresh_from_db()
    assert c.status == CampaignStatus.DRAFT


@pytest.mark.django_db
def test_admin_draft_still_ahead_everywhere_shows_zero_past_and_launches(admin_client, frozen,
                                                                          fast_password_hashing):
    c = draft(date(2030, 1, 11), time(9, 0))
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[c.pk])).content.decode()
    assert "no member's zone has reached 2030-01-11 09:00 yet (now 2030-01-10 11:30:00 UTC)" in page
    assert 'value="Launch campaign"' in page
    admin_client.post(reverse("admin:campaigns_campaign_launch", args=[c.pk]))
    c.refresh_from_db()
    assert (c.status, c.fanout_at) == (CampaignStatus.SCHEDULED, utc(2030, 1, 10, 19))


@pytest.mark.django_db
def test_admin_form_refuses_a_local_time_already_reached_in_the_earliest_zone(admin_client, frozen,
                                                                               fast_password_hashing):
    segment, _ = services.upsert_segment("zones", name="Zones")
    r = admin_client.post(reverse("admin:campaigns_campaign_add"), {
        "name": "late", "segment": segment.pk, "channel": "sms", "priority": "standard", "category": "marketing",
        "body": "hi", "local_date": "2030-01-10", "local_time": "20:00", "missed_policy": "skip",
        "spread_seconds": "0"})
    assert r.status_code == 200
    assert r.context["adminform"].form.errors["local_time"] == [
        "2030-01-10 20:00 has already been reached in the earliest zone (UTC+14, where it is now 2030-01-11 "
        "01:30): a local_time must still be in the future in every zone."]
    assert not Campaign.objects.exists()
