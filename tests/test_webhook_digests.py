"""Digests and the ``event.*`` webhooks (docs/WEBHOOKS.md, "Digests"): an event taken out of an open
digest by its cancel has no notification left for its users; they are ``not_reached`` by it (the API
says so) and the client hears it once, the digest's other events untouched. Sending a digest:
test_status_webhooks.py; an erasure emptying one: test_webhook_erasure.py."""

from __future__ import annotations

import uuid

import pytest

from notifications.api.event_reads import summary
from notifications.events import digests
from notifications.events import services as event_services
from notifications.webhooks import endpoints
from notifications.webhooks.models import WebhookDelivery
from preferences.models import Recipient
from tests.conftest import make_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_subscriptions")]


def test_an_event_cancelled_out_of_open_digests_tells_its_users_not_reached_once():
    client, _ = make_client()
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["event.not_reached", "event.reached"])
    kind, _ = event_services.save_type(f"likes-{uuid.uuid4().hex[:6]}", {
        "channels": ["sms"], "priority": "standard", "category": "social",
        "digest": {"window_seconds": 600, "key": "{{ data.post }}"}},
        [{"channel": "sms", "locale": "en", "body": "{{ items|length }} likes"}], client=client)
    eve = Recipient.objects.create(user_id=f"eve-{uuid.uuid4().hex[:6]}", phone="+4915112345678")
    bob = Recipient.objects.create(user_id=f"bob-{uuid.uuid4().hex[:6]}", phone="+4915112345679")
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
