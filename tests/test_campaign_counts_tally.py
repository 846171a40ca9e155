"""A campaign's counts as every reader takes them (campaigns.selectors.counts_for; docs/CAMPAIGNS.md,
"Pace"): a tallied campaign is read from its tally plus the changes beat's tick has not folded yet,
never from its rows, on the admin list (which reloads every 5 s while a campaign is active), the
API's detail and the change page; exact whatever moved since the last tick, and while a tick's fold
commits (two real connections); a campaign without a tally, or with history possibly dropped, is
counted in full."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from campaigns import pace, tally
from campaigns.models import Campaign, CampaignStatus, CampaignTally, CampaignTallyChange
from campaigns.selectors import campaign_counts, counted_rows, counts_for, counts_of
from notifications.models import APIClient
from tests.conftest import EVERY_SCOPE
from tests.test_campaign_pace import move, sending_campaign

NOW = datetime(2030, 1, 10, 11, 30, 5, tzinfo=UTC)


def full(c: Campaign) -> dict:
    """The campaign's rows counted (what the readers did on every request before the tally)."""
    return counts_of(counted_rows(c.pk), c)


def row_queries(queries) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if "notifications_notification" in q["sql"]]


@pytest.mark.django_db
def test_counts_are_the_tally_and_its_pending_changes_exact_after_sends_receipts_and_cancels(frozen):
    c, rows = sending_campaign(10)
    pace.sample_due()  # the first (full) count
    move(rows[:6], "sent", frozen[0])
    move(rows[:3], "delivered", frozen[0])
    move(rows[6:8], "suppressed", frozen[0], reason="opted_out_channel")
    move(rows[8:], "cancelled", frozen[0])
    assert CampaignTallyChange.objects.exists()  # not folded yet
    assert campaign_counts(c) == full(c)
    assert (campaign_counts(c)["outcome"]["sent"], campaign_counts(c)["outcome"]["delivered"]) == (6, 3)
    assert campaign_counts(c)["suppressed_by_reason"] == {"opted_out_channel": 2}
    move(rows[6:8], "queued", frozen[0])  # a reason netting to zero leaves no key, as a full count
    assert campaign_counts(c) == full(c) and campaign_counts(c)["suppressed_by_reason"] == {}
    pace.sample_due()
    assert not CampaignTallyChange.objects.exists()
    assert campaign_counts(c) == full(c)


@pytest.mark.django_db
def test_a_finished_campaign_keeps_its_tally_and_its_late_receipts(frozen):
    c, rows = sending_campaign(4)
    pace.sample_due()
    move(rows, "sent", frozen[0])
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.COMPLETED, completed_at=frozen[0])
    for _ in range(3):  # its settling samples, then no longer sampled
        frozen[0] += timedelta(seconds=15)
        pace.sample_due()
    assert pace.due(frozen[0]) == []
    move(rows[:2], "opened", frozen[0])  # a day later: two opens
    pace.sample_due()
    assert CampaignTally.objects.filter(campaign=c).exists() and not CampaignTallyChange.objects.exists()
    c.refresh_from_db()
    with CaptureQueriesContext(connection) as queries:
        counts = campaign_counts(c)
    assert not row_queries(queries)
    assert counts == full(c) and counts["outcome"]["opened"] == 2


@pytest.mark.django_db
def test_campaigns_without_a_tally_or_with_history_possibly_dropped_are_counted_in_full(frozen):
    c, _ = sending_campaign(3)
    old = Campaign.objects.create(segment=c.segment, channel="email", title="T", body="b",
                                  status=CampaignStatus.COMPLETED, started_at=NOW - timedelta(days=400))
    with CaptureQueriesContext(connection) as queries:
        counts = counts_for([c, old])
    assert len(row_queries(queries)) == 1  # one grouped count for both
    assert counts[c.pk] == full(c) and counts[old.pk]["history_expired"]
    CampaignTally.objects.create(campaign=old, counts={"sent": {"": 99}}, counted_at=NOW)
    assert counts_for([old])[old.pk]["total"] == 0  # the retention drops partitions: no trigger says so


@pytest.mark.django_db
def test_each_tick_gives_one_untallied_campaign_a_tally_the_newest_first_never_an_expired_one(frozen):
    """Campaigns finished before the sampler existed were counted in full on every list reload."""
    c, rows = sending_campaign(4)
    move(rows[:3], "sent", frozen[0])
    finished = {}
    for days in (2, 1):
        f = Campaign.objects.create(segment=c.segment, channel="email", title="T", body="b",
                                    status=CampaignStatus.COMPLETED, started_at=NOW - timedelta(days=days))
        finished[days] = f
    old = Campaign.objects.create(segment=c.segment, channel="email", title="T", body="b",
                                  status=CampaignStatus.COMPLETED, started_at=NOW - timedelta(days=400))
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.COMPLETED)
    c.refresh_from_db()

    assert tally.backfill(NOW) == c  # the newest
    assert CampaignTally.objects.get(campaign=c).counts == {"sent": {"": 3}, "queued": {"": 1}}
    assert [tally.backfill(NOW), tally.backfill(NOW), tally.backfill(NOW)] == [finished[1], finished[2], None]
    assert not CampaignTally.objects.filter(campaign=old).exists()  # its readers count in full
    move(rows[3:], "sent", frozen[0])
    with CaptureQueriesContext(connection) as queries:
        counted = counts_for([c])[c.pk]
    assert row_queries(queries) == [] and counted == full(c) and counted["outcome"]["sent"] == 4


@pytest.mark.django_db
def test_the_list_the_api_detail_and_the_change_page_read_no_row_of_a_tallied_campaign(frozen):
    c, rows = sending_campaign(4)
    pace.sample_due()
    move(rows[:3], "sent", frozen[0])
    move(rows[:1], "delivered", frozen[0])
    admin = Client()
    admin.force_login(User.objects.create_superuser("admin", "admin@example.com", "pw"))
    _, key = APIClient.objects.create_key(name="tally", scopes=list(EVERY_SCOPE))
    api = Client(headers={"Authorization": f"Api-Key {key}"})
    expected = full(c)

    for get in (lambda: admin.get(reverse("admin:campaigns_campaign_changelist")),
                lambda: api.get(f"/v1/campaigns/{c.pk}"),
                lambda: admin.get(reverse("admin:campaigns_campaign_change", args=[c.pk]))):
        with CaptureQueriesContext(connection) as queries:
            response = get()
        assert response.status_code == 200
        assert not row_queries(queries), row_queries(queries)
    assert api.get(f"/v1/campaigns/{c.pk}").json()["counts"]["by_status"] == expected["by_status"]
    page = admin.get(reverse("admin:campaigns_campaign_changelist")).content.decode()
    assert "sent 3 (delivered 1)" in page


@pytest.mark.django_db(transaction=True)
def test_a_read_while_a_fold_commits_sees_each_change_once():
    """The tick (its own connection, a thread) folds the changes and holds its transaction open; reads
    on this connection before and after it commits equal a full count."""
    c, rows = sending_campaign(6)
    with transaction.atomic():
        assert tally.lock()
        tally.counts([c], NOW)
    move(rows[:4], "sent", NOW)
    move(rows[4:], "failed", NOW, reason="provider_rejected")
    folded, release = threading.Event(), threading.Event()

    def tick() -> None:
        try:
            with transaction.atomic():
                assert tally.lock()
                tally.counts([c], NOW)
                folded.set()
                assert release.wait(30)
        finally:
            connections.close_all()

    worker = threading.Thread(target=tick)
    worker.start()
    try:
        assert folded.wait(30)
        assert CampaignTallyChange.objects.count() > 0  # deleted in the tick's open transaction, not yet for us
        assert campaign_counts(c) == full(c)
        assert campaign_counts(c)["outcome"]["sent"] == 4 and campaign_counts(c)["failed_by_reason"] == {
            "provider_rejected": 2}
    finally:
        release.set()
        worker.join(30)
    assert not CampaignTallyChange.objects.exists()
    assert campaign_counts(c) == full(c) and campaign_counts(c)["outcome"]["sent"] == 4
