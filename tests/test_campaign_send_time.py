"""Send-time optimised campaigns (docs/SEND_TIME.md): the API option's 422s, each member's due instant
at fan-out (best hour in the window in their zone, across a DST change; holdout and no history at the
campaign's time; a missed best hour by missed_policy), the recorded groups, and their comparison.

In-process: fan-out pages run as functions against the test database with the platform clock fixed.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, date, datetime, time

import pytest
from django.test import Client
from django.urls import reverse

from campaigns import fanout, services
from campaigns.models import Campaign, CampaignShard, CampaignStatus, MissedPolicy, SendTimeMember
from core import clock
from notifications.models import APIClient, DeliveryEvent, Notification
from notifications.send_time.models import SendTimeProfile
from notifications.send_time.rule import in_holdout
from preferences.models import Recipient
from tests.conftest import MARKETING_SCOPES

NOW = datetime(2030, 3, 30, 0, 0, tzinfo=UTC)  # Berlin moves to summer time on 2030-03-31 at 01:00 UTC
OPTION = {"window": {"start": "09:00", "end": "21:00"}, "holdout_percent": 50}


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def hist(**hours: int) -> list[int]:
    counts = [0] * 24
    for name, n in hours.items():
        counts[int(name[1:])] = n
    return counts


@pytest.fixture
def http(db):
    _, key = APIClient.objects.create_key(name="marketing-tool", scopes=MARKETING_SCOPES)
    services.upsert_segment("vip", name="VIPs")
    return Client(headers={"Authorization": f"Api-Key {key}"})


def post(http, **over):
    body = {"segment_id": "vip", "channel": "email", "content": {"title": "Sale", "body": "Sale!"},
            "local_time": {"date": "2030-03-31", "time": "18:00"},
            "send_time": {"optimise": True, **OPTION}, **over}
    return http.post("/v1/campaigns", data=json.dumps(body), content_type="application/json",
                     headers={"Idempotency-Key": str(uuid.uuid4())})


@pytest.mark.parametrize(("over", "field", "code"), [
    ({"local_time": None, "scheduled_at": "2030-03-31T18:00:00Z"}, "send_time", "local_time_only"),
    ({"local_time": None}, "send_time", "local_time_only"),
    ({"send_time": {"optimise": True, "window": {"start": "09:00", "end": "09:00"}}},
     "send_time.window.end", "invalid"),
    ({"send_time": {"optimise": True, "window": {"start": "09:10", "end": "09:50"}}},
     "send_time.window.end", "invalid"),
    ({"send_time": {"optimise": True, "window": {"start": "09:00", "end": "21:00"}, "holdout_percent": 51}},
     "send_time.holdout_percent", "max_value"),
    ({"send_time": {"optimise": True, "window": {"start": "9", "end": "21:00"}}}, "send_time.window.start", None),
    ({"send_time": {"optimise": True, "window": {"start": "09:00", "end": "21:00"}, "best": 1}},
     "send_time.best", "unknown_field"),
    ({"send_time": {"optimise": True}}, "send_time.window", "required"),
    ({"local_time": {"date": "2030-03-30", "time": "18:00"}}, "local_time", "local_time_passed"),
])
def test_a_bad_send_time_is_422_naming_the_field_and_creates_nothing(http, frozen, over, field, code):
    r = post(http, **over)
    assert r.status_code == 422, r.content
    errors = {e["field"]: e["code"] for e in r.json()["error"]["fields"]}
    assert field in errors, errors
    if code:
        assert errors[field] == code
    assert not Campaign.objects.exists()


def test_the_option_is_stored_and_starts_fan_out_when_the_earliest_zone_reaches_the_window(http, frozen):
    r = post(http)
    assert r.status_code == 202, r.content
    c = Campaign.objects.get()
    assert c.send_time == OPTION
    # 09:00 on 2030-03-31 in UTC+14 (not the campaign's 18:00): 2030-03-30 19:00 UTC.
    assert c.fanout_at == utc(2030, 3, 30, 19)
    detail = http.get(f"/v1/campaigns/{c.pk}").json()
    assert detail["send_time"] == {**OPTION, "groups": [
        {"group": g, "members": 0, "sent": 0, "opened": 0, "open_rate": None}
        for g in ("optimised", "holdout", "no_history")]}
    # Off is the same as leaving it out (hadv32: without a window, or on a scheduled_at campaign, a 422).
    for off in ({"optimise": False, **OPTION}, {"optimise": False}):
        for when in ({}, {"local_time": None, "scheduled_at": "2030-03-31T18:00:00Z"}):
            r = post(http, send_time=off, **when)
            assert r.status_code == 202, r.content
            assert Campaign.objects.get(pk=r.json()["id"]).send_time is None
            assert http.get(f"/v1/campaigns/{r.json()['id']}").json()["send_time"] is None


# --- fan-out -------------------------------------------------------------------------------------

def member_ids(campaign_id, n_in: int, n_out: int) -> tuple[list[str], list[str]]:
    """User ids drawn into and out of ``campaign_id``'s 50 % holdout."""
    held, kept = [], []
    for i in range(200):
        u = f"u{i:03d}"
        (held if in_holdout(campaign_id, u, 50) else kept).append(u)
    return held[:n_in], kept[:n_out]


def campaign_of(zones: dict[str, str], profiles: dict[str, list[int]], policy=MissedPolicy.SKIP) -> Campaign:
    segment, _ = services.upsert_segment("st", name="Send time")
    for user_id, zone in zones.items():
        Recipient.objects.create(user_id=user_id, email=f"{user_id}@example.com", timezone=zone)
    for user_id, counts in profiles.items():
        SendTimeProfile.objects.create(recipient_id=user_id, counts=counts, events=sum(counts), best_hour=0)
    services.change_members(segment, add=list(zones), remove=[])
    c = Campaign.objects.create(id=CAMPAIGN_ID, segment=segment, channel="email", title="T", body="hi",
                                local_date=date(2030, 3, 31), local_time=time(18, 0), missed_policy=policy,
                                send_time=OPTION, status=CampaignStatus.FANNING_OUT, snapshot_at=clock.now(),
                                snapshot_kind="list",
                                started_at=clock.now(), member_count=len(zones))
    CampaignShard.objects.create(campaign=c, number=0, heartbeat_at=NOW)
    return c


CAMPAIGN_ID = uuid.UUID("5e1d7a3c-0000-4000-8000-000000000026")
(HELD,), (BERLIN, NY, TOKYO, KIRI) = member_ids(CAMPAIGN_ID, 1, 4)
ZONES = {BERLIN: "Europe/Berlin", NY: "America/New_York", TOKYO: "Asia/Tokyo", KIRI: "Pacific/Kiritimati",
         HELD: "Europe/Berlin"}
PROFILES = {BERLIN: hist(h7=9, h14=2),   # 07:00 is outside the window: 14:00 (scores 2 against 08:00's 0)
            NY: hist(h20=5, h21=5),       # 21:00 scores higher but the window ends before it: 20:00
            KIRI: hist(h9=3),
            HELD: hist(h10=9)}            # held out: the campaign's 18:00 whatever its history


def due(c) -> dict:
    return {n.recipient_id: (n.status, n.reason, n.due_at) for n in Notification.objects.filter(campaign_id=c.pk)}


def groups(c) -> dict:
    return {m.recipient_id: (m.group, m.hour) for m in SendTimeMember.objects.filter(campaign=c)}


@pytest.mark.django_db
def test_each_member_is_due_at_their_best_hour_in_their_zone_or_at_the_campaigns_time(frozen):
    c = campaign_of(ZONES, PROFILES)
    assert fanout.fan_out_page(str(c.pk), 0) == "done"
    assert due(c) == {
        BERLIN: ("scheduled", "", utc(2030, 3, 31, 12)),   # 14:00 CEST (summer time from that morning)
        NY: ("scheduled", "", utc(2030, 4, 1, 0)),        # 20:00 EDT
        KIRI: ("scheduled", "", utc(2030, 3, 30, 19)),    # 09:00 UTC+14
        TOKYO: ("scheduled", "", utc(2030, 3, 31, 9)),    # no history: 18:00 JST
        HELD: ("scheduled", "", utc(2030, 3, 31, 16)),    # holdout: 18:00 CEST
    }
    assert groups(c) == {BERLIN: ("optimised", 14), NY: ("optimised", 20), KIRI: ("optimised", 9),
                         TOKYO: ("no_history", None), HELD: ("holdout", None)}
    fanout.fan_out_page(str(c.pk), 0)  # a page run again records nothing new
    assert SendTimeMember.objects.filter(campaign=c).count() == 5


@pytest.mark.django_db
def test_a_best_hour_already_passed_follows_the_missed_policy(frozen):
    frozen[0] = utc(2030, 3, 30, 20)  # 10:00 on the 31st in UTC+14: KIRI's 09:00 passed an hour ago
    c = campaign_of(ZONES, PROFILES, policy=MissedPolicy.NEXT_DAY)
    fanout.fan_out_page(str(c.pk), 0)
    assert due(c)[KIRI] == ("scheduled", "", utc(2030, 3, 31, 19))  # 09:00 the next local day
    assert due(c)[BERLIN] == ("scheduled", "", utc(2030, 3, 31, 12))
    c.refresh_from_db()
    assert c.missed_count == 1


@pytest.mark.django_db
def test_the_comparison_counts_members_sent_and_opened_per_group(frozen, admin_client):
    c = campaign_of(ZONES, PROFILES)
    fanout.fan_out_page(str(c.pk), 0)
    rows = {n.recipient_id: n for n in Notification.objects.filter(campaign_id=c.pk)}
    Notification.objects.filter(pk__in=[rows[u].pk for u in (BERLIN, NY, KIRI, HELD)]).update(status="sent")
    for u, kind in ((BERLIN, "receipt:open"), (NY, "receipt:click"), (HELD, "receipt:delivered")):
        DeliveryEvent.objects.create(notification=rows[u], kind=kind, created_at=NOW)
    from campaigns.send_time import comparison

    assert comparison(Campaign.objects.get(pk=c.pk)) == [
        {"group": "optimised", "members": 3, "sent": 3, "opened": 2, "open_rate": 0.6667},
        {"group": "holdout", "members": 1, "sent": 1, "opened": 0, "open_rate": 0.0},
        {"group": "no_history", "members": 1, "sent": 0, "opened": 0, "open_rate": None},
    ]
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[c.pk])).content.decode()
    assert ("<tr><td>optimised</td><td>3</td><td>3</td><td>2</td><td>66.7%</td></tr>"
            "<tr><td>holdout</td><td>1</td><td>1</td><td>0</td><td>0.0%</td></tr>"
            "<tr><td>no_history</td><td>1</td><td>0</td><td>0</td><td>–</td></tr>") in page


@pytest.mark.django_db
def test_erasure_clears_the_members_hour_and_leaves_the_comparison_as_it_was(frozen):
    """hadv32: deleting the erased member's group changed a finished campaign's comparison. The
    hour chosen from their engagement goes; the group stays, as their notification's status does."""
    from campaigns.send_time import comparison
    from preferences.api.erasure import erase_user, personal_data

    c = campaign_of(ZONES, PROFILES)
    fanout.fan_out_page(str(c.pk), 0)
    before, compared = groups(c), comparison(Campaign.objects.get(pk=c.pk))
    assert before[BERLIN][0] == "optimised" and before[BERLIN][1] is not None

    erase_user(Recipient.objects.get(pk=BERLIN), requested_by="test")

    assert groups(c) == {**before, BERLIN: ("optimised", None)}
    assert comparison(Campaign.objects.get(pk=c.pk)) == compared
    assert personal_data()["campaigns.SendTimeMember"].startswith("the hour chosen")
