"""Dead letters in the admin: visible with their history, replayable, recorded."""

import uuid

import pytest
from django.contrib.admin.models import LogEntry

from notifications.models import DeliveryAttempt, DeliveryEvent, Notification
from preferences.models import Recipient

pytestmark = pytest.mark.django_db


@pytest.fixture
def dead():
    r = Recipient.objects.create(user_id="dl-user", phone="+4915112345678")
    from django.utils import timezone

    n = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status="failed",
                                    reason="attempts_exhausted", reason_detail="twilio 503: down", attempts=8,
                                    dead_lettered_at=timezone.now())
    DeliveryAttempt.objects.create(notification=n, number=8, provider="twilio", outcome="transient",
                                   error_code="503", error_message="Service Unavailable")
    return n


def test_dead_letter_list_shows_depth_and_error(admin_client, dead):
    Notification.objects.create(id=uuid.uuid4(), recipient=dead.recipient, channel="sms", body="b",
                                status="failed", reason="contact_invalid")  # not a dead letter
    page = admin_client.get("/admin/notifications/deadletter/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "Dead letters: 1" in html
    assert str(dead.pk) in html
    assert "twilio 503: down" in html
    assert "Dead letters:" in admin_client.get("/admin/").content.decode()
    detail = admin_client.get(f"/admin/notifications/deadletter/{dead.pk}/change/").content.decode()
    assert "Service Unavailable" in detail


def test_replay_requeues_resets_budget_and_records_who(admin_client, admin_user, dead,
                                                      django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        r = admin_client.post("/admin/notifications/deadletter/", {"action": "replay",
                                                                   "_selected_action": [str(dead.pk)]})
    assert r.status_code == 302
    dead.refresh_from_db()
    assert (dead.status, dead.attempts, dead.dead_lettered_at, dead.reason) == ("queued", 0, None, "")
    event = DeliveryEvent.objects.get(notification=dead, kind="replayed")
    assert f"by {admin_user.username}" in event.detail
    assert LogEntry.objects.filter(object_id=str(dead.pk), change_message="Replayed dead letter").count() == 1
    assert len(callbacks) == 1  # the send task is published after commit
