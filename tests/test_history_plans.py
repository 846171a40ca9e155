"""The reads across live and history stay index scans on an aged database (issue 25): ten day
partitions of the history and the live table, a few thousand rows, ANALYZEd; the plans of a
recipient's page, a lookup by id, a campaign's counts and an event's notifications name no sequential
scan of any notification table (docs/ARCHITECTURE.md, "Reading across live and history").
Sequential scans are disabled while planning, as in tests/test_support_query_plans.py: the plan
still shows one when no index serves the query."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import Count

from campaigns.selectors import campaign_counts
from notifications import records
from notifications.admin.timeline import window_rows
from notifications.api.event_reads import _rows
from notifications.lifecycle.archive import into_history
from notifications.migrations._history_sql import HISTORY, LIVE
from notifications.models import APIClient, Notification, NotificationRecord
from notifications.readers import readable_notifications
from preferences.models import Recipient

pytestmark = pytest.mark.django_db

DAYS = 10
TODAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def aged():
    """300 recipients × 13 notifications: one a day back over DAYS days and two today, and one
    stamped 2031 (a test clock's: the DEFAULT partition); all but today's archived, each the day
    it was made; one campaign
    spread over live and history."""
    client, _ = APIClient.objects.create_key(name="plans")
    campaign, event_id = uuid.uuid4(), uuid.uuid4()
    with connection.cursor() as cur:
        for back in range(1, DAYS + 1):
            day = TODAY - timedelta(days=back)
            cur.execute(f"CREATE TABLE {HISTORY}_p{day:%Y%m%d} PARTITION OF {HISTORY} "
                        f"FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')")
    recipients = Recipient.objects.bulk_create([Recipient(user_id=f"aged-{i:04d}") for i in range(300)])
    rows = [Notification(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status="delivered", client=client,
                         campaign_id=campaign if i % 50 == 0 else None,
                         created_at=TODAY + timedelta(hours=12) - timedelta(days=back, minutes=i), updated_at=TODAY)
            for i, r in enumerate(recipients) for back in [*range(1, DAYS + 1), 0, 0]]
    strays = [Notification(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status="delivered", client=client,
                           created_at=datetime(2031, 1, 1, tzinfo=UTC), updated_at=TODAY) for r in recipients]
    Notification.objects.bulk_create(rows + strays, batch_size=2000)
    with connection.cursor() as cur:
        # Archived 6 h after creation: the same day (created at 12:00 or a few hours before).
        cur.execute(f"""WITH moved AS (DELETE FROM {LIVE} WHERE created_at < %s OR created_at > %s RETURNING *)
                        {into_history("moved", "created_at + interval '6 hours'")}""",
                    [TODAY, TODAY + timedelta(days=1)])
        cur.execute(f"ANALYZE {LIVE}")
        cur.execute(f"ANALYZE {HISTORY}")
        cur.execute("ANALYZE preferences_recipient")
        cur.execute("SET LOCAL enable_seqscan = off")
    return {"client": client, "recipient": recipients[123], "campaign": campaign, "event": event_id,
            "id": rows[123 * 12 + 4].pk}


def notification_scans(plan: str) -> list[str]:
    """The plan's lines that scan a notification table (live or a history partition)."""
    return [line.strip() for line in plan.splitlines()
            if " on notifications_notification" in line and "Scan" in line]


def test_the_aged_database_has_its_rows_in_day_partitions_and_live(aged):
    assert NotificationRecord.objects.filter(live=True).count() == 600
    assert NotificationRecord.objects.filter(live=False).count() == 3300
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM pg_inherits WHERE inhparent = '{HISTORY}'::regclass")
        assert cur.fetchone()[0] == DAYS + 1  # and DEFAULT
    assert records.estimated_count() == 3900  # the admin's unfiltered list: live + each partition, ANALYZEd


def test_a_recipients_page_merges_an_index_scan_of_every_partition(aged):
    qs = (readable_notifications(aged["client"]).filter(recipient=aged["recipient"])
          .order_by("-created_at", "-id")[:51])
    plan = qs.explain()
    scans = notification_scans(plan)
    assert "Merge Append" in plan, plan
    assert not [s for s in scans if "Seq Scan" in s], plan
    assert len(scans) == DAYS + 2, plan  # live, ten days, DEFAULT: an index scan each
    assert all("recipient" in s for s in scans), plan
    assert len(qs) == 13


def test_a_lookup_by_id_probes_each_primary_key(aged):
    qs = readable_notifications(aged["client"]).filter(pk=aged["id"])
    plan = qs.explain()
    scans = notification_scans(plan)
    assert not [s for s in scans if "Seq Scan" in s], plan
    assert all("pkey" in s for s in scans), plan
    assert [r.live for r in qs] == [False]


def test_campaign_counts_read_the_campaign_index_of_each_partition(aged):
    qs = (NotificationRecord.objects.filter(campaign_id=aged["campaign"]).values("status", "reason")
          .annotate(n=Count("id")).order_by())
    plan = qs.explain()
    assert not [s for s in notification_scans(plan) if "Seq Scan" in s], plan
    assert "campaign" in plan, plan
    assert campaign_counts(type("C", (), {"pk": aged["campaign"], "started_at": None})())["total"] == 6 * 12


def test_an_events_notifications_read_the_event_index_of_each_partition(aged):
    from notifications.events.models import Event

    plan = _rows(Event(pk=aged["event"], user_ids=[]), {}).explain()
    assert not [s for s in notification_scans(plan) if "Seq Scan" in s], plan
    assert "event" in plan, plan


@pytest.mark.parametrize("query", [
    lambda: NotificationRecord.objects.order_by("-created_at", "-id")[:100],
    lambda: NotificationRecord.objects.filter(status="delivered").order_by("-created_at", "-id")[:100],
], ids=["admin list, newest first", "admin list by status"])
def test_the_admin_lists_merge_an_index_scan_of_every_partition(aged, query):
    plan = query().explain()
    scans = notification_scans(plan)
    assert "Merge Append" in plan, plan
    assert not [s for s in scans if "Seq Scan" in s], plan
    assert len(scans) == DAYS + 2, plan


def test_a_recipients_timeline_reads_the_partitions_archived_in_its_window_by_the_recipient_index(aged):
    """The admin's last-30-days of a recipient (notifications/admin/timeline.py) seen from 25 days
    ahead: its window starts five days ago, so the five partitions archived before are pruned; the
    rest (live, five days, DEFAULT) are read by the recipient index."""
    qs = window_rows(aged["recipient"].pk, TODAY - timedelta(days=5))[:2001]
    plan = qs.explain()
    scans = notification_scans(plan)
    assert not [s for s in scans if "Seq Scan" in s], plan
    assert len(scans) == 5 + 2, plan
    assert all("recipient" in s for s in scans), plan
    assert len(qs) == 2 + 5 + 1  # today's two, one a day for five days (created 12:00 minus minutes), 2031's
