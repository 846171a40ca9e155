"""Campaign failures and progress made visible (issue 10 #5, #6): a failing fan-out page is counted by
task name in /metrics, recorded on the shard and campaign, reported by ``manage.py doctor`` once the
campaign made no progress for CAMPAIGN_STALL_MINUTES, and shown on the campaign page and API; the
progress shows sent/delivered apart from suppressed/failed/expired in the list, the page and the API.

In-process: the fan-out task runs eagerly (``apply``), the platform clock is fixed.
"""

from __future__ import annotations

import io
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from campaigns import fanout, services, tasks
from campaigns.models import Campaign, CampaignShard, CampaignStatus
from campaigns.selectors import STATUSES, outcome
from notifications.models import APIClient, Notification, Reason, Status
from preferences.models import Recipient
from tests.conftest import MARKETING_SCOPES
from tests.test_metrics import key, prom, scrape  # noqa: F401 - prom: private metrics directory (autouse)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

NOW = datetime(2030, 1, 10, 11, 30, tzinfo=UTC)
OTHER_DOCTOR_CHECKS = ["providers", "public-url", "sendgrid-key", "timezone", "workers", "migrations", "redis",
                       "metrics"]




@pytest.fixture
def api_client():
    client, key_ = APIClient.objects.create_key(name="marketing-tool", scopes=MARKETING_SCOPES)
    return client, Client(headers={"Authorization": f"Api-Key {key_}"})


def doctor() -> tuple[int, list[str]]:
    out = io.StringIO()
    args = [a for check in OTHER_DOCTOR_CHECKS for a in ("--skip", check)]
    try:
        call_command("doctor", *args, stdout=out)
        code = 0
    except SystemExit as exc:
        code = int(exc.code)
    return code, [line for line in out.getvalue().splitlines() if not line.startswith("SKIP")]


def fanning_out(client=None, started=NOW - timedelta(minutes=12)) -> Campaign:
    segment, _ = services.upsert_segment("spring", name="Spring")
    ids = ["u1", "u2", "u3"]
    for user_id in ids:
        Recipient.objects.create(user_id=user_id, phone="+4915112345678")
    services.change_members(segment, add=ids, remove=[])
    # Members of the snapshot taken at ``started``: added before it (stamped on the platform clock).
    segment.members.update(added_at=started - timedelta(minutes=1))
    c = services.create_campaign(client=client, idempotency_key="k" if client else None, segment=segment,
                                 channel="sms", body="hi", name="Spring sale").campaign
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.FANNING_OUT, snapshot_at=started,
                                            snapshot_kind="list", started_at=started, member_count=3)
    CampaignShard.objects.create(campaign=c, number=0, heartbeat_at=started)
    return c


def test_failing_fan_out_page_is_counted_recorded_reported_by_doctor_and_shown(admin_client, client, frozen,
                                                                               monkeypatch, api_client):
    owner, http = api_client
    c = fanning_out(owner)

    def explode(*args, **kwargs):
        raise RuntimeError("page exploded")

    monkeypatch.setattr(fanout, "_insert_page", explode)
    for _ in range(2):
        result = tasks.fan_out_page.apply(args=[str(c.pk), 0])
        assert result.failed() and isinstance(result.result, RuntimeError)

    found = scrape(client)
    assert found[key("notify_task_failures_total", task="campaigns.fan_out_page")] == 2.0
    shard = CampaignShard.objects.get(campaign=c)
    assert (shard.failures, shard.last_error, shard.last_error_at, shard.pages, shard.progressed_at) == (
        2, "RuntimeError: page exploded", NOW, 0, None)
    c.refresh_from_db()
    assert (c.status, c.fanout_failures, c.last_error, c.last_error_at) == (
        CampaignStatus.FANNING_OUT, 2, "shard 0: RuntimeError: page exploded", NOW)
    assert not Notification.objects.filter(campaign_id=c.pk).exists()

    code, lines = doctor()
    assert code == 1
    assert lines[0] == (f"FAIL  campaigns: campaign {c.pk} (Spring sale): fanning out, no progress for 12 min "
                        "(limit 10), 0 of 3 notifications created; 2 failed page(s), last at 2030-01-10 11:30:00 "
                        "UTC: shard 0: RuntimeError: page exploded")

    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[c.pk])).content.decode()
    assert ('<span class="errornote" data-field="last_error">shard 0: RuntimeError: page exploded</span>\n'
            '      at <span data-field="last_error_at">2030-01-10 11:30:00 UTC</span> '
            '(<span data-field="fanout_failures">2</span> failed page(s); each is retried)') in page
    progress = admin_client.get(reverse("admin:campaigns_campaign_progress", args=[c.pk])).json()
    assert (progress["last_error"], progress["last_error_at"], progress["fanout_failures"]) == (
        "shard 0: RuntimeError: page exploded", "2030-01-10 11:30:00 UTC", 2)
    detail = http.get(f"/v1/campaigns/{c.pk}").json()
    assert (detail["last_error"], detail["fanout_failures"]) == ("shard 0: RuntimeError: page exploded", 2)


def test_doctor_is_quiet_while_pages_commit_and_names_a_campaign_that_never_started(frozen, monkeypatch):
    c = fanning_out()
    assert fanout.fan_out_page(str(c.pk), 0) == "done"  # a page committed: progress
    assert doctor() == (0, ["OK    campaigns: nothing stalled", "",
                            "doctor: everything checked is fine (0 warning(s))."])
    segment = c.segment
    late = services.create_campaign(client=None, idempotency_key=None, segment=segment, channel="sms", body="x",
                                    name="Late").campaign
    Campaign.objects.filter(pk=late.pk).update(fanout_at=NOW - timedelta(minutes=11, seconds=5))
    code, lines = doctor()
    assert code == 1
    assert lines[0] == (f"FAIL  campaigns: campaign {late.pk} (Late): fan-out due at 2030-01-10 11:18:55 UTC has "
                        "not started for 11 min (limit 10): is beat or the maintenance worker down?")
    frozen[0] = NOW + timedelta(minutes=20)  # the campaign above finished fanning out: still not reported
    assert len(doctor()[1]) == 3


def test_a_stalled_campaign_without_a_recorded_error_says_so(frozen, settings):
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "STALL_MINUTES": 5}
    c = fanning_out(started=NOW - timedelta(minutes=6))
    code, lines = doctor()
    assert (code, lines[0]) == (1, f"FAIL  campaigns: campaign {c.pk} (Spring sale): fanning out, no progress for "
                                   "6 min (limit 5), 0 of 3 notifications created; no page error recorded (is the "
                                   "fan-out worker running?)")


def test_task_failure_labels_are_bounded(client):
    from notifications import metrics

    class Task:
        def __init__(self, name):
            self.name = name

    metrics.task_failed(sender=Task("notifications.reconcile"))
    metrics.task_failed(sender=Task("some.other.module.task"))
    metrics.task_retried(sender=Task("campaigns.fan_out_page"))
    found = scrape(client)
    assert found[key("notify_task_failures_total", task="notifications.reconcile")] == 1.0
    assert found[key("notify_task_failures_total", task="other")] == 1.0
    assert found[key("notify_task_retries_total", task="campaigns.fan_out_page")] == 1.0


# --- #6: sent apart from not sent -------------------------------------------------------------------

def test_progress_shows_sent_and_delivered_apart_from_suppressed_failed_expired(admin_client, api_client):
    owner, http = api_client
    segment, _ = services.upsert_segment("spring", name="Spring")
    c = services.create_campaign(client=owner, idempotency_key="k", segment=segment, channel="push", body="hi",
                                 name="Push sale").campaign
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.COMPLETED, member_count=50, created_count=50)
    mix = ([(Status.SUPPRESSED, Reason.NO_ACTIVE_DEVICE)] * 30 + [(Status.SENT, "")] * 10
           + [(Status.DELIVERED, "")] * 5 + [(Status.FAILED, Reason.CONTACT_INVALID)] * 3
           + [(Status.EXPIRED, Reason.TTL_EXPIRED)] * 2)
    for i, (status, reason) in enumerate(mix):
        r = Recipient.objects.create(user_id=f"u{i:02}")
        Notification.objects.create(id=uuid.uuid4(), campaign_id=c.pk, recipient=r, channel="push", body="hi",
                                    status=status, reason=reason)
    everything_suppressed = services.create_campaign(client=None, idempotency_key=None, segment=segment,
                                                     channel="push", body="hi", name="Nobody").campaign
    Campaign.objects.filter(pk=everything_suppressed.pk).update(status=CampaignStatus.COMPLETED, member_count=2,
                                                                created_count=2)
    for i in range(2):
        Notification.objects.create(id=uuid.uuid4(), campaign_id=everything_suppressed.pk,
                                    recipient_id=f"u{i:02}", channel="push", body="hi",
                                    status=Status.SUPPRESSED, reason=Reason.NO_ACTIVE_DEVICE)

    counts = http.get(f"/v1/campaigns/{c.pk}").json()["counts"]
    assert counts["outcome"] == {"sent": 15, "delivered": 5, "displayed": 0, "opened": 0, "not_sent": 35,
                                 "suppressed": 30, "failed": 3, "expired": 2, "cancelled": 0, "pending": 0}
    assert counts["total"] == 50

    listing = admin_client.get(reverse("admin:campaigns_campaign_changelist")).content.decode()
    assert ('<meter min="0" max="50" value="15" title="sent"></meter> sent 15 (delivered 5) · not sent 35: '
            'suppressed 30, failed 3, expired 2 · pending 0') in listing
    assert ('<meter min="0" max="2" value="0" title="sent"></meter> sent 0 (delivered 0) · not sent 2: '
            'suppressed 2, failed 0, expired 0 · pending 0') in listing

    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[c.pk])).content.decode()
    assert ('Sent <strong data-field="sent">15</strong> (<span data-field="sent_percent">30.0</span>%),\n'
            '    delivered <span data-field="delivered">5</span>,\n'
            '    displayed <span data-field="displayed">0</span>,\n'
            '    opened <span data-field="opened">0</span> (as the app reported) ·\n'
            '    not sent <strong data-field="not_sent">35</strong>:\n'
            '    suppressed <span data-field="suppressed">30</span>,\n'
            '    failed <span data-field="failed">3</span>,\n'
            '    expired <span data-field="expired">2</span>,\n'
            '    cancelled <span data-field="cancelled">0</span> ·\n'
            '    pending <span data-field="pending">0</span>') in page
    progress = admin_client.get(reverse("admin:campaigns_campaign_progress", args=[c.pk])).json()
    assert {k: progress[k] for k in ("sent", "delivered", "not_sent", "suppressed", "failed", "expired",
                                     "pending", "sent_percent", "done", "percent")} == {
        "sent": 15, "delivered": 5, "not_sent": 35, "suppressed": 30, "failed": 3, "expired": 2, "pending": 0,
        "sent_percent": 30.0, "done": 50, "percent": 100.0}
    assert json.loads(json.dumps(progress))  # JSON-ready for the page's refresh


@hypothesis_settings(max_examples=100, deadline=None)
@given(counts=st.fixed_dictionaries({s: st.integers(0, 10**6) for s in STATUSES}))
def test_outcome_partitions_every_notification_into_sent_not_sent_and_pending(counts):
    result = outcome(counts)
    assert result["sent"] + result["not_sent"] + result["pending"] == sum(counts.values())
    shown = counts["displayed"] + counts["dismissed"] + counts["opened"]  # the app's ladder: at least that far
    assert result["sent"] == counts["sent"] + counts["delivered"] + shown
    assert result["delivered"] == counts["delivered"] + shown
    assert (result["displayed"], result["opened"]) == (shown, counts["opened"])
    assert result["not_sent"] == sum(result[s] for s in ("suppressed", "failed", "expired", "cancelled"))
    assert all(result[s] == counts[s] for s in ("suppressed", "failed", "expired", "cancelled"))
