"""Erasure and status webhooks (docs/SECURITY.md, "Erasure"; hadv32 finding 2): what a client sent
about a user (``metadata.client``) leaves every webhook delivery of the user's notifications, those
already sent, those pending and the erasure's own cancellations; another user's stay as they were.
An erasure emptying an open digest: test_webhook_digests.py."""

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
