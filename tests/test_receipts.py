"""Receipts for rows whose provider call was never recorded (notifications/receipts.py): a worker that
died mid-call (``sending``), or a row waiting for a re-send after an unknown call outcome. The receipt
proves the provider had the message, so it settles the row with what it tells, and the re-send never
happens. Applied in-process (``apply_receipts``) against the real database and Redis."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from notifications import receipts, scheduler
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification, Reason, Status
from notifications.sending import claim
from notifications.sent_markers import find_sent
from preferences.models import Recipient

pytestmark = pytest.mark.django_db

NOW = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)
CLAIMED_AT = NOW - timedelta(minutes=2)


def row(channel: str = "sms", status: str = Status.SENDING, reason: str = "", attempts: int = 2,
        **fields) -> Notification:
    uid = f"r-{uuid.uuid4().hex[:8]}"
    r = Recipient.objects.create(user_id=uid, email=f"{uid}@example.com", phone="+4915112345678")
    defaults = {"lease_until": NOW + timedelta(seconds=20)} if status == Status.SENDING else {}
    return Notification.objects.create(
        id=uuid.uuid4(), recipient=r, channel=channel, body="b", status=status, reason=reason,
        reason_detail="attempt 2: no answer in time" if reason else "", attempts=attempts,
        first_attempt_at=CLAIMED_AT - timedelta(minutes=1), **{**defaults, **fields})


def twilio(n: Notification, status: str, kind: str, *, code: str = "", sid: str = "SM" + "a" * 32):
    return receipts.Receipt(provider="twilio", dedup_key=f"twilio:{sid}:{status}:{code}", kind=kind, raw=status,
                            notification_id=str(n.pk), provider_message_id=sid, error_code=code,
                            sender="+15005550006")


def sendgrid(n: Notification, event: str, kind: str, occurred_at: datetime | None, **extra):
    return receipts.Receipt(provider="sendgrid", dedup_key=f"sendgrid:{uuid.uuid4().hex}", kind=kind, raw=event,
                            notification_id=str(n.pk), provider_message_id="sg-msg-1", occurred_at=occurred_at,
                            **extra)


def settled(n: Notification) -> tuple:
    n.refresh_from_db()
    return (n.status, n.reason, n.reason_detail, n.provider, n.provider_message_id, n.sent_at, n.delivered_at,
            n.lease_until, n.due_at)


def attempts_of(n: Notification) -> list[tuple]:
    return list(DeliveryAttempt.objects.filter(notification=n).order_by("id").values_list(
        "number", "provider", "outcome", "provider_message_id", "error_code"))


def test_delivered_receipt_for_a_worker_that_died_mid_call_records_the_call(frozen,
                                                                          django_capture_on_commit_callbacks):
    n = row()

    with django_capture_on_commit_callbacks(execute=True):
        assert receipts.apply_receipts([twilio(n, "delivered", receipts.DELIVERED)]) == {
            "applied": 1, "duplicate": 0, "unknown": 0}

    sid = "SM" + "a" * 32
    assert settled(n) == ("delivered", "", "", "twilio", sid, NOW, NOW, None, None)
    assert attempts_of(n) == [(2, "twilio", DeliveryAttempt.Outcome.LEARNED_FROM_RECEIPT, sid, "")]
    assert list(n.events.values_list("kind", "status", "reason")) == [("receipt:delivered", "delivered", "")]
    assert find_sent([n.pk]) == {str(n.pk)}  # a re-drive of the row finds the sent marker


def test_failure_receipt_for_a_sending_row_fails_it_and_records_the_call(frozen):
    n = row()

    receipts.apply_receipts([twilio(n, "undelivered", receipts.FAILED, code="30003")])

    sid = "SM" + "a" * 32
    assert settled(n) == ("failed", "provider_undelivered", "twilio undelivered code 30003", "twilio", sid, NOW,
                          None, None, None)
    assert attempts_of(n) == [(2, "twilio", "from_receipt", sid, "")]
    assert list(n.events.values_list("kind", "status", "reason")) == [
        ("receipt:undelivered", "failed", "provider_undelivered")]


def test_sendgrid_bounce_for_a_sending_row_takes_the_event_time_as_sent_at(frozen):
    n = row("email")
    bounced_at = NOW - timedelta(seconds=40)

    receipts.apply_receipts([sendgrid(n, "bounce", receipts.FAILED, bounced_at, error_code="5.1.1",
                                      detail="550 5.1.1 unknown user", invalid_address=True)])

    assert settled(n) == ("failed", "provider_bounced", "sendgrid bounce code 5.1.1 550 5.1.1 unknown user",
                          "sendgrid", "sg-msg-1", bounced_at, None, None, None)
    assert attempts_of(n) == [(2, "sendgrid", "from_receipt", "sg-msg-1", "")]
    assert Recipient.objects.get(pk=n.recipient_id).email_invalid_reason == "sendgrid bounce"


@pytest.mark.parametrize("occurred_at", [
    NOW + timedelta(seconds=30),  # after the receipt arrived: the provider's clock is off
    CLAIMED_AT - timedelta(hours=1),  # before the row was ever claimed: not this call
], ids=["future", "before_first_claim"])
def test_an_event_time_that_cannot_be_the_call_gives_way_to_the_arrival(frozen, occurred_at):
    n = row("email")

    receipts.apply_receipts([sendgrid(n, "delivered", receipts.DELIVERED, occurred_at)])

    assert settled(n)[:7] == ("delivered", "", "", "sendgrid", "sg-msg-1", NOW, NOW)


def test_the_provider_the_row_names_is_kept(frozen):
    n = row(provider="twilio_backup")

    receipts.apply_receipts([twilio(n, "delivered", receipts.DELIVERED)])

    assert settled(n)[3] == "twilio_backup"
    assert attempts_of(n)[0][:3] == (2, "twilio", "from_receipt")


@pytest.mark.parametrize("status", [Status.SCHEDULED, Status.QUEUED])
@pytest.mark.parametrize("reason", [Reason.OUTCOME_UNKNOWN, Reason.LEASE_EXPIRED])
def test_a_receipt_settles_a_row_waiting_for_a_resend_and_the_resend_never_happens(frozen, status, reason):
    waiting = {"due_at": NOW - timedelta(seconds=1)} if status == Status.SCHEDULED else {"queued_at": CLAIMED_AT}
    n = row(status=status, reason=reason, attempts=1, **waiting)

    receipts.apply_receipts([twilio(n, "delivered", receipts.DELIVERED)])

    sid = "SM" + "a" * 32
    assert settled(n) == ("delivered", "", "", "twilio", sid, NOW, NOW, None, None)
    assert attempts_of(n) == [(1, "twilio", "from_receipt", sid, "")]
    assert scheduler.release_due() == 0  # was due: nothing left to release
    assert claim([str(n.pk)], NOW) == []  # its queued message, if any, is skipped
    n.refresh_from_db()
    assert (n.status, n.attempts) == ("delivered", 1)
    assert list(n.events.values_list("kind", flat=True)) == ["receipt:delivered"]


def test_a_failure_receipt_settles_a_row_waiting_for_a_resend(frozen):
    n = row(status=Status.SCHEDULED, reason=Reason.OUTCOME_UNKNOWN, attempts=3, due_at=NOW + timedelta(minutes=1))

    receipts.apply_receipts([twilio(n, "failed", receipts.FAILED, code="30007")])

    sid = "SM" + "a" * 32
    assert settled(n) == ("failed", "provider_undelivered", "twilio failed code 30007", "twilio", sid, NOW, None,
                          None, None)
    assert attempts_of(n) == [(3, "twilio", "from_receipt", sid, "")]


def test_a_sent_row_gets_no_attempt_from_its_receipt(frozen):
    recorded_at = NOW - timedelta(seconds=5)
    n = row(status=Status.SENT, provider="twilio", provider_message_id="SM" + "a" * 32, sent_at=recorded_at)

    receipts.apply_receipts([twilio(n, "delivered", receipts.DELIVERED)])

    assert settled(n)[:7] == ("delivered", "", "", "twilio", "SM" + "a" * 32, recorded_at, NOW)
    assert attempts_of(n) == []


@pytest.mark.parametrize(("status", "reason"), [
    (Status.QUEUED, ""),  # never claimed
    (Status.QUEUED, Reason.RETRY_SCHEDULED),
    (Status.SCHEDULED, Reason.QUIET_HOURS),
    (Status.CANCELLED, Reason.CANCELLED_BY_CLIENT),
])
def test_other_rows_only_store_the_receipt(frozen, status, reason):
    n = row(status=status, reason=reason, attempts=1)

    receipts.apply_receipts([twilio(n, "delivered", receipts.DELIVERED)])

    n.refresh_from_db()
    assert (n.status, n.reason, n.provider, n.provider_message_id, n.sent_at) == (status, reason, "", "", None)
    assert attempts_of(n) == []
    assert list(DeliveryEvent.objects.filter(notification=n).values_list("kind", "status")) == [
        ("receipt:delivered", "")]


def test_a_provider_batch_is_applied_in_bulk_and_in_order_where_order_matters(frozen, django_assert_max_num_queries):
    """A SendGrid POST of 200 events: processed + delivered for 100 sent emails, a repeated event, an
    unknown message, and a bounce: the bulk part is a handful of queries, whatever the batch size;
    the bounce still goes one by one (contact hygiene)."""
    sent = [row("email", status=Status.SENT, attempts=1, provider="sendgrid", sent_at=CLAIMED_AT) for _ in range(100)]
    bounced = row("email", status=Status.SENT, attempts=1, provider="sendgrid", sent_at=CLAIMED_AT)
    batch = []
    for i, n in enumerate(sent):
        batch.append(receipts.Receipt(provider="sendgrid", dedup_key=f"sendgrid:m{i}:processed:1",
                                      kind=receipts.ACCEPTED, raw="processed", notification_id=str(n.pk)))
        batch.append(receipts.Receipt(provider="sendgrid", dedup_key=f"sendgrid:m{i}:delivered:2",
                                      kind=receipts.DELIVERED, raw="delivered", notification_id=str(n.pk)))
    batch.append(batch[1])  # SendGrid re-posted one event
    batch.append(receipts.Receipt(provider="sendgrid", dedup_key="sendgrid:x:delivered:2", kind=receipts.DELIVERED,
                                  raw="delivered", notification_id=str(uuid.uuid4())))
    batch.append(receipts.Receipt(provider="sendgrid", dedup_key="sendgrid:b:bounce:3", kind=receipts.FAILED,
                                  raw="bounce", notification_id=str(bounced.pk), invalid_address=True,
                                  detail="550 5.1.1 unknown user"))

    # The bulk part is 6 statements for the 201 events (lookup, savepoint, INSERT, UPDATE, event
    # UPDATE, release); the unknown receipt and the bounce, one by one, about 30. One by one, the
    # batch took over 800.
    with django_assert_max_num_queries(40):
        counts = receipts.apply_receipts(batch)

    assert counts == {"applied": 201, "duplicate": 1, "unknown": 1}
    statuses = Notification.objects.filter(pk__in=[n.pk for n in sent]).values_list("status", flat=True)
    assert sorted(set(statuses)) == [Status.DELIVERED]
    assert DeliveryEvent.objects.filter(notification__in=sent, kind="receipt:delivered",
                                        status=Status.DELIVERED).count() == 100
    assert DeliveryEvent.objects.filter(notification__in=sent, kind="receipt:processed", status="").count() == 100
    bounced.refresh_from_db()
    assert (bounced.status, bounced.reason) == (Status.FAILED, Reason.PROVIDER_BOUNCED)
    assert Recipient.objects.get(pk=bounced.recipient_id).email_invalid_reason == "sendgrid bounce"


@pytest.mark.parametrize("status", [Status.SCHEDULED, Status.QUEUED])
def test_a_processed_receipt_settles_a_row_waiting_after_an_unknown_outcome_as_sent(frozen, status):
    """Adversarial finding (delivery): one SendGrid request that timed out (500 recipients) was sent
    again whole once the wait ran out, because only `delivered` settled waiting rows and SendGrid's
    delivered events were late; `processed` comes within seconds and proves as much."""
    n = row("email", status=status, reason=Reason.OUTCOME_UNKNOWN, due_at=NOW + timedelta(minutes=2))
    counts = receipts.apply_receipts([sendgrid(n, "processed", receipts.ACCEPTED, NOW - timedelta(seconds=30))])

    assert counts == {"applied": 1, "duplicate": 0, "unknown": 0}
    status_now, reason, _detail, provider, message_id, sent_at, delivered_at, lease, due = settled(n)
    assert (status_now, reason, provider, message_id, delivered_at, lease, due) == (
        Status.SENT, "", "sendgrid", "sg-msg-1", None, None, None)
    assert sent_at == NOW - timedelta(seconds=30)
    assert attempts_of(n) == [(2, "sendgrid", "from_receipt", "sg-msg-1", "")]
    assert DeliveryEvent.objects.get(notification=n, kind="receipt:processed").status == Status.SENT
    assert scheduler.release_due() == 0
