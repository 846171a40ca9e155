"""Helpers for end-to-end tests: create users over the API, wait on rows, read the emulator."""

from __future__ import annotations

import random
import uuid

from bench.stack import wait_until
from notifications.models import Notification
from preferences.models import Device, Preferences, Recipient

TERMINAL = {"sent", "delivered", "failed", "suppressed", "expired", "cancelled"}
# Accepted by the provider; the emulator's delivery receipt may already have made it `delivered`.
SENT = ("sent", "delivered")


def phone() -> str:
    """A fresh valid German mobile number in E.164."""
    return f"+49151{random.randint(10_000_000, 99_999_999)}"


def make_user(api, uid: str, *, devices: int = 1, **extra) -> dict:
    """Create a recipient with a phone, an email and ``devices`` Android push tokens."""
    body = {"phone": phone(), "email": f"{uid}@example.com", "timezone": "Europe/Berlin", "locale": "en"}
    body.update(extra)
    user = api.put_user(uid, **body)
    user["tokens"] = []
    for i in range(devices):
        token = f"tok-{uid}-{i}"
        r = api.request("PUT", f"/v1/users/{uid}/devices", json={"platform": "android", "push_token": token})
        assert r.status_code == 201, r.text
        user["tokens"].append(token)
    return user


def content_for(channel: str, text: str = "hello") -> dict:
    if channel == "sms":
        return {"body": text}
    return {"title": f"title {text}", "body": text}


def send(api, uid: str, channel: str, *, key: str | None = None, **fields) -> str:
    body = {"user_id": uid, "channel": channel, "content": content_for(channel)}
    body.update(fields)
    r = api.send(body, key=key)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def wait_status(nid: str, statuses=TERMINAL, timeout: float = 20.0) -> Notification:
    statuses = {statuses} if isinstance(statuses, str) else set(statuses)

    def check():
        n = Notification.objects.filter(pk=nid).first()
        return n if n is not None and n.status in statuses else None

    return wait_until(check, timeout, interval=0.1, message=f"notification {nid} in {sorted(statuses)}")


def events(nid: str) -> list[str]:
    """The notification's own state changes, in order (provider receipts, which arrive
    asynchronously, left out)."""
    kinds = Notification.objects.get(pk=nid).events.order_by("created_at", "id").values_list("kind", flat=True)
    return [k for k in kinds if not k.startswith("receipt:")]


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
    from campaigns.models import Segment, SegmentMember

    segment = Segment.objects.get(pk=segment_id)
    SegmentMember.objects.bulk_create([SegmentMember(segment=segment, recipient_id=u) for u in users],
                                      batch_size=5000)
    return segment_id, users, opted
