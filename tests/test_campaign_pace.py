"""A campaign's pace on its page (docs/CAMPAIGNS.md, "Pace"; issue 27 part 1): beat's sampler keeps one
row per minute; the page charts sent / delivered / failed / suppressed per minute, the recent rate,
the ETA with the provider budget named, and due → sent latency; while the campaign sends, its
progress reads the newest sample (no count of the campaign's rows per refresh). In-process, real
Postgres, the platform clock moved between samples."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from campaigns import admin_views, pace, services
from campaigns.models import Campaign, CampaignMinute, CampaignStatus
from notifications.models import Notification
from preferences.models import Recipient

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

NOW = datetime(2030, 1, 10, 11, 30, 5, tzinfo=UTC)


def sending_campaign(n: int) -> tuple[Campaign, list[Notification]]:
    segment, _ = services.upsert_segment("pace", name="Pace")
    users = [Recipient.objects.create(user_id=f"p{k:03d}", email=f"p{k:03d}@example.com") for k in range(n)]
    c = Campaign.objects.create(segment=segment, channel="email", title="T", body="b", status=CampaignStatus.SENDING,
                                member_count=n, started_at=NOW, snapshot_at=NOW)
    rows = Notification.objects.bulk_create([
        Notification(id=uuid.uuid4(), campaign_id=c.pk, recipient=u, channel="email", status="queued",
                     created_at=NOW, queued_at=NOW, updated_at=NOW) for u in users])
    return c, rows


def move(rows, status: str, at: datetime, reason: str = "", queued_at: datetime | None = None) -> None:
    extra = {"sent_at": at} if status in ("sent", "delivered") else {}
    if queued_at is not None:
        extra["queued_at"] = queued_at
    Notification.objects.filter(pk__in=[r.pk for r in rows]).update(status=status, reason=reason, updated_at=at,
                                                                    **extra)


def test_samples_per_minute_chart_the_changes_rate_eta_budget_and_latency(frozen, settings):
    settings.PROVIDERS = {**settings.PROVIDERS, "email": [{"NAME": "sendgrid", "BACKEND": "x"}]}
    settings.PROVIDER_LIMITS = {**settings.PROVIDER_LIMITS, "sendgrid": {"RATE_PER_S": 200.0,
                                                                       "HIGH_RESERVED_FRACTION": 0.25}}
    c, rows = sending_campaign(100)
    assert pace.sample_due() == 1  # 11:30:05: all queued
    frozen[0] = NOW + timedelta(minutes=1)  # 11:31:05: 30 sent (due 2 s and 4 s before), 5 suppressed
    move(rows[:20], "sent", frozen[0], queued_at=frozen[0] - timedelta(seconds=2))
    move(rows[20:30], "sent", frozen[0], queued_at=frozen[0] - timedelta(seconds=4))
    move(rows[30:35], "suppressed", frozen[0], reason="opted_out_channel")
    assert pace.sample_due() == 1
    frozen[0] = NOW + timedelta(minutes=3)  # 11:33:05 (no sample at 11:32): 20 delivered, 25 more sent, 5 failed
    move(rows[:20], "delivered", frozen[0] - timedelta(minutes=2))
    move(rows[35:60], "sent", frozen[0], queued_at=frozen[0] - timedelta(seconds=1))
    move(rows[60:65], "failed", frozen[0], reason="provider_rejected")
    assert pace.sample_due() == 1
    frozen[0] = NOW + timedelta(minutes=4)  # 11:34:05: nothing moved; 11:34 is the minute in progress
    assert pace.sample_due() == 1

    p = pace.pace(Campaign.objects.get(pk=c.pk), frozen[0])

    assert p["chart"] == {"labels": ["11:30", "11:31", "11:32", "11:33"],
                          "sent": [0, 30, None, 25], "delivered": [0, 0, None, 20], "failed": [0, 0, None, 5],
                          "suppressed": [0, 5, None, 0], "due_to_sent_p95_ms": [None, 4000, None, 1000]}
    # 65 finished in the 4 minutes (240 s) of samples: 0.27/s; 35 due left: 129 s.
    assert (p["rate_per_s"], p["due_left"], p["scheduled"], p["eta_seconds"]) == (0.3, 35, 0, 129)
    assert p["budget"] == {"provider": "sendgrid", "tier": "standard", "per_second": 150.0}
    assert p["due_to_sent_ms"] == {"p50": 1000, "p95": 1000, "minute": "11:33"}
    # Launched 4 min ago: the rate is since launch, said so (hadv34 #13: not "over the last 5 min").
    assert p["rate_text"] == "0.3/s since launch; bound: sendgrid's standard budget, 150/s"
    assert p["eta_text"] == "about 2 min 09 s for 35 due (at 11:36:14 UTC)"
    minute = CampaignMinute.objects.get(campaign=c, minute=NOW.replace(second=0) + timedelta(minutes=1))
    assert (minute.sent_rows, minute.due_to_sent_p50_ms, minute.due_to_sent_p95_ms) == (30, 2000, 4000)

    frozen[0] = NOW + timedelta(minutes=6)  # 11:36:05: 5 min after the 11:31:05 sample, 30 finished since
    pace.sample_due()
    later = pace.pace(Campaign.objects.get(pk=c.pk), frozen[0])
    assert later["rate_text"] == "0.1/s over the last 5 min; bound: sendgrid's standard budget, 150/s"


def test_while_sending_the_page_reads_the_newest_sample_not_the_campaigns_rows(frozen, admin_client):
    c, rows = sending_campaign(20)
    pace.sample_due()
    move(rows[:5], "sent", frozen[0])  # after the sample: the page shows the sample's counts

    with CaptureQueriesContext(connection) as queries:
        shown = admin_views.progress(Campaign.objects.get(pk=c.pk))

    assert (shown["sent"], shown["pending"], shown["counted_at"]) == (0, 20, "2030-01-10 11:30:05 UTC")
    assert not [q["sql"] for q in queries.captured_queries if "notificationrecord" in q["sql"]]
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[c.pk])).content.decode()
    assert 'id="campaign-pace-chart"' in page and 'id="campaign-pace-data"' in page
    assert "vendor/chartjs/chart.umd.min" in page

    frozen[0] = NOW + timedelta(seconds=3 * pace.sample_seconds() + 1)  # the sampler stopped: counted live
    stale = admin_views.progress(Campaign.objects.get(pk=c.pk))
    assert (stale["sent"], stale["counted_at"]) == (5, "2030-01-10 11:30:51 UTC")


def test_a_finished_campaign_is_sampled_once_more_then_never(frozen):
    """Its last minute is counted after it finished; a day after, it is not looked at again."""
    c, rows = sending_campaign(3)
    pace.sample_due()
    frozen[0] = NOW + timedelta(minutes=2)
    move(rows, "sent", frozen[0])
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.COMPLETED, completed_at=frozen[0])
    frozen[0] = NOW + timedelta(minutes=2, seconds=15)

    assert pace.sample_due() == 1
    assert pace.sample_due() == 0
    last = CampaignMinute.objects.filter(campaign=c).order_by("-minute").first()
    assert last.counts["outcome"]["sent"] == 3
    assert pace.pace(Campaign.objects.get(pk=c.pk), frozen[0])["eta_text"] == (
        "Completed at 11:32:05 UTC: nothing left to send")


def test_a_cancel_is_sampled_until_its_rows_settle_and_the_page_says_it_ended(frozen):
    """hadv27: a sample taken while the cancel was still cancelling rows counted as the last one, and
    the page said "9,052 due" for ever after."""
    c, rows = sending_campaign(10)
    pace.sample_due()
    frozen[0] = NOW + timedelta(seconds=20)
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.CANCELLED, cancelled_at=frozen[0])
    move(rows[:4], "cancelled", frozen[0], reason="campaign_cancelled")  # the first chunk only
    frozen[0] = NOW + timedelta(seconds=35)
    assert pace.sample_due() == 1  # 6 still queued: sampled again at the next tick
    move(rows[4:], "cancelled", frozen[0], reason="campaign_cancelled")
    frozen[0] = NOW + timedelta(seconds=50)
    assert pace.sample_due() == 1
    frozen[0] = NOW + timedelta(seconds=65)
    assert pace.sample_due() == 0  # settled
    p = pace.pace(Campaign.objects.get(pk=c.pk), frozen[0])
    assert p["eta_text"] == "Cancelled at 11:30:25 UTC: nothing left to send"
    assert CampaignMinute.objects.filter(campaign=c).order_by("-minute").first().counts["outcome"]["cancelled"] == 10


def test_the_first_minute_has_a_rate_since_launch_and_an_open_breaker_is_named(frozen, settings, monkeypatch):
    settings.PROVIDERS = {**settings.PROVIDERS, "email": [{"NAME": "sendgrid", "BACKEND": "x"}]}
    c, rows = sending_campaign(100)
    Campaign.objects.filter(pk=c.pk).update(started_at=NOW - timedelta(seconds=20))
    move(rows[:40], "sent", frozen[0])
    pace.sample_due()
    monkeypatch.setattr(pace, "breaker_state", lambda provider: {"state": "open"})

    p = pace.pace(Campaign.objects.get(pk=c.pk), frozen[0] + timedelta(seconds=10))

    assert (p["rate_per_s"], p["eta_seconds"], p["eta_at"][11:19]) == (2.0, 30, "11:30:35")  # from the sample
    assert p["rate_text"].startswith("2.0/s since launch; bound: sendgrid's standard budget")
    assert p["rate_text"].endswith("sendgrid's circuit breaker is open: its calls fail fast and are tried again "
                                   "later (provider health)")


def test_beat_samples_on_the_maintenance_queue(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["sample-campaign-pace"]
    assert (entry["task"], entry["options"]["queue"], entry["schedule"]) == (
        "campaigns.sample_pace", "maintenance", 15.0)
    from celery import current_app

    import campaigns.tasks  # noqa: F401  (what the worker imports)

    assert "campaigns.sample_pace" in current_app.tasks
