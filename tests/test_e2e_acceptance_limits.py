"""End to end, the abuse limit at acceptance (docs/POLICIES.md, "Abuse limits") with the real stack
(gunicorn, Celery workers and beat, Redis, Postgres, the emulator): five one-time codes for a user
reach the emulator, the sixth within ten minutes is 429 ``otp_per_user`` (as an event or a typed send)
and nothing more reaches the emulator or the database."""

from __future__ import annotations

import time
import uuid

import pytest

from notifications.events.models import NotificationType, TypeTemplate
from notifications.models import Notification
from tests.e2e import SENT, make_user, wait_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def ensure_otp_type() -> None:
    """The ``otp`` type the default limits count, made in the admin (any client may send it)."""
    kind, _ = NotificationType.objects.update_or_create(key="otp", defaults={
        "name": "One-time code", "category": "security", "priority": "high", "quiet_hours": "bypass",
        "channels": ["sms"], "client": None})
    TypeTemplate.objects.update_or_create(type=kind, channel="sms", locale="en",
                                          defaults={"body": "Your code is {{ data.code }}"})


def test_five_otps_reach_the_emulator_and_the_sixth_is_refused(api, emulator, uid):
    ensure_otp_type()
    user = make_user(api, uid, devices=0)
    ids = []
    for i in range(5):
        r = api.request("POST", "/v1/events", json={"type": "otp", "user_id": uid, "data": {"code": f"{i:06d}"}},
                        key=uuid.uuid4().hex)
        assert r.status_code == 202, r.text
        ids.append(r.json()["notifications"][0]["id"])
    for nid in ids:
        assert wait_status(nid, SENT).status in SENT

    sixth = api.request("POST", "/v1/events", json={"type": "otp", "user_id": uid, "data": {"code": "999999"}},
                        key=uuid.uuid4().hex)
    typed = api.send({"type": "otp", "user_id": uid, "channel": "sms", "data": {"code": "999999"}})
    for refused in (sixth, typed):
        error = refused.json()["error"]
        assert (refused.status_code, error["code"], error["limit"]) == (429, "acceptance_limited", "otp_per_user")
        assert 500 < int(refused.headers["Retry-After"]) <= 600
    time.sleep(1.0)  # what a worker would have sent meanwhile, had anything been accepted
    got = emulator.messages(channel="sms", to=user["phone"])
    assert sorted(m["notification_id"] for m in got) == sorted(ids)
    assert "999999" not in " ".join(m["body"] for m in got)
    assert Notification.objects.filter(recipient_id=uid).count() == 5
