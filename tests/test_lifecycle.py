"""The one table of a notification's status changes (notifications/lifecycle/): each cause makes its
allowed move through its public entry point and refuses to move a row that has ended (never
backwards, never a second end); docs/ARCHITECTURE.md prints the code's table."""

from __future__ import annotations

import contextlib
import re
import uuid
from datetime import timedelta
from pathlib import Path

import pytest

from core import clock
from notifications import lifecycle, receipts, scheduler, services
from notifications.app_receipts import NotReached, apply_app_receipt
from notifications.delivery import claim, record
from notifications.events import fallback
from notifications.lifecycle import Cause
from notifications.models import DeliveryEvent, Notification, Reason, Status
from preferences.models import Recipient

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent


def make(status: str, reason: str = "", channel: str = "sms", **fields) -> Notification:
    uid = f"lc-{uuid.uuid4().hex[:8]}"
    r = Recipient.objects.create(user_id=uid, email=f"{uid}@example.com", phone="+4915112345678")
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel=channel, body="b", status=status,
                                       reason=reason, **fields)


def _past():
    return clock.now() - timedelta(minutes=5)


def do_claim(n):
    claim.claim([str(n.pk)], clock.now())
    claim.release([n.pk])


def do_record(n):
    record.finish(n, Status.FAILED, Reason.PERMANENT_ERROR, kind="failed", detail="refused by the provider")


def do_lease_expiry(n):
    scheduler.reconcile()


def do_scheduler(n):
    scheduler.release_due()


def do_provider_receipt(n):
    receipts.apply_receipts([receipts.Receipt(provider="twilio", dedup_key=f"twilio:{uuid.uuid4().hex}",
                                              kind="delivered", raw="delivered", notification_id=str(n.pk))])


def do_app_receipt(n):
    with contextlib.suppress(NotReached):
        apply_app_receipt(Notification.objects.filter(pk=n.pk), "opened")


def do_client_cancel(n):
    with contextlib.suppress(services.NotCancellable):
        services.cancel_notification(n.pk)


def do_event_cancel(n):
    lifecycle.cancel([n.pk], Cause.EVENT_CANCEL, Reason.CANCELLED_BY_CLIENT, clock.now(),
                     detail="its event was cancelled")


def do_campaign_cancel(n):
    services.cancel_campaign_notifications(n.campaign_id)


def do_erasure(n):
    services.erase_notification_content(n.recipient_id, [], by="test")


def do_fallback(n):
    fallback.settle([(n.fallback_after, Status.SENT, "", "email")])


def do_replay(n):
    services.replay_dead_letters([n.pk], by="test")


#: cause → (entry point, what the row needs for it, channel, allowed from (status, reason), expected (status, reason))
CASES = {
    Cause.CLAIM: (do_claim, {}, "sms", (Status.QUEUED, ""), (Status.SENDING, "")),
    Cause.RECORD: (do_record, {"attempts": 1}, "sms", (Status.SENDING, ""), (Status.FAILED, Reason.PERMANENT_ERROR)),
    Cause.LEASE_EXPIRY: (do_lease_expiry, {"attempts": 1, "lease_until": _past}, "sms", (Status.SENDING, ""),
                         (Status.SCHEDULED, Reason.LEASE_EXPIRED)),
    Cause.SCHEDULER: (do_scheduler, {"due_at": _past}, "sms", (Status.SCHEDULED, Reason.QUIET_HOURS),
                      (Status.QUEUED, Reason.QUIET_HOURS)),
    Cause.PROVIDER_RECEIPT: (do_provider_receipt, {}, "sms", (Status.SENT, ""), (Status.DELIVERED, "")),
    Cause.APP_RECEIPT: (do_app_receipt, {}, "push", (Status.SENT, ""), (Status.OPENED, "")),
    Cause.CLIENT_CANCEL: (do_client_cancel, {}, "sms", (Status.QUEUED, ""),
                          (Status.CANCELLED, Reason.CANCELLED_BY_CLIENT)),
    Cause.EVENT_CANCEL: (do_event_cancel, {}, "sms", (Status.SUPPRESSED, Reason.FALLBACK_NOT_NEEDED),
                         (Status.CANCELLED, Reason.CANCELLED_BY_CLIENT)),
    Cause.CAMPAIGN_CANCEL: (do_campaign_cancel, {"campaign_id": uuid.uuid4}, "sms", (Status.SCHEDULED, ""),
                            (Status.CANCELLED, Reason.CAMPAIGN_CANCELLED)),
    Cause.ERASURE: (do_erasure, {}, "sms", (Status.QUEUED, ""), (Status.CANCELLED, Reason.CANCELLED_BY_CLIENT)),
    Cause.FALLBACK: (do_fallback, {"fallback_after": uuid.uuid4}, "sms", (Status.SCHEDULED, Reason.FALLBACK_WAITING),
                     (Status.SUPPRESSED, Reason.FALLBACK_NOT_NEEDED)),
    Cause.REPLAY: (do_replay, {"dead_lettered_at": _past}, "sms", (Status.FAILED, Reason.PERMANENT_ERROR),
                   (Status.QUEUED, "")),
}

#: Rows that have ended, each with an ordinary reason (no cause's guard lets it move).
ENDED = [(Status.DELIVERED, ""), (Status.OPENED, ""), (Status.FAILED, Reason.ATTEMPTS_EXHAUSTED),
         (Status.SUPPRESSED, Reason.OPTED_OUT_CHANNEL), (Status.EXPIRED, Reason.TTL_EXPIRED),
         (Status.CANCELLED, Reason.CANCELLED_BY_CLIENT)]


#: Ends a cause may leave (its allowed case covers them).
MAY_LEAVE = {(Cause.APP_RECEIPT, Status.DELIVERED): "delivered is on the app's ladder: an app receipt moves it up",
             (Cause.REPLAY, Status.FAILED): "a dead letter (failed) is what a replay sends again"}


def _fields(needs: dict) -> dict:
    return {k: v() if callable(v) else v for k, v in needs.items()}


def test_every_cause_has_a_case():
    assert set(CASES) == set(Cause)


@pytest.mark.parametrize("cause", list(Cause))
def test_each_cause_makes_its_move_with_one_timeline_entry(cause):
    action, needs, channel, (status, reason), expected = CASES[cause]
    n = make(status, reason, channel, **_fields(needs))
    action(n)
    n.refresh_from_db()
    assert (n.status, n.reason) == expected
    assert lifecycle.allowed(cause, status, expected[0])
    changes = list(DeliveryEvent.objects.filter(notification=n).exclude(status="").values_list("status", flat=True))
    # A claim writes no event (its attempt row is the line); an app receipt's entry is the receipt itself.
    assert changes == ([] if cause == Cause.CLAIM else [expected[0]])


@pytest.mark.parametrize("ended", ENDED, ids=[s for s, _r in ENDED])
@pytest.mark.parametrize("cause", list(Cause))
def test_no_cause_moves_a_row_that_has_ended(cause, ended):
    action, needs, channel, _from, _to = CASES[cause]
    status, reason = ended
    if (cause, status) in MAY_LEAVE:
        pytest.skip(MAY_LEAVE[(cause, status)])
    n = make(status, reason, "push" if cause == Cause.APP_RECEIPT else channel, **_fields(needs))
    action(n)
    n.refresh_from_db()
    assert (n.status, n.reason) == (status, reason)
    assert not DeliveryEvent.objects.filter(notification=n).exclude(status="").exists()


def test_the_table_refuses_a_move_it_does_not_list():
    assert not lifecycle.allowed(Cause.RECORD, Status.DELIVERED, Status.SENT)
    with pytest.raises(ValueError, match="no transition to 'sent' by claim"):
        lifecycle.sources(Cause.CLAIM, Status.SENT)


def test_the_architecture_doc_prints_the_codes_table():
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    printed = re.search(r"<!-- transitions -->\n(.*?)\n<!-- /transitions -->", doc, re.S)
    assert printed is not None, "docs/ARCHITECTURE.md §5 lost its transitions table markers"
    assert printed.group(1).strip() == lifecycle.table.markdown()
