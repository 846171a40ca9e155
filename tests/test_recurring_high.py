"""Pause, resume and cancel of a high-tier recurring series (docs/RECURRING.md, docs/SECURITY.md):
each needs what a high-priority send needs, the admission gate's rule (priority ``high`` or a
high-priority type, even a type made high after the series was), over the API and in the admin."""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client

from campaigns.models import Campaign
from notifications.events.models import NotificationType
from notifications.models import APIClient
from tests.conftest import MARKETING_SCOPES
from tests.fanout_helpers import make_recipient, make_segment_of
from tests.test_campaign_recurring import NOW  # noqa: F401  (the frozen clock reads the module's NOW)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]
SCHEDULE = {"rrule": "FREQ=WEEKLY;BYDAY=MO", "start": "2027-03-01T09:00:00", "timezone": "Europe/Paris"}


def key(scopes) -> tuple[APIClient, Client]:
    client, raw = APIClient.objects.create_key(name=f"k-{uuid.uuid4().hex[:6]}", scopes=scopes)
    return client, Client(headers={"Authorization": f"Api-Key {raw}"})


def post(http, path, body=None):
    return http.post(path, data=json.dumps(body) if body is not None else None, content_type="application/json",
                     headers={"Idempotency-Key": uuid.uuid4().hex})


@pytest.fixture
def segment():
    make_recipient("alice", email="alice@example.com")
    return make_segment_of(["alice"])


def series(http, segment, **what) -> Campaign:
    r = post(http, "/v1/campaigns", {"segment_id": segment.segment_id, "channel": "email", "schedule": SCHEDULE,
                                     **what})
    assert r.status_code == 202, r.content
    return Campaign.objects.get(pk=r.json()["id"])


def state(campaign) -> tuple:
    return Campaign.objects.filter(pk=campaign.pk).values_list("status", "next_run_at").get()


def test_a_type_made_high_after_the_series_is_resumed_only_with_send_high(frozen, segment):
    """Before: resume asked only the campaign's own priority, copied from the type when it was made."""
    kind = NotificationType.objects.create(key="news_t", name="N", category="news", channels=["email"])
    _, http = key(MARKETING_SCOPES)
    s = series(http, segment, type="news_t")
    assert post(http, f"/v1/campaigns/{s.pk}/pause").status_code == 200
    kind.priority = "high"
    kind.save()
    before = state(s)
    r = post(http, f"/v1/campaigns/{s.pk}/resume")
    assert r.status_code == 403, r.content
    error = r.json()["error"]
    assert (error["code"], error["fields"][0]["field"]) == ("missing_scope", "campaign_id")
    assert "resuming a high-priority campaign" in error["fields"][0]["message"]
    assert state(s) == before and before[0] == "paused"


def test_a_high_series_needs_send_high_for_resume_pause_and_cancel_and_works_with_it(frozen, segment):
    owner, http = key([*MARKETING_SCOPES, "notifications:send_high"])
    s = series(http, segment, content={"title": "Alert", "body": "Rotate your keys"}, priority="high",
               category="security")
    assert post(http, f"/v1/campaigns/{s.pk}/pause").status_code == 200
    paused = state(s)
    owner.scopes = MARKETING_SCOPES  # the key lost the scope since it made the series
    owner.save()
    for action in ("resume", "cancel"):
        r = post(http, f"/v1/campaigns/{s.pk}/{action}")
        assert (r.status_code, r.json()["error"]["code"]) == (403, "missing_scope"), action
        assert state(s) == paused and paused[0] == "paused"
    owner.scopes = [*MARKETING_SCOPES, "notifications:send_high"]
    owner.save()
    r = post(http, f"/v1/campaigns/{s.pk}/resume")
    assert (r.status_code, r.json()["status"]) == (200, "scheduled")
    owner.scopes = MARKETING_SCOPES
    owner.save()
    assert post(http, f"/v1/campaigns/{s.pk}/pause").status_code == 403
    assert state(s)[0] == "scheduled"


@pytest.mark.parametrize("permitted", [False, True])
def test_admin_resume_of_a_high_type_series_needs_the_permission(frozen, segment, permitted):
    kind = NotificationType.objects.create(key="news_t", name="N", category="news", channels=["email"])
    _, http = key(MARKETING_SCOPES)
    s = series(http, segment, type="news_t")
    assert post(http, f"/v1/campaigns/{s.pk}/pause").status_code == 200
    kind.priority = "high"
    kind.save()
    paused = state(s)
    user = User.objects.create_user("mara", is_staff=True)
    user.groups.add(Group.objects.get(name="marketing"))
    if permitted:
        user.user_permissions.add(Permission.objects.get(codename="send_high_priority"))
    browser = Client()
    browser.force_login(User.objects.get(pk=user.pk))
    r = browser.post("/admin/campaigns/campaign/", {"action": "resume_selected", "_selected_action": [str(s.pk)]},
                     follow=True)
    shown = [str(m) for m in r.context["messages"]]
    if permitted:
        assert state(s)[0] == "scheduled" and any("resumed" in m for m in shown), shown
    else:
        assert state(s) == paused and paused[0] == "paused"
        assert any("not resumed: a high-priority campaign needs the permission campaigns.send_high_priority" in m
                   for m in shown), shown


@pytest.mark.parametrize("series_of", [True, False])
def test_a_type_made_high_after_the_campaign_sends_its_rows_on_the_high_tier(frozen, segment, monkeypatch,
                                                                            series_of):
    """hadv32: the gate asked for the high tier (the type is high now) but the rows went out
    ``standard``, the priority copied when the series (or one-off campaign) was made. The fan-out's
    start takes the high tier from the type; a type made standard later never lowers a campaign."""
    from campaigns import fanout
    from campaigns.runs import create_due_runs
    from tests.fanout_helpers import run_fan_out

    kind = NotificationType.objects.create(key="news_t", name="N", category="news", channels=["email"])
    _, http = key([*MARKETING_SCOPES, "notifications:send_high"])
    if series_of:
        campaign = series(http, segment, type="news_t")
    else:
        r = post(http, "/v1/campaigns", {"segment_id": segment.segment_id, "channel": "email", "type": "news_t",
                                         "scheduled_at": "2027-03-01T08:00:00Z"})
        assert r.status_code == 202, r.content
        campaign = Campaign.objects.get(pk=r.json()["id"])
    assert campaign.priority == "standard"
    kind.priority = "high"
    kind.save()
    queued = []
    monkeypatch.setattr(fanout, "enqueue_on_commit", lambda rows: queued.extend(rows))
    frozen[0] = campaign.next_run_at if series_of else campaign.fanout_at
    if series_of:
        assert create_due_runs() == {"created": 1, "skipped": 0}
        campaign = campaign.runs.get()

    rows = run_fan_out(campaign)

    assert [(n.recipient_id, n.status, n.priority) for n in rows] == [("alice", "queued", "high")]
    assert queued == [(str(rows[0].pk), "high", "email")]
    assert Campaign.objects.get(pk=campaign.pk).priority == "high"
