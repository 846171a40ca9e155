"""The gauges issue 27's alert rules read (deploy/prometheus/alerts.yml, docs/OPERATIONS.md "Dashboards and
alerts"): the oldest queued row per tier (HighPriorityRowsWaiting), each housekeeping task's last success
and interval (HousekeepingTaskNotRunning: notifications/housekeeping.py) and partition maintenance's.
"Never" is a value while Redis answers (0 for a last success), so no rule needs absent(), which a failed
scrape fires too. In-process, real Postgres and Redis."""

from __future__ import annotations

import os
import time
import uuid
from datetime import timedelta

import pytest
from celery.schedules import crontab
from django.db import connection
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from core import partitions
from core.redis_client import get_redis
from notifications import housekeeping, metrics, scheduler
from notifications.inbox import prune as inbox_prune
from notifications.models import Notification
from notifications.webhooks import endpoints
from notifications.webhooks import retention as webhook_retention
from preferences.models import Recipient
from tests.conftest import make_client

pytestmark = pytest.mark.django_db

SUCCESS, INTERVAL = "notify_housekeeping_last_success_timestamp", "notify_housekeeping_interval_seconds"
TASKS = ("notifications.archive", "notifications.prune_inbox", "notifications.prune_webhooks")


@pytest.fixture(autouse=True)
def prom(tmp_path, settings):
    """A private multiprocess directory, /metrics open to local requests, no record left in Redis."""
    settings.METRICS_TOKEN = ""
    previous = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    metrics.use_multiprocess_dir(str(tmp_path / "prometheus"))
    redis = get_redis()  # the tests' own, even if a test points settings elsewhere
    redis.delete(housekeeping.KEY, partitions.LAST_RUN_KEY)
    yield
    redis.delete(housekeeping.KEY, partitions.LAST_RUN_KEY)
    metrics.use_multiprocess_dir(previous)


def scrape(client, *names: str) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.content.decode()) for s in family.samples
            if s.name in names}


def by_task(found: dict, name: str) -> dict:
    return {dict(labels)["task"]: value for (n, labels), value in found.items() if n == name}


# --- oldest queued row per tier ----------------------------------------------------------------------

def test_the_oldest_queued_row_is_shown_per_tier_the_high_one_by_its_own_index(client):
    r = Recipient.objects.create(user_id=f"ag-{uuid.uuid4().hex[:8]}")
    now = timezone.now()
    for priority, seconds in (("standard", 600), ("standard", 30), ("high", 20), ("high", 2)):
        Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status="queued",
                                    priority=priority, queued_at=now - timedelta(seconds=seconds))
    Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status="sending",
                                priority="high", queued_at=now - timedelta(hours=1))  # claimed: not waiting

    found = scrape(client, "notify_queued_oldest_age_seconds")

    ages = {dict(labels)["tier"]: value for (_n, labels), value in found.items()}
    assert set(ages) == {"high", "standard"}
    assert 20.0 <= ages["high"] < 35.0
    assert 600.0 <= ages["standard"] < 615.0
    with connection.cursor() as cur:  # never a walk past the standard rows a campaign queues
        # On five rows a sequential read is the cheaper plan (whatever the statistics other tests
        # left); what is asked is that the partial index serves the predicate.
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("EXPLAIN SELECT min(queued_at) FROM notifications_notification "
                    "WHERE status = 'queued' AND priority = 'high'")
        plan = "\n".join(line for (line,) in cur.fetchall())
    assert "notification_queued_high_idx" in plan, plan


def test_no_queued_row_is_an_age_of_0_per_tier(client):
    Notification.objects.filter(status="queued").delete()

    found = scrape(client, "notify_queued_oldest_age_seconds")

    assert found == {("notify_queued_oldest_age_seconds", (("tier", "high"),)): 0.0,
                     ("notify_queued_oldest_age_seconds", (("tier", "standard"),)): 0.0}


# --- housekeeping tasks' last success ---------------------------------------------------------------

def test_no_record_reads_as_when_first_found_missing_and_so_does_partition_maintenance(client):
    """No success recorded (a new or flushed Redis): the first scrape's instant, kept, not 0, which
    paged at once while the next run may be an hour away (hadv34 #6)."""
    partition = "notify_partition_maintenance_last_success_timestamp"
    before = time.time()
    found = scrape(client, SUCCESS, INTERVAL, partition)
    after = time.time()

    first = by_task(found, SUCCESS)
    assert set(first) == set(TASKS) and all(before - 0.001 <= at <= after + 0.001 for at in first.values()), first
    assert by_task(found, INTERVAL) == {"notifications.archive": 60.0, "notifications.prune_inbox": 60.0,
                                        "notifications.prune_webhooks": 300.0}
    assert before - 0.001 <= found[(partition, ())] <= after + 0.001
    time.sleep(0.01)
    again = scrape(client, SUCCESS, partition)  # the same instants: the clock runs from the first look
    assert by_task(again, SUCCESS) == first and again[(partition, ())] == found[(partition, ())]
    assert housekeeping.last_successes() == {task: None for task in TASKS}  # no success was invented


def test_each_task_records_its_success_when_a_run_ends(client):
    before = time.time()
    scheduler.archive()
    inbox_prune.prune()
    webhook_retention.prune()
    after = time.time()

    successes = by_task(scrape(client, SUCCESS), SUCCESS)

    assert set(successes) == set(TASKS)
    assert all(before - 0.001 <= at <= after + 0.001 for at in successes.values()), successes
    assert housekeeping.last_successes() == pytest.approx(successes, abs=0.001)


def test_a_failed_run_records_nothing(client, monkeypatch):
    def broken(*_args, **_kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(scheduler.lifecycle.archive, "archive", broken)
    monkeypatch.setattr(inbox_prune, "prune_batch", broken)
    monkeypatch.setattr(webhook_retention, "_delete_batch", broken)
    endpoints.create(make_client()[0], "https://hooks.example.com/hk", ["notification.sent"])  # one to prune
    for run in (scheduler.archive, inbox_prune.prune, webhook_retention.prune):
        with pytest.raises(RuntimeError):
            run()

    assert housekeeping.last_successes() == {task: None for task in TASKS}


def test_a_task_scheduled_by_crontab_has_no_interval_and_still_its_last_success(client, settings):
    settings.CELERY_BEAT_SCHEDULE = {**settings.CELERY_BEAT_SCHEDULE,
                                     "prune-inbox": {**settings.CELERY_BEAT_SCHEDULE["prune-inbox"],
                                                     "schedule": crontab(minute="*/5")},
                                     "prune-webhooks": {**settings.CELERY_BEAT_SCHEDULE["prune-webhooks"],
                                                        "schedule": timedelta(minutes=10)}}
    housekeeping.succeeded("notifications.prune_inbox")

    found = scrape(client, SUCCESS, INTERVAL)

    assert by_task(found, INTERVAL) == {"notifications.archive": 60.0, "notifications.prune_webhooks": 600.0}
    assert by_task(found, SUCCESS)["notifications.prune_inbox"] > 0.0


def test_recording_never_fails_the_run_when_redis_is_down(settings, caplog):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{closed}/0"

    housekeeping.succeeded("notifications.archive")

    assert "notifications.archive: last success not recorded, Redis unavailable" in caplog.text
