"""Error polish (issue 10, finding 7): one shape everywhere, every message naming its field and rule.

In-process (Django test client). Each case asserts the status, the code, the named field, and that
nothing was written.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from campaigns.models import Campaign, Segment
from notifications.models import APIClient, Notification
from preferences.models import Preferences, Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db


@pytest.fixture
def key():
    return APIClient.objects.create_key(name="errors", scopes=EVERY_SCOPE)[1]


@pytest.fixture
def http(key):
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def alice():
    return Recipient.objects.create(user_id="alice", email="a@example.com", phone="+4915123456789")


def error(r) -> dict:
    return r.json()["error"]


def fields(r) -> set[tuple]:
    return {(f["field"], f["code"]) for f in error(r).get("fields", [])}


def send(http, body, key="k", **headers):
    if key:
        headers["Idempotency-Key"] = key
    return http.post("/v1/notifications", data=json.dumps(body), content_type="application/json", headers=headers)


def test_body_over_the_limit_is_413_naming_the_limit(http, alice, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    r = send(http, {"user_id": "alice", "channel": "email", "content": {"title": "t", "body": "x" * 2000}})
    assert r.status_code == 413
    assert error(r)["code"] == "payload_too_large"
    assert "1,000 bytes" in error(r)["message"]
    assert Notification.objects.count() == 0
    r = http.put("/v1/users/bob", data=json.dumps({"attributes": {"a": "x" * 2000}}), content_type="application/json")
    assert r.status_code == 413
    assert not Recipient.objects.filter(pk="bob").exists()


def test_body_over_the_limit_on_a_webhook_is_413_too(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    r = Client().post("/webhooks/twilio/status?nid=x", data={"MessageStatus": "x" * 2000},
                      headers={"X-Twilio-Signature": "sig"})
    assert r.status_code == 413
    assert error(r)["code"] == "payload_too_large"


@pytest.mark.parametrize("phone", ["abc", "4915123456789", "+49", "+999 123", "+4915123456789012345678"])
def test_phone_errors_are_ours_not_libphonenumbers(http, phone):
    r = http.put("/v1/users/bob", data=json.dumps({"phone": phone}), content_type="application/json")
    assert r.status_code == 422
    assert fields(r) == {("phone", "invalid_phone")}
    message = error(r)["message"]
    assert message.startswith("phone: ")
    for leaked in ("(0)", "(1)", "(2)", "(3)", "(4)", "The string supplied", "Missing or invalid default region",
                   "did not seem"):
        assert leaked not in message
    assert not Recipient.objects.filter(pk="bob").exists()


@pytest.mark.parametrize(("header", "code"), [
    ("Bearer abc.def", "wrong_auth_scheme"),
    ("Basic dXNlcjpwYXNz", "wrong_auth_scheme"),
    ("Api-Key", "invalid_api_key"),  # the right scheme, no key after it
    ("Api-Key abc.def", "invalid_api_key"),
])
def test_wrong_scheme_or_key_is_401_naming_the_header_and_the_scheme(alice, header, code):
    r = send(Client(headers={"Authorization": header}), {"user_id": "alice", "channel": "sms",
                                                         "content": {"body": "x"}})
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == "Api-Key"
    assert fields(r) == {("Authorization", code)}
    if code == "wrong_auth_scheme":
        assert "Api-Key" in error(r)["message"]
    assert Notification.objects.count() == 0


def test_bearer_with_a_valid_key_still_names_the_scheme(key, alice):
    r = Client(headers={"Authorization": f"Bearer {key}"}).get("/v1/users/alice")
    assert r.status_code == 401
    assert error(r)["message"] == ("Authorization: the scheme must be Api-Key: send `Authorization: Api-Key <key>` "
                                   "(got 'Bearer')")


def test_no_authorization_header_names_it():
    r = Client().get("/v1/users/alice")
    assert r.status_code == 401
    assert fields(r) == {("Authorization", "not_authenticated")}
    assert "Api-Key" in error(r)["message"]


@pytest.mark.parametrize(("over", "field"), [
    ({"sensitive": "yes"}, "sensitive"),
    ({"sensitive": 1}, "sensitive"),
    ({"user_id": 123}, "user_id"),
    ({"ttl_seconds": "60"}, "ttl_seconds"),
    ({"ttl_seconds": 60.5}, "ttl_seconds"),
    ({"ttl_seconds": True}, "ttl_seconds"),
    ({"channel": ["sms"]}, "channel"),
    ({"content": {"body": 5}}, "content.body"),
    ({"content": {"body": "x", "data": {"k": 1}}}, "content.data.k"),
    ({"category": 7}, "category"),
])
def test_json_types_are_strict(http, alice, over, field):
    body = {"user_id": "alice", "channel": "sms", "content": {"body": "x"}} | over
    r = send(http, body)
    assert r.status_code == 422, r.content
    assert fields(r) == {(field, "invalid_type")}
    assert error(r)["message"].startswith(f"{field}: must be a JSON ")
    assert Notification.objects.count() == 0


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/users/alice", {"phone": 4915123456789}, "phone"),
    ("/v1/users/alice", {"attributes": {"n": 1}}, "attributes.n"),
    ("/v1/users/alice/preferences", {"opt_outs": "sms"}, "opt_outs"),
    ("/v1/users/alice/preferences", {"quiet_hours": {"start": "22:00", "end": "07:00", "timezone": 1}},
     "quiet_hours.timezone"),
    ("/v1/users/alice/devices", {"platform": "ios", "push_token": 12345}, "push_token"),
])
def test_json_types_are_strict_on_users(http, alice, path, body, field):
    r = http.put(path, data=json.dumps(body), content_type="application/json")
    assert r.status_code == 422, r.content
    assert fields(r) == {(field, "invalid_type")}
    assert Recipient.objects.get(pk="alice").phone == "+4915123456789"
    assert not Preferences.objects.exists()


def test_json_types_are_strict_on_campaigns(http):
    Segment.objects.create(segment_id="vip", name="VIP")
    r = http.post("/v1/campaigns", data=json.dumps({"segment_id": "vip", "channel": "sms", "content": {"body": "x"},
                                                     "spread_seconds": "60"}),
                  content_type="application/json", headers={"Idempotency-Key": "c"})
    assert r.status_code == 422
    assert fields(r) == {("spread_seconds", "invalid_type")}
    assert not Campaign.objects.exists()


@pytest.mark.parametrize(("method", "path", "field"), [
    ("get", "/v1/users/ghost", "user_id"),
    ("get", "/v1/users/ghost/preferences", "user_id"),
    ("put", "/v1/users/ghost/devices", "user_id"),
    ("delete", "/v1/users/alice/devices/nope", "push_token"),
    ("get", "/v1/segments/ghost", "segment_id"),
    ("post", "/v1/segments/ghost/members", "segment_id"),
    ("get", "/v1/templates/ghost", "template_id"),
    ("get", "/v1/notifications/00000000-0000-0000-0000-000000000000", "notification_id"),
    ("get", "/v1/campaigns/00000000-0000-0000-0000-000000000000", "campaign_id"),
])
def test_404s_have_the_api_shape_and_name_the_path_field(http, alice, method, path, field):
    if method == "get":
        r = http.get(path)
    else:
        body = {"platform": "ios", "push_token": "t"} if path.endswith("devices") else {"add": ["x"]}
        r = getattr(http, method)(path, data=json.dumps(body), content_type="application/json")
    assert r.status_code == 404
    assert error(r)["code"] == "not_found"
    assert fields(r) == {(field, "not_found")}
    assert error(r)["message"].startswith(f"{field}: ")
    assert "matches the given query" not in r.content.decode()


def test_idempotency_key_message_names_the_header(http, alice):
    r = send(http, {"user_id": "alice", "channel": "sms", "content": {"body": "x"}}, key=None)
    assert r.status_code == 400
    assert error(r)["message"].startswith("Idempotency-Key: ")
    assert fields(r) == {("Idempotency-Key", "required")}


def test_every_field_error_message_starts_with_its_field(http, alice):
    r = send(http, {"user_id": "nobody", "channel": "sms", "content": {"body": "x"}})
    assert r.status_code == 422
    assert error(r)["message"].startswith("user_id: ")


# --- found by the generated-body tests (tests/test_api_generated.py) ------------------------------

@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/notifications", {"\ud800": 1}, "\\ud800"),
    ("/v1/users/alice/preferences", {"category_opt_outs": {"\ud800": ["sms"]}}, "category_opt_outs.\\ud800"),
    ("/v1/users/alice", {"attributes": {"first_name": "a\udfffb"}}, "attributes.first_name"),
    ("/v1/notifications", {"user_id": "alice", "channel": "push", "content": {"body": "x", "data": {"\ud800": "v"}}},
     "content.data.\\ud800"),
])
def test_lone_surrogates_are_400_naming_the_field_not_500(http, alice, path, body, field):
    method = http.post if path == "/v1/notifications" else http.put
    r = method(path, data=json.dumps(body), content_type="application/json", headers={"Idempotency-Key": "s"})
    assert r.status_code == 400
    assert error(r)["code"] == "parse_error"
    assert fields(r) == {(field, "unstorable_character")}
    assert error(r)["message"].startswith(f"{field}: a lone UTF-16 surrogate")
    assert Notification.objects.count() == 0
    assert not Preferences.objects.exists()
    assert Recipient.objects.get(pk="alice").attributes == {}


@pytest.mark.parametrize(("name", "field"), [("", '""'), ("non_field_errors", '"non_field_errors"')])
def test_unknown_empty_or_drf_reserved_key_is_still_named(http, alice, name, field):
    r = send(http, {"user_id": "alice", "channel": "sms", "content": {"body": "x"}, name: 1})
    assert r.status_code == 422
    assert fields(r) == {(field, "unknown_field")}
    assert Notification.objects.count() == 0


def test_wrong_content_type_is_415_naming_the_header(http, alice):
    r = http.post("/v1/notifications", data="user_id=alice", content_type="application/x-www-form-urlencoded",
                  headers={"Idempotency-Key": "ct"})
    assert r.status_code == 415
    assert fields(r) == {("Content-Type", "unsupported_media_type")}
    assert error(r)["message"] == "Content-Type: must be application/json, not application/x-www-form-urlencoded"
    assert Notification.objects.count() == 0


# --- issue 12 #3: revoked, expired and unknown keys say which ------------------------------------

def test_a_revoked_key_says_revoked_an_expired_one_expired_and_a_wrong_secret_unknown(alice):
    from datetime import timedelta

    from django.utils import timezone

    revoked, revoked_key = APIClient.objects.create_key(name="old", scopes=EVERY_SCOPE)
    revoked.revoked = True
    revoked.save()
    _, expired_key = APIClient.objects.create_key(name="temp", scopes=EVERY_SCOPE,
                                                        expiry_date=timezone.now() - timedelta(days=1))
    prefix, _, secret = revoked_key.partition(".")
    cases = {revoked_key: ("revoked_api_key", "this API key is revoked"),
             expired_key: ("expired_api_key", "this API key expired at "),
             # The revoked key's prefix with a wrong secret: nothing learned about that key.
             f"{prefix}.{'x' * len(secret)}": ("invalid_api_key", "unknown API key"),
             "nosuchpf.secret": ("invalid_api_key", "unknown API key")}
    for given, (code, message) in cases.items():
        r = Client(headers={"Authorization": f"Api-Key {given}"}).get("/v1/users/alice")
        assert r.status_code == 401, given
        assert fields(r) == {("Authorization", code)}, (given, r.json())
        assert error(r)["message"].startswith(f"Authorization: {message}"), error(r)


@pytest.mark.parametrize(("path", "raw", "field"), [
    ("/v1/events", '{"type": "t", "user_id": "alice", "data": {"a": 1e999}}', "data.a"),
    ("/v1/events", '{"type": "t", "user_id": "alice", "data": {"a": [1, -1e999]}}', "data.a.1"),
    ("/v1/notifications", '{"user_id": "alice", "channel": "email", "type": "t", "data": {"n": 2e400}}', "data.n"),
    ("/v1/notifications", '{"user_id": "alice", "channel": "sms", "content": {"body": "x"}, "ttl_seconds": 1e400}',
     "ttl_seconds"),
])
def test_a_number_that_overflows_to_infinity_is_400_naming_it_not_500(http, alice, path, raw, field):
    """Adversarial finding (issue 14): ``1e999`` parsed to infinity, which jsonb refuses: a 500."""
    r = http.post(path, data=raw, content_type="application/json", headers={"Idempotency-Key": "inf"})
    assert (r.status_code, error(r)["code"], fields(r)) == (400, "parse_error", {(field, "not_finite")})
    assert Notification.objects.count() == 0


@pytest.mark.parametrize(("method", "path", "body", "field", "message"), [
    ("post", "/v1/notifications", {"user_id": "alice", "channel": "fax", "content": {"body": "x"}}, "channel",
     '"fax" is not a valid choice; one of: sms, email, push, in_app'),
    ("post", "/v1/notifications", {"user_id": "alice", "channel": "sms", "priority": "urgent",
                                   "content": {"body": "x"}}, "priority",
     '"urgent" is not a valid choice; one of: high, standard'),
    # A choice inside a list and inside a map of lists (the field's child).
    ("put", "/v1/users/alice/preferences", {"opt_outs": ["pigeon"]}, "opt_outs.0",
     '"pigeon" is not a valid choice; one of: sms, email, push, in_app'),
    ("put", "/v1/users/alice/preferences", {"category_opt_outs": {"marketing": ["fax"]}},
     "category_opt_outs.marketing.0", '"fax" is not a valid choice; one of: sms, email, push, in_app'),
    ("put", "/v1/users/alice/devices", {"platform": "windows", "push_token": "t"}, "platform",
     '"windows" is not a valid choice; one of: ios, android, web'),
])
def test_a_wrong_choice_lists_the_valid_ones(http, alice, method, path, body, field, message):
    """Issue 23: a client that sent a wrong value learns the right ones from the answer."""
    r = getattr(http, method)(path, data=json.dumps(body), content_type="application/json",
                              headers={"Idempotency-Key": "choice"})
    assert r.status_code == 422
    assert [(f["field"], f["code"], f["message"]) for f in error(r)["fields"]] == [(field, "invalid_choice", message)]
    assert error(r)["message"] == f"{field}: {message}"
    assert Notification.objects.count() == 0 and not Preferences.objects.exists()


@pytest.mark.parametrize(("path", "body", "field", "message"), [
    ("/v1/users/alice/preferences", {"opt_out": ["sms"]}, "opt_out", "unknown field; did you mean opt_outs?"),
    ("/v1/users/alice", {"emial": "a@example.com"}, "emial", "unknown field; did you mean email?"),
    # Nothing near: no suggestion; a read-only field is never suggested (it cannot be written).
    ("/v1/users/alice", {"colour": "red"}, "colour", "unknown field"),
    ("/v1/users/alice", {"user_ib": "x"}, "user_ib", "unknown field"),
])
def test_an_unknown_field_suggests_the_near_one(http, alice, path, body, field, message):
    r = http.put(path, data=json.dumps(body), content_type="application/json")
    assert r.status_code == 422
    assert [(f["field"], f["code"], f["message"]) for f in error(r)["fields"]] == [(field, "unknown_field", message)]
    assert not Preferences.objects.exists()
    assert Recipient.objects.get(pk="alice").email == "a@example.com"
