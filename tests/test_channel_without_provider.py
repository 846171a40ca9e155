"""A channel whose provider list is empty (``PUSH_PROVIDERS=``: a deployment without push, issue 12
#6): a send or campaign on it is refused at once (422 ``channel_unavailable`` on ``channel``); a row
accepted before the list was emptied fails as a dead letter whose reason says why, on the single
(high) and the batch (standard) path alike.

In-process (Django test client, rolled-back transactions).
"""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client

from campaigns import services as campaign_services
from config.provider_settings import build_providers
from notifications.delivery.pipeline import send_notifications
from notifications.models import APIClient, Notification
from preferences.models import Device, Recipient
from providers.registry import check_providers_configured
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db
REFUSAL = ('no push provider is configured (PUSH_PROVIDERS is empty; settings.PROVIDERS["push"] lists none): '
           "nothing is sent on push")


@pytest.fixture
def no_push(settings):
    settings.PROVIDERS = {**settings.PROVIDERS, "push": []}


@pytest.fixture
def http():
    client, key = APIClient.objects.create_key(name="no-push", scopes=EVERY_SCOPE)
    Recipient.objects.create(user_id="alice", phone="+4915112345678")
    campaign_services.upsert_segment("vip", name="VIP", client=client)
    return Client(headers={"Authorization": f"Api-Key {key}"})


def test_an_empty_list_means_no_provider_and_passes_the_check(settings):
    built = build_providers({"PUSH_PROVIDERS": "", "SMS_PROVIDERS": " "}, "emulator",
                            emulator_url="http://127.0.0.1:8900", emulator_smtp_port=8925,
                            public_base_url="http://127.0.0.1:8000", timeout=10.0)
    assert (built["push"], built["sms"], [e["NAME"] for e in built["email"]]) == ([], [], ["sendgrid", "smtp"])
    settings.PROVIDERS = built
    assert check_providers_configured() == []
    unset = build_providers({}, "emulator", emulator_url="http://127.0.0.1:8900", emulator_smtp_port=8925,
                            public_base_url="http://127.0.0.1:8000", timeout=10.0)
    assert [e["NAME"] for e in unset["push"]] == ["fcm"]  # unset: the default list


def test_a_send_on_a_channel_without_provider_is_422_and_writes_nothing(http, no_push):
    r = http.post("/v1/notifications", data=json.dumps({"user_id": "alice", "channel": "push",
                                                        "content": {"title": "t", "body": "b"}}),
                  content_type="application/json", headers={"Idempotency-Key": "k1"})
    assert r.status_code == 422, r.content
    assert r.json()["error"]["fields"] == [{"field": "channel", "code": "channel_unavailable", "message": REFUSAL}]
    assert not Notification.objects.exists()
    ok = http.post("/v1/notifications", data=json.dumps({"user_id": "alice", "channel": "sms",
                                                         "content": {"body": "b"}}),
                   content_type="application/json", headers={"Idempotency-Key": "k2"})
    assert ok.status_code == 202  # the other channels are unaffected


def test_a_campaign_on_a_channel_without_provider_is_422(http, no_push):
    r = http.post("/v1/campaigns", data=json.dumps({"segment_id": "vip", "channel": "push",
                                                    "content": {"title": "t", "body": "b"}}),
                  content_type="application/json", headers={"Idempotency-Key": "c1"})
    assert r.status_code == 422, r.content
    assert {"field": "channel", "code": "channel_unavailable", "message": REFUSAL} in r.json()["error"]["fields"]


@pytest.mark.parametrize("priority", ["high", "standard"])  # the single and the batch path
def test_a_row_accepted_before_is_a_dead_letter_saying_why(no_push, priority):
    alice = Recipient.objects.create(user_id=f"a-{uuid.uuid4().hex[:6]}")
    Device.objects.create(recipient=alice, platform="android", push_token=f"tok-{uuid.uuid4().hex[:6]}")
    n = Notification.objects.create(id=uuid.uuid4(), recipient=alice, channel="push", priority=priority,
                                    title="t", body="b", status="queued")
    send_notifications([str(n.pk)])
    n.refresh_from_db()
    assert (n.status, n.reason) == ("failed", "configuration_error")
    assert n.dead_lettered_at is not None
    assert REFUSAL in n.reason_detail
