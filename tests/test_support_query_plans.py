"""The support admin's queries are answered from indexes, so they stay fast on a table of 10 million
notifications (measured figures: docs/OPERATIONS.md). Plans are read with ``EXPLAIN`` with sequential
scans disabled, which proves an index exists that serves each query's filter *and* order. The lists
read live and archived rows (the view ``NotificationRecord``): "Seq Scan on notifications_notification"
also matches a history partition's name."""

import uuid

import pytest
from django.db import connection

from notifications.models import Notification, NotificationRecord
from preferences.models import Recipient

pytestmark = pytest.mark.django_db


@pytest.fixture
def table():
    # 300 recipients × 20 notifications, so the statistics look like a real table's.
    recipients = Recipient.objects.bulk_create([
        Recipient(user_id=f"plan-{i:04d}", phone=f"+49151{i:08d}", email=f"p{i}@example.com") for i in range(300)])
    Notification.objects.bulk_create([Notification(id=uuid.uuid4(), recipient=r, channel="sms", body="b",
                                                   status="sent") for r in recipients for _ in range(20)])
    r = recipients[123]
    with connection.cursor() as cur:
        cur.execute("ANALYZE notifications_notification")
        cur.execute("ANALYZE notifications_notificationhistory")
        cur.execute("ANALYZE preferences_recipient")
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("SET LOCAL enable_sort = off")
    return r


@pytest.mark.parametrize(("name", "queryset", "index"), [
    ("newest first", lambda r: NotificationRecord.objects.order_by("-created_at")[:100], "notification_created_idx"),
    ("by status, newest first",
     lambda r: NotificationRecord.objects.filter(status="failed").order_by("-created_at")[:100],
     "notification_status_time_idx"),
    ("a recipient's history",
     lambda r: NotificationRecord.objects.filter(recipient_id=r.pk).order_by("-created_at")[:50],
     "notification_recipient_idx"),
    ("search by phone",
     lambda r: NotificationRecord.objects.filter(recipient__phone=r.phone).order_by("-created_at")[:50],
     "preferences_recipient_phone"),
    ("dead letters", lambda r: Notification.objects.filter(status="failed", dead_lettered_at__isnull=False)
     .order_by("-dead_lettered_at")[:100], "notification_dead_letter_idx"),
])
def test_support_queries_use_an_index(table, name, queryset, index):
    plan = queryset(table).explain()
    assert index in plan, f"{name}: {plan}"
    assert "Seq Scan on notifications_notification" not in plan, f"{name}: {plan}"
