"""Fan-out against the real member query (in the test's transaction, no stack): preferences rows,
zones, and the pre-launch reach."""

from __future__ import annotations

from datetime import time

import pytest

from campaigns.models import Campaign
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
