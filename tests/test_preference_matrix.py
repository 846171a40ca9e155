"""Per-type opt-outs in ``PUT/GET /v1/users/{id}/preferences`` and the effective matrix (``effective``):
the round trip, bad input (422 naming the field, nothing written), the matrix for worked cases through
the API, the matrix against the one suppression rule over generated preferences, contacts and types,
and the OpenAPI document of both fields. In-process (Django test client, rolled-back transactions)."""

from __future__ import annotations

import json

import pytest
import yaml
from django.core.management import call_command
from django.db import transaction
from django.test import Client
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from notifications.delivery.routing import sms_sender
from notifications.events.matrix import effective_matrix
from notifications.events.models import NotificationType
from notifications.models import APIClient
from preferences import suppression
from preferences.api import effective
from preferences.api.serializers import EFFECTIVE_REASONS
from preferences.models import Device, Preferences, Recipient, SmsStop
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

OTHER_SENDER = "+15550001111"


@pytest.fixture
def http():
    _, key = APIClient.objects.create_key(name="matrix", scopes=EVERY_SCOPE)
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def alice():
    r = Recipient.objects.create(user_id="alice", email="alice@example.com", phone="+4915123456789")
    Device.objects.create(recipient=r, platform="android", push_token="tok-alice")
    return r


@pytest.fixture
def types():
    """Three types, created in another order than their keys sort in."""
    NotificationType.objects.create(key="password_reset", name="Password reset", category="security",
                                    channels=["email", "sms"], required=True)
    NotificationType.objects.create(key="order_shipped", name="Order shipped", category="shipping",
                                    channels=["push", "email", "sms"])
    NotificationType.objects.create(key="new_follower", name="New follower", category="social",
                                    channels=["push", "email"])


def put(http, body, user="alice"):
    return http.put(f"/v1/users/{user}/preferences", data=json.dumps(body), content_type="application/json")


def fields(resp):
    return {(f["field"], f["code"]) for f in resp.json()["error"].get("fields", [])}


def entry(type_, category, channel, reason="", *, required=False, allowed=None):
    return {"type": type_, "category": category, "channel": channel,
            "allowed": reason in ("", "required") if allowed is None else allowed, "reason": reason,
            "required": required}


def matrix(**reasons):
    """The full matrix of the :func:`types` fixture, every entry allowed unless ``reasons`` names it
    (``order_shipped__sms="no_phone"``)."""
    rows = [("new_follower", "social", "push", False), ("new_follower", "social", "email", False),
            ("order_shipped", "shipping", "push", False), ("order_shipped", "shipping", "email", False),
            ("order_shipped", "shipping", "sms", False), ("password_reset", "security", "email", True),
            ("password_reset", "security", "sms", True)]
    return [entry(t, c, ch, reasons.get(f"{t}__{ch}", ""), required=req) for t, c, ch, req in rows]


# --- the fields: round trip and bad input ----------------------------------------------------------

def test_type_opt_outs_round_trip_and_an_omitted_field_becomes_empty(http, alice):
    body = {"opt_outs": [], "category_opt_outs": {},
            "type_opt_outs": {"order_shipped": ["sms", "email", "sms"], "not_yet_a_type": ["push"]},
            "quiet_hours": None}
    r = put(http, body)
    assert r.status_code == 200, r.content
    stored = {"order_shipped": ["email", "sms"], "not_yet_a_type": ["push"]}  # sorted, once each
    assert r.json() == body | {"type_opt_outs": stored, "effective": []}
    assert Preferences.objects.get(recipient=alice).type_opt_outs == stored
    assert http.get("/v1/users/alice/preferences").json() == r.json()

    r = put(http, {"opt_outs": ["sms"]})  # PUT replaces everything
    assert r.status_code == 200
    assert r.json()["type_opt_outs"] == {}
    assert Preferences.objects.get(recipient=alice).type_opt_outs == {}


def test_at_most_200_type_keys(http, alice):
    many = {f"type-{i:03d}": ["push"] for i in range(200)}
    assert put(http, {"type_opt_outs": many}).status_code == 200
    assert len(Preferences.objects.get(recipient=alice).type_opt_outs) == 200


@pytest.mark.parametrize(("body", "expected"), [
    ({"type_opt_outs": {"order_shipped": ["fax"]}}, {("type_opt_outs.order_shipped.0", "invalid_choice")}),
    ({"type_opt_outs": {"order_shipped": ["sms", "email", "push", "in_app", "sms"]}},
     {("type_opt_outs.order_shipped", "max_length")}),
    ({"type_opt_outs": {"Order Shipped": ["sms"]}}, {("type_opt_outs", "invalid_type_key")}),
    ({"type_opt_outs": {"marketing.promo": ["sms"]}}, {("type_opt_outs", "invalid_type_key")}),  # a category
    ({"type_opt_outs": {"x" * 65: ["sms"]}}, {("type_opt_outs", "invalid_type_key")}),
    ({"type_opt_outs": {"_hidden": ["sms"]}}, {("type_opt_outs", "invalid_type_key")}),
    ({"type_opt_outs": {f"type-{i:03d}": ["push"] for i in range(201)}}, {("type_opt_outs", "max_length")}),
    ({"type_opt_outs": ["order_shipped"]}, {("type_opt_outs", "invalid_type")}),
    ({"type_opt_outs": {"order_shipped": "sms"}}, {("type_opt_outs.order_shipped", "invalid_type")}),
])
def test_bad_type_opt_outs_are_422_naming_the_field_and_change_nothing(http, alice, body, expected):
    Preferences.objects.create(recipient=alice, opt_outs=["email"], type_opt_outs={"new_follower": ["push"]})
    r = put(http, body | {"opt_outs": []})
    assert r.status_code == 422, r.content
    assert fields(r) == expected
    prefs = Preferences.objects.get(recipient=alice)
    assert (prefs.opt_outs, prefs.type_opt_outs) == (["email"], {"new_follower": ["push"]})


def test_bad_type_opt_outs_create_no_row(http, alice):
    assert put(http, {"type_opt_outs": {"Bad Key": ["sms"]}}).status_code == 422
    assert not Preferences.objects.exists()


def test_effective_in_a_put_body_is_read_only_and_ignored(http, alice, types):
    r = put(http, {"type_opt_outs": {}, "effective": [{"type": "x", "allowed": False}]})
    assert r.status_code == 200, r.content
    assert r.json()["effective"] == matrix()


# --- the matrix: worked cases through the API --------------------------------------------------------

def test_no_preferences_row_and_every_contact_allows_everything(http, alice, types):
    assert http.get("/v1/users/alice/preferences").json()["effective"] == matrix()


def test_category_opt_out(http, alice, types):
    r = put(http, {"category_opt_outs": {"shipping": ["email"]}})
    assert r.json()["effective"] == matrix(order_shipped__email="opted_out_category")
    assert http.get("/v1/users/alice/preferences").json()["effective"] == r.json()["effective"]


def test_one_type_on_one_channel(http, alice, types):
    r = put(http, {"type_opt_outs": {"new_follower": ["push"]}})
    assert r.json()["effective"] == matrix(new_follower__push="opted_out_type")  # order_shipped push still goes


def test_required_type_overrides_every_opt_out_and_says_so(http, alice, types):
    r = put(http, {"opt_outs": ["sms"], "category_opt_outs": {"security": ["email"]},
                   "type_opt_outs": {"password_reset": ["email", "sms"]}})
    assert r.json()["effective"] == matrix(order_shipped__sms="opted_out_channel",
                                           password_reset__email="required", password_reset__sms="required")


def test_channel_opt_out_comes_before_category_and_type(http, alice, types):
    r = put(http, {"opt_outs": ["push"], "category_opt_outs": {"social": ["push", "email"]},
                   "type_opt_outs": {"new_follower": ["push", "email"], "order_shipped": ["email"]}})
    assert r.json()["effective"] == matrix(new_follower__push="opted_out_channel",
                                           new_follower__email="opted_out_category",
                                           order_shipped__push="opted_out_channel",
                                           order_shipped__email="opted_out_type")


def test_no_phone_is_not_overridden_by_required(http, alice, types):
    Recipient.objects.filter(pk="alice").update(phone="")
    Preferences.objects.create(recipient=alice, opt_outs=["sms"])
    assert http.get("/v1/users/alice/preferences").json()["effective"] == matrix(
        order_shipped__sms="opted_out_channel", password_reset__sms="no_phone")


def test_no_active_device(http, alice, types):
    Device.objects.filter(recipient=alice).update(active=False, deactivated_reason="fcm UNREGISTERED")
    Device.objects.create(recipient=Recipient.objects.create(user_id="bob"), platform="ios", push_token="tok-bob")
    assert http.get("/v1/users/alice/preferences").json()["effective"] == matrix(
        new_follower__push="no_active_device", order_shipped__push="no_active_device")


def test_dead_contacts(http, alice, types):
    Recipient.objects.filter(pk="alice").update(email_invalid_reason="hard_bounce", phone_invalid_reason="21211")
    assert http.get("/v1/users/alice/preferences").json()["effective"] == matrix(
        new_follower__email="email_invalid", order_shipped__email="email_invalid",
        password_reset__email="email_invalid", order_shipped__sms="phone_invalid",
        password_reset__sms="phone_invalid")


def test_sms_stop_counts_for_the_sender_the_type_sends_from(http, alice, types):
    SmsStop.objects.create(phone=alice.phone, sender=sms_sender(), source="twilio 21610")
    SmsStop.objects.create(phone="+4915100000000", sender=OTHER_SENDER, source="twilio 21610")  # another phone
    assert http.get("/v1/users/alice/preferences").json()["effective"] == matrix(
        order_shipped__sms="sms_stopped", password_reset__sms="sms_stopped")

    # A type with its own sender is not stopped by a STOP to the primary sender, only by one to its own.
    NotificationType.objects.filter(key="password_reset").update(sms_from=OTHER_SENDER)
    assert http.get("/v1/users/alice/preferences").json()["effective"] == matrix(order_shipped__sms="sms_stopped")
    SmsStop.objects.create(phone=alice.phone, sender=OTHER_SENDER, source="twilio 30004")
    assert http.get("/v1/users/alice/preferences").json()["effective"] == matrix(
        order_shipped__sms="sms_stopped", password_reset__sms="sms_stopped")


def test_type_channels_as_stored_are_read_in_order_once_and_junk_skipped(http, alice):
    NotificationType.objects.create(key="digest", name="Digest", category="news",
                                    channels=["email", "fax", "email", 3, "push"])
    assert http.get("/v1/users/alice/preferences").json()["effective"] == [
        entry("digest", "news", "email"), entry("digest", "news", "push")]


def test_without_a_registered_builder_the_matrix_is_empty(http, alice, types, monkeypatch):
    monkeypatch.setattr(effective, "_builder", [])
    assert http.get("/v1/users/alice/preferences").json()["effective"] == []
    assert put(http, {"opt_outs": ["sms"]}).json()["effective"] == []


def test_the_notifications_app_registers_its_builder():
    assert effective._builder == [effective_matrix]
    effective.register_matrix(effective_matrix)  # again: still the one builder
    assert effective._builder == [effective_matrix]


def test_the_matrix_reads_the_preferences_as_just_written(http, alice, types):
    put(http, {"type_opt_outs": {"new_follower": ["push"]}})
    r = put(http, {"type_opt_outs": {"new_follower": ["email"]}})
    assert r.json()["effective"] == matrix(new_follower__email="opted_out_type")


# --- the matrix against the one rule, generated --------------------------------------------------------

CHANNELS = ("sms", "email", "push")
contact = st.sampled_from(["absent", "valid", "invalid"])
channel_lists = st.lists(st.sampled_from(CHANNELS), max_size=3)
#: Stored opt-outs: what the API writes, and shapes an older row or SQL may hold (a bare string, junk).
stored_channels = st.one_of(channel_lists, st.sampled_from(CHANNELS), st.integers(), st.none())
type_keys = st.sampled_from(["order_shipped", "new_follower", "password_reset", "otp", "not_a_type"])
categories = st.sampled_from(["shipping", "social", "security", "marketing"])
notification_types = st.lists(st.fixed_dictionaries({
    "key": type_keys, "category": categories,
    "channels": st.lists(st.sampled_from(CHANNELS), unique=True, min_size=1, max_size=3),
    "required": st.booleans(), "sms_from": st.sampled_from(["", OTHER_SENDER])}),
    max_size=4, unique_by=lambda t: t["key"])
generated_preferences = st.one_of(st.none(), st.fixed_dictionaries({
    "opt_outs": st.one_of(channel_lists, st.sampled_from(CHANNELS), st.integers()),  # the column is NOT NULL
    "category_opt_outs": st.one_of(st.dictionaries(categories, stored_channels, max_size=3), st.just(["sms"])),
    "type_opt_outs": st.one_of(st.dictionaries(type_keys, stored_channels, max_size=4), st.just("otp")),
}))


class _Rollback(Exception):
    pass


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(types_=notification_types, prefs=generated_preferences, phone=contact, email=contact,
       devices=st.lists(st.booleans(), max_size=2),
       stops=st.sets(st.sampled_from(["primary", OTHER_SENDER, "+15559999999"])))
@example(types_=[{"key": "otp", "category": "security", "channels": ["sms"], "required": True,
                  "sms_from": OTHER_SENDER},
                 {"key": "order_shipped", "category": "shipping", "channels": ["sms", "push"], "required": False,
                  "sms_from": ""}],
         prefs={"opt_outs": ["sms"], "category_opt_outs": {}, "type_opt_outs": {}}, phone="valid", email="valid",
         devices=[False], stops={"primary"})
@example(types_=[{"key": "otp", "category": "security", "channels": ["sms", "email"], "required": False,
                  "sms_from": OTHER_SENDER}],
         prefs=None, phone="valid", email="absent", devices=[], stops={OTHER_SENDER})
def test_every_entry_is_what_the_suppression_rule_says(types_, prefs, phone, email, devices, stops):
    primary = sms_sender()
    try:
        with transaction.atomic():
            for t in types_:
                NotificationType.objects.create(name=t["key"], **t)
            r = Recipient.objects.create(user_id="gen", phone="" if phone == "absent" else "+4915123456789",
                                         email="" if email == "absent" else "gen@example.com",
                                         phone_invalid_reason="21211" if phone == "invalid" else "",
                                         email_invalid_reason="bounce" if email == "invalid" else "")
            for i, active in enumerate(devices):
                Device.objects.create(recipient=r, platform="android", push_token=f"tok-gen-{i}", active=active)
            if prefs is not None:
                Preferences.objects.create(recipient=r, **prefs)
            for sender in stops:
                SmsStop.objects.create(phone="+4915123456789", sender=primary if sender == "primary" else sender,
                                       source="twilio 21610")
            got = effective_matrix(r)
            raise _Rollback
    except _Rollback:
        pass

    stored = prefs or {}
    ordered = sorted(types_, key=lambda t: t["key"])
    assert [(e["type"], e["channel"]) for e in got] == [(t["key"], c) for t in ordered for c in t["channels"]]
    for e, (t, channel) in zip(got, [(kind, c) for kind in ordered for c in kind["channels"]], strict=True):
        sender = t["sms_from"] or primary
        stopped = phone != "absent" and (sender in stops or (sender == primary and "primary" in stops))
        facts = suppression.RecipientFacts(
            has_phone=phone != "absent", phone_invalid=phone == "invalid", has_email=email != "absent",
            email_invalid=email == "invalid", has_active_device=True in devices, sms_stopped=stopped,
            opt_outs=suppression.channels(stored.get("opt_outs")),
            category_opt_outs=suppression.category_channels(stored.get("category_opt_outs")),
            type_opt_outs=suppression.category_channels(stored.get("type_opt_outs")))
        reason = suppression.suppression_reason(facts, channel, t["category"], t["key"], t["required"])
        overridden = t["required"] and not reason and suppression.opt_out_reason(
            facts, channel, t["category"], t["key"])
        expected = "required" if overridden else reason
        assert e == entry(t["key"], t["category"], channel, expected, required=t["required"]), (t, stored)


# --- OpenAPI ---------------------------------------------------------------------------------------------

def test_the_schema_documents_type_opt_outs_and_effective_exactly(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--file", str(out), "--validate", "--fail-on-warn")
    schema = yaml.safe_load(out.read_text())
    components = schema["components"]["schemas"]
    operations = schema["paths"]["/v1/users/{user_id}/preferences"]
    for method in ("get", "put"):
        ref = operations[method]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        assert ref == "#/components/schemas/Preferences"
    request = operations["put"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert request == "#/components/schemas/PreferencesRequest"

    answer = components["Preferences"]
    assert set(answer["properties"]) == {"opt_outs", "category_opt_outs", "type_opt_outs", "quiet_hours",
                                         "effective"}
    assert "effective" in answer["required"]
    listed = answer["properties"]["effective"]
    assert (listed["type"], listed["readOnly"], listed["items"]) == (
        "array", True, {"$ref": "#/components/schemas/EffectiveEntry"})
    item = components["EffectiveEntry"]
    assert set(item["properties"]) == set(item["required"]) == {"type", "category", "channel", "allowed", "reason",
                                                                "required"}
    assert item["properties"]["reason"]["oneOf"] == [{"$ref": "#/components/schemas/EffectiveReasonEnum"},
                                                     {"$ref": "#/components/schemas/BlankEnum"}]
    assert components["EffectiveReasonEnum"]["enum"] == [*suppression.REASONS, "required"]
    assert components["BlankEnum"]["enum"] == [""]
    assert ("", *suppression.REASONS, "required") == EFFECTIVE_REASONS
    assert item["properties"]["channel"]["allOf"] == [{"$ref": "#/components/schemas/ChannelEnum"}]
    assert (item["properties"]["allowed"]["type"], item["properties"]["required"]["type"]) == ("boolean", "boolean")
    assert item["properties"]["type"]["pattern"] == "^[a-z0-9][a-z0-9_-]{0,63}$"

    body = components["PreferencesRequest"]
    assert "effective" not in body["properties"]
    per_type = body["properties"]["type_opt_outs"]
    assert (per_type["type"], per_type["maxProperties"]) == ("object", 200)
    assert per_type["additionalProperties"]["maxItems"] == 4
    assert per_type["additionalProperties"]["items"]["enum"] == ["sms", "email", "push", "in_app"]
    assert answer["properties"]["type_opt_outs"]["maxProperties"] == 200
    assert body["properties"]["category_opt_outs"]["maxProperties"] == 100
    assert "need not name a type that exists" in per_type["description"]


# --- the admin: the per-type grid ------------------------------------------------------------------------

def _support_client() -> Client:
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user("agent", is_staff=True)
    user.groups.add(Group.objects.get(name="support"))
    client = Client(raise_request_exception=False)
    client.force_login(User.objects.get(pk=user.pk))
    return client


def _page_inputs(html: str) -> list[dict]:
    from tests.test_preferences_admin_form import Inputs

    parser = Inputs()
    parser.feed(html)
    return parser.inputs


@pytest.mark.usefixtures("fast_password_hashing")
def test_support_sees_and_edits_type_opt_outs_on_the_recipient_page(alice):
    from tests.test_preferences_admin_form import post

    Preferences.objects.create(recipient=alice, category_opt_outs={"marketing": ["sms"]},
                               type_opt_outs={"new_follower": ["push"]})
    client = _support_client()
    url = f"/admin/preferences/recipient/{alice.pk}/change/"
    page = client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert '<table class="type-opt-outs"' in html and "<th>Notification type</th>" in html
    inputs = _page_inputs(html)
    grid = [i for i in inputs if (i["name"] or "").startswith("preferences-0-type_opt_outs-")]
    rows = {i["value"] for i in grid if i["name"].endswith("-category")}
    assert rows == {"new_follower", ""}  # the recipient's types, then a blank row
    assert {(i["name"], i["value"]) for i in grid if i["type"] == "checkbox" and i["checked"]} == {
        ("preferences-0-type_opt_outs-0-channels", "push")}

    # Untick push, tick email for new_follower; type another key with SMS in the blank row.
    for i in grid:
        if i["name"] == "preferences-0-type_opt_outs-0-channels":
            i["checked"] = i["value"] == "email"
        if i["name"] == "preferences-0-type_opt_outs-1-category":
            i["value"] = "order_shipped"
        if i["name"] == "preferences-0-type_opt_outs-1-channels":
            i["checked"] = i["value"] == "sms"
    r = client.post(url, post(inputs))
    assert r.status_code == 302, r.content.decode()[-3000:]
    prefs = Preferences.objects.get(recipient=alice)
    assert prefs.type_opt_outs == {"new_follower": ["email"], "order_shipped": ["sms"]}
    assert prefs.category_opt_outs == {"marketing": ["sms"]}  # untouched


@pytest.mark.usefixtures("fast_password_hashing")
def test_a_bad_type_key_in_the_admin_is_refused_with_the_rule_and_nothing_saved(alice):
    from tests.test_preferences_admin_form import post

    Preferences.objects.create(recipient=alice, type_opt_outs={"new_follower": ["push"]})
    client = _support_client()
    url = f"/admin/preferences/recipient/{alice.pk}/change/"
    inputs = _page_inputs(client.get(url).content.decode())
    for i in inputs:
        if i["name"] == "preferences-0-type_opt_outs-1-category":
            i["value"] = "Order Shipped!"
        if i["name"] == "preferences-0-type_opt_outs-1-channels" and i["value"] == "sms":
            i["checked"] = True
    r = client.post(url, post(inputs))
    assert r.status_code == 200  # the page again, with the error
    assert "notification type &#x27;Order Shipped!&#x27; must be a type key" in r.content.decode()
    assert Preferences.objects.get(recipient=alice).type_opt_outs == {"new_follower": ["push"]}
