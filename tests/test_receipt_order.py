"""Receipts apply in the provider's order, not in the order our receipt workers get to them (issue 24,
item 2; docs/ARCHITECTURE.md §5, "Receipt order").

The issue's race: Twilio posted ``undelivered`` (ErrorCode 30008) for an SMS, we answered 204, then it
posted ``delivered`` for the same message. Each callback became one message on the ``receipts``
queue, and two receipt workers applied them concurrently: 6 of 27 trials ended ``delivered`` with the
timeline listing ``delivered`` first, the others ``failed``. Twilio's callbacks carry no event time,
so the instant we received each one orders them; the newest receipt of a message is its end, and the
timeline lists receipts as they came.

Here the callbacks go through the real webhook (signed, answered 204) with the queue path on, and the
queued messages are applied by :func:`notifications.receipts.apply_wire`, as the receipts worker does:
in arrival order, against it, and from two connections at once.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from core import clock
from notifications import receipts
from notifications.models import Notification, Status, TimelineEntry
from preferences.models import Recipient
from tests.test_lifecycle_stateful import race
from tests.test_webhooks import PUBLIC, twilio_post

# Committed rows: the racing workers apply the receipts on connections of their own.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

NOW = datetime(2031, 7, 1, 12, 0, tzinfo=UTC)
#: Trials of the two-worker race (the issue saw the wrong end in 6 of 27).
TRIALS = 12


@pytest.fixture
def queued(settings, monkeypatch, frozen):
    """Webhooks verify and queue (``RECEIPTS_INLINE`` off, as in production); the messages the
    receipts worker would take from the queue are kept here instead, in the order they were queued."""
    settings.PUBLIC_BASE_URL = PUBLIC
    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    messages: list[list[dict]] = []

    def send_task(name, args, **_options):
        assert name == receipts.RECEIPTS_TASK
        messages.append(args[0])

    monkeypatch.setattr(receipts.current_app, "send_task", send_task)
    return messages


def sent_sms() -> Notification:
    uid = f"ro-{uuid.uuid4().hex[:8]}"
    r = Recipient.objects.create(user_id=uid, phone="+4915112345678")
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="sms", body="b", status=Status.SENT,
                                       provider="twilio", provider_message_id=f"SM{uuid.uuid4().hex}",
                                       sent_at=NOW - timedelta(minutes=1))


def post_both(n: Notification, frozen, queued: list, first: tuple, second: tuple) -> tuple[list, list]:
    """Twilio posts ``first`` then, 2 s later, ``second`` (``(status, ErrorCode)``); both answered 204.
    Returns the two queued messages."""
    queued.clear()
    assert twilio_post(n, first[0], code=first[1]).status_code == 204
    frozen[0] += timedelta(seconds=2)
    assert twilio_post(n, second[0], code=second[1]).status_code == 204
    frozen[0] += timedelta(seconds=5)  # the receipt workers get to them later
    assert len(queued) == 2
    return queued[0], queued[1]


def receipts_on_timeline(n: Notification) -> list[tuple[str, str]]:
    """The receipt entries of ``n``'s timeline as every reader orders them: ``(kind, status)``."""
    return list(TimelineEntry.objects.filter(notification_id=n.pk, kind__startswith="receipt:")
                .order_by("created_at", "id").values_list("kind", "status"))


def end_of(n: Notification) -> tuple:
    n.refresh_from_db()
    return n.status, n.reason, n.reason_detail


UNDELIVERED = ("undelivered", "30008")
DELIVERED = ("delivered", "")
FAILED_30008 = ("failed", "provider_undelivered", "twilio undelivered code 30008")
ENDS_DELIVERED = ("delivered", "", "")


def test_in_arrival_order_the_later_delivered_is_the_end(queued, frozen):
    n = sent_sms()
    undelivered, delivered = post_both(n, frozen, queued, UNDELIVERED, DELIVERED)

    assert receipts.apply_wire(undelivered) == {"applied": 1, "duplicate": 0, "unknown": 0}
    assert end_of(n) == FAILED_30008
    assert receipts.apply_wire(delivered) == {"applied": 1, "duplicate": 0, "unknown": 0}

    assert end_of(n) == ENDS_DELIVERED
    assert receipts_on_timeline(n) == [("receipt:undelivered", "failed"), ("receipt:delivered", "delivered")]


def test_against_arrival_order_the_earlier_undelivered_changes_nothing(queued, frozen):
    """The second worker applies the older callback last: it is recorded (in its place on the
    timeline, marked out of order) and moves nothing."""
    n = sent_sms()
    undelivered, delivered = post_both(n, frozen, queued, UNDELIVERED, DELIVERED)

    assert receipts.apply_wire(delivered) == {"applied": 1, "duplicate": 0, "unknown": 0}
    assert receipts.apply_wire(undelivered) == {"applied": 1, "duplicate": 0, "unknown": 0}

    assert end_of(n) == ENDS_DELIVERED
    assert receipts_on_timeline(n) == [("receipt:undelivered", ""), ("receipt:delivered", "delivered")]
    late = n.events.get(kind="receipt:undelivered")
    assert "out of order" in late.detail


@pytest.mark.parametrize("reverse", [False, True], ids=["in_order", "reversed"])
def test_a_later_undelivered_ends_a_delivered_sms_in_either_order(queued, frozen, reverse):
    """The rule the other way round: the newest callback is the end, whichever is applied first."""
    n = sent_sms()
    delivered, undelivered = post_both(n, frozen, queued, DELIVERED, UNDELIVERED)

    for message in ([undelivered, delivered] if reverse else [delivered, undelivered]):
        receipts.apply_wire(message)

    assert end_of(n) == FAILED_30008
    assert [kind for kind, _status in receipts_on_timeline(n)] == ["receipt:delivered", "receipt:undelivered"]


def test_two_receipt_workers_racing_end_every_trial_the_same(queued, frozen):
    """The issue's trials: the two queued callbacks applied at once from two connections, released
    together, :data:`TRIALS` times. Every trial ends ``delivered`` with the timeline in arrival order."""
    ends, timelines = [], []
    for trial in range(TRIALS):
        n = sent_sms()
        messages = post_both(n, frozen, queued, UNDELIVERED, DELIVERED)
        # Which worker's thread starts first alternates: either may win the row's lock.
        race(*[lambda m=m: receipts.apply_wire(m) for m in (messages[::-1] if trial % 2 else messages)])
        ends.append(end_of(n))
        timelines.append([kind for kind, _status in receipts_on_timeline(n)])

    assert Counter(ends) == {ENDS_DELIVERED: TRIALS}
    assert timelines == [["receipt:undelivered", "receipt:delivered"]] * TRIALS


def test_the_received_instant_travels_with_the_queued_message(queued, frozen):
    """A worker applying a message long after it came still orders it by when it came."""
    n = sent_sms()
    undelivered, delivered = post_both(n, frozen, queued, UNDELIVERED, DELIVERED)
    frozen[0] += timedelta(minutes=10)

    receipts.apply_wire(delivered)
    receipts.apply_wire(undelivered)

    entries = dict(TimelineEntry.objects.filter(notification_id=n.pk).values_list("kind", "created_at"))
    assert entries == {"receipt:undelivered": NOW, "receipt:delivered": NOW + timedelta(seconds=2)}
    assert clock.now() == NOW + timedelta(minutes=10, seconds=7)
