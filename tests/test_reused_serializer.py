"""``POST /v1/notifications`` validates with one serializer per thread (core/api/reused.py): its
fields are built once, not deep-copied per request, and no request sees anything of the one
before it (its data, errors, validated values or defaults)."""

from __future__ import annotations

import json
import threading
from unittest import mock

import pytest
from django.test import Client

from core.api.reused import validator
from notifications.api.serializers import ContentSerializer, SendRequestSerializer
from notifications.models import APIClient, Notification
from preferences.models import Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db


@pytest.fixture
def http():
    Recipient.objects.create(user_id="ru-alice", email="alice@example.com", phone="+4915123456789")
    _, key = APIClient.objects.create_key(name="reused", scopes=EVERY_SCOPE)
    return Client(headers={"Authorization": f"Api-Key {key}"})


def post(http, body, key):
    return http.post("/v1/notifications", data=json.dumps(body), content_type="application/json",
                     headers={"Idempotency-Key": key})


def test_a_later_request_builds_no_fields_and_sees_nothing_of_the_one_before(http):
    high = {"user_id": "ru-alice", "channel": "sms", "priority": "high", "category": "security", "sensitive": True,
            "ttl_seconds": 60, "content": {"body": "Your code is 123456"}}
    assert post(http, high, "r1").status_code == 202

    with mock.patch.object(SendRequestSerializer, "get_fields", side_effect=AssertionError("built again")), \
            mock.patch.object(ContentSerializer, "get_fields", side_effect=AssertionError("built again")):
        plain = post(http, {"user_id": "ru-alice", "channel": "email",
                            "content": {"title": "Hi", "body": "Hello"}}, "r2")
        refused = post(http, {"user_id": "ru-alice", "channel": "sms", "content": {"body": "x", "titel": "y"}}, "r3")
        again = post(http, {"user_id": "ru-alice", "channel": "sms", "content": {"body": "ok"}}, "r4")

    assert plain.status_code == 202
    n = Notification.objects.get(pk=plain.json()["id"])
    # The defaults, not the first request's values.
    assert (n.channel, n.priority, n.category, n.sensitive, n.expires_at, n.title) == (
        "email", "standard", "", False, None, "Hi")
    assert refused.status_code == 422
    assert [(f["field"], f["code"]) for f in refused.json()["error"]["fields"]] == [("content.titel", "unknown_field")]
    assert again.status_code == 202  # the refusal's errors are not kept
    assert Notification.objects.get(pk=again.json()["id"]).body == "ok"


def test_each_thread_has_its_own_instance_with_only_its_own_data():
    mine = validator(SendRequestSerializer, {"user_id": "a"})
    assert validator(SendRequestSerializer, {"user_id": "b"}) is mine and mine.initial_data == {"user_id": "b"}
    assert not hasattr(mine, "_validated_data") and not hasattr(mine, "_errors")
    theirs = []
    thread = threading.Thread(target=lambda: theirs.append(validator(SendRequestSerializer, {"user_id": "c"})))
    thread.start()
    thread.join()
    assert theirs[0] is not mine and theirs[0].initial_data == {"user_id": "c"}
    assert mine.initial_data == {"user_id": "b"}
