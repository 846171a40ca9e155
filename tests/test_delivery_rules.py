"""The delivery pipeline's rules (notifications/delivery/): the checks verdict where its rules combine
(Hypothesis, in memory), and the one outcome rule set that the high tier (a batch of one with the
failover policy) and the standard tier (a batch) now share, in-process against a real emulator
subprocess, Postgres and Redis."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, time, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.redis_client import get_redis
from notifications.delivery.checks import Facts, verdict
from notifications.delivery.outcomes import decide
from notifications.delivery.pipeline import send_notifications
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification
from preferences.models import Preferences, Recipient
from providers.base import ContactInvalidError, PermanentProviderError, SendResult, TransientProviderError
from providers.registry import reset_backends
from tests.providers.conftest import twilio_options

BYPASS = {"security", "transactional"}  # QUIET_HOURS_BYPASS_CATEGORIES' default


# --- checks: expiry × suppression × quiet hours × priority × category --------------------------

def _oracle(channel, priority, category, expiry, contact, opted_out, quiet, now):
    if expiry == "past":
        return "expired", "ttl_expired", None
    if opted_out:
        return "suppressed", "opted_out_channel", None
    if not contact:
        return "suppressed", {"sms": "no_phone", "email": "no_email"}[channel], None
    bypass = category in BYPASS if category else priority == "high"
    if quiet == "inside" and not bypass:
        return "scheduled", "quiet_hours", (now + timedelta(hours=2)).replace(second=0)
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(channel=st.sampled_from(["sms", "email"]), priority=st.sampled_from(["high", "standard"]),
       category=st.sampled_from(["", "security", "transactional", "marketing", "orders"]),
       expiry=st.sampled_from(["none", "past", "future"]), contact=st.booleans(), opted_out=st.booleans(),
       quiet=st.sampled_from(["none", "inside", "outside"]), hour=st.integers(0, 23), minute=st.integers(0, 59))
def test_the_checks_verdict_combines_expiry_suppression_and_quiet_hours_in_order(
        channel, priority, category, expiry, contact, opted_out, quiet, hour, minute):
    now = datetime(2030, 3, 1, hour, minute, 30, tzinfo=UTC)
    recipient = Recipient(user_id="h", phone="+15550000001" if contact else "",
                          email="h@example.org" if contact else "", timezone="UTC")
    window = {"none": (None, None),
              "inside": ((now - timedelta(hours=1)).time().replace(second=0),
                         (now + timedelta(hours=2)).time().replace(second=0)),
              "outside": ((now + timedelta(hours=1)).time().replace(second=0),
                          (now + timedelta(hours=2)).time().replace(second=0))}[quiet]
    recipient.preferences = Preferences(recipient=recipient, opt_outs=[channel] if opted_out else [],
                                        quiet_start=window[0], quiet_end=window[1], quiet_timezone="UTC")
    expires_at = {"none": None, "past": now - timedelta(seconds=1), "future": now + timedelta(hours=1)}[expiry]
    n = Notification(id=uuid.uuid4(), recipient=recipient, channel=channel, priority=priority, category=category,
                     expires_at=expires_at, status="sending", attempts=1)

    found = verdict(n, Facts(stopped_phones=set()), now)

    expected = _oracle(channel, priority, category, expiry, contact, opted_out, quiet, now)
    assert (None if found is None else (found.status, found.reason, found.until)) == expected
    if found is not None and expected[0] == "scheduled":
        assert time(0) <= window[1] and found.kind == "deferred"


@pytest.mark.parametrize("campaign", [False, True])
def test_a_campaign_row_never_takes_its_types_user_overrides_even_gained_after_launch(campaign):
    """hadvroads 2: a type made ``required`` and quiet-hours ``bypass`` after a campaign of it was
    launched reached an opted-out user and one in quiet hours. A bulk send never overrides users'
    choices (campaigns of such a type are refused at creation; the send holds the rule too)."""
    from notifications.events.models import NotificationType

    now = datetime(2030, 3, 1, 12, 0, tzinfo=UTC)
    kind = NotificationType(key="newsx", category="news", channels=["sms"], required=True, quiet_hours="bypass")
    opted = Recipient(user_id="u6", phone="+15550000001", timezone="UTC")
    opted.preferences = Preferences(recipient=opted, opt_outs=["sms"])
    quiet = Recipient(user_id="u4", phone="+15550000002", timezone="UTC")
    quiet.preferences = Preferences(recipient=quiet, quiet_start=time(0, 0), quiet_end=time(23, 59),
                                    quiet_timezone="UTC")
    campaign_id = uuid.uuid4() if campaign else None

    def found(recipient):
        n = Notification(id=uuid.uuid4(), recipient=recipient, channel="sms", category="news", status="sending",
                         attempts=1, notification_type=kind, campaign_id=campaign_id)
        v = verdict(n, Facts(stopped_phones=set(), kind=kind), now)
        return None if v is None else (v.status, v.reason)

    if campaign:
        assert (found(opted), found(quiet)) == (("suppressed", "opted_out_channel"), ("scheduled", "quiet_hours"))
    else:  # one user's message of a required, bypassing type: the type's override stands
        assert (found(opted), found(quiet)) == (None, None)


# --- outcomes: one rule set for a batch of 1 or N ------------------------------------------------

def _row(priority="standard", attempts=1):
    return Notification(id=uuid.uuid4(), channel="sms", priority=priority, attempts=attempts,
                        first_attempt_at=datetime(2030, 1, 1, tzinfo=UTC))


ERRORS = {
    "accepted": (SendResult(provider="tw", provider_message_id="SM1", raw_status="queued"), "sent", ""),
    "timeout": (TransientProviderError("tw", "timeout", "no answer"), "retry", ""),
    "503": (TransientProviderError("tw", "503", "unavailable", http_status=503), "retry", ""),
    "invalid": (ContactInvalidError("tw", "21211", "bad number", reason="invalid_number"), "failed",
                "contact_invalid"),
    "refused": (PermanentProviderError("tw", "21602", "body required"), "dead_letter", "permanent_error"),
}


@pytest.mark.parametrize("outcome", sorted(ERRORS))
def test_one_rule_set_for_both_tiers_and_any_batch_size(outcome):
    result, action, reason = ERRORS[outcome]
    now = datetime(2030, 1, 1, 0, 0, 5, tzinfo=UTC)
    decisions = [decide(_row(priority), [result], planned=1, devices=0, waiting=None, now=now)
                 for priority in ("high", "standard") for _ in range(3)]
    assert {(d.action, d.reason) for d in decisions} == {(action, reason)}


def test_a_batch_that_must_wait_defers_without_a_call_in_both_tiers():
    until = datetime(2030, 1, 1, 0, 1, tzinfo=UTC)
    for priority in ("high", "standard"):
        d = decide(_row(priority), [], planned=1, devices=0, waiting=(until, "tw unavailable"), now=until)
        assert (d.action, d.status, d.reason, d.kind, d.until) == ("wait", "scheduled", "retry_scheduled",
                                                                   "deferred", until)
        assert decide(_row(priority), [], planned=1, devices=0, waiting=None, now=until) is None


def test_spent_attempts_dead_letter_a_transient_error_in_both_tiers(settings):
    now = datetime(2030, 1, 2, tzinfo=UTC)  # a day after the first attempt: the retry window has passed
    for priority in ("high", "standard"):
        n = _row(priority, attempts=settings.NOTIFY["MAX_ATTEMPTS"][priority])
        d = decide(n, [ERRORS["503"][0]], planned=1, devices=0, waiting=None, now=now)
        assert (d.action, d.reason) == ("dead_letter", "attempts_exhausted")


@pytest.fixture
def sms_provider(settings, module_emulator):
    module_emulator.reset()
    name = f"tw{uuid.uuid4().hex[:6]}"
    settings.PROVIDERS = {**settings.PROVIDERS, "sms": [{
        "NAME": name, "BACKEND": "providers.twilio.backend.TwilioSmsBackend",
        "OPTIONS": twilio_options(module_emulator, STATUS_CALLBACK_URL=None)}]}
    reset_backends()
    yield name
    reset_backends()
    keys = list(get_redis().scan_iter(f"*:{name}*"))
    if keys:
        get_redis().delete(*keys)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_high_and_standard_record_a_refused_call_alike(sms_provider, module_emulator):
    module_emulator.fault(provider="twilio", status=503)
    tag = uuid.uuid4().hex[:8]
    ids = []
    for i, priority in enumerate(["high", "standard", "standard"]):
        r = Recipient.objects.create(user_id=f"u-{tag}-{i}", phone=f"+1555{i:07d}")
        ids.append(str(Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", priority=priority,
                                                   body=f"Hello {i}", status="queued").pk))

    send_notifications(ids)

    rows = {str(n.pk): n for n in Notification.objects.filter(pk__in=ids)}
    for i in ids:
        n = rows[i]
        assert (n.reason, n.attempts) == ("retry_scheduled", 1)
        assert n.status in ("queued", "scheduled")
        assert list(DeliveryAttempt.objects.filter(notification_id=i).values_list("outcome", "error_code")) == [
            ("transient", "503")]
        assert DeliveryEvent.objects.filter(notification_id=i, kind="retry").count() == 1
    assert module_emulator.count() == 0


# --- findings of the adversarial pass on the pipeline ------------------------------------------------

def _queued_sms(tag: str, priority: str, count: int) -> list[str]:
    ids = []
    for i in range(count):
        r = Recipient.objects.create(user_id=f"u-{tag}-{i}", phone=f"+1555{i:07d}")
        ids.append(str(Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", priority=priority,
                                                   body=f"Hello {i}", status="queued").pk))
    return ids


@pytest.fixture
def sms_with_backup(settings, module_emulator):
    module_emulator.reset()
    names = [f"tw{uuid.uuid4().hex[:6]}", f"twb{uuid.uuid4().hex[:6]}"]
    settings.PROVIDERS = {**settings.PROVIDERS, "sms": [
        {"NAME": names[0], "BACKEND": "providers.twilio.backend.TwilioSmsBackend",
         "OPTIONS": twilio_options(module_emulator, STATUS_CALLBACK_URL=None)},
        {"NAME": names[1], "BACKEND": "providers.twilio.backend.TwilioSmsBackend",
         "OPTIONS": twilio_options(module_emulator, STATUS_CALLBACK_URL=None, ACCOUNT_SID="AC" + "1" * 32,
                                   FROM_NUMBER="+15005550007")}]}
    reset_backends()
    yield names
    reset_backends()
    for name in names:
        keys = list(get_redis().scan_iter(f"*:{name}*"))
        if keys:
            get_redis().delete(*keys)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_an_otp_refused_with_429_by_the_primary_account_goes_to_the_backup_at_once(sms_with_backup, module_emulator):
    """Adversarial finding: a 429 (the primary account's limit) did not fail over, because it does
    not count against the provider's health; the OTP was retried on the primary until dead-lettered."""
    rule = module_emulator.fault(provider="twilio", account="AC" + "0" * 32, status=429, retry_after=20)
    [pk] = _queued_sms(uuid.uuid4().hex[:8], "high", 1)

    send_notifications([pk])

    n = Notification.objects.get(pk=pk)
    assert (n.status, n.provider) == ("sent", sms_with_backup[1])
    assert list(DeliveryAttempt.objects.filter(notification_id=pk).order_by("created_at", "id")
                .values_list("provider", "outcome")) == [(sms_with_backup[0], "transient"),
                                                         (sms_with_backup[1], "accepted")]
    assert module_emulator.fired(rule) == 1
    assert module_emulator.count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_429_stops_the_batch_and_the_rest_waits_without_spending_an_attempt(settings, sms_provider, module_emulator):
    """Adversarial finding: after a 429 with Retry-After the rest of a standard batch was still sent
    into the limit, every row spending an attempt per round."""
    settings.NOTIFY = {**settings.NOTIFY, "SEND_CONCURRENCY": {**settings.NOTIFY["SEND_CONCURRENCY"], "sms": 4}}
    rule = module_emulator.fault(provider="twilio", status=429, retry_after=30)
    ids = _queued_sms(uuid.uuid4().hex[:8], "standard", 12)

    send_notifications(ids)

    assert module_emulator.fired(rule) == 4  # one wave, then the batch stopped
    rows = list(Notification.objects.filter(pk__in=ids))
    called = [n for n in rows if n.attempts_log.exists()]
    waiting = [n for n in rows if not n.attempts_log.exists()]
    assert (len(called), len(waiting)) == (4, 8)
    assert {(n.status, n.reason, n.attempts) for n in called} == {("scheduled", "retry_scheduled", 1)}
    assert {(n.status, n.reason, n.attempts) for n in waiting} == {("scheduled", "retry_scheduled", 0)}
    assert all(n.due_at >= n.updated_at + timedelta(seconds=29) for n in waiting)
    assert module_emulator.count() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_each_attempt_row_carries_its_own_calls_instant(settings, sms_provider, module_emulator):
    """Adversarial finding: every attempt of a batch was stamped with the batch's end, so the lookup
    of a call in doubt (its end minus its latency) started after the call and missed the message."""
    settings.NOTIFY = {**settings.NOTIFY, "SEND_CONCURRENCY": {**settings.NOTIFY["SEND_CONCURRENCY"], "sms": 2}}
    module_emulator.fault(provider="twilio", latency_ms=600)
    ids = _queued_sms(uuid.uuid4().hex[:8], "standard", 4)

    send_notifications(ids)

    instants = sorted(DeliveryAttempt.objects.filter(notification_id__in=ids).values_list("created_at", flat=True))
    assert len(instants) == 4 and module_emulator.count() == 4
    assert instants[2] - instants[1] >= timedelta(milliseconds=500)  # two waves, two instants


def test_a_push_sent_to_one_of_two_devices_says_which_error_the_other_met():
    """Adversarial finding: one device accepted, the other got a 429; the row is sent (one status per
    notification, the other device is not retried) and its detail says what the other device met."""
    n = Notification(id=uuid.uuid4(), channel="push", priority="standard", attempts=1)
    limited = TransientProviderError("fcm", "QUOTA_EXCEEDED", "quota exceeded", http_status=429)
    decision = decide(n, [SendResult(provider="fcm", provider_message_id="m1"), limited], planned=2, devices=2,
                      waiting=None, now=datetime(2026, 12, 2, tzinfo=UTC))
    assert (decision.action, decision.status) == ("sent", "sent")
    assert decision.detail == ("accepted for 1 of 2 device(s); not reached: fcm QUOTA_EXCEEDED: quota exceeded "
                               "(not retried: the notification is sent)")
    both = decide(n, [SendResult(provider="fcm", provider_message_id="m1")] * 2, planned=2, devices=2,
                  waiting=None, now=datetime(2026, 12, 2, tzinfo=UTC))
    assert both.detail == "accepted for 2 of 2 device(s)"



@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_an_otp_whose_user_is_erased_while_its_first_provider_fails_is_not_failed_over(
        sms_with_backup, module_emulator, monkeypatch):
    """hadv24c 1: the erasure came while the primary account's call was failing (503); the failover
    then sent the erased user's code to the erased number through the backup account. The failover
    reads the erasure first; the row goes to its retry, whose checks cancel it (recipient_erased)."""
    from core import clock
    from notifications.delivery import calls

    rule = module_emulator.fault(provider="twilio", account="AC" + "0" * 32, status=503)
    [pk] = _queued_sms(uuid.uuid4().hex[:8], "high", 1)
    first_send = calls._send

    def send_then_erase(*args, **kwargs):
        out = first_send(*args, **kwargs)
        Recipient.objects.filter(notifications__pk=pk).update(erased_at=clock.now())  # the erasure commits
        return out

    monkeypatch.setattr(calls, "_send", send_then_erase)
    send_notifications([pk])

    n = Notification.objects.get(pk=pk)
    assert (module_emulator.fired(rule), module_emulator.count()) == (1, 0)
    assert list(DeliveryAttempt.objects.filter(notification_id=pk).values_list("provider", "outcome")) == [
        (sms_with_backup[0], "transient")]
    assert (n.status, n.reason) == ("queued", "retry_scheduled")  # a high row retries at once
