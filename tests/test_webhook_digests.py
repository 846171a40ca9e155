"""Digests and the ``event.*`` webhooks (docs/WEBHOOKS.md, "Digests"): an open digest that never sends
an event's item (an erasure empties it, or the event's cancel takes the item out) leaves that user
``not_reached`` by the event (the API says so), and the client hears it once, no client metadata in
it (an ``event.*`` body carries none); the other users and events are untouched. Sending a digest:
test_status_webhooks.py."""

from __future__ import annotations

import uuid

import pytest

from core import clock
from notifications.api.event_reads import summary
from notifications.events import digests
from notifications.events import services as event_services
from notifications.webhooks import endpoints, outbox
from notifications.webhooks.models import WebhookDelivery
from preferences.api.erasure import erase_user
from preferences.models import Recipient
from tests.conftest import make_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_subscriptions")]

SECRET = {"order": "A-1", "email": "eve@example.org"}


def digest_setup():
    """A client with an endpoint on both outcomes, a digest type of its own (an SMS of likes, a
    10-minute window) and two users, eve and bob."""
    client, _ = make_client()
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["event.not_reached", "event.reached"])
    kind, _ = event_services.save_type(f"likes-{uuid.uuid4().hex[:6]}", {
        "channels": ["sms"], "priority": "standard", "category": "social",
        "digest": {"window_seconds": 600, "key": "{{ data.post }}"}},
        [{"channel": "sms", "locale": "en", "body": "{{ items|length }} likes"}], client=client)
    eve = Recipient.objects.create(user_id=f"eve-{uuid.uuid4().hex[:6]}", phone="+4915112345678")
    bob = Recipient.objects.create(user_id=f"bob-{uuid.uuid4().hex[:6]}", phone="+4915112345679")
    return client, endpoint, kind, eve, bob


def test_an_erasure_emptying_an_open_digest_tells_its_events_not_reached_once():
    """bob's digest stays open."""
    client, endpoint, kind, eve, bob = digest_setup()
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


def test_an_event_cancelled_out_of_open_digests_tells_its_users_not_reached_once():
    client, endpoint, kind, eve, bob = digest_setup()
    first, kept = (event_services.accept_event(client=client, idempotency_key=f"like-{i}", fingerprint="f", kind=kind,
                                               recipients=[eve, bob], data={"post": "p1"}).event for i in range(2))

    assert event_services.cancel_event(first) == 2  # one item in each user's open digest

    told = sorted((d.event_type, d.subject, d.payload["data"]["user_id"], d.payload["data"]["outcome"],
                   d.payload["data"]["idempotency_key"], d.payload["data"]["notifications"])
                  for d in WebhookDelivery.objects.filter(endpoint=endpoint))
    assert told == sorted(("event.not_reached", f"event:{first.pk}:{user.pk}", user.pk, "not_reached", "like-0", [])
                          for user in (eve, bob))
    assert summary(first)["outcomes"] == {"reached": 0, "pending": 0, "not_reached": 2, "unknown": 0}
    assert summary(kept)["outcomes"] == {"reached": 0, "pending": 2, "not_reached": 0, "unknown": 0}
    assert sorted(digests.DigestItem.objects.filter(digest__closed_at__isnull=True).values_list(
        "event_id", "digest__recipient_id")) == sorted([(kept.pk, bob.pk), (kept.pk, eve.pk)])
