"""The standard tier's batch path in-process (notifications/delivery/) against a real emulator
subprocess, Postgres and Redis: bulk records, the bulkhead's cap on concurrent calls, the budget,
and the per-row fallbacks for errors."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from core.redis_client import get_redis
from notifications.delivery.pipeline import send_notifications
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification, TimelineEntry
from notifications.sent_markers import find_sent
from preferences.models import Recipient
from providers import isolation
from providers.registry import reset_backends
from tests.providers.conftest import sendgrid_options, twilio_options

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def providers(settings, module_emulator):
    """SMS and email providers of their own names on the emulator; bulkhead of 2 standard calls."""
    module_emulator.reset()
    tag = uuid.uuid4().hex[:6]
    sms, email = f"tw{tag}", f"sg{tag}"
    settings.PROVIDERS = {
        **settings.PROVIDERS,
        "sms": [{"NAME": sms, "BACKEND": "providers.twilio.backend.TwilioSmsBackend",
                 "OPTIONS": twilio_options(module_emulator, STATUS_CALLBACK_URL=None)}],
        "email": [{"NAME": email, "BACKEND": "providers.sendgrid.backend.SendGridEmailBackend",
                   "OPTIONS": sendgrid_options(module_emulator)}],
    }
    settings.PROVIDER_LIMITS = {**settings.PROVIDER_LIMITS,
                                sms: {"MAX_CONCURRENCY": {"high": 1, "standard": 2}},
                                email: {"RATE_PER_S": 100000.0}}
    settings.NOTIFY = {**settings.NOTIFY, "SEND_CONCURRENCY": {"sms": 8, "email": 4, "push": 8}}
    reset_backends()
    yield sms, email
    reset_backends()
    r = get_redis()
    for name in (sms, email):
        keys = list(r.scan_iter(f"*:{name}*"))
        if keys:
            r.delete(*keys)


def queued(channel: str, count: int, **recipient) -> list[str]:
    tag = uuid.uuid4().hex[:8]
    ids = []
    for i in range(count):
        r = Recipient.objects.create(user_id=f"b-{tag}-{i}", phone=f"+1555{i:07d}", email=f"b{tag}{i}@example.org",
                                     **recipient)
        n = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel=channel, priority="standard",
                                        title=f"Hi {i}", body=f"Hello {i}", status="queued")
        ids.append(str(n.pk))
    return ids


def test_email_batch_is_one_request_and_is_recorded_in_bulk(providers, module_emulator):
    _sms, email = providers
    ids = queued("email", 30)

    send_notifications(ids)

    rows = Notification.objects.filter(pk__in=ids)
    assert sorted(set(rows.values_list("status", "provider", "attempts"))) == [("sent", email, 1)]
    message_ids = set(rows.values_list("provider_message_id", flat=True))
    assert len(message_ids) == 1 and "" not in message_ids  # one request, one X-Message-Id
    assert module_emulator.stats("sendgrid") == {"requests": 1, "accepted": 1, "rejected": 0, "messages": 30}
    assert {(m["notification_id"], m["body"]) for m in module_emulator.messages()} == {
        (str(n.pk), n.body) for n in rows}
    assert DeliveryAttempt.objects.filter(notification_id__in=ids, outcome="accepted", provider=email).count() == 30
    assert TimelineEntry.objects.filter(notification_id__in=ids, kind="sent", status="sent").count() == 30
    assert find_sent(ids) == set(ids)


def test_bulkhead_caps_concurrent_calls_of_a_batch(providers, module_emulator):
    sms, _email = providers
    module_emulator.fault(provider="twilio", latency_ms=150)  # slow answers: calls overlap if allowed
    ids = queued("sms", 12)
    seen: list[int] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen.append(isolation.slots_in_use(sms, "standard"))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        send_notifications(ids)  # 8 threads wanted; the bulkhead grants 2
    finally:
        done.set()
        watcher.join()

    assert max(seen) == 2
    assert isolation.slots_in_use(sms, "standard") == 0  # all given back
    assert Notification.objects.filter(pk__in=ids, status="sent").count() == 12
    assert module_emulator.count() == 12


def test_errors_in_a_batch_are_recorded_row_by_row(providers, module_emulator):
    ids = queued("sms", 5)
    bad = Notification.objects.select_related("recipient").get(pk=ids[2])
    module_emulator.fault(provider="twilio", to=bad.recipient.phone, status=400, code=21211)
    slow = Notification.objects.select_related("recipient").get(pk=ids[4])
    module_emulator.fault(provider="twilio", to=slow.recipient.phone, status=503)

    send_notifications(ids)

    status = dict(Notification.objects.filter(pk__in=ids).values_list("id", "status"))
    # 503: a transient error, retried after a full-jitter backoff of 0–10 s: a short one waits as a
    # Celery countdown (`queued`), a longer one in Postgres (`scheduled`).
    assert [status[uuid.UUID(i)] for i in ids[:4]] == ["sent", "sent", "failed", "sent"]
    assert status[uuid.UUID(ids[4])] in ("queued", "scheduled")
    failed = Notification.objects.get(pk=ids[2])
    assert failed.reason == "contact_invalid"
    assert Recipient.objects.get(pk=failed.recipient_id).phone_invalid_reason == "invalid_number"
    retry = Notification.objects.get(pk=ids[4])
    assert (retry.reason, retry.attempts) == ("retry_scheduled", 1)
    assert module_emulator.count() == 3


def test_standard_waits_without_spending_an_attempt_while_the_breaker_is_open(providers, module_emulator, settings):
    sms, _email = providers
    settings.PROVIDER_LIMITS[sms]["BREAKER"] = {"WINDOW_SECONDS": 10, "MIN_CALLS": 2, "FAILURE_RATE": 0.5,
                                                "OPEN_SECONDS": 30}
    assert isolation.record_calls(sms, failed=2) == "open"
    ids = queued("sms", 3)

    send_notifications(ids)

    rows = Notification.objects.filter(pk__in=ids)
    assert sorted(set(rows.values_list("status", "reason", "attempts"))) == [("scheduled", "retry_scheduled", 0)]
    assert all("circuit breaker open" in d for d in rows.values_list("reason_detail", flat=True))
    assert module_emulator.count() == 0
    assert DeliveryEvent.objects.filter(notification_id__in=ids, kind="deferred").count() == 3


def test_a_refused_sendgrid_request_is_retried_as_one_group(providers, module_emulator):
    module_emulator.fault(provider="sendgrid", status=503)
    ids = queued("email", 20)

    send_notifications(ids)

    rows = Notification.objects.filter(pk__in=ids)
    assert sorted(set(rows.values_list("status", "reason", "attempts"))) == [("scheduled", "retry_scheduled", 1)]
    assert len(set(rows.values_list("due_at", flat=True))) == 1  # one backoff: released as one batch again
    assert module_emulator.stats("sendgrid")["requests"] == 1  # not one retry request per recipient
    attempts = DeliveryAttempt.objects.filter(notification_id__in=ids)
    assert sorted(set(attempts.values_list("outcome", "error_code"))) == [("transient", "503")]
    assert attempts.count() == 20
    assert DeliveryEvent.objects.filter(notification_id__in=ids, kind="retry").count() == 20


def test_a_row_whose_lease_lapsed_and_changed_hands_is_not_sent_or_recorded(providers, module_emulator, settings):
    from notifications.delivery import calls

    settings.NOTIFY = {**settings.NOTIFY, "LEASE_SECONDS": 0}  # renew before every call
    ids = queued("sms", 3)
    original = calls.still_ours

    def steal_then_check(rows, seconds):
        # Another worker re-claimed the first row (its lease ran out): its claim number moved on.
        Notification.objects.filter(pk=ids[0]).update(attempts=7, claims=7)
        return original(rows, seconds)

    calls.still_ours = steal_then_check
    try:
        send_notifications(ids)
    finally:
        calls.still_ours = original

    assert Notification.objects.get(pk=ids[0]).status == "sending"  # left to its new owner
    assert module_emulator.count() == 2
    phones = dict(Notification.objects.filter(pk__in=ids).values_list("id", "recipient__phone"))
    assert sorted(m["to"] for m in module_emulator.messages()) == sorted(phones[uuid.UUID(i)] for i in ids[1:])


def test_the_provider_health_page_counts_each_email_of_a_sendgrid_request_and_its_breaker_the_request_once(
        providers, module_emulator):
    """The page's last hour charts attempts, not HTTP requests (docs/OPERATIONS.md, "Provider health
    page"): a refused request of 20 emails is 20 failed attempts there, and one failed call for the
    breaker, which needs 20 calls in its window before it may open."""
    from notifications.provider_minutes import last_hour, sampler

    _sms, email = providers
    sampler.sample()  # the high-water mark: attempts from here on are counted
    module_emulator.fault(provider="sendgrid", status=503)
    ids = queued("email", 20)

    send_notifications(ids)
    sampler.sample()

    assert module_emulator.stats("sendgrid")["requests"] == 1
    assert DeliveryAttempt.objects.filter(notification_id__in=ids, provider=email).count() == 20
    assert isolation.breaker_state(email)["state"] == "closed"
    summary = last_hour.last_hour([email])["providers"][0]["summary"]
    assert (summary["attempts"], summary["errors"]) == (20, 20)
    assert summary["text"].startswith("20 attempts, error share 100.0% (20),")
