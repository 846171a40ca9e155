"""The history is keyed by when a row was archived, not when it was created (issue 25): a row
scheduled far ahead keeps its late receipts and its retention. Before, a row created more than
``HOT_HOURS`` + 72 h before it was sent lost its bounces once archived (the receipt lookup bounded
``created_at``), and one created more than 90 days before it was sent was archived into DEFAULT
(its creation day long dropped) and deleted as a stray by the next maintenance run."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.db import connection

from core import partitions
from notifications import scheduler
from notifications.migrations._history_sql import HISTORY
from notifications.models import DeliveryEvent, Notification, NotificationHistory, NotificationRecord
from preferences.models import Recipient
from tests.test_webhooks import _public_url, sg_event, sg_key, sg_post, twilio_post  # noqa: F401 - fixtures

#: The platform clock of ``frozen``: a reminder made days or months before is sent at NOW.
NOW = datetime(2031, 3, 10, 12, 0, tzinfo=UTC)


def sent_now(channel: str, created: datetime) -> Notification:
    """A row created at ``created``, scheduled for NOW and sent at NOW."""
    uid = f"hkey-{uuid.uuid4().hex[:8]}"
    r = Recipient.objects.create(user_id=uid, email=f"{uid}@example.com", phone="+4915112345678")
    return Notification.objects.create(
        id=uuid.uuid4(), recipient=r, channel=channel, body="reminder", status="sent", scheduled_at=NOW,
        sent_at=NOW, provider_message_id=f"SM{uuid.uuid4().hex}", created_at=created, updated_at=NOW)


def archive_after_hot_hours(frozen, *rows: Notification) -> datetime:
    """Move the clock past ``HOT_HOURS`` and run the archiver; returns the archive run's instant."""
    frozen[0] = NOW + timedelta(hours=float(settings.NOTIFY["HOT_HOURS"]), minutes=1)
    assert scheduler.archive() == len(rows)
    assert {h.pk: h.archived_at for h in NotificationHistory.objects.all()} == {n.pk: frozen[0] for n in rows}
    return frozen[0]


@pytest.mark.django_db
def test_a_bounce_of_a_row_scheduled_ten_days_ahead_is_applied_after_it_was_archived(frozen, sg_key):  # noqa: F811
    n = sent_now("email", NOW - timedelta(days=10))
    archived_at = archive_after_hot_hours(frozen, n)

    bounce = sg_event(n, "bounce", type="bounce", status="5.1.1", reason="550 5.1.1 unknown user")
    assert sg_post(sg_key, [bounce]).status_code == 204

    moved = NotificationHistory.objects.get(pk=n.pk)
    assert (moved.status, moved.reason, moved.archived_at) == ("failed", "provider_bounced", archived_at)
    assert Recipient.objects.get(pk=n.recipient_id).email_invalid_reason == "sendgrid bounce"
    assert list(DeliveryEvent.objects.filter(notification_id=n.pk).values_list("kind", "status")) == [
        ("receipt:bounce", "failed")]
    assert not Notification.objects.filter(pk=n.pk).exists()


@pytest.mark.django_db
def test_a_dead_number_of_a_row_scheduled_ten_days_ahead_is_applied_after_it_was_archived(frozen):
    n = sent_now("sms", NOW - timedelta(days=10))
    archive_after_hot_hours(frozen, n)

    assert twilio_post(n, "undelivered", code="30005").status_code == 204

    moved = NotificationHistory.objects.get(pk=n.pk)
    assert (moved.status, moved.reason) == ("failed", "provider_undelivered")
    assert "30005" in moved.reason_detail
    assert Recipient.objects.get(pk=n.recipient_id).phone_invalid_reason == "unknown_handset"
    assert list(DeliveryEvent.objects.filter(notification_id=n.pk).values_list("kind", "status")) == [
        ("receipt:undelivered", "failed")]


def partition_of(pk) -> str:
    with connection.cursor() as cur:
        cur.execute(f"SELECT tableoid::regclass::text FROM {HISTORY} WHERE id = %s", [pk])
        row = cur.fetchone()
    return row[0] if row else ""


@pytest.mark.django_db
@pytest.mark.parametrize("age_days", [100, 120])
def test_a_row_created_months_before_it_was_sent_is_kept_for_the_retention_after_it_was_archived(frozen, age_days):
    keep = settings.NOTIFY["RETENTION_DAYS"][HISTORY]
    assert keep == 90
    partitions.maintain()
    n = sent_now("sms", NOW - timedelta(days=age_days))
    archived_at = archive_after_hot_hours(frozen, n)
    day = partitions.partition_name(HISTORY, archived_at.date())

    partitions.maintain()
    assert partition_of(n.pk) == day
    record = NotificationRecord.objects.get(pk=n.pk)
    assert (record.live, record.archived_at, record.created_at) == (False, archived_at, n.created_at)

    frozen[0] = archived_at + timedelta(days=89)
    partitions.maintain()
    assert partition_of(n.pk) == day

    frozen[0] = archived_at + timedelta(days=91)
    run = partitions.maintain()
    assert day in {t.table: t for t in run.tables}[HISTORY].dropped
    assert partition_of(n.pk) == ""
    assert not NotificationRecord.objects.filter(pk=n.pk).exists()
