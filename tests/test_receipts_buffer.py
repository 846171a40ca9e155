"""The receipts buffer never loses a receipt a webhook answered 2xx for: a drain killed between the
take and the commit leaves its batch leased, and once the lease ran out the reconciler's tick and the
next drain apply it; applying a batch twice changes nothing (notifications/receipts_buffer.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from core import clock
from core.redis_client import get_redis
from notifications import receipts, receipts_buffer, tasks
from notifications.models import DeliveryEvent, Notification
from tests.test_webhooks import _public_url, make_notification, twilio_post  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.django_db


class WorkerKilled(BaseException):
    """The drain's process ends here (SIGKILL, OOM): nothing after it runs."""


@pytest.fixture
def buffered(settings, monkeypatch):
    """Receipts go through the buffer; drains queued are recorded, not sent; the reconciler only
    looks at the buffer. Returns the names of the tasks queued."""
    settings.NOTIFY = {**settings.NOTIFY, "RECEIPTS_INLINE": False}
    redis = get_redis()
    redis.delete(receipts_buffer.BUFFER_KEY, receipts_buffer.DRAIN_FLAG, receipts_buffer.PROCESSING,
                 *redis.keys(receipts_buffer.BATCH_PREFIX + "*"))
    queued: list[str] = []
    monkeypatch.setattr(receipts.current_app, "send_task", lambda name, **kw: queued.append(name))
    monkeypatch.setattr(tasks.scheduler, "reconcile", lambda: {})
    yield queued
    redis.delete(receipts_buffer.BUFFER_KEY, receipts_buffer.DRAIN_FLAG, receipts_buffer.PROCESSING,
                 *redis.keys(receipts_buffer.BATCH_PREFIX + "*"))


def _callbacks(count: int) -> list[Notification]:
    """``count`` SMS rows, each with its Twilio ``sent`` and ``delivered`` callbacks answered 204."""
    rows = [make_notification("sms") for _ in range(count)]
    for n in rows:
        assert twilio_post(n, "sent").status_code == 204
        assert twilio_post(n, "delivered").status_code == 204
    return rows


def _lease_ran_out(monkeypatch) -> None:
    """The platform clock moves past the dead drain's lease (and its flag expired with it)."""
    later = timezone.now() + timedelta(seconds=receipts_buffer.FLAG_SECONDS + 1)
    monkeypatch.setattr(clock, "now", lambda: later)
    get_redis().delete(receipts_buffer.DRAIN_FLAG)


def _timelines(rows: list[Notification]) -> list[tuple[str, list[str]]]:
    return [(Notification.objects.get(pk=n.pk).status,
             list(DeliveryEvent.objects.filter(notification_id=n.pk).order_by("id").values_list("kind", flat=True)))
            for n in rows]


def test_a_drain_killed_between_take_and_commit_loses_nothing_and_applies_each_receipt_once(buffered, monkeypatch):
    rows = _callbacks(3)
    assert buffered == ["notifications.drain_receipts"]
    real_apply = receipts.apply_wire

    def killed_mid_batch(items):
        real_apply(items[:2])  # the first row's two receipts committed, then the worker dies
        raise WorkerKilled

    monkeypatch.setattr(receipts, "apply_wire", killed_mid_batch)
    with pytest.raises(WorkerKilled):
        tasks.drain_receipts()
    monkeypatch.setattr(receipts, "apply_wire", real_apply)
    assert get_redis().llen(receipts_buffer.BUFFER_KEY) == 0  # taken...
    assert receipts.drain_buffer() == {"applied": 0, "duplicate": 0, "unknown": 0}  # ...and leased: not retaken yet
    assert [status for status, _kinds in _timelines(rows)] == ["delivered", "sent", "sent"]

    _lease_ran_out(monkeypatch)
    buffered.clear()
    assert tasks.reconcile() == {"receipts_drain_queued": True}
    assert buffered == ["notifications.drain_receipts"]
    assert tasks.drain_receipts() == {"applied": 4, "duplicate": 2, "unknown": 0}
    assert _timelines(rows) == [("delivered", ["receipt:sent", "receipt:delivered"])] * 3
    assert DeliveryEvent.objects.filter(notification_id__in=[n.pk for n in rows]).count() == 6
    assert get_redis().zcard(receipts_buffer.PROCESSING) == 0
    assert tasks.reconcile() == {"receipts_drain_queued": False}  # nothing waits


def test_a_batch_applied_and_then_applied_again_changes_nothing(buffered, monkeypatch):
    """The drain died after its batch committed, before it released it: the batch is applied a second
    time, and every receipt of it is a duplicate."""
    rows = _callbacks(2)
    real_apply = receipts.apply_wire

    def killed_after_commit(items):
        real_apply(items)
        raise WorkerKilled

    monkeypatch.setattr(receipts, "apply_wire", killed_after_commit)
    with pytest.raises(WorkerKilled):
        receipts.drain_buffer()
    monkeypatch.setattr(receipts, "apply_wire", real_apply)
    first = _timelines(rows)
    assert first == [("delivered", ["receipt:sent", "receipt:delivered"])] * 2

    _lease_ran_out(monkeypatch)
    assert receipts.drain_buffer() == {"applied": 0, "duplicate": 4, "unknown": 0}
    assert _timelines(rows) == first
    assert DeliveryEvent.objects.filter(notification_id__in=[n.pk for n in rows]).count() == 4


def test_receipts_put_back_keep_their_place_before_later_ones(buffered, monkeypatch):
    """A dead drain's batch goes back at the head of the buffer: a later ``sent`` callback is applied
    after the batch's ``delivered`` and never moves the row back (it is stored, out of order)."""
    (n,) = _callbacks(1)
    real_apply = receipts.apply_wire

    def killed(items):
        raise WorkerKilled

    monkeypatch.setattr(receipts, "apply_wire", killed)
    with pytest.raises(WorkerKilled):
        receipts.drain_buffer()
    monkeypatch.setattr(receipts, "apply_wire", real_apply)
    assert twilio_post(n, "queued").status_code == 204
    _lease_ran_out(monkeypatch)
    assert receipts_buffer.reclaim() == 2
    assert [e.decode() for e in get_redis().lrange(receipts_buffer.BUFFER_KEY, 0, -1)][-1].count('"raw": "queued"') == 1
    assert receipts.drain_buffer() == {"applied": 3, "duplicate": 0, "unknown": 0}
    assert _timelines([n]) == [("delivered", ["receipt:sent", "receipt:delivered", "receipt:queued"])]


def test_the_drain_waits_after_a_batch_that_was_not_full_so_the_next_one_gathers_more(buffered, monkeypatch):
    """``RECEIPTS_DRAIN_LINGER``: callbacks arriving while the drain waits go into one batch."""
    batches: list[int] = []
    waits: list[float] = []

    def arrivals_meanwhile(seconds):
        waits.append(seconds)
        if len(waits) == 1:
            receipts_buffer.push([{"provider": "twilio", "n": 2}])
            receipts_buffer.push([{"provider": "twilio", "n": 3}])

    monkeypatch.setattr(receipts_buffer.time, "sleep", arrivals_meanwhile)
    receipts_buffer.push([{"provider": "twilio", "n": 1}])
    counts = receipts_buffer.drain(lambda items: batches.append(len(items)) or {"applied": len(items)}, linger=0.2)
    assert batches == [1, 2]
    assert waits == [0.2, 0.2]
    assert counts == {"applied": 3, "duplicate": 0, "unknown": 0}
