"""After the history's retention dropped an event's or a campaign's notifications (issue 25): the
event and the campaign are kept, their reads say the history may be gone (``history_expired``) and a
user with no notification left reads ``unknown``, never ``not_reached``. Clock moved past the
retention, the partition manager run, as beat would (docs/ARCHITECTURE.md §13)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings
from django.db import connection
from django.urls import reverse

from campaigns.api.serializers import run_items
from campaigns.models import Campaign
from core import partitions
from notifications import records
from notifications.admin.outcomes import EXPIRED
from notifications.models import Notification, NotificationRecord
from tests.history import archive
from tests.test_api_lists import api_client, http  # noqa: F401 - fixtures
from tests.test_event_reads import USERS, event  # noqa: F401 - fixture
from tests.test_history_reads import campaign  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db

NOW = datetime(2031, 3, 10, 12, 0, tzinfo=UTC)
#: When the archiver moved the rows: HOT_HOURS after they finished.
ARCHIVED = NOW + timedelta(hours=7)


def drop_history(frozen, days: int) -> None:
    """Move the clock ``days`` on and run the partition manager, as beat does (its own transaction)."""
    frozen[0] = NOW + timedelta(days=days)
    with connection.cursor() as cur:
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
    partitions.maintain()


def archive_all(**where) -> int:
    return archive(*Notification.objects.filter(**where).values_list("pk", flat=True), at=ARCHIVED)


def test_the_rule_turns_at_retention_plus_hot_hours_after_creation():
    keep = timedelta(days=settings.NOTIFY["RETENTION_DAYS"]["notifications_notificationhistory"],
                     hours=settings.NOTIFY["HOT_HOURS"])
    assert keep == timedelta(days=90, hours=6)
    assert records.history_expired(NOW, now=NOW + keep) is False
    assert records.history_expired(NOW, now=NOW + keep + timedelta(seconds=1)) is True
    assert records.history_expired(None, now=NOW + keep * 10) is False


def test_an_event_past_retention_reads_unknown_not_not_reached(frozen, event):  # noqa: F811
    client, eid = event
    partitions.maintain()
    assert archive_all(event_id=eid) == USERS * 3

    drop_history(frozen, 80)  # within the retention: the history still answers
    kept = client.get(f"/v1/events/{eid}").json()
    assert (kept["history_expired"], kept["summary"]["outcomes"]) == (
        False, {"reached": 1, "pending": USERS - 2, "not_reached": 1, "unknown": 0})

    drop_history(frozen, 100)
    assert NotificationRecord.objects.filter(event_id=eid).count() == 0

    body = client.get(f"/v1/events/{eid}")
    assert body.status_code == 200
    body = body.json()
    assert body["history_expired"] is True
    assert body["summary"]["outcomes"] == {"reached": 0, "pending": 0, "not_reached": 0, "unknown": USERS}
    assert body["summary"]["channels"] == {}
    assert body["recipients"][0] == {"user_id": "u00", "digest": None, "outcome": "unknown", "notifications": []}
    listing = client.get(f"/v1/events/{eid}/recipients?limit=100").json()
    assert [(r["user_id"], r["outcome"], r["notifications"]) for r in listing["items"]] == [
        (f"u{i:02d}", "unknown", []) for i in range(USERS)]


def test_a_user_whose_sent_notification_is_left_still_reads_reached(frozen, event):  # noqa: F811
    """Only what is gone is unknown: u00's push, archived on day 50, is kept past day 100."""
    client, eid = event
    partitions.maintain()
    push = Notification.objects.get(event_id=eid, recipient_id="u00", channel="push").pk
    assert archive(*Notification.objects.filter(event_id=eid).exclude(pk=push).values_list("pk", flat=True),
                   at=ARCHIVED) == USERS * 3 - 1
    frozen[0] = NOW + timedelta(days=50)
    partitions.maintain()
    assert archive(push, at=frozen[0]) == 1
    drop_history(frozen, 100)

    body = client.get(f"/v1/events/{eid}").json()
    assert body["summary"]["outcomes"] == {"reached": 1, "pending": 0, "not_reached": 0, "unknown": USERS - 1}
    first = body["recipients"][0]
    assert (first["outcome"], [n["channel"] for n in first["notifications"]]) == ("reached", ["push"])


def test_the_event_admin_page_says_the_history_expired(frozen, admin_client, event):  # noqa: F811
    _client, eid = event
    partitions.maintain()
    archive_all(event_id=eid)
    drop_history(frozen, 100)

    html = admin_client.get(reverse("admin:notifications_event_change", args=[eid])).content.decode()

    assert 'id="history-expired"' in html
    cells = re.findall(r'<tr class="event-user"><td><a href="[^"]*">(u\d+)</a></td><td>(.*?)</td></tr>', html)
    assert sorted(cells) == [(f"u{i:02d}", EXPIRED) for i in range(USERS)]


def test_a_completed_campaign_past_retention_says_its_history_expired(frozen, campaign, http,  # noqa: F811
                                                                      admin_client):
    c, _rows = campaign
    Campaign.objects.filter(pk=c.pk).update(started_at=NOW)
    partitions.maintain()
    assert archive_all(campaign_id=c.pk) == 20
    drop_history(frozen, 80)
    counts = http.get(f"/v1/campaigns/{c.pk}").json()["counts"]
    assert (counts["total"], counts["history_expired"]) == (20, False)

    drop_history(frozen, 100)

    counts = http.get(f"/v1/campaigns/{c.pk}").json()["counts"]
    assert (counts["total"], counts["history_expired"]) == (0, True)
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[c.pk])).content.decode()
    assert 'id="history-expired"' in page
    progress = admin_client.get(reverse("admin:campaigns_campaign_progress", args=[c.pk])).json()
    assert progress["history_expired"] is True
    listing = admin_client.get(reverse("admin:campaigns_campaign_changelist")).content.decode()
    assert "sent 0 (delivered 0)" in listing and "history expired: counts of the notifications left" in listing
    assert [(r["outcome"]["sent"], r["history_expired"]) for r in run_items([Campaign.objects.get(pk=c.pk)])] == [
        (0, True)]
