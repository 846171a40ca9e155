"""A send's free-form ``metadata`` (notifications/metadata.py; docs/API.md, docs/WEBHOOKS.md): the
rule at the API (4xx naming ``metadata.<key>``, nothing written), stored once per notification on
the single, typed and event roads, returned on GET, in every webhook payload's
``data.metadata.client``, counted by the idempotency fingerprint, kept by the archive and blanked
by an erasure. The real database, the API through Django's test client."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.test import Client

from core import clock
from notifications import lifecycle
from notifications.events import services as event_services
from notifications.lifecycle import archive
from notifications.models import Notification, NotificationHistory, Status
from notifications.webhooks import endpoints
from notifications.webhooks.models import WebhookDelivery
from preferences.api.erasure import erase_user
from preferences.models import Recipient
from tests.conftest import make_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_subscriptions")]

META = {"order_id": "A-1001", "tenant": "eu-2", "attempt": 2, "vip": True, "coupon": None}


def http_for(key: str) -> Client:
    return Client(HTTP_AUTHORIZATION=f"Api-Key {key}")


def send(http: Client, body: dict, key: str | None = None):
    return http.post("/v1/notifications", data=json.dumps(body), content_type="application/json",
                     HTTP_IDEMPOTENCY_KEY=key or uuid.uuid4().hex)


def user() -> Recipient:
    return Recipient.objects.create(user_id=f"u-{uuid.uuid4().hex[:10]}", phone="+4915112345678",
                                    email="a@example.com")


def single(uid: str, **over) -> dict:
    return {"user_id": uid, "channel": "sms", "content": {"body": "Your order shipped"}, **over}


@pytest.mark.parametrize(("metadata", "field", "code"), [
    ({"order id": "x"}, "metadata.order id", "invalid_key"),
    ({"1st": "x"}, "metadata.1st", "invalid_key"),
    ({"note": "a\u202eb"}, "metadata.note", "control_character"),
    ({"items": [1, 2]}, "metadata.items", "invalid_value"),
    ({"nested": {"a": 1}}, "metadata.nested", "invalid_value"),
    ({f"k{i}": i for i in range(21)}, "metadata", "too_many_keys"),
    ({"blob": "x" * 2100}, "metadata", "payload_too_large"),
    (["not", "an", "object"], "metadata", "invalid"),
    # jsonb keeps numbers as decimals: 1e308 came back as a 309-digit integer (hadv32).
    ({"big": 1e308}, "metadata.big", "invalid_value"),
    ({"huge": 10 ** 400}, "metadata.huge", "invalid_value"),
    ({"low": -(2 ** 53)}, "metadata.low", "invalid_value"),
])
def test_bad_metadata_is_a_422_naming_the_key_and_the_rule_and_writes_nothing(metadata, field, code):
    _, key = make_client()
    r = send(http_for(key), single(user().user_id, metadata=metadata))
    assert r.status_code == 422, r.content
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [(field, code)]
    assert Notification.objects.count() == 0


def test_a_single_sends_metadata_is_stored_returned_and_counted_by_the_fingerprint():
    _, key = make_client()
    http, uid = http_for(key), user().user_id
    r = send(http, single(uid, metadata=META), key="order-1")
    assert r.status_code == 202, r.content
    nid = r.json()["id"]
    assert Notification.objects.get(pk=nid).metadata == META
    assert http.get(f"/v1/notifications/{nid}").json()["metadata"] == META
    assert send(http, single(uid, metadata=META), key="order-1").status_code == 202  # a replay
    again = send(http, single(uid, metadata={**META, "tenant": "us-1"}), key="order-1")
    assert again.status_code == 422
    assert [(f["field"], f["code"]) for f in again.json()["error"]["fields"]] == [
        ("Idempotency-Key", "idempotency_key_reused")]
    plain = send(http, single(uid), key="order-2")
    assert plain.status_code == 202
    assert http.get(f"/v1/notifications/{plain.json()['id']}").json()["metadata"] is None
    assert Notification.objects.count() == 2


def test_typed_and_event_sends_carry_metadata_to_each_row_and_every_webhook_payload():
    client, key = make_client()
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["notification.sent", "event.reached"])
    kind, _ = event_services.save_type(f"order-{uuid.uuid4().hex[:6]}", {
        "name": "Order", "category": "shipping", "channels": ["sms", "email"]}, [
        {"channel": "sms", "locale": "en", "body": "Order {{ data.id }}"},
        {"channel": "email", "locale": "en", "title": "Order", "body": "Order {{ data.id }}"}], client=client)
    http, alice, bob = http_for(key), user(), user()
    typed = send(http, {"user_id": alice.user_id, "channel": "sms", "type": kind.key, "data": {"id": 1},
                        "metadata": {"order_id": "A-1"}})
    assert typed.status_code == 202, typed.content
    event = http.post("/v1/events", data=json.dumps({"type": kind.key, "user_ids": [bob.user_id], "data": {"id": 2},
                                                      "metadata": {"order_id": "B-2"}}),
                      content_type="application/json", HTTP_IDEMPOTENCY_KEY=uuid.uuid4().hex)
    assert event.status_code == 202, event.content
    rows = list(Notification.objects.order_by("recipient_id", "channel"))
    assert {(n.recipient_id, n.channel): n.metadata for n in rows} == {
        (alice.user_id, "sms"): {"order_id": "A-1"},
        (bob.user_id, "email"): {"order_id": "B-2"}, (bob.user_id, "sms"): {"order_id": "B-2"}}
    Notification.objects.update(status=Status.SENDING, claims=1)
    lifecycle.sent(clock.now(), "twilio", [n.pk for n in rows], [1 for _ in rows], [f"SM{i}" for i in range(3)],
                   ["" for _ in rows])
    told = {(d.event_type, str(d.notification_id or d.payload["data"]["event_id"])): d.payload["data"]
            for d in WebhookDelivery.objects.filter(endpoint=endpoint)}
    sent = {k[1]: v["metadata"]["client"] for k, v in told.items() if k[0] == "notification.sent"}
    assert sent == {str(n.pk): n.metadata for n in rows}
    assert sum(1 for k in told if k[0] == "event.reached") == 2


def test_metadata_is_kept_by_the_archive_and_blanked_by_an_erasure():
    _, key = make_client()
    r = user()
    nid = send(http_for(key), single(r.user_id, metadata=META)).json()["id"]
    Notification.objects.filter(pk=nid).update(status=Status.SENT)
    assert archive.archive(clock.now() + timedelta(days=2), 100) == 1
    assert NotificationHistory.objects.get(pk=nid).metadata == META
    erase_user(r, requested_by="test")
    assert NotificationHistory.objects.get(pk=nid).metadata is None


def test_a_campaigns_one_metadata_object_reaches_every_member_row_and_its_webhooks():
    """One object for the campaign: checked at the API like a send's, counted by its key, returned
    on its GET, stored on each member's row at fan-out (the INSERT of a page run again:
    tests/test_campaign_rows.py) and told in the webhook of a member created suppressed."""
    from campaigns.models import Campaign
    from tests.conftest import MARKETING_SCOPES
    from tests.fanout_helpers import make_recipient, make_segment_of, run_fan_out

    client, key = make_client(scopes=MARKETING_SCOPES)
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["notification.suppressed"])
    http, tag = http_for(key), uuid.uuid4().hex[:6]
    make_recipient(f"ok-{tag}")
    make_recipient(f"bad-{tag}", phone_invalid=True)
    segment = make_segment_of([f"ok-{tag}", f"bad-{tag}"])
    segment.client = client
    segment.save(update_fields=["client"])

    def launch(metadata, idem="c1"):
        return http.post("/v1/campaigns", data=json.dumps({
            "segment_id": segment.segment_id, "channel": "sms", "category": "marketing",
            "content": {"body": "Sale!"}, "metadata": metadata}), content_type="application/json",
            HTTP_IDEMPOTENCY_KEY=idem)

    bad = launch({"promo code": "X"}, idem="c0")
    assert [(f["field"], f["code"]) for f in bad.json()["error"]["fields"]] == [("metadata.promo code", "invalid_key")]
    r = launch({"promo": "WINTER", "wave": 3})
    assert r.status_code == 202, r.content
    assert launch({"promo": "SUMMER", "wave": 3}).status_code == 422  # the key's body had other metadata
    assert http.get(f"/v1/campaigns/{r.json()['id']}").json()["metadata"] == {"promo": "WINTER", "wave": 3}
    rows = run_fan_out(Campaign.objects.get(pk=r.json()["id"]))
    assert [(n.status, n.metadata) for n in rows] == [("suppressed", {"promo": "WINTER", "wave": 3}),
                                                      ("queued", {"promo": "WINTER", "wave": 3})]
    [told] = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert told.payload["data"]["metadata"]["client"] == {"promo": "WINTER", "wave": 3}


def test_numbers_within_the_safe_range_come_back_as_they_were_sent():
    _, key = make_client()
    sent = {"max": 2 ** 53 - 1, "min": -(2 ** 53 - 1), "half": 0.5, "ratio": 1234.5678, "flag": True}
    r = send(http_for(key), single(user().user_id, metadata=sent))
    assert r.status_code == 202, r.content
    back = http_for(key).get(f"/v1/notifications/{r.json()['id']}").json()["metadata"]
    assert back == sent and {k: type(v) for k, v in back.items()} == {k: type(v) for k, v in sent.items()}
