"""The idempotency fingerprint (notifications/services.py, ``request_fingerprint``;
docs/SECURITY.md): a keyed hash, so a stored one does not give a sensitive send's code back; a
plain one stored before the deploy is rewritten by migration 0036 (or matched, if written by a
process still on the old code) and still recognises a replay; an erasure blanks the erased user's."""

from __future__ import annotations

import hashlib
import importlib
import json

import pytest
from django.apps import apps as django_apps
from django.db import connection
from django.test import Client

from campaigns.models import Campaign, Segment
from notifications import services
from notifications.events.models import Event
from notifications.models import APIClient, Notification
from preferences.models import Recipient
from tests.conftest import EVERY_SCOPE
from tests.test_acceptance_limits import otp_type

pytestmark = pytest.mark.django_db

CODE_SEND = {"user_id": "alice", "channel": "sms", "sensitive": True, "content": {"body": "Your code is 482913"}}
_0036 = importlib.import_module("notifications.migrations.0036_keyed_request_fingerprint")


@pytest.fixture
def http():
    Recipient.objects.create(user_id="alice", phone="+4915123456789", email="alice@example.org")
    _, key = APIClient.objects.create_key(name="fingerprints", scopes=list(EVERY_SCOPE))
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def hashed(monkeypatch) -> list:
    """The bodies the API hashes (the validated requests), in order."""
    from notifications.api import events

    seen: list = []
    real = services.request_fingerprint

    def spy(body):
        seen.append(body)
        return real(body)

    monkeypatch.setattr(services, "request_fingerprint", spy)
    monkeypatch.setattr(events, "request_fingerprint", spy)
    return seen


def post(http, path: str, body: dict, key: str):
    return http.post(path, data=json.dumps(body), content_type="application/json", headers={"Idempotency-Key": key})


def reused(resp) -> bool:
    """The answer to a key used with another body: 422 on the ``Idempotency-Key`` header."""
    error = resp.json()["error"]
    return resp.status_code == 422 and [(f["field"], f["code"]) for f in error["fields"]] == [
        ("Idempotency-Key", "idempotency_key_reused")]


def plain(body: object) -> str:
    """The fingerprint as it was stored before it was keyed: SHA-256 of the canonical JSON."""
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                                     default=str).encode()).hexdigest()


def test_the_stored_fingerprint_does_not_give_the_code_back(http, hashed):
    assert post(http, "/v1/notifications", CODE_SEND, "code-1").status_code == 202
    stored = Notification.objects.get().request_fingerprint
    # The attack: the request's canonical form with each candidate code, hashed as it was stored.
    tried = {plain({**hashed[0], "content": {**hashed[0]["content"], "body": f"Your code is {code}"}}): code
             for code in range(482900, 483000)}
    assert stored not in tried
    assert (stored[:3], len(stored)) == ("rf-", 64)


def test_a_replay_needs_the_servers_secret_to_match(http, settings):
    assert post(http, "/v1/notifications", CODE_SEND, "code-2").status_code == 202
    assert post(http, "/v1/notifications", CODE_SEND, "code-2")["Idempotent-Replayed"] == "true"
    settings.SECRET_KEY = "another-" + settings.SECRET_KEY
    resp = post(http, "/v1/notifications", CODE_SEND, "code-2")
    assert reused(resp)


def test_a_plain_fingerprint_stored_before_the_deploy_still_replays(http, hashed):
    assert post(http, "/v1/notifications", CODE_SEND, "old-1").status_code == 202
    Notification.objects.update(request_fingerprint=plain(hashed[0]))
    resp = post(http, "/v1/notifications", CODE_SEND, "old-1")
    assert (resp.status_code, resp["Idempotent-Replayed"]) == (202, "true")
    other = post(http, "/v1/notifications", {**CODE_SEND, "content": {"body": "Your code is 000000"}}, "old-1")
    assert reused(other)


def test_the_migration_rewrites_plain_fingerprints_into_the_keyed_ones(http, hashed):
    otp_type()
    assert post(http, "/v1/notifications", CODE_SEND, "m-1").status_code == 202
    event_body = {"type": "otp", "user_id": "alice", "data": {"code": "482913"}}
    assert post(http, "/v1/events", event_body, "m-2").status_code == 202
    keyed = (Notification.objects.get(idempotency_key="m-1").request_fingerprint,
             Event.objects.get().request_fingerprint)
    segment = Segment.objects.create(segment_id="s", name="s")
    campaign = Campaign.objects.create(name="c", channel="sms", segment=segment, request_fingerprint=plain({"c": 1}))
    Notification.objects.filter(idempotency_key="m-1").update(request_fingerprint=plain(hashed[0]))
    Event.objects.update(request_fingerprint=plain(hashed[1]))
    with connection.schema_editor() as editor:
        _0036.to_keyed(django_apps, editor)
        importlib.import_module("campaigns.migrations.0012_keyed_request_fingerprint").to_keyed(django_apps, editor)
    assert (Notification.objects.get(idempotency_key="m-1").request_fingerprint,
            Event.objects.get().request_fingerprint) == keyed
    campaign.refresh_from_db()
    assert campaign.request_fingerprint == services.keyed_fingerprint(plain({"c": 1}))
    assert post(http, "/v1/events", event_body, "m-2")["Idempotent-Replayed"] == "true"


def test_an_erasure_blanks_the_fingerprints_of_the_erased_users_requests(http):
    otp_type()
    assert post(http, "/v1/notifications", CODE_SEND, "e-1").status_code == 202
    assert post(http, "/v1/events", {"type": "otp", "user_id": "alice", "data": {"code": "482913"}},
                "e-2").status_code == 202
    assert http.delete("/v1/users/alice").status_code == 200
    assert list(Notification.objects.values_list("request_fingerprint", flat=True).distinct()) == [""]
    assert list(Notification.objects.values_list("limit_contact", flat=True).distinct()) == [""]  # hadv24c 3
    assert Event.objects.get().request_fingerprint == ""
    resp = post(http, "/v1/notifications", CODE_SEND, "e-1")
    assert reused(resp)
