"""Erasure and status webhooks (docs/SECURITY.md, "Erasure"; hadv32 finding 2): what a client sent
about a user (``metadata.client``) leaves every webhook delivery of the user's notifications, those
already sent, those pending and the erasure's own cancellations; another user's stay as they were."""

from __future__ import annotations

import uuid

import pytest

from core import clock
from notifications import lifecycle
from notifications.models import Notification, Status
from notifications.webhooks import endpoints, outbox
from notifications.webhooks.models import WebhookDelivery
from preferences.api.erasure import erase_user
from preferences.models import Recipient
from tests.conftest import make_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_subscriptions")]

SECRET = {"order": "A-1", "email": "eve@example.org"}


def row(client, user: Recipient, status: str) -> Notification:
    return Notification.objects.create(id=uuid.uuid4(), client=client, recipient=user, channel="sms", body="b",
                                       status=status, claims=1, attempts=1, metadata=SECRET,
                                       idempotency_key=f"k-{uuid.uuid4().hex[:8]}")


def clients_of(rows: list[Notification]) -> dict[tuple[str, str], dict | None]:
    return {(d.event_type, str(d.notification_id)): d.payload["data"]["metadata"]["client"]
            for d in WebhookDelivery.objects.filter(notification_id__in=[n.pk for n in rows])}


def test_erasure_removes_the_clients_metadata_from_every_delivery_of_the_users_notifications():
    client, _ = make_client()
    endpoints.create(client, "https://hooks.example.com/a", ["notification.sent", "notification.cancelled"])
    eve = Recipient.objects.create(user_id=f"eve-{uuid.uuid4().hex[:6]}", phone="+4915112345678")
    bob = Recipient.objects.create(user_id=f"bob-{uuid.uuid4().hex[:6]}", phone="+4915112345679")
    eve_sent, bob_sent = row(client, eve, Status.SENDING), row(client, bob, Status.SENDING)
    eve_queued = row(client, eve, Status.QUEUED)
    lifecycle.sent(clock.now(), "twilio", [eve_sent.pk, bob_sent.pk], [1, 1], ["SM1", "SM2"], ["", ""])
    assert clients_of([eve_sent, bob_sent]) == {("notification.sent", str(eve_sent.pk)): SECRET,
                                                ("notification.sent", str(bob_sent.pk)): SECRET}

    erase_user(eve, requested_by="test")

    # The erasure cancelled the queued row: its event was written in the erasure, then cleared too.
    assert clients_of([eve_sent, eve_queued, bob_sent]) == {
        ("notification.sent", str(eve_sent.pk)): None, ("notification.cancelled", str(eve_queued.pk)): None,
        ("notification.sent", str(bob_sent.pk)): SECRET}
    cancelled = WebhookDelivery.objects.get(notification_id=eve_queued.pk).payload["data"]
    assert (cancelled["status"], cancelled["reason"], cancelled["metadata"]["user_id"]) == (
        "cancelled", "recipient_erased", eve.pk)
    assert outbox.forget_client_metadata(eve.pk) == 0  # nothing left to change


def test_an_erasure_emptying_an_open_digest_tells_its_events_not_reached_once():
    """An open digest emptied by the erasure never sends: the events in it are ``not_reached`` for
    the user (the API says so), and an endpoint subscribed to ``event.not_reached`` hears it once
    per event, no client metadata in it (an ``event.*`` body carries none); bob's digest stays open."""
    from notifications.api.event_reads import summary
    from notifications.events import services as event_services

    client, _ = make_client()
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["event.not_reached", "event.reached"])
    kind, _ = event_services.save_type(f"likes-{uuid.uuid4().hex[:6]}", {
        "channels": ["sms"], "priority": "standard", "category": "social",
        "digest": {"window_seconds": 600, "key": "{{ data.post }}"}},
        [{"channel": "sms", "locale": "en", "body": "{{ items|length }} likes"}], client=client)
    eve = Recipient.objects.create(user_id=f"eve-{uuid.uuid4().hex[:6]}", phone="+4915112345678")
    bob = Recipient.objects.create(user_id=f"bob-{uuid.uuid4().hex[:6]}", phone="+4915112345679")
    event = event_services.accept_event(client=client, idempotency_key="like-1", fingerprint="f", kind=kind,
                                        recipients=[eve, bob], data={"post": "p1"}, metadata=SECRET).event

    erase_user(eve, requested_by="test")
    outbox.emit_digests_emptied([], clock.now())  # nothing emptied: nothing told

    [told] = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert (told.event_type, told.notification_id, told.subject) == (
        "event.not_reached", None, f"event:{event.pk}:{eve.pk}")
    assert told.payload["data"] == {"event_id": str(event.pk), "user_id": eve.pk, "outcome": "not_reached",
                                    "at": told.payload["timestamp"], "idempotency_key": "like-1",
                                    "notifications": []}
    assert summary(event)["outcomes"] == {"reached": 0, "pending": 1, "not_reached": 1, "unknown": 0}
