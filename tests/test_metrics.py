"""/metrics: protection, the series the send path / scheduler / receipts record, the scrape-time gauges,
and prometheus-client multiprocess aggregation across real processes.

Every test gets a private PROMETHEUS_MULTIPROC_DIR (``metrics.use_multiprocess_dir``), so values start
at zero and nothing lands in the development stack's ``.run/prometheus``."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from core.redis_client import client_for, get_redis
from notifications import metrics, receipts, scheduler
from notifications.delivery import pipeline
from notifications.health import queue_snapshot
from notifications.models import Notification
from preferences.models import Device, Recipient
from providers.base import (
    ContactInvalidError,
    PermanentProviderError,
    PushBackend,
    SendResult,
    SmsBackend,
    TransientProviderError,
)
from providers.registry import reset_backends

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent

PHONE_OK = "+4915100000001"
PHONE_TRANSIENT = "+4915100000002"
PHONE_INVALID = "+4915100000003"
PHONE_REFUSED = "+4915100000004"
DEAD_TOKEN = "dead-token"


class FakeTwilio(SmsBackend):
    """Answers by destination number, like the real backend would classify Twilio's answers."""

    name = "twilio"

    def send(self, message):
        if message.to == PHONE_TRANSIENT:
            raise TransientProviderError("twilio", "503", "Service Unavailable", http_status=503)
        if message.to == PHONE_INVALID:
            raise ContactInvalidError("twilio", "21211", "invalid To", reason="invalid_number", http_status=400)
        if message.to == PHONE_REFUSED:
            raise PermanentProviderError("twilio", "30007", "filtered", http_status=400)  # not allow-listed
        return SendResult("twilio", f"SM{uuid.uuid4().hex}")


class FakeFcm(PushBackend):
    name = "fcm"

    def send(self, message):
        if message.to == DEAD_TOKEN:
            raise ContactInvalidError("fcm", "UNREGISTERED", "gone", reason="unregistered_token", http_status=404)
        return SendResult("fcm", f"projects/p/messages/{uuid.uuid4().hex}")


def samples(text: str) -> dict:
    """``{(sample name, ((label, value), ...)): value}`` of a Prometheus text exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def only(found: dict, *names: str) -> dict:
    return {k: v for k, v in found.items() if k[0] in names}


def key(name: str, **labels) -> tuple:
    return (name, tuple(sorted(labels.items())))


@pytest.fixture(autouse=True)
def prom(tmp_path, settings):
    """A private multiprocess directory; /metrics open to local requests."""
    settings.METRICS_TOKEN = ""
    previous = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    path = tmp_path / "prometheus"
    metrics.use_multiprocess_dir(str(path))
    yield path
    metrics.use_multiprocess_dir(previous)


@pytest.fixture(autouse=True)
def empty_queues():
    """The tests' own Redis database: no broker messages left over from other tests."""
    from django.conf import settings

    from core.queues import ALL_QUEUES

    broker = client_for(settings.CELERY_BROKER_URL)  # tests may point settings elsewhere meanwhile
    keys = [q + suffix for q in ALL_QUEUES for suffix in ("", "\x06\x163", "\x06\x166", "\x06\x169")]

    def clear():
        broker.delete(*keys)

    clear()
    yield
    clear()


def scrape(client) -> dict:
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    return samples(response.content.decode())


# --- protection ----------------------------------------------------------------------------------

def test_without_token_only_direct_local_requests_are_answered_in_local_development(client, settings):
    settings.LOCAL_DEVELOPMENT = True
    assert client.get("/metrics").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    refused = client.get("/metrics", REMOTE_ADDR="10.1.2.3")
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "forbidden"
    # Through a reverse proxy on the same host: REMOTE_ADDR is loopback, but it is not a local client.
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 403
    assert client.get("/metrics", HTTP_FORWARDED="for=203.0.113.9").status_code == 403


def test_outside_local_development_the_token_is_required_whatever_the_peer_and_headers(client, settings):
    """Issue 11 #7: a deployment is never protected by which forwarding headers its proxy sets."""
    settings.LOCAL_DEVELOPMENT = False
    settings.METRICS_TOKEN = ""
    for meta in ({}, {"REMOTE_ADDR": "::1"}, {"REMOTE_ADDR": "10.1.2.3"}):
        refused = client.get("/metrics", **meta)
        assert refused.status_code == 403
        assert refused.json()["error"]["message"] == ("METRICS_TOKEN is not set: outside local development "
                                                      "/metrics answers only Authorization: Bearer <METRICS_TOKEN>")
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token").status_code == 200


def test_with_token_the_bearer_token_is_required_from_everywhere(client, settings):
    settings.METRICS_TOKEN = "s3cret-metrics-token"
    missing = client.get("/metrics")
    assert missing.status_code == 401
    assert missing["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Basic s3cret-metrics-token").status_code == 401
    ok = client.get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert ok.status_code == 200
    assert b"notify_scrape_source_up" in ok.content


def test_post_is_not_allowed(client):
    assert client.post("/metrics").status_code == 405


# --- events from the real send path -------------------------------------------------------------

@pytest.fixture
def fake_providers(settings):
    settings.PROVIDERS = {
        "sms": [{"NAME": "twilio", "BACKEND": "tests.test_metrics.FakeTwilio", "OPTIONS": {"FROM_NUMBER": "+1500"}}],
        "email": settings.PROVIDERS["email"],
        "push": [{"NAME": "fcm", "BACKEND": "tests.test_metrics.FakeFcm", "OPTIONS": {}}],
    }
    reset_backends()
    yield
    reset_backends()


def _notification(recipient: Recipient, channel: str, priority: str, **fields) -> Notification:
    return Notification.objects.create(id=uuid.uuid4(), recipient=recipient, channel=channel, priority=priority,
                                       body="b", status=fields.pop("status", "queued"),
                                       queued_at=fields.pop("queued_at", timezone.now()), **fields)


def test_send_path_records_calls_outcomes_latency_and_invalid_tokens(client, fake_providers,
                                                                       django_capture_on_commit_callbacks):
    users = {p: Recipient.objects.create(user_id=f"m-{uuid.uuid4().hex[:8]}", phone=p)
             for p in (PHONE_OK, PHONE_TRANSIENT, PHONE_INVALID, PHONE_REFUSED)}
    sms = {p: _notification(r, "sms", "high") for p, r in users.items()}
    no_phone = _notification(Recipient.objects.create(user_id=f"m-{uuid.uuid4().hex[:8]}"), "sms", "high")
    pusher = Recipient.objects.create(user_id=f"m-{uuid.uuid4().hex[:8]}")
    Device.objects.create(recipient=pusher, platform="android", push_token="good-token")
    dead = Device.objects.create(recipient=pusher, platform="ios", push_token=DEAD_TOKEN)
    push = _notification(pusher, "push", "standard")
    # Accepted 2 s before the send: accept → provider-accept lands in the (2, 3] s bucket.
    Notification.objects.filter(pk=sms[PHONE_OK].pk).update(created_at=timezone.now() - timedelta(seconds=2))

    with django_capture_on_commit_callbacks(execute=True):
        pipeline.send_notifications([str(n.pk) for n in [*sms.values(), no_phone]])
        pipeline.send_notifications([str(push.pk)])

    statuses = dict(Notification.objects.filter(pk__in=[n.pk for n in [*sms.values(), no_phone, push]])
                    .values_list("pk", "status"))
    assert [statuses[sms[p].pk] for p in users] == ["sent", "queued", "failed", "failed"]
    assert (statuses[no_phone.pk], statuses[push.pk]) == ("suppressed", "sent")
    dead.refresh_from_db()
    assert dead.active is False

    found = scrape(client)
    calls = "notify_provider_calls_total"
    assert only(found, calls) == {
        key(calls, provider="twilio", outcome="accepted", code=""): 1.0,
        key(calls, provider="twilio", outcome="transient", code="503"): 1.0,
        key(calls, provider="twilio", outcome="contact_invalid", code="21211"): 1.0,
        key(calls, provider="twilio", outcome="permanent", code="4xx"): 1.0,
        key(calls, provider="fcm", outcome="accepted", code=""): 1.0,
        key(calls, provider="fcm", outcome="contact_invalid", code="UNREGISTERED"): 1.0,
    }
    outcomes = "notify_notification_outcomes_total"
    assert only(found, outcomes) == {
        key(outcomes, status="sent", reason="", channel="sms", tier="high"): 1.0,
        key(outcomes, status="sent", reason="", channel="push", tier="standard"): 1.0,
        key(outcomes, status="failed", reason="contact_invalid", channel="sms", tier="high"): 1.0,
        key(outcomes, status="failed", reason="permanent_error", channel="sms", tier="high"): 1.0,
        key(outcomes, status="suppressed", reason="no_phone", channel="sms", tier="high"): 1.0,
    }
    deferrals = "notify_notification_deferrals_total"
    assert only(found, deferrals) == {key(deferrals, reason="retry_scheduled", channel="sms", tier="high"): 1.0}
    tokens = "notify_push_tokens_invalidated_total"
    assert only(found, tokens) == {key(tokens, provider="fcm", code="UNREGISTERED"): 1.0}
    # The retry went back on the broker with a countdown.
    published = "notify_tasks_published_total"
    assert only(found, published) == {key(published, queue="high.sms"): 1.0}

    latency = "notify_accept_to_provider_seconds"
    assert found[key(latency + "_count", tier="high", channel="sms")] == 1.0
    assert found[key(latency + "_bucket", tier="high", channel="sms", le="2.0")] == 0.0
    assert found[key(latency + "_bucket", tier="high", channel="sms", le="3.0")] == 1.0
    assert 2.0 < found[key(latency + "_sum", tier="high", channel="sms")] < 3.0
    # Push: two devices, one acceptance observed once.
    assert found[key(latency + "_count", tier="standard", channel="push")] == 1.0
    assert {k[1] for k in only(found, latency + "_count")} == {
        (("channel", "sms"), ("tier", "high")), (("channel", "push"), ("tier", "standard"))}
    duration = "notify_provider_call_duration_seconds_count"
    assert only(found, duration) == {key(duration, provider="twilio"): 4.0, key(duration, provider="fcm"): 2.0}
    # The permanent refusal is ours: a dead letter, visible in the scrape-time gauge.
    assert found[key("notify_dead_letters")] == 1.0


def test_receipts_count_results_outcomes_and_hard_bounces(client, django_capture_on_commit_callbacks):
    r = Recipient.objects.create(user_id=f"m-{uuid.uuid4().hex[:8]}", email="gone@example.com")
    bounced = _notification(r, "email", "standard", status="sent", provider_message_id="sg-1")
    delivered = _notification(r, "email", "standard", status="sent", provider_message_id="sg-2")
    events = [
        receipts.Receipt(provider="sendgrid", dedup_key="sendgrid:e1", kind=receipts.FAILED, raw="bounce",
                         provider_message_id="sg-1", invalid_address=True, error_code="5.1.1"),
        receipts.Receipt(provider="sendgrid", dedup_key="sendgrid:e1", kind=receipts.FAILED, raw="bounce",
                         provider_message_id="sg-1", invalid_address=True, error_code="5.1.1"),  # duplicate
        receipts.Receipt(provider="sendgrid", dedup_key="sendgrid:e2", kind=receipts.DELIVERED, raw="delivered",
                         provider_message_id="sg-2"),
        receipts.Receipt(provider="sendgrid", dedup_key="sendgrid:e3", kind=receipts.DELIVERED, raw="delivered",
                         provider_message_id="sg-unknown"),
    ]
    with django_capture_on_commit_callbacks(execute=True):  # as after the webhook's transaction commits
        assert receipts.apply_receipts(events) == {"applied": 2, "duplicate": 1, "unknown": 1}
    bounced.refresh_from_db()
    delivered.refresh_from_db()
    assert (bounced.status, delivered.status) == ("failed", "delivered")

    found = scrape(client)
    assert only(found, "notify_receipts_total") == {
        key("notify_receipts_total", provider="sendgrid", result="applied"): 2.0,
        key("notify_receipts_total", provider="sendgrid", result="duplicate"): 1.0,
        key("notify_receipts_total", provider="sendgrid", result="unknown"): 1.0,
    }
    assert only(found, "notify_email_bounces_total") == {
        key("notify_email_bounces_total", provider="sendgrid", type="hard"): 1.0}
    outcomes = "notify_notification_outcomes_total"
    assert only(found, outcomes) == {
        key(outcomes, status="failed", reason="provider_bounced", channel="email", tier="standard"): 1.0,
        key(outcomes, status="delivered", reason="", channel="email", tier="standard"): 1.0,
    }


# --- scrape-time gauges ---------------------------------------------------------------------------

def test_gauges_show_scheduler_lag_pending_rows_dead_letters_and_queues(client,
                                                                         django_capture_on_commit_callbacks):
    r = Recipient.objects.create(user_id=f"m-{uuid.uuid4().hex[:8]}", email="a@example.com")
    now = timezone.now()
    for _ in range(2):
        _notification(r, "email", "standard", status="scheduled", queued_at=None, due_at=now - timedelta(seconds=45))
    _notification(r, "email", "standard", status="scheduled", queued_at=None, due_at=now + timedelta(hours=1))
    _notification(r, "sms", "high", queued_at=now - timedelta(seconds=10))
    _notification(r, "push", "high", status="sending", lease_until=now - timedelta(seconds=5))
    _notification(r, "sms", "standard", status="failed", reason="attempts_exhausted",
                  dead_lettered_at=now - timedelta(seconds=120))

    found = scrape(client)
    pending = "notify_notifications_pending"
    assert only(found, pending) == {key(pending, status="scheduled"): 3.0, key(pending, status="queued"): 1.0,
                                    key(pending, status="sending"): 1.0}
    assert found[key("notify_scheduler_due_unreleased")] == 2.0
    assert 45.0 <= found[key("notify_scheduler_lag_seconds")] < 60.0
    assert 10.0 <= found[key("notify_queued_oldest_age_seconds", tier="high")] < 25.0
    assert found[key("notify_queued_oldest_age_seconds", tier="standard")] == 0.0  # none queued
    assert found[key("notify_expired_leases")] == 1.0
    assert found[key("notify_dead_letters")] == 1.0
    assert 120.0 <= found[key("notify_dead_letters_oldest_age_seconds")] < 135.0
    assert only(found, "notify_scrape_source_up") == {
        key("notify_scrape_source_up", source=s): 1.0 for s in ("broker", "redis", "postgres")}
    depth = "notify_queue_depth"
    from core.queues import ALL_QUEUES, SEND_QUEUES

    assert only(found, depth) == {key(depth, queue=q): 0.0 for q in ALL_QUEUES}

    with django_capture_on_commit_callbacks(execute=True):
        assert scheduler.release_due() == 2

    found = scrape(client)
    assert found[key("notify_scheduler_due_unreleased")] == 0.0
    assert found[key("notify_scheduler_lag_seconds")] == 0.0
    assert found[key("notify_scheduler_released_total")] == 2.0
    assert 0.0 <= found[key("notify_scheduler_heartbeat_age_seconds")] < 5.0
    # The two released standard emails travel in one task on standard.email.
    assert only(found, depth) == {key(depth, queue=q): (1.0 if q == "standard.email" else 0.0) for q in ALL_QUEUES}
    oldest = "notify_queue_oldest_age_seconds"
    ages = only(found, oldest)
    assert set(ages) == {key(oldest, queue=q) for q in SEND_QUEUES}  # ages: send queues only
    assert 0.0 <= ages[key(oldest, queue="standard.email")] < 5.0
    assert queue_snapshot()["standard.email"]["depth"] == 1


def test_a_queues_oldest_age_is_counted_on_the_platform_clock(monkeypatch, django_capture_on_commit_callbacks):
    """``queued_at`` is stamped on the platform clock: with that clock three days ahead of the host's,
    a message queued 30 minutes ago (platform) is 30 minutes old, not 0 (before: the host's time)."""
    from core import clock

    ahead = timezone.now() + timedelta(days=3)
    monkeypatch.setattr(clock, "now", lambda: ahead)
    r = Recipient.objects.create(user_id=f"m-{uuid.uuid4().hex[:8]}", email="a@example.com")
    n = _notification(r, "email", "standard", status="scheduled", queued_at=None, due_at=ahead)
    with django_capture_on_commit_callbacks(execute=True):
        assert scheduler.release_due() == 1
    Notification.objects.filter(pk=n.pk).update(queued_at=ahead - timedelta(minutes=30))
    snapshot = queue_snapshot()["standard.email"]
    assert (snapshot["depth"], round(snapshot["oldest_age"], 3)) == (1, 1800.0)


def test_a_failing_source_is_reported_and_its_gauges_left_out(client, settings):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{closed}/0"
    settings.CELERY_BROKER_URL = settings.REDIS_URL
    found = scrape(client)
    assert only(found, "notify_scrape_source_up") == {
        key("notify_scrape_source_up", source="broker"): 0.0,
        key("notify_scrape_source_up", source="redis"): 0.0,
        key("notify_scrape_source_up", source="postgres"): 1.0,
    }
    assert not only(found, "notify_queue_depth", "notify_scheduler_heartbeat_age_seconds",
                    "notify_worker_heartbeat_age_seconds", "notify_housekeeping_last_success_timestamp")
    assert found[key("notify_dead_letters")] == 0.0


# --- label hygiene --------------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "http_status", "label"), [
    ("21211", 400, "21211"), ("UNREGISTERED", 404, "UNREGISTERED"), ("550", None, "550"),
    ("timeout", None, "timeout"), ("30007", 400, "4xx"), ("SOMETHING NEW!", 502, "5xx"),
    ("x" * 80, None, "other"), ("", None, ""),
])
def test_error_code_labels_are_bounded(code, http_status, label):
    assert metrics.code_label(code, http_status) == label


def test_unknown_provider_and_outcome_do_not_create_series(client):
    metrics.record_provider_call(provider="made-up", channel="sms", outcome="accepted")
    metrics.record_provider_call(provider="twilio", channel="sms", outcome="duplicate_skipped")
    assert only(scrape(client), "notify_provider_calls_total") == {
        key("notify_provider_calls_total", provider="other", outcome="accepted", code=""): 1.0}


def test_attempts_refused_before_a_call_are_not_provider_calls(client):
    """The no-call attempt of a send the last provider's open breaker refused is not a call (hadv34 #3)."""
    from notifications.delivery.outcomes import attempt_row

    n = Notification(channel="sms", priority="high", attempts=1)
    refused = attempt_row(n, TransientProviderError("twilio_backup", "circuit_open", "breaker open"), latency_ms=0)
    failed = attempt_row(n, TransientProviderError("twilio_backup", "20500", "boom", http_status=503), latency_ms=9)
    metrics.provider_calls(n, [refused, failed])
    assert only(scrape(client), "notify_provider_calls_total") == {
        key("notify_provider_calls_total", provider="twilio_backup", outcome="transient", code="5xx"): 1.0}


# --- multiprocess ---------------------------------------------------------------------------------

def test_a_process_that_records_nothing_writes_no_file(client, prom):
    scrape(client)  # importing the module and scraping create no values
    assert list(prom.iterdir()) == []
    metrics.record_outcome(status="sent", reason="", channel="sms", tier="high")
    assert [p.name for p in prom.iterdir()] == [f"counter_{os.getpid()}.db"]


def test_counts_of_several_processes_are_summed_at_scrape(client, prom):
    assert metrics.MULTIPROCESS, "PROMETHEUS_MULTIPROC_DIR must be set before prometheus_client is imported"
    metrics.record_provider_call(provider="twilio", channel="sms", outcome="accepted", seconds=0.2)
    metrics.record_accept_to_provider(tier="high", channel="sms", seconds=0.6)
    child = textwrap.dedent("""
        import django
        django.setup()
        from notifications import metrics
        assert metrics.MULTIPROCESS
        for _ in range(2):
            metrics.record_provider_call(provider="twilio", channel="sms", outcome="accepted", seconds=0.2)
        metrics.record_accept_to_provider(tier="high", channel="sms", seconds=0.3)
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(prom), "DJANGO_SETTINGS_MODULE": "config.test_settings"}
    done = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(list(prom.glob("counter_*.db"))) == 2  # one file per process
    assert len(list(prom.glob("histogram_*.db"))) == 2

    found = scrape(client)
    assert found[key("notify_provider_calls_total", provider="twilio", outcome="accepted", code="")] == 3.0
    assert found[key("notify_provider_call_duration_seconds_count", provider="twilio")] == 3.0
    latency = "notify_accept_to_provider_seconds"
    assert found[key(latency + "_count", tier="high", channel="sms")] == 2.0
    assert found[key(latency + "_sum", tier="high", channel="sms")] == pytest.approx(0.9)
    assert found[key(latency + "_bucket", tier="high", channel="sms", le="0.25")] == 0.0
    assert found[key(latency + "_bucket", tier="high", channel="sms", le="0.5")] == 1.0
    assert found[key(latency + "_bucket", tier="high", channel="sms", le="0.75")] == 2.0


def test_breaker_state_gauge_and_isolation_counters(client, settings):
    from providers import isolation
    from tests.conftest import reset_isolation

    reset_isolation()
    breaker = {"BREAKER": {"WINDOW_SECONDS": 10, "MIN_CALLS": 2, "FAILURE_RATE": 0.5, "OPEN_SECONDS": 30}}
    settings.PROVIDER_LIMITS = {**settings.PROVIDER_LIMITS, "twilio": breaker, "fcm": breaker}
    try:
        assert isolation.record_calls("twilio", failed=2) == "open"
        # fcm's open period ended with no call since (an idle backup): waiting for a probe, not open.
        assert isolation.record_calls("fcm", failed=2) == "open"
        get_redis().hset("breaker:fcm", "until", 1)
        metrics.isolation_event("breaker_opened", "twilio")
        metrics.isolation_event("failover", "twilio_backup", "high", channel="sms")
        metrics.isolation_event("budget_wait", "sendgrid", "standard", seconds=1.5)
        found = scrape(client)
    finally:
        reset_isolation()
    state = "notify_provider_breaker_state"
    assert only(found, state) == {key(state, provider=p): {"twilio": 2.0, "fcm": 1.0}.get(p, 0.0)
                                  for p in ("twilio", "twilio_backup", "sendgrid", "smtp", "fcm")}
    assert found[key("notify_breaker_opened_total", provider="twilio")] == 1.0
    assert found[key("notify_provider_failovers_total", channel="sms", provider="twilio_backup")] == 1.0
    assert found[key("notify_budget_wait_seconds_total", provider="sendgrid", tier="standard")] == 1.5


def test_events_accepted_and_fallback_steps_are_counted(client, django_capture_on_commit_callbacks):
    from notifications.events import fallback, services
    from notifications.events.models import NotificationType
    from notifications.models import APIClient

    kind = NotificationType.objects.create(key="m_type", name="m", category="shipping", channels=["push", "email"],
                                           routing="fallback")
    api_client = APIClient.objects.create_key(name="metrics-events")[0]
    r = Recipient.objects.create(user_id="m-user")
    with django_capture_on_commit_callbacks(execute=True):
        accepted = services.accept_event(client=api_client, idempotency_key="k", fingerprint="f", kind=kind,
                                         recipients=[r], data={})
    push, email = accepted.notifications
    Notification.objects.filter(pk=push.pk).update(status="suppressed", reason="no_active_device")
    with django_capture_on_commit_callbacks(execute=True):
        assert fallback.settle([(push.pk, "suppressed", "no_active_device", "push")]) == 1
    found = scrape(client)
    assert found[key("notify_events_accepted_total", kind="events")] == 1
    assert found[key("notify_events_accepted_total", kind="notifications")] == 2
    assert found[key("notify_fallback_total", outcome="released")] == 1
    assert Notification.objects.get(pk=email.pk).status == "queued"


def test_digests_opened_closed_and_their_items_are_counted(client, django_capture_on_commit_callbacks):
    from datetime import timedelta

    from core import clock
    from notifications.events import digests, services
    from notifications.events.models import NotificationType
    from notifications.models import APIClient

    kind = NotificationType.objects.create(key="m_digest", name="m", category="social", channels=["push"],
                                           digest={"window_seconds": 60, "key": "{{ data.post }}"})
    api_client = APIClient.objects.create_key(name="metrics-digests")[0]
    one, two = Recipient.objects.create(user_id="m-d1"), Recipient.objects.create(user_id="m-d2")
    with django_capture_on_commit_callbacks(execute=True):
        for idempotency_key, users in (("a", [one, two]), ("b", [one]), ("c", [one])):
            services.accept_event(client=api_client, idempotency_key=idempotency_key, fingerprint="f", kind=kind,
                                  recipients=users, data={"post": "p1"})
    with django_capture_on_commit_callbacks(execute=True):
        later = clock.now() + timedelta(seconds=61)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(clock, "now", lambda: later)
            assert digests.close_due() == 2
    found = scrape(client)
    assert only(found, "notify_digests_total") == {key("notify_digests_total", kind="opened"): 2,
                                                   key("notify_digests_total", kind="items"): 4,
                                                   key("notify_digests_total", kind="closed"): 2}


def test_frequency_capped_rows_are_counted_by_category_and_channel(client, django_capture_on_commit_callbacks):
    """Two rows over the default cap (3 marketing pushes a day) of one user: counted twice, and as
    outcomes ``suppressed``/``frequency_capped``."""
    from core import clock
    from notifications.delivery import caps
    from notifications.delivery.types import Row

    r = Recipient.objects.create(user_id=f"m-cap-{uuid.uuid4().hex[:8]}")
    rows = [_notification(r, "push", "standard", category="marketing", status="sending", attempts=1)
            for _ in range(5)]
    with django_capture_on_commit_callbacks(execute=True):
        caps.admit([Row(n) for n in rows], lambda _n: None, clock.now())
    found = scrape(client)
    assert found[key("notify_frequency_capped_total", category="marketing", channel="push")] == 2
    assert only(found, "notify_frequency_capped_total") == {
        key("notify_frequency_capped_total", category="marketing", channel="push"): 2}
    assert found[key("notify_notification_outcomes_total", status="suppressed", reason="frequency_capped",
                     channel="push", tier="standard")] == 2


def test_the_archiver_counts_what_it_moved_and_the_live_table_estimate_is_shown(client):
    from django.db import connection

    r = Recipient.objects.create(user_id=f"arc-{uuid.uuid4().hex[:8]}")
    old = timezone.now() - timedelta(hours=7)
    for status in ("sent", "delivered", "queued"):
        Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status=status,
                                    created_at=old, updated_at=old)
    assert scheduler.archive() == 2
    with connection.cursor() as cur:
        cur.execute("ANALYZE notifications_notification")
    found = scrape(client)
    assert found[key("notify_archived_total")] == 2.0
    assert found[key("notify_live_notifications_estimate")] == float(Notification.objects.count())


def test_worker_heartbeats_and_the_receipts_buffer_are_shown(client):
    from core import clock
    from core.queues import WORKERS
    from core.redis_client import get_redis
    from notifications import health, receipts_buffer

    heartbeat, buffered = "notify_worker_heartbeat_age_seconds", "notify_receipts_buffered"
    redis = get_redis()
    redis.delete(*(health.WORKER_HEARTBEAT_PREFIX + kind for kind in WORKERS), receipts_buffer.BUFFER_KEY,
                 health.HEARTBEAT_KEY)
    found = scrape(client)
    # Never seen: +Inf, not left out, so an alert needs no absent() (which a failed scrape also fires).
    assert only(found, heartbeat) == {key(heartbeat, worker=kind): math.inf for kind in WORKERS}
    assert found[key("notify_scheduler_heartbeat_age_seconds")] == math.inf
    assert only(found, buffered, f"{buffered}_oldest_age_seconds") == {
        key(buffered): 0.0, key(f"{buffered}_oldest_age_seconds"): 0.0}

    health.write_worker_heartbeat(["high.sms", "high.push", "receipts", "not-a-queue"])
    for seconds_ago in (40, 0):
        received = (clock.now() - timedelta(seconds=seconds_ago)).isoformat()
        receipts_buffer.push([{"provider": "twilio", "received_at": received}])
    try:
        found = scrape(client)
    finally:
        redis.delete(receipts_buffer.BUFFER_KEY, receipts_buffer.DRAIN_FLAG)
    ages = only(found, heartbeat)
    assert set(ages) == {key(heartbeat, worker=kind) for kind in WORKERS}
    assert {k[1][0][1] for k, age in ages.items() if age != math.inf} == {"high", "receipts"}
    assert all(0.0 <= age < 5.0 for age in ages.values() if age != math.inf)
    assert found[key(buffered)] == 2.0
    assert 40.0 <= found[key(f"{buffered}_oldest_age_seconds")] < 55.0
