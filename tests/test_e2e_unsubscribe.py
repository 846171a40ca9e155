"""End to end, real workers: a marketing campaign's email carries the RFC 8058 headers at the
emulator, a one-click POST to its link opts the recipient out, the next campaign's email to them is
suppressed ``opted_out_category``, and the first campaign shows one unsubscribe (docs/TYPES.md,
"Unsubscribe")."""

from __future__ import annotations

import uuid

import pytest
import requests

from notifications.models import Notification
from preferences.models import Preferences, Unsubscribe
from tests.e2e import make_segment
from tests.test_e2e_campaigns import create_campaign, wait_campaign

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CONTENT = {"title": "Sale for {{ first_name }}", "body": "Hi {{ first_name }}, 20% off today"}


def campaign_mail(emulator, cid: str) -> dict:
    """``{to: recorded message}`` of campaign ``cid``'s emails at the emulator."""
    ids = {str(i) for i in Notification.objects.filter(campaign_id=cid).values_list("id", flat=True)}
    return {m["to"]: m for m in emulator.messages(channel="email") if m["notification_id"] in ids}


def test_a_one_click_unsubscribe_suppresses_the_next_campaign_and_is_counted(api, emulator):
    segment_id, users, _ = make_segment(api, 3, channel="email")
    first = create_campaign(api, {"segment_id": segment_id, "channel": "email", "content": CONTENT})
    wait_campaign(api, first, "completed", timeout=90)

    got = campaign_mail(emulator, first)
    assert sorted(got) == sorted(f"{u}@example.com" for u in users)
    headers = got[f"{users[0]}@example.com"]["details"]["headers"]
    assert set(headers) == {"List-Unsubscribe", "List-Unsubscribe-Post"}
    assert headers["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    link = headers["List-Unsubscribe"].removeprefix("<").removesuffix(">")
    assert link.startswith(f"{api.base}/u/")
    # Each recipient's link is its own.
    assert len({m["details"]["headers"]["List-Unsubscribe"] for m in got.values()}) == 3

    # What a mail provider does: a POST with no cookie, no CSRF token, no API key.
    assert requests.get(link, timeout=10).status_code == 200
    assert not Unsubscribe.objects.filter(recipient_id__in=users).exists()  # GET changed nothing
    answer = requests.post(link, data={"List-Unsubscribe": "One-Click"}, timeout=10)
    assert answer.status_code == 200, answer.text

    assert Preferences.objects.get(recipient_id=users[0]).category_opt_outs == {"marketing": ["email"]}
    assert list(Unsubscribe.objects.filter(recipient_id__in=users).values_list(
        "recipient_id", "category", "channel", "source", "campaign_id")) == [
        (users[0], "marketing", "email", "one_click", uuid.UUID(first))]
    body = api.request("GET", f"/v1/campaigns/{first}").json()
    assert (body["unsubscribes"], body["unsubscribe_rate"]) == (1, 1 / 3)

    second = create_campaign(api, {"segment_id": segment_id, "channel": "email", "content": CONTENT})
    body = wait_campaign(api, second, "completed", timeout=90)
    assert body["counts"]["suppressed_by_reason"] == {"opted_out_category": 1}
    assert body["counts"]["outcome"]["sent"] == 2
    row = Notification.objects.get(campaign_id=second, recipient_id=users[0])
    assert (row.status, row.reason) == ("suppressed", "opted_out_category")
    assert sorted(campaign_mail(emulator, second)) == sorted(f"{u}@example.com" for u in users[1:])
    assert (body["unsubscribes"], body["unsubscribe_rate"]) == (0, 0.0)
