"""``manage.py bench_pages`` at a tiny scale (bench/pages.py, bench/pages_fill.py): the command fills a
campaign of 2,000 members that has been sending for two hours, the provider minutes and a recipient's
40 days, measures every page and tick, writes its JSON; the same request is reused; the ticks leave
the database as they found it. In-process on the test database (the command's inner run)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models import Count

from bench import history, pages, pages_fill
from bench.management.commands.bench import INNER
from campaigns.models import Campaign, CampaignMinute
from campaigns.selectors import campaign_counts
from notifications.models import DeliveryAttempt, Notification, NotificationRecord
from notifications.provider_minutes.models import ProviderMinute, RollupMark

MEMBERS = 2_000
OPTIONS = ["--days", "1", "--per-day", "300", "--campaign-recipients", str(MEMBERS), "--campaign-hours", "2",
           "--recipient-notifications", "120", "--background-per-minute", "4", "--repeat", "1"]
TARGETS = ["tick_pace_first", "campaign_page", "pace_poll", "campaign_list", "provider_health", "recipient_page",
           "tick_pace", "tick_provider_minutes"]


@pytest.fixture
def ran(transactional_db, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(INNER, "1")  # the inner run, against the test database
    call_command("bench_pages", *OPTIONS, "--out", str(tmp_path))
    yield json.loads(next(tmp_path.glob("pages-*.json")).read_text()), capsys.readouterr().out
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {pages_fill.RECORD_TABLE}")
        cur.execute(f"DROP TABLE IF EXISTS {history.RECORD_TABLE}")


def by_status(campaign) -> dict[tuple[str, str], int]:
    return {(s, r): n for s, r, n in Notification.objects.filter(campaign_id=campaign.pk)
            .values_list("status", "reason").annotate(n=Count("id"))}


def test_the_command_fills_a_sending_campaign_and_measures_every_page_and_tick(ran):
    result, out = ran
    fill = result["fill"]
    campaign = Campaign.objects.get(pk=fill["campaign_id"])
    assert (campaign.status, campaign.member_count, campaign.created_count) == ("sending", MEMBERS, MEMBERS)
    assert fill["rows"]["campaign_notifications"] == MEMBERS == Notification.objects.filter(
        campaign_id=campaign.pk).count()
    statuses = by_status(campaign)
    # Fan-out's own suppression (every 50th member opted out of email, every 100th bounced); the
    # American zones (40 %) are not due yet; Berlin and Paris were released and sent, a backlog queued.
    assert statuses[("suppressed", "opted_out_channel")] == MEMBERS // 50
    assert statuses[("suppressed", "email_invalid")] == MEMBERS // 100
    assert statuses[("scheduled", "")] == MEMBERS * 40 // 100 - MEMBERS // 100
    for moved in [("queued", ""), ("sent", ""), ("delivered", ""), ("failed", "provider_bounced"),
                  ("failed", "contact_invalid"), ("suppressed", "opted_out_category")]:
        assert statuses.get(moved, 0) > 0, (moved, statuses)
    assert statuses[("delivered", "")] > MEMBERS // 3

    # One pace sample a minute, by beat's task; the newest 5 s before the anchor, counting as the rule does.
    minutes = list(CampaignMinute.objects.filter(campaign=campaign).order_by("minute"))
    assert fill["rows"]["campaign_minutes"] == len(minutes) >= 115
    newest = minutes[-1]
    anchor = pages_fill.recorded()["anchor"]
    # (the newest may be the bench's own committed sample at the anchor, taken before the pages)
    assert abs(anchor - newest.sampled_at) <= timedelta(seconds=5)
    assert newest.counts["by_status"] == campaign_counts(campaign)["by_status"]
    assert [m.minute for m in minutes] == [minutes[0].minute + timedelta(minutes=k) for k in range(len(minutes))]

    # The provider minutes: beat's sampler up to the minute before the anchor, the breaker's spells.
    spell = ProviderMinute.objects.filter(provider="sendgrid", breaker_opened=1).get()
    assert spell.breaker_state == "open" and spell.spell_began == anchor - timedelta(minutes=40, seconds=-7)
    closed = ProviderMinute.objects.filter(provider="sendgrid", spell_ended__isnull=False).get()
    assert closed.spell_ended - closed.spell_began == timedelta(seconds=152)
    assert ProviderMinute.objects.filter(provider="twilio", spell_ended__isnull=False).count() == 1
    assert DeliveryAttempt.objects.filter(id__gt=RollupMark.objects.get().last_id).exists()  # the tick's minute

    # The recipient: 120 sends over 40 days (archived or live) and their campaign row.
    mine = NotificationRecord.objects.filter(recipient_id=fill["recipient_id"])
    assert mine.count() == 121 and mine.filter(live=False).exists() and mine.filter(campaign_id=campaign.pk).exists()

    assert list(result["results"]) == TARGETS
    for name, r in result["results"].items():
        assert r["queries"] >= 1 and r["wall_ms"] > 0 and r["cpu_ms"] >= 0, name
        assert r["explained"][0]["execution_ms"] >= 0 and r["explained"][0]["sql"], name
        assert r["queries_per_run"] == [r["queries"]], name
    assert result["results"]["pace_poll"]["url"] == f"/admin/campaigns/campaign/{campaign.pk}/progress/"
    assert result["database"]["bytes"] > 0 and "notifications_notification" in result["database"]["tables"]
    assert "| campaign_page |" in out and "| tick_provider_minutes |" in out

    # The ticks were rolled back; the same request reuses the fill.
    assert CampaignMinute.objects.filter(campaign=campaign).count() == len(minutes)
    assert pages_fill.ensure(pages_fill.Request(**fill["request"]), lambda _m: None)["reused"] is True
    assert Campaign.objects.filter(name__startswith="bench pages").count() == 1


def test_a_target_is_flagged_when_slow_or_reading_a_big_table():
    plan = {"seq_scans_of_big_tables": ["notifications_deliveryattempt_p20301010"],
            "largest_scan": {"node": "Index Scan", "relation": "notifications_notification", "index": "campaign_idx",
                             "rows_read": 1_000_000}}
    small = {"seq_scans_of_big_tables": [], "largest_scan": {"node": "Index Scan", "relation": "x", "index": None,
                                                             "rows_read": 99_999}}
    assert pages.flags({"wall_ms": 250.4, "explained": [plan, small]}) == [
        "250 ms (over 200 ms)", "sequential scan of notifications_deliveryattempt_p20301010",
        "Index Scan of notifications_notification read 1,000,000 rows (campaign_idx)"]
    assert pages.flags({"wall_ms": 199.0, "explained": [small]}) == []
