"""Receipts apply in the provider's order, not the order a receipts worker happens to apply them
(docs/ARCHITECTURE.md §5, "Receipt order"). Issue 24: a Twilio ``undelivered`` (30008) posted and
answered, then ``delivered`` for the same SMS; with two receipt workers the two applied in either
order, and the row ended ``failed`` or ``delivered`` depending on which ran first."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from notifications import receipts, receipts_buffer
from notifications.lifecycle import OUT_OF_ORDER
from notifications.models import Notification, Reason, Status
from preferences.models import Recipient
from tests.test_webhooks import PUBLIC, make_notification, twilio_post

pytestmark = pytest.mark.django_db

UNDELIVERED = ("receipt:undelivered", "twilio undelivered code 30008")
DELIVERED = ("receipt:delivered", "twilio delivered")
#: Trials of the two-worker race (the issue saw the wrong end in 6 of 27).
TRIALS = 10


@pytest.fixture(autouse=True)
def _public_url(settings):
    settings.PUBLIC_BASE_URL = PUBLIC  # the URL Twilio signs


def posted(settings, monkeypatch, n: Notification) -> list[list[dict]]:
    """Post Twilio's ``undelivered`` (30008) and then ``delivered`` for ``n`` through the webhook; each
    request queues its receipts for a receipts worker: returns the two queued task payloads."""
    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    queued: list[list[dict]] = []
    monkeypatch.setattr(receipts_buffer, "push", queued.append)  # buffered for the receipts worker
    assert twilio_post(n, "undelivered", code="30008").status_code == 204
    assert twilio_post(n, "delivered").status_code == 204
    n.refresh_from_db()
    assert n.status == Status.SENT and len(queued) == 2  # nothing applied in the requests
    return queued


def timeline(n: Notification) -> list[tuple]:
    return list(n.events.order_by("created_at", "id").values_list("kind", "status", "detail"))


@pytest.mark.parametrize("workers_order", ["as posted", "reversed"])
def test_undelivered_then_delivered_ends_delivered_whichever_worker_applies_first(settings, monkeypatch,
                                                                                 workers_order):
    n = make_notification("sms")
    undelivered, delivered = posted(settings, monkeypatch, n)
    for payload in ([undelivered, delivered] if workers_order == "as posted" else [delivered, undelivered]):
        assert receipts.apply_wire(payload) == {"applied": 1, "duplicate": 0, "unknown": 0}
    n.refresh_from_db()
    assert (n.status, n.reason, n.reason_detail) == (Status.DELIVERED, "", "")
    # The timeline lists them as they came; the older one says it did not apply when it came second.
    if workers_order == "as posted":
        assert timeline(n) == [(*UNDELIVERED[:1], "failed", UNDELIVERED[1]), (*DELIVERED[:1], "delivered",
                                                                              DELIVERED[1])]
    else:
        assert timeline(n) == [(UNDELIVERED[0], "", f"{UNDELIVERED[1]} {OUT_OF_ORDER}"),
                               (DELIVERED[0], "delivered", DELIVERED[1])]


def _worker(start: threading.Barrier, errors: list):
    def apply(payload):
        try:
            start.wait(timeout=10)
            receipts.apply_wire(payload)
        except Exception as exc:  # reported by the test: a thread's own assertion would be lost
            errors.append(exc)
        finally:
            connection.close()
    return apply


@pytest.mark.django_db(transaction=True)
def test_two_receipt_workers_at_once_end_the_same_every_time(settings, monkeypatch):
    """The issue's reproduction: two workers (threads with their own database connections) apply the
    two receipts at the same moment, :data:`TRIALS` times; which one's thread starts first alternates,
    so either may take the row's lock first (on main, 2 of 12 trials ended ``failed``)."""
    ends = []
    for trial in range(TRIALS):
        n = make_notification("sms")
        payloads = posted(settings, monkeypatch, n)
        start = threading.Barrier(2)
        errors: list[Exception] = []
        worker = _worker(start, errors)
        threads = [threading.Thread(target=worker, args=(p,)) for p in (payloads[::-1] if trial % 2 else payloads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert errors == []
        n.refresh_from_db()
        kinds = [kind for kind, _status, _detail in timeline(n)]
        ends.append((n.status, n.reason, kinds))
    assert ends == [(Status.DELIVERED, "", [UNDELIVERED[0], DELIVERED[0]])] * TRIALS


NOW = datetime(2031, 3, 4, 10, 0, tzinfo=UTC)


def email_row() -> Notification:
    uid = f"ro-{uuid.uuid4().hex[:8]}"
    r = Recipient.objects.create(user_id=uid, email=f"{uid}@example.com")
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="email", body="b", status=Status.SENT,
                                       provider="sendgrid", provider_message_id="sg-1", sent_at=NOW)


def sendgrid(n: Notification, event: str, kind: str, at: datetime) -> receipts.Receipt:
    """A SendGrid event as its webhook maps it: ``timestamp`` is the receipt's ``occurred_at``."""
    return receipts.Receipt(provider="sendgrid", dedup_key=f"sendgrid:sg-1:{event}:{int(at.timestamp())}",
                            kind=kind, raw=event, notification_id=str(n.pk), provider_message_id="sg-1",
                            occurred_at=at)


@pytest.mark.parametrize("arrival", ["in order", "bounce first"])
def test_sendgrid_a_bounce_older_than_delivered_never_fails_the_row(frozen, arrival):
    n = email_row()
    bounce = sendgrid(n, "bounce", "failed", NOW + timedelta(seconds=5))
    delivered = sendgrid(n, "delivered", "delivered", NOW + timedelta(seconds=9))
    for r in ([bounce, delivered] if arrival == "in order" else [delivered, bounce]):
        receipts.apply_receipts([r])
    n.refresh_from_db()
    assert (n.status, n.reason, n.receipt_at, n.receipt_rank) == (Status.DELIVERED, "", NOW + timedelta(seconds=9), 3)


def test_sendgrid_a_bounce_after_delivered_fails_the_row(frozen):
    """An asynchronous bounce: the receiving server took the message, then bounced it."""
    n = email_row()
    receipts.apply_receipts([sendgrid(n, "delivered", "delivered", NOW + timedelta(seconds=5))])
    receipts.apply_receipts([sendgrid(n, "bounce", "failed", NOW + timedelta(seconds=60))])
    n.refresh_from_db()
    assert (n.status, n.reason, n.reason_detail) == (Status.FAILED, Reason.PROVIDER_BOUNCED, "sendgrid bounce")


@pytest.mark.parametrize("arrival", ["failure first", "delivered first"])
def test_in_the_same_second_delivered_outranks_a_failure(frozen, arrival):
    n = email_row()
    same = NOW + timedelta(seconds=5)
    bounce, delivered = sendgrid(n, "bounce", "failed", same), sendgrid(n, "delivered", "delivered", same)
    for r in ([bounce, delivered] if arrival == "failure first" else [delivered, bounce]):
        receipts.apply_receipts([r])
    n.refresh_from_db()
    assert n.status == Status.DELIVERED


@pytest.mark.parametrize("workers_order", ["as posted", "reversed"])
def test_an_undelivered_posted_after_delivered_ends_the_sms_failed(settings, monkeypatch, frozen, workers_order):
    """The rule the other way round: Twilio's later word is the end, whichever worker applies first."""
    n = make_notification("sms")
    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    queued: list[list[dict]] = []
    monkeypatch.setattr(receipts_buffer, "push", queued.append)  # buffered for the receipts worker
    assert twilio_post(n, "delivered").status_code == 204
    frozen[0] += timedelta(seconds=2)
    assert twilio_post(n, "undelivered", code="30008").status_code == 204
    delivered, undelivered = queued
    for payload in ([delivered, undelivered] if workers_order == "as posted" else [undelivered, delivered]):
        receipts.apply_wire(payload)
    n.refresh_from_db()
    assert (n.status, n.reason, n.reason_detail) == (Status.FAILED, Reason.PROVIDER_UNDELIVERED, UNDELIVERED[1])
    assert [kind for kind, _status, _detail in timeline(n)] == [DELIVERED[0], UNDELIVERED[0]]


def test_a_receipt_applied_long_after_it_came_keeps_the_instant_it_came(settings, monkeypatch, frozen):
    """The instant the webhook received a callback travels with the queued message: a worker ten
    minutes behind still lists (and orders) the two as Twilio posted them."""
    n = make_notification("sms")
    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    queued: list[list[dict]] = []
    monkeypatch.setattr(receipts_buffer, "push", queued.append)  # buffered for the receipts worker
    assert twilio_post(n, "undelivered", code="30008").status_code == 204
    frozen[0] += timedelta(seconds=2)
    assert twilio_post(n, "delivered").status_code == 204
    frozen[0] += timedelta(minutes=10)
    undelivered, delivered = queued

    receipts.apply_wire(delivered)
    receipts.apply_wire(undelivered)

    n.refresh_from_db()
    assert n.status == Status.DELIVERED
    assert dict(n.events.values_list("kind", "created_at")) == {UNDELIVERED[0]: NOW,
                                                                DELIVERED[0]: NOW + timedelta(seconds=2)}
