"""The one table of a notification's status changes (notifications/lifecycle/): each cause makes its
allowed move through its public entry point and refuses to move a row that has ended (never
backwards, never a second end); docs/ARCHITECTURE.md prints the code's table."""

from __future__ import annotations

import ast
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


def test_a_worker_that_stalled_through_a_replay_cannot_record_on_the_next_claim(settings):
    """Found by hstate's stateful test: a replay resets ``attempts``, so fencing records on it let a
    worker of the row's first life (attempt 1) record over the claim after the replay (attempt 1
    again). Records are fenced on ``claims``, which never goes back."""
    settings.NOTIFY = {**settings.NOTIFY, "MAX_ATTEMPTS": {"high": 1, "standard": 1}}
    n = make(Status.QUEUED)
    claim.claim([str(n.pk)], clock.now())
    stalled = Notification.objects.get(pk=n.pk)  # worker 1, attempt 1: its call hangs
    Notification.objects.filter(pk=n.pk).update(lease_until=_past())
    scheduler.reconcile()  # its lease ran out on the last allowed attempt: dead-lettered
    assert services.replay_dead_letters([n.pk], by="support") == 1
    claim.claim([str(n.pk)], clock.now())  # worker 2: attempt 1 again, claim 2
    claim.release([n.pk])
    record.reschedule([stalled], clock.now() + timedelta(minutes=1), "attempt 1 failed (503)", kind="retry",
                      give_back_attempt=False)
    n.refresh_from_db()
    assert (n.status, n.attempts, n.claims) == (Status.SENDING, 1, 2)
    assert not DeliveryEvent.objects.filter(notification=n, kind="retry").exists()


def test_a_claimed_campaign_row_whose_campaign_was_cancelled_meanwhile_is_recorded_cancelled():
    """Found by hstate's stateful test: the send path's own verdict ``cancelled`` (the campaign was
    cancelled after the row was claimed) was missing from the table, so recording it crashed the
    worker and the row was retried instead."""
    from campaigns.models import Campaign, CampaignStatus
    from notifications.delivery.pipeline import send_notifications
    from tests.fanout_helpers import make_campaign, make_recipient, run_fan_out

    make_recipient("lc-campaign-user")
    c = make_campaign(["lc-campaign-user"], channel="sms")
    (n,) = run_fan_out(c)
    Notification.objects.filter(pk=n.pk).update(status=Status.QUEUED, due_at=None)
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.CANCELLED)  # cancelled after the row was taken
    send_notifications([str(n.pk)])
    n.refresh_from_db()
    assert (n.status, n.reason) == (Status.CANCELLED, Reason.CAMPAIGN_CANCELLED)
    assert list(DeliveryEvent.objects.filter(notification=n).exclude(kind="accepted")
                .values_list("kind", "status", "reason")) == [("cancelled", "cancelled", "campaign_cancelled")]


def test_every_status_the_send_path_can_record_is_in_the_table():
    """The kind of test that would have found the missing ``cancelled``: every ``Status.X`` the
    delivery stages name in a verdict, a decision or a record call is a move the table lets the
    record stage make from ``sending``."""
    named = set()
    for path in (ROOT / "notifications" / "delivery").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in {"Verdict", "Decision", "finish", "transition", "defer"}:
                    named |= {a.attr for a in node.args if isinstance(a, ast.Attribute)
                              and isinstance(a.value, ast.Name) and a.value.id == "Status"}
    assert {"CANCELLED", "EXPIRED", "SENT", "FAILED", "SCHEDULED", "SUPPRESSED", "QUEUED"} <= named
    named.discard("SENDING")  # a verdict to go on sending (a silent push): no move
    assert [s for s in sorted(named) if not lifecycle.allowed(Cause.RECORD, Status.SENDING, Status[s])] == []
