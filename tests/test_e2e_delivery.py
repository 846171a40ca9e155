"""End to end: the API, real Celery workers and beat, Postgres, Redis, and the provider emulator
driven by the real Twilio, SendGrid and firebase-admin SDKs. Nothing is mocked."""

from __future__ import annotations

import concurrent.futures
import time
from datetime import UTC, datetime, timedelta

import pytest

from bench.stack import wait_until
from core.redis_client import get_redis
from notifications.models import DeliveryAttempt, Notification
from preferences.models import Device, Recipient
from tests.conftest import reset_isolation
from tests.e2e import SENT, events, make_user, send, wait_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

CHANNELS = ["sms", "email", "push"]


def to_of(user: dict, channel: str) -> str:
    return {"sms": user["phone"], "email": user["email"], "push": user["tokens"][0]}[channel]


@pytest.mark.parametrize("channel", CHANNELS)
@pytest.mark.parametrize("priority", ["high", "standard"])
def test_immediate_send_is_delivered_exactly_once(api, emulator, uid, channel, priority):
    user = make_user(api, uid)
    nid = send(api, uid, channel, priority=priority)
    n = wait_status(nid, SENT)
    got = wait_until(lambda: emulator.messages(notification_id=nid), 5, message="emulator record")
    time.sleep(0.5)  # anything duplicated would arrive within this
    got = emulator.messages(notification_id=nid)
    assert len(got) == 1
    assert got[0]["channel"] == channel
    assert got[0]["to"] == to_of(user, channel)
    assert got[0]["body"] == "hello"
    assert n.provider_message_id == got[0]["provider_message_id"]
    assert n.attempts == 1
    assert events(nid) == ["accepted", "sent"]
    attempt = DeliveryAttempt.objects.get(notification_id=nid)
    assert attempt.outcome == "accepted"

    detail = api.request("GET", f"/v1/notifications/{nid}").json()
    assert detail["status"] in SENT
    assert [e["kind"] for e in detail["timeline"] if not e["kind"].startswith("receipt:")] == ["accepted", "sent"]
    assert detail["attempts_log"][0]["provider_message_id"] == got[0]["provider_message_id"]


@pytest.mark.parametrize("channel", CHANNELS)
def test_scheduled_send_waits_in_postgres_and_goes_on_time(api, emulator, uid, channel):
    make_user(api, uid)
    at = datetime.now(UTC) + timedelta(seconds=3)
    nid = send(api, uid, channel, scheduled_at=at.isoformat())
    assert Notification.objects.get(pk=nid).status == "scheduled"
    time.sleep(1)
    assert emulator.messages(notification_id=nid) == []
    wait_status(nid, SENT, timeout=15)
    got = emulator.messages(notification_id=nid)
    assert len(got) == 1
    received = datetime.fromtimestamp(got[0]["received_at_ms"] / 1000, UTC)
    assert at <= received < at + timedelta(seconds=4)
    assert events(nid) == ["accepted", "released", "sent"]


def test_idempotent_replay_over_http_sends_once(api, emulator, uid):
    make_user(api, uid)
    body = {"user_id": uid, "channel": "sms", "content": {"body": "code 123"}, "priority": "high"}
    first = api.send(body, key="otp-1")
    second = api.send(body, key="otp-1")
    assert first.status_code == second.status_code == 202
    assert first.json() == second.json()
    assert second.headers["Idempotent-Replayed"] == "true"
    mismatch = api.send({**body, "content": {"body": "code 999"}}, key="otp-1")
    assert mismatch.status_code == 422
    assert mismatch.json()["error"]["fields"][0]["field"] == "Idempotency-Key"
    nid = first.json()["id"]
    wait_status(nid, SENT)
    time.sleep(0.5)
    assert len(emulator.messages(notification_id=nid)) == 1
    assert Notification.objects.filter(recipient_id=uid).count() == 1


def test_concurrent_duplicate_posts_make_one_notification(api, emulator, uid):
    make_user(api, uid)
    body = {"user_id": uid, "channel": "email", "content": {"title": "t", "body": "b"}}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: api.send(body, key="dup-key"), range(8)))
    assert [r.status_code for r in responses] == [202] * 8
    assert len({r.json()["id"] for r in responses}) == 1
    assert sum(1 for r in responses if "Idempotent-Replayed" not in r.headers) == 1
    nid = responses[0].json()["id"]
    wait_status(nid, SENT)
    time.sleep(0.5)
    assert Notification.objects.filter(recipient_id=uid).count() == 1
    assert len(emulator.messages(notification_id=nid)) == 1


@pytest.mark.parametrize(("prefs", "category", "reason"), [
    ({"opt_outs": ["sms"]}, "", "opted_out_channel"),
    ({"category_opt_outs": {"marketing": ["sms"]}}, "marketing", "opted_out_category"),
])
def test_opt_out_is_suppressed_with_reason(api, emulator, uid, prefs, category, reason):
    make_user(api, uid)
    assert api.request("PUT", f"/v1/users/{uid}/preferences", json=prefs).status_code == 200
    nid = send(api, uid, "sms", category=category)
    n = wait_status(nid)
    assert (n.status, n.reason) == ("suppressed", reason)
    assert emulator.messages(notification_id=nid) == []
    assert DeliveryAttempt.objects.filter(notification_id=nid).count() == 0
    detail = api.request("GET", f"/v1/notifications/{nid}").json()
    assert (detail["status"], detail["reason"]) == ("suppressed", reason)


def test_category_opt_out_does_not_block_other_categories(api, emulator, uid):
    make_user(api, uid)
    api.request("PUT", f"/v1/users/{uid}/preferences", json={"category_opt_outs": {"marketing": ["sms"]}})
    nid = send(api, uid, "sms", category="security")
    assert wait_status(nid).status in SENT


def _quiet_window_around_now(tz: str, minutes_left: int = 1) -> tuple[dict, datetime]:
    """A quiet window that crosses midnight and contains the current local time."""
    from zoneinfo import ZoneInfo

    local = datetime.now(ZoneInfo(tz))
    end = (local + timedelta(minutes=minutes_left + 1)).replace(second=0, microsecond=0)
    start = local - timedelta(hours=1) if local.hour >= 2 else local + timedelta(hours=2)
    window = {"start": start.strftime("%H:%M"), "end": end.strftime("%H:%M"), "timezone": tz}
    if window["start"] <= window["end"]:
        later = end + timedelta(minutes=30)
        if later.date() == end.date():
            # Make it cross midnight: start later in the day than end, still covering now.
            window["start"] = later.strftime("%H:%M")
        else:
            # Late in the evening (a start after end would fall on the next day and miss now): end just
            # after midnight instead; the tests move the clock to the end, they do not wait for it.
            end = (local + timedelta(days=1)).replace(hour=0, minute=5, second=0, microsecond=0)
            window["end"] = end.strftime("%H:%M")
    return window, end.astimezone(UTC)


def test_quiet_hours_crossing_midnight_defer_standard_until_window_end(api, emulator, uid, stack):
    make_user(api, uid)
    window, end_utc = _quiet_window_around_now("Asia/Tokyo")
    assert window["start"] > window["end"]  # crosses midnight
    api.request("PUT", f"/v1/users/{uid}/preferences", json={"quiet_hours": window})
    nid = send(api, uid, "sms", priority="standard")
    n = wait_status(nid, "scheduled")
    wait_until(lambda: Notification.objects.get(pk=nid).reason == "quiet_hours", 10, message="deferral")
    n = Notification.objects.get(pk=nid)
    assert n.due_at == end_utc
    assert emulator.messages(notification_id=nid) == []
    # Move every process's clock past the end of the window: the scheduler releases it.
    stack.set_clock_offset((end_utc - datetime.now(UTC)).total_seconds() + 1)
    n = wait_status(nid, SENT, timeout=15)
    assert events(nid) == ["accepted", "deferred", "released", "sent"]
    assert n.attempts == 1
    assert len(emulator.messages(notification_id=nid)) == 1


def test_quiet_hours_do_not_hold_high_priority(api, emulator, uid):
    make_user(api, uid)
    window, _ = _quiet_window_around_now("Europe/Berlin", minutes_left=30)
    api.request("PUT", f"/v1/users/{uid}/preferences", json={"quiet_hours": window})
    nid = send(api, uid, "sms", priority="high")
    assert wait_status(nid).status in SENT


@pytest.mark.parametrize(("tz", "night_utc", "window", "expected_end_utc"), [
    # Europe/Berlin springs forward 2026-03-29 02:00 CET → 03:00 CEST: 02:30 does not exist that night.
    ("Europe/Berlin", datetime(2026, 3, 29, 0, 15, tzinfo=UTC), ("22:00", "02:30"),
     datetime(2026, 3, 29, 1, 0, tzinfo=UTC)),
    # America/New_York falls back 2026-11-01 02:00 EDT → 01:00 EST: a 22:00–07:00 window lasts 10 h.
    ("America/New_York", datetime(2026, 11, 1, 4, 0, tzinfo=UTC), ("22:00", "07:00"),
     datetime(2026, 11, 1, 12, 0, tzinfo=UTC)),
])
def test_quiet_hours_on_dst_transition_night(api, emulator, uid, stack, tz, night_utc, window, expected_end_utc):
    make_user(api, uid, timezone=tz)
    api.request("PUT", f"/v1/users/{uid}/preferences",
                json={"quiet_hours": {"start": window[0], "end": window[1]}})  # zone: the user's
    stack.set_clock_offset((night_utc - datetime.now(UTC)).total_seconds())
    nid = send(api, uid, "email")
    wait_until(lambda: Notification.objects.get(pk=nid).reason == "quiet_hours", 10, message="deferral")
    assert Notification.objects.get(pk=nid).due_at == expected_end_utc
    stack.set_clock_offset((expected_end_utc - datetime.now(UTC)).total_seconds() - 5)
    time.sleep(2.5)
    assert Notification.objects.get(pk=nid).status == "scheduled"  # not a moment early
    stack.set_clock_offset((expected_end_utc - datetime.now(UTC)).total_seconds() + 1)
    assert wait_status(nid, SENT, timeout=15).status in SENT
    assert len(emulator.messages(notification_id=nid)) == 1


def test_expired_high_priority_is_expired_not_sent(api, emulator, uid, stack):
    make_user(api, uid)
    at = datetime.now(UTC) + timedelta(minutes=10)
    nid = send(api, uid, "sms", priority="high", scheduled_at=at.isoformat(), ttl_seconds=30)
    stack.set_clock_offset(10 * 60 + 31)  # due, and its 30 s to live are over
    n = wait_status(nid)
    assert (n.status, n.reason) == ("expired", "ttl_expired")
    assert emulator.messages(notification_id=nid) == []


def test_cancel_scheduled_then_nothing_is_sent(api, emulator, uid, stack):
    make_user(api, uid)
    at = datetime.now(UTC) + timedelta(minutes=5)
    nid = send(api, uid, "email", scheduled_at=at.isoformat())
    r = api.request("POST", f"/v1/notifications/{nid}/cancel")
    assert r.status_code == 200
    assert r.json() == {"id": nid, "status": "cancelled"}
    stack.set_clock_offset(5 * 60 + 2)
    time.sleep(2.5)
    n = Notification.objects.get(pk=nid)
    assert (n.status, n.reason) == ("cancelled", "cancelled_by_client")
    assert emulator.messages(notification_id=nid) == []
    again = api.request("POST", f"/v1/notifications/{nid}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["fields"][0]["code"] == "not_cancellable"


def test_push_goes_to_every_device_and_unregistered_deactivates_only_that_one(api, emulator, uid):
    user = make_user(api, uid, devices=3)
    dead = user["tokens"][1]
    emulator.add_fault(provider="fcm", to=dead, status=404, code="UNREGISTERED")
    nid = send(api, uid, "push", priority="high")
    n = wait_status(nid)
    assert n.status in SENT
    got = emulator.messages(notification_id=nid)
    assert sorted(m["to"] for m in got) == sorted([user["tokens"][0], user["tokens"][2]])
    outcomes = sorted(DeliveryAttempt.objects.filter(notification_id=nid).values_list("outcome", "error_code"))
    assert outcomes == [("accepted", ""), ("accepted", ""), ("contact_invalid", "UNREGISTERED")]
    dead_device = Device.objects.get(push_token=dead)
    assert (dead_device.active, dead_device.deactivated_reason) == (False, "unregistered_token")
    assert Device.objects.filter(recipient_id=uid, active=True).count() == 2


def test_push_to_only_dead_device_fails_and_next_push_is_suppressed(api, emulator, uid):
    user = make_user(api, uid, devices=1)
    emulator.add_fault(provider="fcm", to=user["tokens"][0], status=404, code="UNREGISTERED")
    nid = send(api, uid, "push")
    n = wait_status(nid)
    assert (n.status, n.reason) == ("failed", "contact_invalid")
    assert Device.objects.get(push_token=user["tokens"][0]).active is False
    # A missing contact is not a request error (docs/API.md, "A recipient without the contact a
    # channel needs"): accepted, then suppressed with the reason.
    nid2 = send(api, uid, "push")
    n2 = wait_status(nid2)
    assert (n2.status, n2.reason) == ("suppressed", "no_active_device")
    assert emulator.messages(notification_id=nid2) == []


def test_twilio_21211_fails_permanently_without_retry(api, emulator, uid):
    user = make_user(api, uid)
    emulator.add_fault(provider="twilio", to=user["phone"], status=400, code=21211)
    nid = send(api, uid, "sms", priority="high")
    n = wait_status(nid)
    assert (n.status, n.reason) == ("failed", "contact_invalid")
    assert n.attempts == 1
    time.sleep(2)  # a retry, if any, would happen within this (high backoff ≤ 2 s here)
    assert DeliveryAttempt.objects.filter(notification_id=nid).count() == 1
    assert Notification.objects.get(pk=nid).attempts == 1
    assert Recipient.objects.get(pk=uid).phone_invalid_reason == "invalid_number"
    # The next SMS to the dead number is suppressed without calling Twilio.
    nid2 = send(api, uid, "sms")
    n2 = wait_status(nid2)
    assert (n2.status, n2.reason) == ("suppressed", "phone_invalid")
    assert DeliveryAttempt.objects.filter(notification_id=nid2).count() == 0
    assert emulator.messages(to=user["phone"]) == []


@pytest.mark.parametrize("channel", CHANNELS)
def test_503_then_success_is_delivered_once_after_retry(api, emulator, uid, channel):
    user = make_user(api, uid)
    provider = {"sms": "twilio", "email": "sendgrid", "push": "fcm"}[channel]
    # One failed call each: no SDK retries it (providers/fcm/backend.py disables firebase-admin's).
    emulator.add_fault(provider=provider, to=to_of(user, channel), status=503, times=1,
                       code="UNAVAILABLE" if channel == "push" else None)
    nid = send(api, uid, channel, priority="high")
    n = wait_status(nid, timeout=30)
    assert n.status in SENT
    outcomes = list(DeliveryAttempt.objects.filter(notification_id=nid).order_by("number", "id")
                    .values_list("number", "provider", "outcome"))
    if channel == "push":
        # One provider: retried after a backoff.
        assert n.attempts == 2
        assert outcomes == [(1, "fcm", "transient"), (2, "fcm", "accepted")]
        assert "retry" in events(nid)
    else:
        # High tier with a backup: the failed call goes to the next provider in the same attempt.
        backup = {"sms": "twilio_backup", "email": "smtp"}[channel]
        assert n.attempts == 1
        assert outcomes == [(1, provider, "transient"), (1, backup, "accepted")]
        assert n.provider == backup
    time.sleep(0.5)
    assert len(emulator.messages(notification_id=nid)) == 1


def test_attempts_exhausted_is_dead_lettered(api, emulator, uid):
    user = make_user(api, uid)
    # Both email providers fail (the high tier would otherwise fail over to SMTP).
    emulator.add_fault(provider="sendgrid", to=user["email"], status=503)
    emulator.add_fault(provider="smtp", to=user["email"], status=451)
    nid = send(api, uid, "email", priority="high")
    n = wait_status(nid, timeout=40)
    assert (n.status, n.reason) == ("failed", "attempts_exhausted")
    assert n.dead_lettered_at is not None
    assert n.attempts == 5  # MAX_ATTEMPTS_HIGH
    log = DeliveryAttempt.objects.filter(notification_id=nid)
    assert set(log.values_list("outcome", flat=True)) == {"transient"}
    assert set(log.values_list("number", flat=True)) == {1, 2, 3, 4, 5}
    # Each attempt tried SMTP (and SendGrid too, until SendGrid's breaker opened: 5 failed calls).
    assert set(log.filter(provider="smtp").values_list("number", flat=True)) == {1, 2, 3, 4, 5}
    assert emulator.messages(notification_id=nid) == []

    # Found in the admin's dead-letter view and replayed from there (the providers have recovered,
    # their breakers closed): delivered once.
    emulator.clear_faults()
    reset_isolation()
    from django.contrib.auth.models import User
    from django.test import Client

    staff = User.objects.create_superuser(f"ops-{uid}", f"ops-{uid}@example.com", "pw")
    admin = Client()
    admin.force_login(staff)
    page = admin.get("/admin/notifications/deadletter/", {"q": uid})
    assert page.status_code == 200
    assert nid in page.content.decode()
    r = admin.post("/admin/notifications/deadletter/", {"action": "replay", "_selected_action": [nid]})
    assert r.status_code == 302
    n = wait_status(nid, SENT, timeout=20)
    assert n.dead_lettered_at is None
    assert n.attempts == 1
    assert len(emulator.messages(notification_id=nid)) == 1
    replayed = n.events.get(kind="replayed")
    assert f"by ops-{uid}" in replayed.detail


def test_killed_worker_claim_is_redriven_after_lease(api, emulator, uid, stack):
    user = make_user(api, uid)
    # The first call hangs 2.5 s inside the provider; the worker is killed during it. No receipts
    # for this number: a `delivered` callback would (rightly) settle the row before the lease ends.
    emulator.add_receipt_rule(provider="twilio", to=user["phone"], outcome="none")
    emulator.add_fault(provider="twilio", to=user["phone"], latency_ms=2500, times=1)
    nid = send(api, uid, "sms", priority="standard")
    wait_status(nid, "sending", timeout=10)
    time.sleep(0.3)
    stack.kill("worker_standard")
    killed_at = time.monotonic()
    stack.start("worker_standard")
    n = wait_status(nid, SENT, timeout=30)
    assert time.monotonic() - killed_at >= 8  # not before the 10 s lease ran out
    assert "lease_expired" in events(nid)
    assert n.attempts == 2
    # The provider accepted the first call after the worker died. The re-driven attempt waited
    # (OUTCOME_UNKNOWN_WAIT_STANDARD), then found that message in Twilio's list: not sent again.
    assert list(n.attempts_log.values_list("number", "outcome")) == [(2, "found_by_lookup")]
    assert n.provider_message_id == emulator.messages(notification_id=nid)[0]["provider_message_id"]
    time.sleep(3)
    assert len(emulator.messages(notification_id=nid)) == 1


def test_a_twilio_call_that_times_out_but_was_accepted_is_found_not_sent_again(api, emulator, uid):
    """Issue 10 #10(c): Twilio answered after our timeout (5 s vs 3 s). The call is `unknown`; the row
    waits (OUTCOME_UNKNOWN_WAIT_STANDARD), then the lookup in Twilio's message list finds the message
    the first call created: one SMS, never two."""
    user = make_user(api, uid)
    emulator.add_receipt_rule(provider="twilio", to=user["phone"], outcome="none")  # no receipt settles it
    emulator.add_fault(provider="twilio", to=user["phone"], latency_ms=5000, times=1)
    nid = send(api, uid, "sms", priority="standard")
    n = wait_status(nid, SENT, timeout=40)
    assert list(n.attempts_log.order_by("id").values_list("number", "outcome", "error_code")) == [
        (1, "unknown", "timeout"), (2, "found_by_lookup", "")]
    assert "outcome_unknown" in [e.reason for e in n.events.all()]
    (received,) = emulator.messages(notification_id=nid)
    assert n.provider_message_id == received["provider_message_id"]


def test_redis_flushed_while_scheduled_send_waits_is_still_delivered_once_on_time(api, emulator, uid, stack):
    make_user(api, uid)
    at = datetime.now(UTC) + timedelta(seconds=4)
    nid = send(api, uid, "sms", scheduled_at=at.isoformat())
    get_redis().flushdb()  # broker queues, sent markers, throttle counters: all gone
    n = wait_status(nid, SENT, timeout=20)
    got = emulator.messages(notification_id=nid)
    assert len(got) == 1
    received = datetime.fromtimestamp(got[0]["received_at_ms"] / 1000, UTC)
    assert at <= received < at + timedelta(seconds=5)
    assert n.attempts == 1


def test_redis_flushed_after_accept_immediate_send_is_redriven(api, emulator, uid, stack):
    """A queued row whose broker message vanished is re-enqueued by the reconciler."""
    make_user(api, uid)
    stack.kill("worker_standard")  # nobody consumes: the message sits in Redis
    try:
        nid = send(api, uid, "email")
        time.sleep(0.3)
        assert Notification.objects.get(pk=nid).status == "queued"
        get_redis().flushdb()
    finally:
        stack.start("worker_standard")
    n = wait_status(nid, SENT, timeout=30)
    assert "requeued" in events(nid)
    assert n.attempts == 1
    assert len(emulator.messages(notification_id=nid)) == 1



def test_receipts_from_the_emulator_settle_status(api, emulator, uid):
    user = make_user(api, uid)
    emulator.add_receipt_rule(provider="twilio", to=user["phone"], outcome="undelivered", error_code=30006)
    sms = send(api, uid, "sms")
    email = send(api, uid, "email")
    n_email = wait_status(email, "delivered", timeout=15)
    assert n_email.delivered_at is not None
    n_sms = wait_status(sms, "failed", timeout=15)
    assert n_sms.reason == "provider_undelivered"
    assert "30006" in n_sms.reason_detail
    assert Recipient.objects.get(pk=uid).phone_invalid_reason == "landline"
    receipts = [k for k in n_sms.events.order_by("id").values_list("kind", flat=True) if k.startswith("receipt:")]
    assert receipts == ["receipt:sent", "receipt:undelivered"]
