"""End to end, the in-app inbox (docs/APP.md): real gunicorn, Celery workers and beat, Postgres,
Redis and the provider emulator driven by firebase-admin. An event type on ``in_app`` + ``push``
puts one inbox item and one push per device, and a silent (data-only) refresh push; a campaign on
``in_app`` fills every eligible member's inbox exactly once and completes."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from bench.stack import wait_until
from notifications.inbox.models import InboxCounts, InboxItem
from notifications.models import Notification
from tests.e2e import make_segment, make_user, wait_status
from tests.test_e2e_campaigns import create_campaign, wait_campaign

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

LIKED = {
    "name": "Post liked", "category": "social", "channels": ["in_app", "push"], "routing": "all",
    "templates": [
        {"channel": "in_app", "locale": "en", "title": "{{ data.who }} liked your post",
         "body": "{{ data.who }} and others liked “{{ data.post }}”", "data": {"post_id": "{{ data.post_id }}"}},
        {"channel": "push", "locale": "en", "title": "New like", "body": "{{ data.who }} liked your post"}]}


def test_an_event_on_in_app_and_push_is_one_inbox_item_one_push_per_device_and_a_silent_refresh(api, emulator, uid):
    key = f"post_liked_{uid[-6:]}"
    r = api.request("PUT", f"/v1/notification-types/{key}", json=LIKED)
    assert r.status_code in (200, 201), r.text
    user = make_user(api, uid, devices=2)
    r = api.request("POST", "/v1/events", key=uuid.uuid4().hex, json={
        "type": key, "user_id": uid, "data": {"who": "Ada", "post": "Hello", "post_id": "p-1"}})
    assert r.status_code == 202, r.text
    ids = {n["channel"]: n["id"] for n in r.json()["notifications"]}
    assert wait_status(ids["in_app"], timeout=30).status == "sent"
    assert wait_status(ids["push"], statuses={"sent", "delivered"}, timeout=30)

    item = InboxItem.objects.get(pk=ids["in_app"])
    assert (item.recipient_id, item.type_key, item.category) == (uid, key, "social")
    assert (item.title, item.body, item.data) == ("Ada liked your post", "Ada and others liked “Hello”",
                                                  {"post_id": "p-1"})
    assert InboxItem.objects.filter(recipient_id=uid).count() == 1
    counts = InboxCounts.objects.get(recipient_id=uid)
    assert (counts.unseen, counts.unread, counts.total) == (1, 1, 1)

    def pushes():
        got = [m for m in emulator.messages(channel="push") if m["to"] in user["tokens"]]
        return got if len(got) >= 4 else None

    got = wait_until(pushes, 20, interval=0.2, message="2 pushes and 2 refreshes")
    assert len(got) == 4
    shown = [m for m in got if "notification" in m["details"]["message"]]
    silent = [m for m in got if "notification" not in m["details"]["message"]]
    assert Counter(m["to"] for m in shown) == Counter(user["tokens"])
    assert all(m["notification_id"] == ids["push"] for m in shown)
    assert Counter(m["to"] for m in silent) == Counter(user["tokens"])
    for m in silent:
        data = m["details"]["message"]["data"]
        assert (data["type"], data["unseen"], data["notification_id"]) == ("inbox_refresh", "1", ids["in_app"])
        assert m["details"]["message"]["apns"]["payload"]["aps"]["content-available"] == 1

    # The app's backend: badge, list, then the user opens the inbox (seen) and the item (read).
    def badge():
        return api.request("GET", f"/v1/users/{uid}/inbox/counts").json()

    assert badge() == {"unseen": 1, "unread": 1, "total": 1}
    listed = api.request("GET", f"/v1/users/{uid}/inbox?status=unseen").json()
    assert [i["id"] for i in listed["items"]] == [ids["in_app"]] and listed["next_cursor"] is None
    r = api.request("POST", f"/v1/users/{uid}/inbox/mark", json={"ids": [ids["in_app"]], "status": "seen"})
    assert r.json() == {"changed": 1, "more": False}
    assert badge() == {"unseen": 0, "unread": 1, "total": 1}
    r = api.request("POST", f"/v1/users/{uid}/inbox/mark", json={"ids": [ids["in_app"]], "status": "read"})
    assert r.json() == {"changed": 1, "more": False}
    assert badge() == {"unseen": 0, "unread": 0, "total": 1}
    assert api.request("GET", f"/v1/users/{uid}/inbox?status=unread").json()["items"] == []
    # The marks are the item's app receipts: its notification's timeline and status say so.
    body = api.request("GET", f"/v1/notifications/{ids['in_app']}").json()
    assert body["status"] == "opened"
    kinds = [e["kind"] for e in body["timeline"]]
    assert kinds.index("app_displayed") < kinds.index("app_opened")


def test_a_campaign_on_in_app_fills_every_eligible_inbox_exactly_once_and_completes(api, emulator):
    segment_id, users, opted = make_segment(api, 5000, channel="in_app", opted_out_every=10)
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "in_app", "category": "news",
                                "content": {"title": "News for {{ first_name }}", "body": "Hi {{ first_name }}"}})
    body = wait_campaign(api, cid, "completed", timeout=420)
    counts = body["counts"]
    assert counts["total"] == 5000 == body["member_count"]
    assert counts["by_status"]["sent"] == 4500 and counts["by_status"]["suppressed"] == len(opted) == 500
    assert counts["suppressed_by_reason"] == {"opted_out_channel": 500}
    items = Counter(InboxItem.objects.filter(recipient_id__in=users).values_list("recipient_id", flat=True))
    assert set(items) == set(users) - opted and set(items.values()) == {1}
    assert InboxItem.objects.filter(recipient_id=users[1]).get().title == "News for User1"
    assert set(InboxCounts.objects.filter(recipient_id__in=users).values_list("unseen", "unread", "total")) == {
        (1, 1, 1)}
    assert InboxCounts.objects.filter(recipient_id__in=users).count() == 4500
    assert Notification.objects.filter(campaign_id=cid, channel="in_app", status="sent").count() == 4500
