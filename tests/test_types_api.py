"""``/v1/notification-types``: define, replace, read; every bad definition a 422 naming the field
(templates by variant and line) and nothing written; ownership and the high scope (docs/TYPES.md).

In-process (Django test client, rolled-back transactions)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from notifications.events.models import NotificationType, TypeTemplate
from notifications.models import APIClient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db


def http_for(name: str, scopes=EVERY_SCOPE) -> Client:
    _client, key = APIClient.objects.create_key(name=name, scopes=list(scopes))
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def http():
    return http_for("types")


def order_shipped(**over) -> dict:
    body = {
        "name": "Order shipped", "category": "shipping", "channels": ["push", "email", "sms"],
        "quiet_hours": "silent", "required_data": ["tracking_url"], "collapse_key": "order-{{ data.order_id }}",
        "templates": [
            {"channel": "push", "locale": "en", "title": "Shipped", "body": "Order {{ data.order_id }} is on its way",
             "data": {"url": "{{ data.tracking_url }}"}},
            {"channel": "push", "locale": "de", "title": "Verschickt", "body": "Bestellung {{ data.order_id }}"},
            {"channel": "email", "locale": "en", "title": "Order {{ data.order_id }} shipped",
             "body": "Track it: {{ data.tracking_url }}", "html": "<a href='{{ data.tracking_url }}'>Track</a>"},
            {"channel": "sms", "locale": "en", "body": "Order {{ data.order_id }} shipped"}]}
    body.update(over)
    return body


def put(http, key, body):
    return http.put(f"/v1/notification-types/{key}", data=json.dumps(body), content_type="application/json")


def fields(resp) -> dict:
    return {f["field"]: (f["code"], f["message"]) for f in resp.json()["error"]["fields"]}


def test_a_type_is_created_read_and_replaced_with_exactly_its_new_templates(http):
    created = put(http, "order_shipped", order_shipped())
    assert created.status_code == 201, created.content
    body = created.json()
    assert (body["key"], body["category"], body["channels"], body["routing"], body["quiet_hours"], body["owner"]) == (
        "order_shipped", "shipping", ["push", "email", "sms"], "all", "silent", "types")
    assert [(t["channel"], t["locale"]) for t in body["templates"]] == [
        ("email", "en"), ("push", "de"), ("push", "en"), ("sms", "en")]

    replaced = put(http, "order_shipped", order_shipped(channels=["push", "email"], routing="fallback", templates=[
        {"channel": "push", "locale": "en", "body": "Shipped"},
        {"channel": "email", "locale": "en", "title": "Shipped", "body": "Shipped"}]))
    assert replaced.status_code == 200, replaced.content
    assert TypeTemplate.objects.filter(type_id="order_shipped").count() == 2
    got = http.get("/v1/notification-types/order_shipped").json()
    assert (got["channels"], got["routing"]) == (["push", "email"], "fallback")
    assert http.get("/v1/notification-types").json()["items"][0]["key"] == "order_shipped"


@pytest.mark.parametrize(("change", "field", "code"), [
    ({"channels": []}, "channels", "min_length"),
    ({"channels": ["push", "fax"]}, "channels.1", "invalid_choice"),
    ({"channels": ["push", "push"]}, "channels.1", "duplicate"),
    ({"channels": ["push"], "routing": "fallback"}, "routing", "fallback_needs_two"),
    ({"category": "Shipping!"}, "category", "invalid"),
    ({"category": "marketing", "priority": "high"}, "priority", "marketing_not_high"),
    ({"category": "marketing", "quiet_hours": "bypass"}, "quiet_hours", "marketing_bypass"),
    ({"category": "marketing", "required": True}, "required", "marketing_required"),
    ({"sms_from": "12345"}, "sms_from", "invalid"),
    ({"email_from": "not an address"}, "email_from", "invalid"),
    ({"required_data": ["9lives"]}, "required_data.0", "invalid"),
    ({"collapse_key": "{{ data.order_id "}, "collapse_key", "template_syntax"),
    ({"routing": "round_robin"}, "routing", "invalid_choice"),
    ({"name": "Order\x1bshipped"}, "name", "control_character"),
    ({"description": "ok\nok\tok\x07"}, "description", "control_character"),
    ({"required_data": ["order_id", "tracking_url", "order_id"]}, "required_data.2", "duplicate"),
])
def test_a_bad_type_is_refused_naming_the_field_and_nothing_is_written(http, change, field, code):
    resp = put(http, "order_shipped", order_shipped(**change))
    assert resp.status_code == 422, resp.content
    assert fields(resp)[field][0] == code
    assert NotificationType.objects.count() == 0 and TypeTemplate.objects.count() == 0


@pytest.mark.parametrize(("template", "field", "code", "words"), [
    ({"channel": "push", "locale": "de", "body": "Hallo\n{{ data.order_id }"}, "templates.1.body", "template_syntax",
     ["push [de] body", "line 2"]),
    ({"channel": "push", "locale": "de", "body": "x", "html": "<p>x</p>"}, "templates.1.html",
     "not_allowed_for_channel", ["push [de]"]),
    ({"channel": "push", "locale": "de", "body": "x", "data": {"google.x": "1"}}, "templates.1.data.google.x",
     "reserved_key", ["google."]),
    ({"channel": "push", "locale": "de", "body": "x", "data": {"": "1"}}, "templates.1.data.", "reserved_key",
     ["must not be empty"]),
    ({"channel": "push", "locale": "de", "body": '{% include "x.html" %}'}, "templates.1.body", "template_syntax",
     ["cannot include, import or extend"]),
    ({"channel": "push", "locale": "de", "body": '{% from "m" import f %}{{ f() }}'}, "templates.1.body",
     "template_syntax", ["cannot include"]),
    ({"channel": "push", "locale": "de", "body": '{{ "".__class__.__mro__ }}'}, "templates.1.body", "template_syntax",
     ["as every send would"]),
    ({"channel": "email", "locale": "de", "body": "x"}, "templates.1.title", "required", ["email [de]"]),
    ({"channel": "email", "locale": "de", "title": "a\nb", "body": "x"}, "templates.1.title", "line_break", []),
    ({"channel": "sms", "locale": "de", "title": "t", "body": "x"}, "templates.1.title", "not_allowed_for_channel",
     []),
    ({"channel": "push", "locale": "en", "body": "again"}, "templates.1.locale", "duplicate", []),
    ({"channel": "push", "locale": "de_AT", "body": "x"}, "templates.1.locale", "invalid", []),
])
def test_a_bad_template_names_its_variant_and_part(http, template, field, code, words):
    body = order_shipped()
    body["templates"][1] = template
    resp = put(http, "order_shipped", body)
    assert resp.status_code == 422, resp.content
    got_code, message = fields(resp)[field]
    assert got_code == code and all(w in message for w in words), message
    assert NotificationType.objects.count() == 0


def test_every_channel_needs_a_template_and_a_template_needs_its_channel(http):
    resp = put(http, "order_shipped", order_shipped(channels=["push", "email"]))
    assert fields(resp)["templates.3.channel"][0] == "not_in_channels"
    resp = put(http, "order_shipped", order_shipped(channels=["push", "email", "sms"], templates=[
        {"channel": "push", "locale": "en", "body": "x"}]))
    code, message = fields(resp)["templates"]
    assert code == "missing_channel" and "email, sms" in message


def test_only_the_owner_changes_a_type_and_an_admin_made_one_is_changed_in_the_admin(http):
    assert put(http, "order_shipped", order_shipped()).status_code == 201
    other = http_for("other")
    resp = put(other, "order_shipped", order_shipped(name="Hijacked"))
    assert (resp.status_code, fields(resp)["key"][0]) == (403, "not_owner")
    NotificationType.objects.create(key="password_reset", name="Reset", category="security", channels=["email"])
    resp = put(http, "password_reset", order_shipped())
    assert resp.status_code == 403 and "admin" in fields(resp)["key"][1]
    assert NotificationType.objects.get(pk="order_shipped").name == "Order shipped"


def test_a_high_type_needs_the_high_scope_and_writing_needs_types_write():
    low = http_for("low", ["types:write", "read", "notifications:send"])
    resp = put(low, "otp", order_shipped(category="security", priority="high", quiet_hours="bypass"))
    assert (resp.status_code, fields(resp)["priority"][0]) == (403, "missing_scope")
    reader = http_for("reader", ["read"])
    assert put(reader, "order_shipped", order_shipped()).status_code == 403
    assert NotificationType.objects.count() == 0


def test_a_bad_key_in_the_path_is_a_422_and_an_unknown_one_a_404(http):
    assert fields(put(http, "Order Shipped", order_shipped()))["key"][0] == "invalid"
    resp = http.get("/v1/notification-types/nope")
    assert resp.status_code == 404 and fields(resp)["key"][0] == "not_found"


def test_concurrent_first_puts_of_one_key_make_one_owner_and_refuse_the_other():
    """Adversarial finding (issue 14): the owner check ran before the row was locked, so two clients
    creating one key at once could both succeed and one wrote into the other's type."""
    from notifications.events import services

    a = APIClient.objects.create_key(name="a")[0]
    b = APIClient.objects.create_key(name="b")[0]
    body = order_shipped()
    fields = {k: v for k, v in body.items() if k != "templates"}
    services.save_type("raced", fields, body["templates"], client=a)
    with pytest.raises(services.TypeNotOwned):
        services.save_type("raced", {**fields, "name": "B's"}, body["templates"], client=b)
    assert NotificationType.objects.get(pk="raced").name == "Order shipped"
    with pytest.raises(services.HighNotAllowed):
        services.save_type("raced", {**fields, "priority": "high", "category": "security", "quiet_hours": "bypass"},
                           body["templates"], client=a, may_high=False)
