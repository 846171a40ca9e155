"""Helpers for end-to-end tests: create users over the API, wait on rows, read the emulator."""

from __future__ import annotations

import random

from notifications.models import Notification
from tests.stack import wait_until

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
