"""A send's and an event's ``metadata`` (docs/API.md, "Metadata"): stored with each notification,
returned on reads, carried by the status webhooks, part of the request a key stands for, erased with
the user; a broken rule is a 422 naming ``metadata`` or ``metadata.<key>``, writing nothing."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client

from notifications.events import services as event_services
from notifications.models import Notification
from notifications.webhooks import endpoints, outbox
from notifications.webhooks.models import WebhookDelivery
from preferences.api.erasure import erase_user
from preferences.models import Recipient
from tests.conftest import make_client
from tests.test_status_webhooks import ORDER, ORDER_TEMPLATES, mark_sent

pytestmark = pytest.mark.django_db

META = {"order_id": "A-1042", "tenant": "acme", "attempt": 2, "vip": True, "coupon": None, "score": 0.5}


@pytest.fixture(autouse=True)
def fresh_subscriptions():
    outbox.forget_subscriptions()
    yield
    outbox.forget_subscriptions()


@pytest.fixture
def api():
    client, key = make_client()
    Recipient.objects.create(user_id="meta-ann", phone="+4915112345601", email="ann@example.com")
    return client, Client(headers={"Authorization": f"Api-Key {key}"})


def send(http, metadata, key=None, **more):
    body = {"user_id": "meta-ann", "channel": "sms", "content": {"body": "Your code is 1234"}, **more}
    if metadata is not ...:
        body["metadata"] = metadata
    return http.post("/v1/notifications", data=json.dumps(body), content_type="application/json",
                     headers={"Idempotency-Key": key or uuid.uuid4().hex})


def test_a_sends_metadata_is_stored_returned_and_in_its_webhooks(api):
    client, http = api
    endpoints.create(client, "https://hooks.example.com/a", ["notification.sent"])
    r = send(http, META)
    assert r.status_code == 202, r.content
    n = Notification.objects.get(pk=r.json()["id"])
    assert n.metadata == META
    got = http.get(f"/v1/notifications/{n.pk}").json()
    assert got["metadata"] == META
    listed = http.get("/v1/users/meta-ann/notifications").json()
    assert [item["metadata"] for item in listed["items"]] == [META]
    Notification.objects.filter(pk=n.pk).update(status="sending", claims=1)
    n.refresh_from_db()
    mark_sent([n])
    [told] = WebhookDelivery.objects.all()
    assert told.payload["data"]["metadata"] == META
    assert (told.payload["data"]["user_id"], told.payload["data"]["idempotency_key"]) == ("meta-ann", n.idempotency_key)


def test_without_metadata_reads_and_webhooks_say_an_empty_object(api):
    _client, http = api
    r = send(http, ...)
    n = Notification.objects.get(pk=r.json()["id"])
    assert n.metadata is None
    assert http.get(f"/v1/notifications/{n.pk}").json()["metadata"] == {}


def test_the_key_stands_for_the_metadata_too(api):
    _client, http = api
    first = send(http, {"order_id": "A-1"}, key="order-1")
    assert first.status_code == 202
    again = send(http, {"order_id": "A-1"}, key="order-1")
    assert (again.status_code, again.json()["id"]) == (first.status_code, first.json()["id"])
    other = send(http, {"order_id": "A-2"}, key="order-1")
    assert other.status_code == 422, other.content
    assert Notification.objects.count() == 1


@pytest.mark.parametrize(("metadata", "field", "code"), [
    (["a"], "metadata", "invalid_type"),
    ({f"k{i}": i for i in range(21)}, "metadata", "too_many_keys"),
    ({"bad key": 1}, "metadata.bad key", "invalid_key"),
    ({"-dash": 1}, "metadata.-dash", "invalid_key"),
    ({"x" * 65: 1}, f"metadata.{'x' * 65}", "invalid_key"),
    ({"nested": {"a": 1}}, "metadata.nested", "wrong_type"),
    ({"list": [1, 2]}, "metadata.list", "wrong_type"),
    ({"long": "x" * 501}, "metadata.long", "max_length"),
    ({"rtl": "abc\u202edef"}, "metadata.rtl", "control_character"),
    ({f"k{i}": "x" * 200 for i in range(12)}, "metadata", "payload_too_large"),
])
def test_broken_metadata_is_422_naming_the_key_and_the_rule_and_writes_nothing(api, metadata, field, code):
    _client, http = api
    r = send(http, metadata)
    assert r.status_code == 422, r.content
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [(field, code)]
    assert Notification.objects.count() == 0


def test_an_events_metadata_is_on_each_of_its_notifications_and_in_its_webhooks(api):
    client, http = api
    kind, _ = event_services.save_type(f"order-{uuid.uuid4().hex[:6]}", ORDER, ORDER_TEMPLATES, client=client)
    Recipient.objects.filter(user_id="meta-ann").update(email="ann@example.com")
    Recipient.objects.create(user_id="meta-bob", phone="+4915112345602", email="bob@example.com")
    endpoints.create(client, "https://hooks.example.com/a", ["notification.sent", "event.reached"])
    r = http.post("/v1/events", data=json.dumps({"type": kind.key, "user_ids": ["meta-ann", "meta-bob"],
                                                 "data": {"id": 7}, "metadata": {"order_id": "A-7"}}),
                  content_type="application/json", headers={"Idempotency-Key": "evt-7"})
    assert r.status_code == 202, r.content
    rows = list(Notification.objects.filter(event_id=r.json()["id"]))
    assert sorted((n.recipient_id, n.channel, n.metadata["order_id"]) for n in rows) == [
        ("meta-ann", "email", "A-7"), ("meta-ann", "sms", "A-7"), ("meta-bob", "email", "A-7"),
        ("meta-bob", "sms", "A-7")]
    Notification.objects.filter(event_id=r.json()["id"]).update(status="sending", claims=1)
    mark_sent(list(Notification.objects.filter(event_id=r.json()["id"])))
    sent = WebhookDelivery.objects.filter(event_type="notification.sent")
    assert [d.payload["data"]["metadata"] for d in sent] == [{"order_id": "A-7"}] * 4
    other = http.post("/v1/events", data=json.dumps({"type": kind.key, "user_ids": ["meta-ann", "meta-bob"],
                                                     "data": {"id": 7}, "metadata": {"order_id": "A-8"}}),
                      content_type="application/json", headers={"Idempotency-Key": "evt-7"})
    assert other.status_code == 422, other.content


def test_erasure_removes_the_metadata(api):
    _client, http = api
    r = send(http, {"email": "ann@example.com"})
    erase_user(Recipient.objects.get(pk="meta-ann"), requested_by="api client tests")
    assert Notification.objects.get(pk=r.json()["id"]).metadata is None
