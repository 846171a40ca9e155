"""Bad input everywhere gets a 4xx naming the field and the rule, and nothing is written.

These run in-process (Django test client, rolled-back transactions): they exercise validation,
authentication and idempotency bookkeeping, not delivery (see test_e2e_*.py for that).
"""

from __future__ import annotations

import json

import pytest
from django.test import Client

from notifications.models import APIClient, DeliveryEvent, Notification
from preferences.models import Device, Preferences, Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db


@pytest.fixture
def client_key():
    client, key = APIClient.objects.create_key(name="validation", scopes=EVERY_SCOPE)
    return client, key


@pytest.fixture
def http(client_key):
    return Client(headers={"Authorization": f"Api-Key {client_key[1]}"})


@pytest.fixture
def user():
    r = Recipient.objects.create(user_id="alice", email="alice@example.com", phone="+4915123456789",
                                 timezone="Europe/Berlin")
    Device.objects.create(recipient=r, platform="android", push_token="tok-alice")
    return r


def post(http, body, key="k1", **headers):
    if key is not None:
        headers["Idempotency-Key"] = key
    return http.post("/v1/notifications", data=json.dumps(body), content_type="application/json",
                     headers=headers)


def sms(**over):
    body = {"user_id": "alice", "channel": "sms", "content": {"body": "hello"}}
    body.update(over)
    return body


def fields(resp):
    return {(f["field"], f["code"]) for f in resp.json()["error"].get("fields", [])}


def assert_nothing_written():
    assert Notification.objects.count() == 0
    assert DeliveryEvent.objects.count() == 0


def test_missing_api_key_is_401_and_names_the_scheme(user):
    r = post(Client(), sms())
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"] == "Api-Key"
    assert_nothing_written()


def test_wrong_api_key_is_401(user):
    r = post(Client(headers={"Authorization": "Api-Key abc.def"}), sms())
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert_nothing_written()


def test_revoked_key_is_401(http, client_key, user):
    client_key[0].revoked = True
    client_key[0].save()
    assert post(http, sms()).status_code == 401


def test_missing_idempotency_key_is_400_naming_the_header(http, user):
    r = post(http, sms(), key=None)
    assert r.status_code == 400
    assert fields(r) == {("Idempotency-Key", "required")}
    assert_nothing_written()


def test_overlong_idempotency_key_is_400(http, user):
    r = post(http, sms(), key="k" * 256)
    assert r.status_code == 400
    assert fields(r) == {("Idempotency-Key", "invalid")}
    assert post(http, sms(), key="k" * 255).status_code == 202


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"channel": "sms", "content": {"body": "x"}}, {("user_id", "required")}),
        (sms(channel="fax"), {("channel", "invalid_choice")}),
        (sms(priority="urgent"), {("priority", "invalid_choice")}),
        (sms(content={}), {("content.body", "required")}),
        (sms(content={"body": "   "}), {("content.body", "blank")}),
        (sms(content={"body": "x" * 1601}), {("content.body", "max_length")}),
        (sms(content={"body": "x", "title": "t"}), {("content.title", "not_allowed_for_channel")}),
        (sms(channel="email", content={"body": "x"}), {("content.title", "required")}),
        (sms(channel="push", content={"body": "x", "html": "<b>"}), {("content.html", "not_allowed_for_channel")}),
        # An SMS carries only its body; its data was stored and silently dropped (adversarial review).
        (sms(content={"body": "x", "data": {"a": "1"}}), {("content.data", "not_allowed_for_channel")}),
        (sms(channel="email", content={"body": "x", "title": "Hi\r\nBcc: x@evil.example"}),
         {("content.title", "line_break")}),
        (sms(channel="email", content={"body": "x", "title": "t", "data": {"Notification_ID": "1"}}),
         {("content.data.Notification_ID", "reserved_key")}),
        (sms(channel="email", content={"body": "x", "title": "t", "data": {"k": "v" * 10_000}}),
         {("content.data", "payload_too_large")}),
        (sms(channel="push", content={"body": "x", "data": {"k": "v" * 4100}}), {("content", "payload_too_large")}),
        (sms(channel="push", content={"body": "x", "data": {"k": {"nested": 1}}}),
         {("content.data.k", "invalid_type")}),
        (sms(scheduled_at="2030-01-01T09:00:00"), {("scheduled_at", "naive_datetime")}),
        (sms(scheduled_at="tomorrow"), {("scheduled_at", "invalid")}),
        (sms(scheduled_at="2099-01-01T09:00:00Z"), {("scheduled_at", "too_far_ahead")}),
        (sms(scheduled_at="0001-01-01T00:00:00+05:00"), {("scheduled_at", "too_far_past")}),
        (sms(ttl_seconds=0), {("ttl_seconds", "min_value")}),
        (sms(ttl_seconds="soon"), {("ttl_seconds", "invalid_type")}),
        (sms(category="Not A Slug"), {("category", "invalid_category")}),
        (sms(user_id="nobody"), {("user_id", "unknown_user")}),
    ],
)
def test_invalid_send_is_422_naming_field_and_rule(http, user, body, expected):
    r = post(http, body)
    assert r.status_code == 422, r.content
    assert fields(r) == expected
    assert r.json()["error"]["code"] == "validation_error"
    assert_nothing_written()


@pytest.mark.parametrize("channel", ["sms", "email", "push"])
def test_recipient_without_contact_for_channel_is_accepted_and_suppressed_at_send_time(http, channel):
    """One rule at accept and send time (docs/API.md, "A recipient without the contact a channel
    needs"): a missing contact is not a request error; the
    send is accepted and suppressed with the reason when it is due, as when the contact is removed later."""
    Recipient.objects.create(user_id="bare")
    content = {"body": "x", "title": "t"} if channel != "sms" else {"body": "x"}
    r = post(http, {"user_id": "bare", "channel": channel, "content": content})
    assert r.status_code == 202, r.content
    n = Notification.objects.get()
    assert (n.status, n.recipient_id) == ("queued", "bare")
    from notifications.delivery.content import Content as _CampaignContent
    from notifications.delivery.pipeline import prepare

    Notification.objects.filter(pk=n.pk).update(status="sending", attempts=1)
    n = Notification.objects.select_related("recipient").get(pk=n.pk)
    assert prepare(n, set(), _CampaignContent(), stopped_phones=set()) is None
    n.refresh_from_db()
    reason = {"sms": "no_phone", "email": "no_email", "push": "no_active_device"}[channel]
    assert (n.status, n.reason) == ("suppressed", reason)


def test_malformed_json_is_400(http, user):
    r = http.post("/v1/notifications", data="{not json", content_type="application/json",
                  headers={"Idempotency-Key": "k"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "parse_error"
    assert r.json()["error"]["message"].startswith("body: JSON parse error: ")
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [(None, "parse_error")]
    assert_nothing_written()


@pytest.mark.parametrize("text", ['{"ttl_seconds": NaN}', '{"ttl_seconds": Infinity}', '{"ttl_seconds": -Infinity}'])
def test_nan_and_infinity_are_not_json(http, user, text):
    r = http.post("/v1/notifications", data=text, content_type="application/json", headers={"Idempotency-Key": "k"})
    assert r.status_code == 400
    assert r.json()["error"]["message"].startswith("body: JSON parse error: ")
    assert "is not a JSON number (RFC 8259)" in r.json()["error"]["message"]
    assert_nothing_written()


def test_a_key_given_twice_is_400_naming_it(http, user):
    """Adversarial finding: the last value won silently (the send would have gone to bob)."""
    r = http.post("/v1/notifications", content_type="application/json", headers={"Idempotency-Key": "k"},
                  data='{"user_id": "alice", "channel": "sms", "content": {"body": "x"}, "user_id": "bob"}')
    assert r.status_code == 400
    assert r.json() == {"error": {"status": 400, "code": "parse_error", "message": "user_id: given twice in one object",
                                  "fields": [{"field": "user_id", "code": "duplicate_key",
                                              "message": "given twice in one object"}]}}
    assert_nothing_written()


@pytest.mark.parametrize(("body", "path"), [
    ('{"user_id": "alice", "channel": "sms", "content": {"body": "x"}, "metadata": {"a": 1, "a": 2}}',
     "metadata.a"),
    ('{"user_ids": ["alice"], "type": "t", "data": {"items": [{"sku": 1}, {"sku": 2, "sku": 3}]}}',
     "data.items.1.sku"),
])
def test_a_key_given_twice_inside_an_object_is_named_by_its_path(http, user, body, path):
    """hadv32: a duplicate in ``metadata`` was reported as ``a``, which is no field of the request."""
    r = http.post("/v1/notifications", content_type="application/json", headers={"Idempotency-Key": "k"},
                  data=body)
    assert r.status_code == 400
    assert r.json()["error"]["fields"] == [{"field": path, "code": "duplicate_key",
                                           "message": "given twice in one object"}]
    assert_nothing_written()


def test_high_priority_needs_permission(user):
    _, key = APIClient.objects.create_key(name="marketing", allow_high=False)
    r = post(Client(headers={"Authorization": f"Api-Key {key}"}), sms(priority="high"))
    assert r.status_code == 403
    assert fields(r) == {("priority", "missing_scope")}
    assert r.json()["error"]["code"] == "missing_scope"
    assert r.json()["error"]["message"] == ("priority: this API key lacks the scope notifications:send_high "
                                            "(needed for priority=high)")
    assert_nothing_written()


def test_accept_writes_one_row_and_replays(http, user):
    r1 = post(http, sms(), key="same")
    assert r1.status_code == 202
    r2 = post(http, sms(), key="same")
    assert r2.status_code == 202
    assert r2.json() == r1.json()
    assert r2.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in r1.headers
    assert Notification.objects.count() == 1
    assert DeliveryEvent.objects.filter(kind="accepted").count() == 1


def test_same_key_different_body_is_422_and_changes_nothing(http, user):
    assert post(http, sms(), key="k").status_code == 202
    r = post(http, sms(content={"body": "different"}), key="k")
    assert r.status_code == 422
    assert fields(r) == {("Idempotency-Key", "idempotency_key_reused")}
    n = Notification.objects.get()
    assert n.body == "hello"


def test_keys_are_scoped_per_client(http, user):
    _, other_key = APIClient.objects.create_key(name="other", allow_high=True)
    other = Client(headers={"Authorization": f"Api-Key {other_key}"})
    a = post(http, sms(), key="shared").json()
    b = post(other, sms(content={"body": "other body"}), key="shared").json()
    assert a["id"] != b["id"]
    assert Notification.objects.count() == 2


def test_a_client_cannot_read_or_cancel_another_clients_notification(http, user):
    nid = post(http, sms(), key="mine").json()["id"]
    _, other_key = APIClient.objects.create_key(name="other")
    other = Client(headers={"Authorization": f"Api-Key {other_key}"})
    assert other.get(f"/v1/notifications/{nid}").status_code == 404
    assert other.post(f"/v1/notifications/{nid}/cancel").status_code == 404
    assert Notification.objects.get().status == "queued"


# --- recipients, preferences, devices ------------------------------------------------------------

@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"phone": "12345"}, {("phone", "invalid_phone")}),
        ({"phone": "+1 555 0100"}, {("phone", "invalid_phone")}),
        ({"timezone": "+03:00"}, {("timezone", "invalid_timezone")}),
        ({"timezone": "EST"}, {("timezone", "invalid_timezone")}),
        ({"timezone": "Mars/Olympus_Mons"}, {("timezone", "invalid_timezone")}),
        ({"timezone": "America"}, {("timezone", "invalid_timezone")}),  # a tzdata folder
        ({"email": "not-an-email"}, {("email", "invalid")}),
        ({"locale": "english please"}, {("locale", "invalid_locale")}),
    ],
)
def test_invalid_user_is_422_and_not_written(http, body, expected):
    r = http.put("/v1/users/bob", data=json.dumps(body), content_type="application/json")
    assert r.status_code == 422
    assert fields(r) == expected
    assert not Recipient.objects.filter(pk="bob").exists()


def test_user_phone_normalised_to_e164(http):
    r = http.put("/v1/users/bob", data=json.dumps({"phone": "+49 (151) 2345-6789", "timezone": "Europe/Berlin",
                                                   "email": "bob@example.com", "locale": "de-DE"}),
                 content_type="application/json")
    assert r.status_code == 201
    assert r.json()["phone"] == "+4915123456789"
    assert Recipient.objects.get(pk="bob").phone == "+4915123456789"
    r = http.put("/v1/users/bob", data=json.dumps({"phone": "+4915123456789"}), content_type="application/json")
    assert r.status_code == 200


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"opt_outs": ["fax"]}, {("opt_outs.0", "invalid_choice")}),
        ({"category_opt_outs": {"marketing": ["pigeon"]}}, {("category_opt_outs.marketing.0", "invalid_choice")}),
        ({"quiet_hours": {"start": "22:00"}}, {("quiet_hours.end", "required")}),
        ({"quiet_hours": {"start": "25:00", "end": "07:00"}}, {("quiet_hours.start", "invalid")}),
        ({"quiet_hours": {"start": "22:00", "end": "22:00"}}, {("quiet_hours.end", "empty_window")}),
        ({"quiet_hours": {"start": "22:00", "end": "07:00", "timezone": "+01:00"}},
         {("quiet_hours.timezone", "invalid_timezone")}),
        ({"quiet_hours": {"start": "22:00", "end": "07:00", "timezone": "America"}},
         {("quiet_hours.timezone", "invalid_timezone")}),
    ],
)
def test_invalid_preferences_are_422_and_not_written(http, user, body, expected):
    r = http.put("/v1/users/alice/preferences", data=json.dumps(body), content_type="application/json")
    assert r.status_code == 422, r.content
    assert fields(r) == expected
    assert not Preferences.objects.exists()


def test_preferences_round_trip(http, user):
    body = {"opt_outs": ["sms"], "category_opt_outs": {"marketing": ["email"]},
            "quiet_hours": {"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"}}
    r = http.put("/v1/users/alice/preferences", data=json.dumps(body), content_type="application/json")
    assert r.status_code == 200
    answer = body | {"type_opt_outs": {}, "effective": []}  # omitted: none; no notification types exist
    assert r.json() == answer
    assert http.get("/v1/users/alice/preferences").json() == answer


def test_preferences_of_unknown_user_is_404(http):
    r = http.put("/v1/users/ghost/preferences", data=json.dumps({}), content_type="application/json")
    assert r.status_code == 404
    assert not Preferences.objects.exists()


def test_device_moves_to_the_user_who_registers_it(http, user):
    Recipient.objects.create(user_id="bob")
    r = http.put("/v1/users/bob/devices", data=json.dumps({"platform": "ios", "push_token": "tok-alice"}),
                 content_type="application/json")
    assert r.status_code == 200
    device = Device.objects.get(push_token="tok-alice")
    assert (device.recipient_id, device.platform, device.active) == ("bob", "ios", True)
    assert Device.objects.count() == 1


def test_device_delete(http, user):
    assert http.delete("/v1/users/alice/devices/nope").status_code == 404
    assert http.delete("/v1/users/alice/devices/tok-alice").status_code == 204
    assert not Device.objects.exists()


def test_invalid_device_is_422(http, user):
    r = http.put("/v1/users/alice/devices", data=json.dumps({"platform": "windows-phone", "push_token": ""}),
                 content_type="application/json")
    assert r.status_code == 422
    assert fields(r) == {("platform", "invalid_choice"), ("push_token", "blank")}
    assert Device.objects.count() == 1


def test_per_client_rate_limit_is_429_with_retry_after(user):
    _, key = APIClient.objects.create_key(name="limited", rate_limit="3/min")
    limited = Client(headers={"Authorization": f"Api-Key {key}"})
    codes = [post(limited, sms(), key=f"rl-{i}").status_code for i in range(4)]
    assert codes == [202, 202, 202, 429]
    r = post(limited, sms(), key="rl-x")
    assert r.status_code == 429
    assert r.json()["error"]["code"] == "throttled"
    assert 0 < int(r.headers["Retry-After"]) <= 60
    assert Notification.objects.count() == 3


# --- hardening found by the adversarial run ------------------------------------------------------

@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/users/alice/preferences", {"category_opt_outs": {"m\x00x": ["email"]}}, "category_opt_outs.m\\u0000x"),
    ("/v1/users/alice", {"email": "a\x00@example.com"}, "email"),
])
def test_nul_characters_are_400_naming_the_field(http, user, path, body, field):
    r = http.put(path, data=json.dumps(body), content_type="application/json")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "parse_error"
    assert field in r.json()["error"]["message"]
    assert not Preferences.objects.exists()


def test_absurdly_nested_json_is_400(http, user):
    r = http.post("/v1/notifications", data="[" * 100_000 + "]" * 100_000, content_type="application/json",
                  headers={"Idempotency-Key": "deep"})
    assert r.status_code == 400
    assert_nothing_written()


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/users/alice/preferences", {"opt_out": ["sms"]}, "opt_out"),
    ("/v1/users/alice", {"phon": "+4915112345678"}, "phon"),
    ("/v1/notifications", sms(prio="high"), "prio"),
])
def test_unknown_fields_are_422_and_change_nothing(http, user, path, body, field):
    method = http.post if path == "/v1/notifications" else http.put
    r = method(path, data=json.dumps(body), content_type="application/json", headers={"Idempotency-Key": "u"})
    assert r.status_code == 422
    assert fields(r) == {(field, "unknown_field")}
    assert Recipient.objects.get(pk="alice").phone == "+4915123456789"
    assert_nothing_written()


@pytest.mark.parametrize(("user_id", "code"), [("y" * 256, "invalid"), ("a%00b", "control_character"),
                                               ("tab%09here", "control_character")])
def test_bad_user_id_in_path_is_422(http, user_id, code):
    r = http.put(f"/v1/users/{user_id}", data=json.dumps({}), content_type="application/json")
    assert r.status_code == 422
    assert fields(r) == {("user_id", code)}
    assert not Recipient.objects.exists()


def test_category_opt_out_keys_follow_the_category_rule(http, user):
    r = http.put("/v1/users/alice/preferences", data=json.dumps({"category_opt_outs": {"Marketing Promo!": ["email"]}}),
                 content_type="application/json")
    assert r.status_code == 422
    assert fields(r) == {("category_opt_outs", "invalid_category")}


def test_overlong_push_token_is_422(http, user):
    r = http.put("/v1/users/alice/devices", data=json.dumps({"platform": "ios", "push_token": "t" * 1025}),
                 content_type="application/json")
    assert r.status_code == 422
    assert fields(r) == {("push_token", "max_length")}


def test_unknown_api_path_and_bad_uuid_answer_json_404(http):
    for path in ("/v1/notifications/not-a-uuid", "/v1/nothing-here"):
        r = http.get(path)
        assert r.status_code == 404
        assert r.json()["error"]["code"] == "not_found"
    r = http.get("/v1/users/ghost")
    assert r.json()["error"]["code"] == "not_found"


def test_invalid_stored_rate_limit_falls_back_to_default(user):
    client, key = APIClient.objects.create_key(name="typo")
    APIClient.objects.filter(pk=client.pk).update(rate_limit="lots")
    r = post(Client(headers={"Authorization": f"Api-Key {key}"}), sms())
    assert r.status_code == 202
    with pytest.raises(Exception, match="rate like"):
        APIClient(name="x", rate_limit="lots").full_clean()


def test_fingerprint_ignores_spelled_out_defaults(http, user):
    assert post(http, sms(), key="fp").status_code == 202
    r = post(http, sms(priority="standard", sensitive=False, category=""), key="fp")
    assert r.status_code == 202
    assert r.headers["Idempotent-Replayed"] == "true"


@pytest.mark.django_db(transaction=True)
def test_concurrent_upserts_of_a_new_user_and_token_never_500(client_key):
    import concurrent.futures

    key = client_key[1]

    def put(path, body):
        from django.db import connection

        c = Client(headers={"Authorization": f"Api-Key {key}"})
        try:
            return c.put(path, data=json.dumps(body), content_type="application/json").status_code
        finally:
            connection.close()  # each thread has its own connection

    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(lambda i: put("/v1/users/racer", {"email": f"r{i}@example.com"}), range(20)))
    assert set(codes) <= {200, 201} and codes.count(201) == 1
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(lambda i: put("/v1/users/racer/devices", {"platform": "ios", "push_token": "tok-race"}),
                              range(20)))
    assert set(codes) <= {200, 201} and codes.count(201) == 1
    assert Device.objects.filter(push_token="tok-race").count() == 1


@pytest.mark.parametrize(("text", "says"), [
    ("1e2", "must be a JSON integer, not a number in float notation (write it without a fraction or exponent)"),
    ("100.0", "must be a JSON integer, not a number in float notation (write it without a fraction or exponent)"),
    ("1.5", "must be a JSON integer, not a number with a fraction"),
])
def test_an_integer_written_as_a_float_is_refused_with_the_right_words(http, user, text, says):
    """(``1e400`` overflows to infinity when parsed: a 400 naming the field, test_api_errors.py.)"""
    r = http.post("/v1/notifications", content_type="application/json", headers={"Idempotency-Key": "k"},
                  data='{"user_id": "alice", "channel": "sms", "content": {"body": "x"}, "ttl_seconds": ' + text + "}")
    assert r.status_code == 422, r.content
    assert [(f["field"], f["code"], f["message"]) for f in r.json()["error"]["fields"]] == [
        ("ttl_seconds", "invalid_type", says)]
    assert_nothing_written()

