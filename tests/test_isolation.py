"""Isolation mechanisms (providers/isolation.py, docs/ARCHITECTURE.md §8) against the real Redis, and the router
and batch path against the whole stack: reserved high budget, circuit breaker, bulkhead, failover."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from bench.stack import wait_until
from core.redis_client import get_redis
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification
from providers import isolation
from tests.e2e import SENT, make_user, send, wait_status

pytestmark = pytest.mark.timeout(120)

PRIMARY_SID = "AC" + "0" * 32
BACKUP_SID = "AC" + "1" * 32


def _forget(provider: str) -> None:
    r = get_redis()
    keys = [k for pattern in (f"bucket:{provider}:*", f"breaker:{provider}*", f"bulkhead:{provider}:*")
            for k in r.scan_iter(pattern)]
    if keys:
        r.delete(*keys)


@pytest.fixture
def provider(settings):
    """A provider name of its own (100 messages/s, 10 of them reserved for high; bulkhead 3 standard
    calls; breaker: 5 calls, 50 %, open 0.5 s), with no state in Redis before or after."""
    name = f"p{uuid.uuid4().hex[:8]}"
    settings.PROVIDER_LIMITS = {
        **settings.PROVIDER_LIMITS,
        name: {"RATE_PER_S": 100.0, "HIGH_RESERVED_PER_S": 10.0,
               "MAX_CONCURRENCY": {"high": 1, "standard": 3},
               "BREAKER": {"WINDOW_SECONDS": 10, "MIN_CALLS": 5, "FAILURE_RATE": 0.5, "OPEN_SECONDS": 0.5}},
    }
    _forget(name)
    yield name
    _forget(name)


def test_standard_traffic_never_takes_the_reserved_high_tokens(provider):
    taken: list[int] = []
    started = time.monotonic()

    def drain():
        while time.monotonic() - started < 1.0:
            granted, _wait = isolation.take_tokens(provider, "standard", 25)
            taken.append(granted)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started

    # The reserve is untouched: exactly its capacity (10 tokens = 10/s × 1 s burst) is left...
    assert float(get_redis().hget(f"bucket:{provider}:high", "t")) == 10.0
    # ...and standard got no more than its own 90/s: a full bucket (90) plus the refill.
    assert 90 <= sum(taken) <= 90 + 90 * elapsed + 1
    # The high tier gets its reserve at once, all or nothing, even right after standard drained it all.
    assert isolation.take_tokens(provider, "high", 10, partial=False) == (10, 0.0)
    granted, wait = isolation.take_tokens(provider, "standard", 50)
    assert granted < 50 and wait > 0


def test_high_tier_borrows_unused_standard_budget_but_never_the_reverse(provider):
    # Idle bucket: high may take its 10 reserved plus the 90 of standard.
    assert isolation.take_tokens(provider, "high", 100, partial=False)[0] == 100
    assert isolation.take_tokens(provider, "standard", 10)[0] <= 1  # ~nothing left for standard


def test_breaker_opens_past_the_failure_rate_fails_fast_then_probes(provider):
    assert isolation.record_calls(provider, ok=4) == "closed"
    assert isolation.record_calls(provider, failed=3) == "closed"  # 3 of 7 < 50 %
    assert isolation.breaker_allows(provider) == isolation.BreakerVerdict(True)
    assert isolation.record_calls(provider, failed=2) == "open"  # 5 of 9 ≥ 50 %, ≥ 5 calls
    began = isolation.breaker_state(provider)["since_ms"]
    assert began > 0 and isolation.breaker_state(provider)["until_ms"] == began + 500

    verdict = isolation.breaker_allows(provider)
    assert verdict.allowed is False and 0 < verdict.retry_in <= 0.5
    assert isolation.breaker_state(provider)["state"] == "open"

    time.sleep(0.6)
    # The open period is over but no call asked yet: Redis still says "open", the breaker reports
    # that a probe is due (an idle backup would otherwise read open for ever, hadv34).
    assert get_redis().hget(f"breaker:{provider}", "state") == b"open"
    assert isolation.breaker_state(provider)["state"] == "probe_due"
    probe = isolation.breaker_allows(provider)
    assert (probe.allowed, probe.probe) == (True, True)
    assert isolation.breaker_state(provider)["state"] == "half_open"
    assert isolation.breaker_allows(provider).allowed is False  # one probe at a time
    assert isolation.record_calls(provider, failed=1, probe=True) == "open"  # failed probe: open again
    assert isolation.breaker_allows(provider).allowed is False

    time.sleep(0.6)
    probe = isolation.breaker_allows(provider)
    assert probe.probe is True
    assert isolation.record_calls(provider, ok=1, probe=True) == "closed"
    assert isolation.breaker_allows(provider) == isolation.BreakerVerdict(True)
    # Closing forgot the old failures: one more failure does not reopen it.
    assert isolation.record_calls(provider, failed=1) == "closed"
    state = isolation.breaker_state(provider)
    # One spell (the failed probe re-opened it): began at the first opening, ended at the good probe.
    assert state == {"state": "closed", "until_ms": 0, "opened": 2, "since_ms": began,
                     "closed_ms": state["closed_ms"]}
    assert state["closed_ms"] >= began + 1000


def test_rate_limited_and_bad_requests_do_not_count_against_provider_health():
    from providers.base import ContactInvalidError, TransientProviderError

    assert isolation.is_failure(TransientProviderError("twilio", "timeout"))
    assert isolation.is_failure(TransientProviderError("twilio", "20500", http_status=503))
    assert not isolation.is_failure(TransientProviderError("twilio", "20429", http_status=429))
    assert not isolation.is_failure(ContactInvalidError("twilio", "21211", reason="invalid_number"))


def test_bulkhead_caps_concurrent_slots_and_expires_leaked_ones(provider):
    first = isolation.acquire_slots(provider, "standard", 2, lease_seconds=10)
    second = isolation.acquire_slots(provider, "standard", 5, lease_seconds=10)
    assert (len(first), len(second)) == (2, 1)
    assert isolation.acquire_slots(provider, "standard", 1, lease_seconds=10) == []
    assert isolation.slots_in_use(provider, "standard") == 3
    assert len(isolation.acquire_slots(provider, "high", 5, lease_seconds=10)) == 1  # tiers apart
    isolation.release_slots(provider, "standard", first)
    assert len(isolation.acquire_slots(provider, "standard", 5, lease_seconds=0.2)) == 2
    time.sleep(0.3)  # a killed worker's slots come back when their lease runs out
    assert len(isolation.acquire_slots(provider, "standard", 5, lease_seconds=10)) == 2


# --- through the whole stack ------------------------------------------------------------------

@pytest.fixture
def open_primary_sms(stack, settings):
    """Open the primary SMS provider's circuit breaker as five timeouts would (the stack's breaker
    opens after 5 failing calls and stays open 3 s); closed again afterwards."""
    settings.PROVIDER_LIMITS = {**settings.PROVIDER_LIMITS, "twilio": {
        "BREAKER": {"WINDOW_SECONDS": 10, "MIN_CALLS": 5, "FAILURE_RATE": 0.5, "OPEN_SECONDS": 3}}}
    _forget("twilio")
    assert isolation.record_calls("twilio", failed=5) == "open"
    yield
    _forget("twilio")


@pytest.mark.e2e
def test_open_breaker_fails_high_over_to_the_backup_and_standard_waits(api, emulator, uid, open_primary_sms):
    user = make_user(api, uid)
    otp = send(api, uid, "sms", priority="high")
    promo = send(api, uid, "sms", priority="standard")

    n = wait_status(otp, SENT, timeout=10)
    assert n.provider == "twilio_backup"
    [message] = emulator.messages(notification_id=otp)
    assert (message["account"], message["to"]) == (BACKUP_SID, user["phone"])
    assert list(DeliveryAttempt.objects.filter(notification_id=otp).values_list("provider", "outcome")) == [
        ("twilio_backup", "accepted")]

    # Standard waits for its primary: back in Postgres until the breaker's probe, no attempt spent.
    waiting = wait_until(lambda: Notification.objects.filter(pk=promo, status="scheduled").first(), 10,
                         message="standard SMS deferred")
    assert waiting.reason == "retry_scheduled" and "circuit breaker open" in waiting.reason_detail
    assert waiting.attempts == 0
    assert emulator.messages(notification_id=promo) == []

    # The breaker turns half-open after 3 s; the probe succeeds and closes it; the row goes out.
    n = wait_status(promo, SENT, timeout=20)
    assert n.provider == "twilio"
    [message] = emulator.messages(notification_id=promo)
    assert message["account"] == PRIMARY_SID
    assert DeliveryEvent.objects.filter(notification_id=promo, kind="deferred").count() >= 1
    assert isolation.breaker_state("twilio")["state"] == "closed"


def test_out_of_range_isolation_settings_fail_the_system_check(settings):
    from django.core import checks

    settings.PROVIDER_LIMITS = {**settings.PROVIDER_LIMITS,
                                "twilio": {"RATE_PER_S": 0, "MAX_CONCURRENCY": {"high": 1, "standard": 0}}}
    settings.NOTIFY = {**settings.NOTIFY, "BATCH_SIZE": {**settings.NOTIFY["BATCH_SIZE"], "email": 5000}}
    found = checks.run_checks()
    # Isolation checks its own settings (providers.E002); the pipeline its batch sizes (notifications.E002).
    assert [e.msg for e in found if e.id == "providers.E002"] == [
        'PROVIDER_LIMITS["twilio"] RATE_PER_S (PROVIDER_RATE_PER_S) must be > 0 messages/s, got 0',
        "PROVIDER_LIMITS[\"twilio\"] MAX_CONCURRENCY['standard'] (BULKHEAD_STANDARD) must be >= 1, got 0",
    ]
    assert [e.msg for e in found if e.id == "notifications.E002"] == [
        'NOTIFY["BATCH_SIZE"]["email"] (BATCH_SIZE_EMAIL) must be in 1..1000 (SendGrid takes at most 1,000 '
        "recipients per request), got 5000",
    ]


@pytest.mark.parametrize(("batch_api", "probe", "expected"), [
    (False, False, (0, 15)), (True, False, (0, 1)), (False, True, (98, 15))])
def test_answers_of_429_are_not_counted_healthy(monkeypatch, batch_api, probe, expected):
    """hadv27: Twilio answering 503 below its rate and 429 above it read ok 98 / failed 15 a second,
    and the breaker never opened. 429s count as neither, but a probe answered 429 was answered."""
    from notifications.delivery import calls
    from providers.base import TransientProviderError

    outcomes = ([TransientProviderError("twilio", "20429", http_status=429)] * 98
                + [TransientProviderError("twilio", "20500", http_status=503)] * 15)
    if batch_api:
        outcomes = outcomes[-16:]  # one request of a batch API: some 429, some 503 answers
    seen = []
    monkeypatch.setattr(calls.isolation, "record_calls", lambda name, **kw: seen.append(kw) or "closed")
    calls._count_calls("twilio", outcomes, batch_api, probe)
    assert [(kw["ok"], kw["failed"]) for kw in seen] == [expected]


def test_a_batch_request_answered_429_alone_counts_as_nothing(monkeypatch):
    from notifications.delivery import calls
    from providers.base import TransientProviderError

    seen = []
    monkeypatch.setattr(calls.isolation, "record_calls", lambda name, **kw: seen.append(kw) or "closed")
    calls._count_calls("sendgrid", [TransientProviderError("sendgrid", "429", http_status=429)] * 3, True, False)
    assert [(kw["ok"], kw["failed"]) for kw in seen] == [(0, 0)]  # nothing (record_calls writes nothing)
