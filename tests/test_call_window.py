"""The calls stage's sliding window (notifications/delivery/calls.py), in-process against a real
emulator subprocess, Postgres and Redis: a slow answer holds one slot, not a wave; rows whose calls
ended are recorded while the rest are in flight; a 429 stops the window; a call whose row's lease
no longer covers it is never made."""

from __future__ import annotations

import threading
import uuid

import pytest

from bench.stack import wait_until
from core.redis_client import get_redis
from notifications.delivery import claim
from notifications.delivery.pipeline import send_notifications
from notifications.models import DeliveryAttempt, Notification
from providers.registry import reset_backends
from tests.providers.conftest import twilio_options
from tests.test_batch_path import queued

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

SLOW_PHONE = "+15550000000"  # queued()'s first row


@pytest.fixture
def sms(settings, module_emulator):
    """An SMS provider of its own name on the emulator: 2 standard calls in flight (bulkhead),
    10 s timeout, rows recorded every 3."""
    module_emulator.reset()
    name = f"tw{uuid.uuid4().hex[:6]}"
    settings.PROVIDERS = {**settings.PROVIDERS, "sms": [{
        "NAME": name, "BACKEND": "providers.twilio.backend.TwilioSmsBackend",
        "OPTIONS": twilio_options(module_emulator, STATUS_CALLBACK_URL=None, TIMEOUT=10)}]}
    settings.PROVIDER_LIMITS = {**settings.PROVIDER_LIMITS, name: {"MAX_CONCURRENCY": {"high": 1, "standard": 2}}}
    settings.NOTIFY = {**settings.NOTIFY, "SEND_CONCURRENCY": {"sms": 2, "email": 4, "push": 8},
                       "RECORD_EVERY_ROWS": 3, "RECORD_EVERY_SECONDS": 0.1}
    reset_backends()
    yield name
    reset_backends()
    r = get_redis()
    keys = list(r.scan_iter(f"*:{name}*"))
    if keys:
        r.delete(*keys)


def test_a_slow_answer_holds_one_slot_and_the_rest_is_recorded_meanwhile(sms, module_emulator):
    ids = queued("sms", 12)
    module_emulator.fault(provider="twilio", to=SLOW_PHONE, latency_ms=4000)
    worker = threading.Thread(target=send_notifications, args=(ids,))
    worker.start()
    try:
        # The 11 fast rows go through the other slot and are recorded while the slow call is in
        # flight (in waves of 2, the slow call would have held back every row behind it).
        wait_until(lambda: Notification.objects.filter(pk__in=ids[1:], status="sent").count() == 11, 3.5,
                   message="the fast rows recorded while the slow call is in flight")
        assert Notification.objects.get(pk=ids[0]).status == "sending"
        assert module_emulator.count() == 11
    finally:
        worker.join(30)
    rows = Notification.objects.filter(pk__in=ids)
    assert sorted(set(rows.values_list("status", "attempts"))) == [("sent", 1)]
    assert DeliveryAttempt.objects.filter(notification_id__in=ids).count() == 12
    assert module_emulator.stats("twilio")["requests"] == 12


def test_a_429_stops_the_window_and_the_rest_waits_without_an_attempt(sms, module_emulator):
    ids = queued("sms", 10)
    module_emulator.fault(provider="twilio", status=429, code=20429, retry_after=30)

    send_notifications(ids)

    # The two calls in flight when the first 429 came back were made; no call started after it.
    assert module_emulator.stats("twilio")["requests"] == 2
    rows = list(Notification.objects.filter(pk__in=ids).values_list("status", "reason", "attempts"))
    assert sorted(rows) == sorted([("scheduled", "retry_scheduled", 1)] * 2 + [("scheduled", "retry_scheduled", 0)] * 8)
    assert DeliveryAttempt.objects.filter(notification_id__in=ids, error_code="20429").count() == 2


def test_a_call_whose_lease_no_longer_covers_it_is_never_made(sms, module_emulator, monkeypatch):
    ids = queued("sms", 4)
    real = claim.covers_call
    # The lease keeper says the last row's lease (as last written) would run out during a call:
    # e.g. the heartbeat stalled while that message waited for its slot.
    monkeypatch.setattr("notifications.delivery.calls.covers_call", lambda pk: str(pk) != ids[-1] and real(pk))

    send_notifications(ids)

    assert sorted(m["to"] for m in module_emulator.messages()) == [f"+1555{i:07d}" for i in range(3)]
    rows = {str(n.pk): n for n in Notification.objects.filter(pk__in=ids)}
    assert [rows[i].status for i in ids[:3]] == ["sent"] * 3
    # Left to its lease: the reconciler re-drives it once the lease runs out (never sent from here).
    assert (rows[ids[-1]].status, DeliveryAttempt.objects.filter(notification_id=ids[-1]).count()) == ("sending", 0)


def test_covers_reads_the_lease_last_written(settings):
    from datetime import timedelta

    from core import clock
    from notifications.delivery.leases import LeaseKeeper

    keeper = LeaseKeeper()
    settings.NOTIFY = {**settings.NOTIFY, "LEASE_HEARTBEAT": False}
    keeper.hold([("a", 1), ("b", 1)], clock.now() + timedelta(seconds=30))
    keeper.hold([("c", 1)], clock.now() + timedelta(seconds=5))
    assert [keeper.covers(pk, 10) for pk in ("a", "b", "c", "unknown")] == [True, True, False, False]
    keeper.release(["a"])
    assert keeper.covers("a", 10) is False


def test_a_worker_killed_before_its_record_leaves_the_markers_and_nothing_is_sent_twice(
        sms, module_emulator, monkeypatch, settings):
    from datetime import timedelta

    from core import clock
    from notifications import scheduler
    from notifications.delivery import record

    settings.NOTIFY = {**settings.NOTIFY, "OUTCOME_UNKNOWN_WAIT_SECONDS": {"high": 0, "standard": 0}}
    ids = queued("sms", 6)
    # The worker dies after its calls were accepted and before anything of them is recorded.
    monkeypatch.setattr(record, "record", lambda *args, **kwargs: None)
    send_notifications(ids)
    monkeypatch.undo()
    assert module_emulator.count() == 6
    assert set(Notification.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"sending"}

    # Its leases run out; the reconciler re-drives the rows; the next worker finds the markers.
    Notification.objects.filter(pk__in=ids).update(lease_until=clock.now() - timedelta(seconds=1))
    assert scheduler.reconcile()["leases"] == 6
    scheduler.release_due()
    send_notifications(ids)

    assert module_emulator.count() == 6  # nothing sent twice
    assert set(Notification.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"sent"}
    assert sorted(DeliveryAttempt.objects.filter(notification_id__in=ids).values_list("outcome", flat=True)) == [
        "duplicate_skipped"] * 6
