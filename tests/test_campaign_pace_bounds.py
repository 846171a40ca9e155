"""What a campaign's pace may cost and claim (docs/CAMPAIGNS.md, "Pace"; hnew33 M2 and L4): a sample
older than three intervals is not presented as current; the chart is at most a day of points, with
dates when it spans days, and never draws the minute still being sampled; a campaign with rows
scheduled for later says when the last one goes; beat's tick reads what changed since the last tick,
not the campaign's rows, and its tally stays equal to a full count whoever moves the rows (every
writer: tests/test_lifecycle_stateful.py); the campaign page never counts a tallied campaign's rows
(tests/test_campaign_counts_tally.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from campaigns import admin_views, pace, selectors
from campaigns.models import Campaign, CampaignMinute, CampaignStatus, CampaignTally, CampaignTallyChange
from campaigns.pace_chart import MINUTES_SHOWN
from campaigns.selectors import campaign_counts
from notifications.campaign_rows import CampaignRow, insert_campaign_page
from notifications.models import Notification, NotificationHistory
from preferences.models import Recipient, Unsubscribe
from tests.history import archive
from tests.test_campaign_pace import move, sending_campaign

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

NOW = datetime(2030, 1, 10, 11, 30, 5, tzinfo=UTC)
UNKNOWN = "unknown since 2030-01-10 11:31:05 UTC, the last sample (is beat running?)"
LATER = "scheduled for later (local time, spread, quiet hours or a retry's backoff) go when due"


def schedule(rows, due: datetime, at: datetime) -> None:
    Notification.objects.filter(pk__in=[r.pk for r in rows]).update(status="scheduled", due_at=due, updated_at=at)


def minutes(c: Campaign, *samples: tuple[datetime, int]) -> None:
    """Samples of ``c`` as beat would have written them: ``(instant, sent so far)``."""
    for at, sent in samples:
        CampaignMinute.objects.create(campaign=c, minute=at.replace(second=0), sampled_at=at,
                                      counts={"outcome": {"sent": sent}, "by_status": {"sent": sent}, "total": sent})


def test_a_stale_sample_leaves_the_rate_unknown_and_counts_what_is_due_live(frozen):
    """hnew33 M2: beat stopped; the page counted its progress itself but said "about 1 min for 60 due"
    from the last sample, an instant already past."""
    c, rows = sending_campaign(100)
    pace.sample_due()
    frozen[0] = NOW + timedelta(minutes=1)  # 11:31:05: 40 sent, a rate measured
    move(rows[:40], "sent", frozen[0])
    pace.sample_due()
    frozen[0] = NOW + timedelta(minutes=1, seconds=3 * pace.sample_seconds() + 1)  # beat stopped
    move(rows[40:70], "sent", frozen[0])
    schedule(rows[70:80], datetime(2030, 1, 10, 13, 0, tzinfo=UTC), frozen[0])

    shown = admin_views.progress(Campaign.objects.get(pk=c.pk))
    p = shown["pace"]

    assert p["rate_text"] == UNKNOWN
    assert p["eta_text"] == (f"20 due; the rate is {UNKNOWN}; 10 {LATER}, the last scheduled send at "
                             "2030-01-10 13:00:00 UTC")
    assert p["latency_text"] == "— (no sample since 2030-01-10 11:31:05 UTC)"
    assert (shown["sent"], shown["pending"], shown["counted_at"]) == (70, 30, "2030-01-10 11:31:51 UTC")
    assert (p["due_left"], p["scheduled"], p["rate_per_s"], p["eta_seconds"], p["eta_at"]) == (20, 10, None, None, None)
    assert p["stale_since"] == "2030-01-10T11:31:05+00:00"

    frozen[0] += timedelta(seconds=15)  # beat is back: the sentences are the sample's again
    pace.sample_due()
    back = pace.pace(Campaign.objects.get(pk=c.pk), frozen[0])
    assert (back["stale_since"], back["due_left"], back["scheduled"]) == (None, 20, 10)
    assert back["rate_text"].startswith("0.6/s since launch")  # 70 in 121 s


def test_a_sample_dated_in_the_future_is_ignored_after_the_clock_moves_back(frozen):
    """hadv34 #4: the platform clock stood 2 h ahead for a tick, then went back; the sample dated 13:30
    stayed "the newest" and the page showed its counts, frozen, until the clock reached it."""
    c, rows = sending_campaign(100)
    pace.sample_due()  # 11:30:05
    frozen[0] = NOW + timedelta(hours=2)  # 13:30:05: 10 sent
    move(rows[:10], "sent", frozen[0])
    assert pace.sample_due() == 1
    frozen[0] = NOW + timedelta(seconds=30)  # back to 11:30:35: 40 sent in all
    move(rows[10:40], "sent", frozen[0])

    assert pace.sample_due() == 1  # not blocked: the 11:30 row takes the sample
    shown = admin_views.progress(Campaign.objects.get(pk=c.pk))

    assert (shown["sent"], shown["pending"], shown["counted_at"]) == (40, 60, "2030-01-10 11:30:35 UTC")
    p = shown["pace"]
    assert (p["sampled_at"], p["stale_since"], p["due_left"]) == ("2030-01-10T11:30:35+00:00", None, 60)
    assert p["chart"]["labels"] == []  # 11:30 is the minute in progress; 13:30 is not drawn
    assert list(CampaignMinute.objects.filter(campaign=c).order_by("minute").values_list("minute", "sampled_at")) == [
        (NOW.replace(second=0), NOW + timedelta(seconds=30)),
        (NOW.replace(second=0) + timedelta(hours=2), NOW + timedelta(hours=2))]


def test_the_chart_is_at_most_a_day_of_points_and_a_gap_longer_than_that_is_one(frozen):
    """hnew33 L4: a gap was filled minute by minute (51,301 labels, 2 MB per 3-s poll), labels had
    no date."""
    c, _ = sending_campaign(1)
    day = datetime(2030, 1, 10, 23, 58, 5, tzinfo=UTC)
    minutes(c, (day, 10), (day + timedelta(minutes=1), 20), (day + timedelta(hours=32, minutes=2), 50),
            (day + timedelta(hours=32, minutes=3), 60))  # 01-12 08:00, then 08:01 (in progress)

    p = pace.pace(Campaign.objects.get(pk=c.pk), day + timedelta(hours=32, minutes=3, seconds=5))

    assert p["chart"]["labels"] == ["01-10 23:58", "01-10 23:59", "01-11 00:00 … 01-12 07:59", "01-12 08:00"]
    assert p["chart"]["sent"] == [10, 10, None, 30]
    assert p["chart"]["due_to_sent_p95_ms"] == [None, None, None, None]


def test_gaps_shorter_than_a_day_still_fill_at_most_a_day_of_points_the_newest_kept(frozen):
    c, _ = sending_campaign(1)
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.COMPLETED, completed_at=NOW)
    start = datetime(2030, 1, 10, 0, 0, 5, tzinfo=UTC)
    minutes(c, *[(start + timedelta(minutes=m), sent) for m, sent in ((0, 5), (1000, 10), (2000, 20), (2001, 30))])

    chart = pace.pace(Campaign.objects.get(pk=c.pk), start + timedelta(minutes=2002))["chart"]

    assert {len(v) for v in chart.values()} == {MINUTES_SHOWN}
    newest = start + timedelta(minutes=2001)
    assert (chart["labels"][0], chart["labels"][-1]) == (
        f"{newest - timedelta(minutes=MINUTES_SHOWN - 1):%m-%d %H:%M}", f"{newest:%m-%d %H:%M}")
    assert chart["sent"][-2:] == [10, 10] and chart["sent"][-1002] == 5  # minute 1000, against minute 0
    assert [v for v in chart["sent"] if v is not None] == [5, 10, 10]


def test_the_minute_in_progress_is_not_drawn_until_it_is_over(frozen):
    """Its change covered only the seconds sampled so far: the chart dipped at its right edge."""
    c, rows = sending_campaign(100)
    pace.sample_due()
    frozen[0] = NOW + timedelta(minutes=1)
    move(rows[:60], "sent", frozen[0])
    pace.sample_due()  # 11:31:05: 60 sent, 5 s into the minute
    assert pace.pace(Campaign.objects.get(pk=c.pk), frozen[0])["chart"]["labels"] == ["11:30"]

    frozen[0] += timedelta(minutes=1)
    move(rows[60:], "sent", frozen[0])
    pace.sample_due()  # 11:32:05
    assert pace.pace(Campaign.objects.get(pk=c.pk), frozen[0])["chart"]["sent"] == [0, 60]

    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.COMPLETED, completed_at=frozen[0])
    frozen[0] += timedelta(seconds=15)
    pace.sample_due()  # its last sample: a finished campaign's last minute is whole, drawn
    assert pace.pace(Campaign.objects.get(pk=c.pk), frozen[0])["chart"]["sent"] == [0, 60, 40]


def test_a_campaign_with_rows_scheduled_says_when_the_last_goes_through_an_index(frozen):
    c, rows = sending_campaign(30)
    schedule(rows[:10], datetime(2030, 1, 10, 18, 0, tzinfo=UTC), NOW)
    schedule(rows[10:20], datetime(2030, 1, 11, 6, 0, tzinfo=UTC), NOW)
    pace.sample_due()

    p = pace.pace(Campaign.objects.get(pk=c.pk), frozen[0])

    assert p["eta_text"] == (f"10 due; no rate yet; 20 {LATER}, the last scheduled send at 2030-01-11 06:00:00 UTC")
    assert CampaignMinute.objects.get(campaign=c).last_due_at == datetime(2030, 1, 11, 6, 0, tzinfo=UTC)
    with CaptureQueriesContext(connection) as queries:
        assert pace.last_scheduled(c) == datetime(2030, 1, 11, 6, 0, tzinfo=UTC)
    assert "notification_campaign_due_idx" in plan(queries.captured_queries[-1]["sql"])


def plan(sql: str) -> str:
    """``sql``'s plan with sequential scans disabled (as tests/test_history_plans.py): a tiny table
    would be read whole anyway; the plan shows a sequential scan only when no index serves it."""
    with connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute(f"EXPLAIN {sql}")
        return "\n".join(r[0] for r in cur.fetchall())


def tick_reads(frozen) -> list[str]:
    frozen[0] += timedelta(seconds=15)
    with CaptureQueriesContext(connection) as queries:
        assert pace.sample_due() == 1
    return [q["sql"] for q in queries.captured_queries]


def test_a_tick_reads_what_changed_not_the_campaigns_rows_and_its_counts_equal_a_full_count(frozen):
    c, rows = sending_campaign(40)
    first = tick_reads(frozen)  # the campaign's first tick: one full count
    assert len([q for q in first if "notifications_notificationrecord" in q]) == 1
    move(rows[:10], "sent", frozen[0])
    move(rows[10:15], "suppressed", frozen[0], reason="opted_out_channel")
    move(rows[15:17], "failed", frozen[0], reason="provider_rejected")
    archive(*[r.pk for r in rows[:5]], at=frozen[0])  # moved to the history: no count changes
    NotificationHistory.objects.filter(pk__in=[r.pk for r in rows[:3]]).update(status="delivered")  # late receipts
    schedule(rows[20:22], datetime(2030, 1, 11, tzinfo=UTC), frozen[0])

    later = tick_reads(frozen)

    assert not [q for q in later if "notifications_notificationrecord" in q], later
    newest = CampaignMinute.objects.filter(campaign=c).order_by("-minute").first()
    assert newest.counts == campaign_counts(c)
    assert (newest.counts["by_status"]["delivered"], newest.counts["suppressed_by_reason"]) == (
        3, {"opted_out_channel": 5})
    assert not CampaignTallyChange.objects.exists()
    latency = plan(next(q for q in later if "percentile_cont" in q))
    assert "notification_campaign_sent_idx" in latency, latency


def test_a_fan_out_page_run_again_is_counted_once(frozen):
    """A page run twice: its COPY fails on the rows already there (rolled back with its savepoint,
    the trigger's changes too) and ``INSERT … ON CONFLICT DO NOTHING`` creates only the new one."""
    c, _ = sending_campaign(2)
    pace.sample_due()
    members = [Recipient.objects.create(user_id=f"page{k}", email=f"page{k}@example.com") for k in range(4)]
    page = [CampaignRow(uuid.uuid4(), m.pk, "queued", "", NOW, None) for m in members]
    with transaction.atomic():
        assert len(insert_campaign_page(campaign_id=c.pk, channel="email", priority="standard", category="",
                                        now=NOW, rows=page[:3])) == 3
    with transaction.atomic():
        assert len(insert_campaign_page(campaign_id=c.pk, channel="email", priority="standard", category="",
                                        now=NOW, rows=page)) == 1

    tick_reads(frozen)

    newest = CampaignMinute.objects.filter(campaign=c).order_by("-minute").first()
    assert newest.counts == campaign_counts(c) and newest.counts["by_status"]["queued"] == 6


def test_changes_of_campaigns_without_a_tally_are_dropped_and_a_finished_campaign_keeps_its_tally(frozen):
    c, rows = sending_campaign(3)
    other = Campaign.objects.create(segment=c.segment, channel="email", title="T", body="b",
                                    status=CampaignStatus.COMPLETED, completed_at=NOW - timedelta(days=3))
    Notification.objects.bulk_create([Notification(id=uuid.uuid4(), campaign_id=other.pk, recipient=rows[0].recipient,
                                                   channel="sms", body="b", status="sent")])
    pace.sample_due()
    assert list(CampaignTally.objects.values_list("campaign_id", flat=True)) == [c.pk]
    assert not CampaignTallyChange.objects.exists()

    frozen[0] += timedelta(minutes=1)
    move(rows, "sent", frozen[0])
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.COMPLETED, completed_at=frozen[0])
    frozen[0] += timedelta(seconds=15)
    assert pace.sample_due() == 1  # its last sample, from the tally
    assert CampaignMinute.objects.filter(campaign=c).order_by("-minute").first().counts["outcome"]["sent"] == 3
    frozen[0] += timedelta(seconds=15)
    assert pace.sample_due() == 0
    assert list(CampaignTally.objects.values_list("campaign_id", flat=True)) == [c.pk]  # its counts' source


def test_a_tick_finding_another_running_does_nothing(frozen):
    """Two ticks at once would both consume changes and write one tally over the other."""
    sending_campaign(2)
    db = connection.settings_dict
    with psycopg.connect(dbname=db["NAME"], user=db["USER"], host=db["HOST"], port=db["PORT"],
                         password=db["PASSWORD"] or None, autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(hashtext('campaigns-pace-tally'))")
        assert pace.sample_due() == 0
        other.execute("SELECT pg_advisory_unlock(hashtext('campaigns-pace-tally'))")  # before the close returns
        assert pace.sample_due() == 1


def record_queries(queries) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "notifications_notificationrecord" in q["sql"]]


def test_the_campaign_page_never_counts_the_rows_of_a_tallied_campaign(frozen, admin_client):
    """The Unsubscribes field counted every row of the campaign again on each page load; finished, the
    page counted them once (now its tally's, tests/test_campaign_counts_tally.py)."""
    c, rows = sending_campaign(4)
    move(rows[:2], "sent", frozen[0])
    Unsubscribe.objects.create(recipient=rows[0].recipient, category="promotions", channel="email", source="link",
                               campaign_id=c.pk, at=NOW)
    pace.sample_due()
    url = reverse("admin:campaigns_campaign_change", args=[c.pk])

    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(url).content.decode()
    assert not record_queries(queries), record_queries(queries)
    assert "1 (50.0 % of sent)" in page

    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.COMPLETED, completed_at=frozen[0])
    with CaptureQueriesContext(connection) as queries:
        page = admin_client.get(url).content.decode()
    assert not record_queries(queries), record_queries(queries)
    assert "1 (50.0 % of sent)" in page
    assert selectors.unsubscribe_stats(c) == {"unsubscribes": 1, "unsubscribe_rate": 0.5}  # from its tally


@pytest.mark.django_db
def test_a_samples_statuses_come_in_the_order_a_count_gives_them(frozen):
    """The change page's by-status table kept changing its columns' order between a sample (jsonb's
    key order) and a count (hadv34)."""
    c, rows = sending_campaign(3)
    move(rows[:1], "sent", NOW)
    pace.sample_due()
    counts, _at = pace.fresh_counts(Campaign.objects.get(pk=c.pk), NOW)
    assert list(counts["by_status"]) == list(campaign_counts(c)["by_status"]) == selectors.STATUSES
    assert (counts["by_status"]["sent"], counts["by_status"]["queued"]) == (1, 2)
