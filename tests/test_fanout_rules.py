"""Fan-out against the real member query (in the test's transaction, no stack): preferences rows,
zones, and the pre-launch reach."""

from __future__ import annotations

from datetime import time, timedelta

import pytest

from campaigns.models import Campaign
from core import clock
from tests.conftest import MARKETING_SCOPES
from tests.fanout_helpers import make_campaign, make_recipient, run_fan_out

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("prefs", [
    {"category_opt_outs": {"marketing": ["email"]}},  # a category opt-out on another channel
    {"quiet_start": time(22), "quiet_end": time(7), "quiet_timezone": "Europe/Berlin"},
    {"opt_outs": ["email"]},  # an opt-out of another channel
    {},  # a row with nothing in it
], ids=["category-other-channel", "quiet-hours", "other-channel", "empty-row"])
def test_members_with_saved_preferences_are_created_and_queued(prefs):
    make_recipient("pref-1", prefs=prefs)
    make_recipient("pref-2")  # no preferences row
    campaign = make_campaign(["pref-1", "pref-2"], channel="sms")
    rows = run_fan_out(campaign)
    assert [(n.recipient_id, n.status, n.reason) for n in rows] == [
        ("pref-1", "queued", ""), ("pref-2", "queued", "")]
    assert Campaign.objects.get(pk=campaign.pk).status == "sending"


def test_channel_names_are_matched_exactly_not_as_substrings():
    # '["smsx"]' contains "sms" as text; the opt-out is of no channel we send on.
    make_recipient("sub-1", prefs={"opt_outs": ["smsx"], "category_opt_outs": {"marketing": ["xsms"]}})
    make_recipient("sub-2", prefs={"category_opt_outs": {"marketing": ["sms"]}})
    make_recipient("sub-3", prefs={"opt_outs": ["sms"]})
    rows = run_fan_out(make_campaign(["sub-1", "sub-2", "sub-3"], channel="sms"))
    assert [(n.recipient_id, n.status, n.reason) for n in rows] == [
        ("sub-1", "queued", ""), ("sub-2", "suppressed", "opted_out_category"),
        ("sub-3", "suppressed", "opted_out_channel")]
    # A suppressed row says why in the words a single send's does (hadvroads 6: it said nothing).
    assert [n.reason_detail for n in rows] == [
        "", "Recipient opted out of this category on this channel (marketing on sms)",
        "Recipient opted out of this channel"]


def test_api_shows_the_eligible_reach_before_fan_out_and_fan_out_creates_exactly_that_many():
    import json

    from django.test import Client

    from notifications.delivery.routing import sms_sender
    from notifications.models import APIClient
    from preferences.models import SmsStop
    from tests.fanout_helpers import make_segment_of

    make_recipient("r-ok")
    make_recipient("r-ok-prefs", prefs={"opt_outs": ["email"], "category_opt_outs": {"news": ["sms"]}})
    make_recipient("r-out", prefs={"opt_outs": ["sms"]})
    make_recipient("r-cat", prefs={"category_opt_outs": {"marketing": ["sms", "push"]}})
    make_recipient("r-nophone", phone="")
    make_recipient("r-invalid", phone_invalid=True)
    make_recipient("r-stopped", phone="+4915199999999")
    SmsStop.objects.create(phone="+4915199999999", sender=sms_sender(), source="twilio 21610")
    segment = make_segment_of(["r-ok", "r-ok-prefs", "r-out", "r-cat", "r-nophone", "r-invalid", "r-stopped"])
    _, key = APIClient.objects.create_key(name="reach", scopes=MARKETING_SCOPES)
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    r = http.post("/v1/campaigns", data=json.dumps({
        "segment_id": segment.pk, "channel": "sms", "content": {"body": "Sale!"},
        "scheduled_at": (clock.now() + timedelta(days=30)).isoformat()}), content_type="application/json",
        headers={"Idempotency-Key": "r"})
    assert r.status_code == 202, r.content
    cid = r.json()["id"]
    before = http.get(f"/v1/campaigns/{cid}").json()
    assert (before["status"], before["member_count"]) == ("scheduled", None)
    assert before["reach"] == {"members": 7, "eligible": 2, "suppressed_by_reason": {
        "no_phone": 1, "opted_out_category": 1, "opted_out_channel": 1, "phone_invalid": 1, "sms_stopped": 1},
        "exact": True}

    campaign = Campaign.objects.get(pk=cid)
    Campaign.objects.filter(pk=cid).update(fanout_at=campaign.created_at, scheduled_at=campaign.created_at)
    rows = run_fan_out(campaign)  # due now
    assert sorted((n.recipient_id, n.status, n.reason) for n in rows) == [
        ("r-cat", "suppressed", "opted_out_category"), ("r-invalid", "suppressed", "phone_invalid"),
        ("r-nophone", "suppressed", "no_phone"), ("r-ok", "queued", ""), ("r-ok-prefs", "queued", ""),
        ("r-out", "suppressed", "opted_out_channel"), ("r-stopped", "suppressed", "sms_stopped")]
    after = http.get(f"/v1/campaigns/{cid}").json()
    assert (after["status"], after["member_count"], after["reach"]) == ("sending", 7, None)
    assert after["counts"]["by_status"]["queued"] == before["reach"]["eligible"]
    assert after["counts"]["suppressed_by_reason"] == before["reach"]["suppressed_by_reason"]


def test_users_sharing_an_address_each_get_the_campaign_by_their_own_rules():
    """docs/POLICIES.md, "One address, several users": a campaign goes per user, not per address
    (each account's opt-outs, unsubscribe link, locale and caps are its own); one account's opt-out
    suppresses only that account."""
    make_recipient("home-a", email="family@example.org")
    make_recipient("home-b", email="Family@Example.org")
    make_recipient("home-c", email="family@example.org", prefs={"category_opt_outs": {"marketing": ["email"]}})
    rows = run_fan_out(make_campaign(["home-a", "home-b", "home-c"], channel="email"))
    assert [(n.recipient_id, n.channel, n.status, n.reason) for n in rows] == [
        ("home-a", "email", "queued", ""), ("home-b", "email", "queued", ""),
        ("home-c", "email", "suppressed", "opted_out_category")]


def test_a_typed_campaign_honours_type_opt_outs_in_reach_and_fan_out_and_its_rows_carry_the_type():
    """Every road (hroads, finding 1): a user opted out of a type got its campaign on every channel;
    the reach counted them eligible and the rows carried no type (nor its sensitivity)."""
    from campaigns.audience import reach
    from notifications.events.models import NotificationType

    kind = NotificationType.objects.create(key="lo_promo", name="Promo", category="promo", channels=["sms"],
                                           sensitive=True)
    make_recipient("out", prefs={"type_opt_outs": {"lo_promo": ["sms"]}})
    make_recipient("in")
    campaign = make_campaign(["in", "out"], channel="sms", category="promo")
    Campaign.objects.filter(pk=campaign.pk).update(notification_type=kind)
    campaign.refresh_from_db()

    assert reach(campaign, clock.now()).as_dict() == {
        "members": 2, "eligible": 1, "suppressed_by_reason": {"opted_out_type": 1}, "exact": True}
    rows = run_fan_out(campaign)
    assert [(n.recipient_id, n.status, n.reason, n.notification_type_id, n.sensitive) for n in rows] == [
        ("in", "queued", "", "lo_promo", True), ("out", "suppressed", "opted_out_type", "lo_promo", True)]
    assert rows[1].reason_detail == "Recipient opted out of this notification type on this channel (lo_promo on sms)"
