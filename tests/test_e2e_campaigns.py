"""End to end: campaigns to segments through real workers, beat, Postgres, Redis and the emulator."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from campaigns.models import SegmentMember
from notifications.models import Notification
from preferences.models import Device, Preferences, Recipient
from tests.stack import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def make_segment(api, n: int, *, channel: str, opted_out_every: int = 0, prefix: str | None = None,
                 zones: list[str] | None = None, locale: str = "en") -> tuple[str, list[str], set[str]]:
    """A segment of ``n`` members created straight in the database (the API path is covered elsewhere).
    Every ``opted_out_every``-th member opts out of ``channel``. Returns (segment_id, user ids, opted out)."""
    prefix = prefix or f"c{uuid.uuid4().hex[:8]}"
    segment_id = f"seg-{prefix}"
    assert api.request("PUT", f"/v1/segments/{segment_id}", json={"name": f"Segment {prefix}"}).status_code == 201
    users = [f"{prefix}-{i:06d}" for i in range(n)]
    Recipient.objects.bulk_create([
        Recipient(user_id=u, email=f"{u}@example.com", phone=f"+49151{i:08d}", locale=locale,
                  timezone=(zones[i % len(zones)] if zones else "Europe/Berlin"),
                  attributes={"first_name": f"User{i}"})
        for i, u in enumerate(users)], batch_size=5000)
    if channel == "push":
        Device.objects.bulk_create([Device(recipient_id=u, platform="android", push_token=f"tok-{u}")
                                    for u in users], batch_size=5000)
    opted = set()
    if opted_out_every:
        opted = set(users[::opted_out_every])
        Preferences.objects.bulk_create([Preferences(recipient_id=u, opt_outs=[channel]) for u in opted])
    from campaigns.models import Segment

    segment = Segment.objects.get(pk=segment_id)
    SegmentMember.objects.bulk_create([SegmentMember(segment=segment, recipient_id=u) for u in users],
                                      batch_size=5000)
    return segment_id, users, opted


def create_campaign(api, body: dict, key: str | None = None) -> str:
    r = api.request("POST", "/v1/campaigns", json=body, key=key or uuid.uuid4().hex)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def wait_campaign(api, cid: str, statuses, timeout: float = 120) -> dict:
    statuses = {statuses} if isinstance(statuses, str) else set(statuses)

    def check():
        body = api.request("GET", f"/v1/campaigns/{cid}").json()
        return body if body["status"] in statuses else None

    return wait_until(check, timeout, interval=0.5, message=f"campaign {cid} in {statuses}")


def content_for(channel: str) -> dict:
    if channel == "sms":
        return {"body": "Hi {{ first_name }}, 20% off today"}
    return {"title": "Sale for {{ first_name }}", "body": "Hi {{ first_name }}, 20% off today"}


def test_small_campaign_with_template_renders_per_recipient_and_completes(api, emulator):
    segment_id, users, _ = make_segment(api, 30, channel="email")
    Recipient.objects.filter(pk__in=users[:10]).update(locale="de-AT")
    r = api.request("PUT", "/v1/templates/welcome", json={
        "name": "Welcome", "default_locale": "en",
        "variants": [
            {"locale": "en", "title": "Hello {{ first_name }}", "body": "Welcome, {{ first_name }}!",
             "html": "<p>Welcome, {{ first_name }}!</p>"},
            {"locale": "de", "title": "Hallo {{ first_name }}", "body": "Willkommen, {{ first_name }}!"},
        ]})
    assert r.status_code in (200, 201), r.text
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "email", "template_id": "welcome"})
    body = wait_campaign(api, cid, "completed", timeout=60)
    assert body["counts"]["by_status"]["sent"] == 30
    assert body["counts"]["total"] == 30
    got = {m["to"]: m for m in emulator.messages(channel="email") if m["to"].startswith(segment_id[4:])}
    assert len(got) == 30
    assert got[f"{users[0]}@example.com"]["title"] == "Hallo User0"
    assert got[f"{users[29]}@example.com"]["title"] == "Hello User29"
    assert got[f"{users[29]}@example.com"]["body"] == "Welcome, User29!"


@pytest.mark.parametrize("channel", ["sms", "email", "push"])
def test_campaign_to_5000_members_delivers_once_per_eligible_member(api, emulator, channel):
    segment_id, users, opted = make_segment(api, 5000, channel=channel, opted_out_every=10)
    cid = create_campaign(api, {"segment_id": segment_id, "channel": channel, "content": content_for(channel)})
    body = wait_campaign(api, cid, "completed", timeout=200)
    counts = body["counts"]
    assert counts["total"] == 5000 == body["member_count"]
    assert counts["by_status"]["sent"] == 5000 - len(opted)
    assert counts["by_status"]["suppressed"] == len(opted) == 500
    assert counts["suppressed_by_reason"] == {"opted_out_channel": 500}
    assert sum(counts["by_status"].values()) == 5000
    ids = {str(i) for i in Notification.objects.filter(campaign_id=cid).values_list("id", flat=True)}
    received = [m for m in emulator.messages(channel=channel) if m["notification_id"] in ids]
    per_to = Counter(m["to"] for m in received)
    assert len(per_to) == 5000 - len(opted)
    assert set(per_to.values()) == {1}
    expected_to = {
        "sms": lambda i, u: f"+49151{i:08d}", "email": lambda i, u: f"{u}@example.com",
        "push": lambda i, u: f"tok-{u}"}[channel]
    assert set(per_to) == {expected_to(i, u) for i, u in enumerate(users) if u not in opted}
    assert all(m["body"].startswith("Hi User") for m in received)
