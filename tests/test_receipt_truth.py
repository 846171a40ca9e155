"""A receipt leaves the row and the timeline agreeing, whatever order two receipt workers apply a
message's receipts in (docs/ARCHITECTURE.md §5, "Receipt order"): a failed row holds no
``delivered_at``, the provider's last failure is the row's reason detail, and a receipt's timeline
entry says whether it was applied, or applied and then overruled by a newer one listed before it."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from notifications import receipts, receipts_buffer
from notifications.lifecycle import OUT_OF_ORDER, OVERRULED
from notifications.models import Notification, Reason, Status
from tests.test_receipt_order import timeline
from tests.test_webhooks import PUBLIC, make_notification, sg_event, sg_key, sg_post, twilio_post  # noqa: F401 - sg_key is a fixture

pytestmark = pytest.mark.django_db

BOUNCE_DETAIL = "sendgrid bounce code 5.1.1 550 5.1.1 no such user"


@pytest.fixture(autouse=True)
def _public_url(settings):
    settings.PUBLIC_BASE_URL = PUBLIC  # the URL Twilio signs


def queue_to(settings, monkeypatch) -> list[list[dict]]:
    """Webhooks queue their receipts for a receipts worker: the queued task payloads, in order."""
    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    queued: list[list[dict]] = []
    monkeypatch.setattr(receipts_buffer, "push", queued.append)  # buffered for the receipts worker
    return queued


def bounce_then_delivered(key, n: Notification) -> None:
    """SendGrid posts the ``bounce`` (event time T+1) first and the ``delivered`` (T) after it: an
    asynchronous bounce whose ``delivered`` reached us late."""
    t = int(time.time())
    assert sg_post(key, [sg_event(n, "bounce", timestamp=t + 1, type="bounce", status="5.1.1",
                                  reason="550 5.1.1 no such user")]).status_code == 204
    assert sg_post(key, [sg_event(n, "delivered", timestamp=t)]).status_code == 204


@pytest.mark.parametrize("workers_order", ["as posted", "delivered first"])
def test_a_bounce_newer_than_delivered_ends_failed_with_a_truthful_timeline(settings, monkeypatch,
                                                                            sg_key, workers_order):  # noqa: F811
    queued = queue_to(settings, monkeypatch)
    n = make_notification("email")
    bounce_then_delivered(sg_key, n)
    bounce, delivered = queued
    for payload in ([bounce, delivered] if workers_order == "as posted" else [delivered, bounce]):
        assert receipts.apply_wire(payload) == {"applied": 1, "duplicate": 0, "unknown": 0}
    n.refresh_from_db()
    assert (n.status, n.reason, n.reason_detail, n.delivered_at) == (Status.FAILED, Reason.PROVIDER_BOUNCED,
                                                                     BOUNCE_DETAIL, None)
    if workers_order == "as posted":  # delivered came second and older: never applied
        last = ("receipt:delivered", "", f"sendgrid delivered {OUT_OF_ORDER}")
    else:  # applied first, then the bounce listed before it overruled it
        last = ("receipt:delivered", "delivered", f"sendgrid delivered {OVERRULED}")
    assert timeline(n) == [("receipt:bounce", "failed", BOUNCE_DETAIL), last]


@pytest.mark.django_db(transaction=True)
def test_bounce_and_delivered_applied_at_once_end_failed_and_say_so(settings, monkeypatch, sg_key):  # noqa: F811
    """The finding's reproduction: two workers (threads, own connections) apply the two at once."""
    queued = queue_to(settings, monkeypatch)
    rows = [make_notification("email") for _ in range(6)]
    for n in rows:
        bounce_then_delivered(sg_key, n)
    for i, n in enumerate(rows):
        start, errors = threading.Barrier(2), []

        def apply(payload, start=start, errors=errors):
            try:
                start.wait(timeout=10)
                receipts.apply_wire(payload)
            except Exception as exc:  # reported below: a thread's own assertion would be lost
                errors.append(exc)
            finally:
                connection.close()
        threads = [threading.Thread(target=apply, args=(p,)) for p in queued[2 * i:2 * i + 2]]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert errors == []
        n.refresh_from_db()
        assert (n.status, n.delivered_at) == (Status.FAILED, None)
        (_b, b_status, _bd), (_d, d_status, d_detail) = timeline(n)
        assert b_status == "failed"
        assert (d_status, d_detail) in {("", f"sendgrid delivered {OUT_OF_ORDER}"),
                                        ("delivered", f"sendgrid delivered {OVERRULED}")}


def test_a_newer_twilio_failure_is_the_rows_reason_detail():
    """Twilio ``undelivered`` 30008 (unknown error), then ``failed`` 30006 (landline) for one SMS."""
    n = make_notification("sms")
    assert twilio_post(n, "undelivered", code="30008").status_code == 204
    assert twilio_post(n, "failed", code="30006").status_code == 204
    n.refresh_from_db()
    assert (n.status, n.reason, n.reason_detail) == (Status.FAILED, Reason.PROVIDER_UNDELIVERED,
                                                     "twilio failed code 30006")
    assert timeline(n) == [("receipt:undelivered", "failed", "twilio undelivered code 30008"),
                           ("receipt:failed", "failed", "twilio failed code 30006")]
    assert n.recipient.__class__.objects.get(pk=n.recipient_id).phone_invalid_reason == "landline"
