"""Deleting a webhook endpoint never fails anyone's status move (docs/WEBHOOKS.md, "Delivery"): other
processes hold the endpoint in their subscriptions for up to ``WEBHOOKS_CACHE_SECONDS``, so the
outbox writes only to the endpoints that still exist (locked ``FOR KEY SHARE`` until the move
commits) and the delete takes the endpoint ``FOR UPDATE`` first. Two connections (threads) on the
real database; "another process" is this one with its subscriptions read before the delete."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection
from django.test import Client

from core import clock
from notifications import lifecycle
from notifications.models import Notification, Status
from notifications.webhooks import delivery, endpoints, outbox, retention
from notifications.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from preferences.models import Recipient
from tests.conftest import make_client

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120),
              pytest.mark.usefixtures("fresh_subscriptions")]

EVENTS = ["notification.sent", "notification.cancelled"]


def rows_of(client, n: int, status: str = Status.SENDING) -> list[Notification]:
    made = []
    for _ in range(n):
        uid = f"u-{uuid.uuid4().hex[:10]}"
        r = Recipient.objects.create(user_id=uid, phone="+4915112345678")
        made.append(Notification.objects.create(id=uuid.uuid4(), client=client, recipient=r, channel="sms", body="b",
                                                status=status, claims=1, attempts=1))
    return made


def mark_sent(rows: list[Notification]) -> set[str]:
    return lifecycle.sent(clock.now(), "twilio", [n.pk for n in rows], [n.claims for n in rows],
                          [f"SM{i}" for i in range(len(rows))], ["" for _ in rows])


def in_thread(work, errors: list) -> threading.Thread:
    """``work`` on its own connection (its own transactions); an exception lands in ``errors``."""
    def run() -> None:
        try:
            work()
        except Exception as exc:  # reported by the test: a thread's own raise would be lost
            errors.append(exc)
        finally:
            connection.close()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def deleted_elsewhere(endpoint: WebhookEndpoint) -> None:
    """The endpoint deleted by another process: committed on another connection, and this process's
    subscriptions (read before) still hold it, as no signal reaches another process."""
    held = (outbox._subscriptions, outbox._read_at, outbox._deadline)
    errors: list = []
    in_thread(lambda: endpoints.delete(endpoint), errors).join()
    assert errors == []
    outbox._subscriptions, outbox._read_at, outbox._deadline = held


@pytest.fixture
def two_clients():
    """Client ``mine`` with endpoints ``gone`` (to be deleted) and ``kept``; ``other`` with its own."""
    mine, mine_key = make_client()
    other, _ = make_client()
    gone = endpoints.create(mine, "https://hooks.example.com/gone", EVENTS)
    kept = endpoints.create(mine, "https://hooks.example.com/kept", EVENTS)
    theirs = endpoints.create(other, "https://hooks.example.com/theirs", EVENTS)
    return mine, mine_key, other, gone, kept, theirs


def deliveries() -> list[tuple]:
    return sorted((str(d.endpoint_id), str(d.notification_id), d.event_type) for d in WebhookDelivery.objects.all())


def test_a_batch_moved_with_a_deleted_endpoint_in_the_cache_commits_without_it(two_clients):
    """The finding: ``record_sent`` crashed on the foreign key and every row of the batch (another
    client's too) stayed ``sending`` until its lease ran out."""
    mine, _key, other, gone, kept, theirs = two_clients
    rows = rows_of(mine, 2) + rows_of(other, 1)
    assert gone.pk in outbox.subscribers("notification.sent")[mine.pk]  # read before the delete
    deleted_elsewhere(gone)

    assert len(mark_sent(rows)) == 3

    assert sorted(Notification.objects.values_list("status", flat=True)) == ["sent"] * 3
    assert deliveries() == sorted([(str(kept.pk), str(n.pk), "notification.sent") for n in rows[:2]]
                                  + [(str(theirs.pk), str(rows[2].pk), "notification.sent")])


def test_a_cancel_through_the_api_with_a_deleted_endpoint_in_the_cache_answers_and_commits(two_clients):
    """The finding: 7 of 12 ``POST /v1/notifications/{id}/cancel`` answered 500."""
    mine, key, _other, gone, kept, _theirs = two_clients
    row = rows_of(mine, 1, status=Status.QUEUED)[0]
    outbox.subscribers("notification.cancelled")
    deleted_elsewhere(gone)

    r = Client(headers={"Authorization": f"Api-Key {key}"}).post(f"/v1/notifications/{row.pk}/cancel")

    assert r.status_code == 200, r.content
    assert Notification.objects.get(pk=row.pk).status == Status.CANCELLED
    assert deliveries() == [(str(kept.pk), str(row.pk), "notification.cancelled")]


def waiting_on_a_lock(thread: threading.Thread) -> None:
    """Returns once another connection of this test's database waits on a lock, or ``thread`` ended."""
    with connection.cursor() as cur:
        while thread.is_alive():
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            if cur.fetchone()[0]:
                return
            thread.join(0.01)


def test_a_delete_waits_for_a_move_in_flight_and_then_removes_its_deliveries(two_clients):
    """A move that wrote to the endpoint before the delete: the delete waits for its commit (the
    endpoint row is locked by the move), then deletes what it wrote; both succeed."""
    mine, _key, other, gone, kept, theirs = two_clients
    rows = rows_of(mine, 2) + rows_of(other, 1)
    written, go, errors = threading.Event(), threading.Event(), []

    def move() -> None:
        from django.db import transaction
        with transaction.atomic():
            mark_sent(rows)
            written.set()
            go.wait(60)

    mover = in_thread(move, errors)
    assert written.wait(60)
    deleter = in_thread(lambda: endpoints.delete(gone), errors)
    waiting_on_a_lock(deleter)
    go.set()
    mover.join(60)
    deleter.join(60)

    assert errors == []
    assert sorted(Notification.objects.values_list("status", flat=True)) == ["sent"] * 3
    assert not WebhookEndpoint.objects.filter(pk=gone.pk).exists()
    assert deliveries() == sorted([(str(kept.pk), str(n.pk), "notification.sent") for n in rows[:2]]
                                  + [(str(theirs.pk), str(rows[2].pk), "notification.sent")])


def test_a_move_during_a_delete_skips_the_endpoint_without_waiting(two_clients, monkeypatch):
    """The delete holds the endpoint (``FOR UPDATE``) while it deletes its deliveries: a move made
    then writes nothing to it, and does not wait for the delete (a send batch is never held by it)."""
    mine, _key, other, gone, kept, theirs = two_clients
    rows = rows_of(mine, 2) + rows_of(other, 1)
    outbox.subscribers("notification.sent")
    holding, go, errors = threading.Event(), threading.Event(), []
    real_batch = retention._delete_batch

    def paused_batch(*args):
        holding.set()
        go.wait(60)
        return real_batch(*args)

    monkeypatch.setattr(retention, "_delete_batch", paused_batch)
    deleter = in_thread(lambda: endpoints.delete(gone), errors)
    assert holding.wait(60)

    assert len(mark_sent(rows)) == 3  # does not wait for the delete (it would never end here)
    assert deliveries() == sorted([(str(kept.pk), str(n.pk), "notification.sent") for n in rows[:2]]
                                  + [(str(theirs.pk), str(rows[2].pk), "notification.sent")])
    go.set()
    deleter.join(60)
    assert errors == []
    assert not WebhookEndpoint.objects.filter(pk=gone.pk).exists()


def test_a_delivery_run_records_nothing_for_an_endpoint_deleted_during_it(two_clients):
    """The webhook worker's run ends quietly when its endpoint was deleted meanwhile (its attempts'
    deliveries are gone with it), instead of failing on the attempts' foreign key."""
    mine, _key, _other, gone, _kept, _theirs = two_clients
    row = rows_of(mine, 1)[0]
    mark_sent([row])
    pending = WebhookDelivery.objects.get(endpoint=gone)
    tried = delivery.Tried(pending, 1, 200, 12, "", str(WebhookDelivery.State.DELIVERED), None, clock.now(),
                           clock.now())
    endpoints.delete(gone)

    delivery.record(gone, [tried])

    assert WebhookAttempt.objects.count() == 0
    assert not WebhookDelivery.objects.filter(endpoint_id=gone.pk).exists()


def test_campaign_completed_with_a_deleted_endpoint_in_the_cache_goes_to_the_others(two_clients):
    mine, _key, _other, gone, kept, _theirs = two_clients
    gone.events = kept.events = ["campaign.completed"]
    gone.save()
    kept.save()
    outbox.subscribers("campaign.completed")
    deleted_elsewhere(gone)
    campaign_id = uuid.uuid4()

    assert outbox.emit_campaign_completed(campaign_id, mine.pk, clock.now()) == 1

    assert [(d.endpoint_id, d.payload["data"]["campaign_id"]) for d in WebhookDelivery.objects.all()] == [
        (kept.pk, str(campaign_id))]
