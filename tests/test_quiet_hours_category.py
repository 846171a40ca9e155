"""Quiet hours follow the category, not only the priority (issue 10, finding 12).

Accept time: marketing is never ``high`` (422, single sends and campaigns, and the admin form);
``high`` only with a category in ``QUIET_HOURS_BYPASS_CATEGORIES`` or with none. Send time: quiet
hours hold a notification unless its category bypasses them (or it is ``high`` without a category).
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns.models import Campaign, Segment
from core import clock
from core.api.scopes import Scope
from notifications.delivery.content import Content as _CampaignContent
from notifications.delivery.pipeline import prepare
from notifications.models import APIClient, DeliveryEvent, Notification
from notifications.quiet_hours_policy import bypasses_quiet_hours, priority_category_problem
from preferences.models import Preferences, Recipient

pytestmark = pytest.mark.django_db


@pytest.fixture
def http():
    _, key = APIClient.objects.create_key(name="qh", allow_high=True,
                                          scopes=[Scope.SEND, Scope.CAMPAIGNS_WRITE, Scope.READ])
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def alice():
    return Recipient.objects.create(user_id="alice", email="a@example.com", phone="+4915123456789")


def _fields(r):
    return {(f["field"], f["code"]) for f in r.json()["error"].get("fields", [])}


def _send(http, **over):
    body = {"user_id": "alice", "channel": "sms", "content": {"body": "hi"}} | over
    return http.post("/v1/notifications", data=json.dumps(body), content_type="application/json",
                     headers={"Idempotency-Key": json.dumps(over, sort_keys=True)})


@pytest.mark.parametrize(("priority", "category", "status", "code"), [
    ("high", "marketing", 422, "marketing_not_high"),
    ("high", "newsletter", 422, "category_not_high"),
    ("high", "security", 202, None),
    ("high", "transactional", 202, None),
    ("high", "", 202, None),
    ("standard", "marketing", 202, None),
])
def test_single_send_priority_follows_category(http, alice, priority, category, status, code):
    r = _send(http, priority=priority, category=category)
    assert r.status_code == status, r.content
    if code:
        assert _fields(r) == {("priority", code)}
        assert "priority" in r.json()["error"]["message"]
        assert Notification.objects.count() == 0
    else:
        assert Notification.objects.count() == 1


def test_campaign_marketing_high_is_422_and_writes_nothing(http):
    Segment.objects.create(segment_id="vip", name="VIPs")
    body = {"segment_id": "vip", "channel": "sms", "content": {"body": "Sale"}, "priority": "high"}
    r = http.post("/v1/campaigns", data=json.dumps(body), content_type="application/json",
                  headers={"Idempotency-Key": "c"})
    assert r.status_code == 422  # the default category is marketing
    assert _fields(r) == {("priority", "marketing_not_high")}
    assert not Campaign.objects.exists()
    body["category"] = "security"
    r = http.post("/v1/campaigns", data=json.dumps(body), content_type="application/json",
                  headers={"Idempotency-Key": "c"})
    assert r.status_code == 202


def test_bypass_categories_are_configuration(http, alice, settings):
    settings.QUIET_HOURS_BYPASS_CATEGORIES = ("security",)
    assert _fields(_send(http, priority="high", category="transactional")) == {("priority", "category_not_high")}
    assert not bypasses_quiet_hours("standard", "transactional")
    assert bypasses_quiet_hours("standard", "security")


def test_marketing_in_bypass_setting_fails_the_system_check(settings):
    from notifications.apps import check_quiet_hours_bypass

    settings.QUIET_HOURS_BYPASS_CATEGORIES = ("security", "marketing")
    assert [e.id for e in check_quiet_hours_bypass()] == ["notifications.E001"]
    settings.QUIET_HOURS_BYPASS_CATEGORIES = ("security", "transactional")
    assert check_quiet_hours_bypass() == []


def _claimed(recipient, priority, category):
    now = clock.now()
    import uuid

    return Notification.objects.create(id=uuid.uuid4(), recipient=recipient, channel="sms", priority=priority,
                                       category=category, body="x", status="sending", attempts=1,
                                       lease_until=now + timedelta(seconds=30))


@pytest.mark.parametrize(("priority", "category", "held"), [
    ("high", "marketing", True),        # a row written before the accept-time rule: held all the same
    ("high", "newsletter", True),
    ("high", "security", False),
    ("high", "", False),                # uncategorised urgent (an OTP): sent, as high always was
    ("standard", "security", False),    # a security alert skips quiet hours at any priority
    ("standard", "transactional", False),
    ("standard", "marketing", True),
    ("standard", "", True),
])
def test_send_time_quiet_hours_follow_the_category(alice, priority, category, held):
    now = clock.now()
    Preferences.objects.create(recipient=alice, quiet_start=(now - timedelta(hours=1)).time().replace(second=0),
                               quiet_end=(now + timedelta(hours=2)).time().replace(second=0), quiet_timezone="UTC")
    n = _claimed(Recipient.objects.get(pk="alice"), priority, category)
    n = Notification.objects.select_related("recipient__preferences").get(pk=n.pk)
    result = prepare(n, set(), _CampaignContent(), stopped_phones=set())
    n.refresh_from_db()
    if held:
        assert result is None
        assert (n.status, n.reason, n.attempts) == ("scheduled", "quiet_hours", 0)
        assert DeliveryEvent.objects.filter(notification=n, kind="deferred").count() == 1
    else:
        assert result is not None and (result.n.pk, result.devices, result.silent) == (n.pk, [], False)
        assert (n.status, n.reason) == ("sending", "")
        assert not DeliveryEvent.objects.filter(notification=n).exists()


_CATEGORIES = st.sampled_from(["", "marketing", "security", "transactional", "orders", "newsletter"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(priority=st.sampled_from(["high", "standard"]), category=_CATEGORIES)
def test_what_is_accepted_at_high_never_waits_for_quiet_hours(priority, category):
    """The two halves agree: every (priority, category) accepted at high bypasses quiet hours at
    send time, and marketing never does, at any priority."""
    if priority_category_problem(priority, category) is None and priority == "high":
        assert bypasses_quiet_hours(priority, category)
    if category == "marketing":
        assert not bypasses_quiet_hours(priority, category)
        assert priority_category_problem("high", category)[0] == "marketing_not_high"
