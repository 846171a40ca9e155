"""A template that renders an empty body for every recipient is refused when it is saved (attack
report, finding 2): the save-time dry render applies the send path's rule
(:func:`notifications.content_limits.empty_body_problem`, "the rendered body is empty") to the
first sample recipient, who has every attribute the template names. And ``data`` is reserved in a
campaign's template: ``{{ data }}`` is refused as ``{{ data.code }}`` is, and a recipient's
attribute named ``data`` is never rendered."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from campaigns.models import Campaign, Template
from notifications.events.models import NotificationType
from notifications.models import APIClient
from notifications.rendering import context_for
from preferences.models import Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

EMPTY = ("a dry render on sample data (all 4 recipients, the first with every attribute the template names) failed, "
         "as every send would: the rendered body is empty")
NO_DATA = ("a dry render on sample data (recipient 1 of 4) failed, as every send would: line 1: 'data' is undefined "
           "(a campaign's template has no data: only a notification type's templates read the event's "
           "{{ data.* }}; a campaign's read the recipient's attributes and user_id, email, locale, timezone)")


@pytest.fixture
def http() -> Client:
    _, key = APIClient.objects.create_key(name="tool", scopes=list(EVERY_SCOPE))
    return Client(headers={"Authorization": f"Api-Key {key}"})


def put(http, path, body):
    return http.put(path, data=json.dumps(body), content_type="application/json")


def template(body: str) -> dict:
    return {"name": "T", "default_locale": "en", "variants": [{"locale": "en", "title": "Hi", "body": body}]}


@pytest.mark.parametrize("body", ['{{ "" }}', "{% if false %}x{% endif %}", "  {{ '  ' }}\n",
                                  # Second round: what shows nothing is empty too (a body of U+200B was
                                  # delivered, one of U+202E reversed nothing but read as blank).
                                  '{{ "\u200b" }}', '{{ "\u202e" }}', '{{ "\u3164" }}', '{{ "\u2800" }}',
                                  '{{ "\u0301\u0301" }}'])
def test_a_campaign_template_whose_body_renders_empty_is_refused(http, body):
    r = put(http, "/v1/templates/t", template(body))
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [{"field": "variants.0.body", "code": "empty_body", "message": EMPTY}]
    assert not Template.objects.exists()


@pytest.mark.parametrize("body", ["{{ first_name }}", "{% if first_name %}{{ first_name }}{% endif %}"])
def test_a_body_of_attributes_only_is_accepted(http, body):
    assert put(http, "/v1/templates/t", template(body)).status_code == 201


def test_data_alone_in_a_campaign_template_is_refused_as_data_code_is(http):
    r = put(http, "/v1/templates/dtpl2", template("{{ data }}"))
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [{"field": "variants.0.body", "code": "undefined_variable",
                                            "message": NO_DATA}]
    assert not Template.objects.exists()


def test_inline_campaign_content_that_renders_empty_is_refused(http):
    assert put(http, "/v1/segments/vip", {"name": "VIPs"}).status_code == 201
    r = http.post("/v1/campaigns", data=json.dumps({"segment_id": "vip", "channel": "sms",
                                                    "content": {"body": '{{ "" }}'}}),
                  content_type="application/json", headers={"Idempotency-Key": "c1"})
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [{"field": "content.body", "code": "empty_body", "message": EMPTY}]
    assert not Campaign.objects.exists()


def a_type(body: str) -> dict:
    return {"name": "Order shipped", "category": "shipping", "channels": ["sms"],
            "templates": [{"channel": "sms", "locale": "en", "body": body}]}


def test_a_type_template_whose_body_renders_empty_is_refused(http):
    r = put(http, "/v1/notification-types/order_shipped", a_type('{{ "" }}'))
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [{"field": "templates.0.body", "code": "empty_body",
                                            "message": f"sms [en] body: {EMPTY}"}]
    assert not NotificationType.objects.exists()


def test_a_type_body_that_reads_the_event_data_is_left_to_the_event(http):
    assert put(http, "/v1/notification-types/order_shipped", a_type("{{ data.code }}")).status_code == 201


def test_a_collapse_key_is_not_a_body():
    from notifications.rendering import check_parts
    assert check_parts({"body": "{% if false %}x{% endif %}"}, content=False) == {}


def test_an_attribute_named_data_is_never_rendered():
    recipient = Recipient(user_id="u", attributes={"data": "secret", "first_name": "Ada"})
    assert context_for(recipient) == {"first_name": "Ada", "user_id": "u", "email": recipient.email,
                                      "locale": recipient.locale, "timezone": recipient.timezone}
    assert context_for(recipient, {"code": "1"})["data"] == {"code": "1"}


@pytest.mark.parametrize(("body", "empty"), [("\u200b", True), ("\u202e \u3164", True), ("\u2800", True),
                                             ("\u0301", True), ("a", False), ("\u2764\ufe0f", False),
                                             ("\u6771", False), ("!", False)])
def test_the_send_paths_rule_reads_a_body_that_shows_nothing_as_empty(body, empty):
    from notifications.content_limits import rendered_problem

    assert (rendered_problem("email", "Hi", body, "", None) == "the rendered body is empty") is empty



@pytest.mark.parametrize(("part", "value"), [("title", r'invoice{{ "\u202e" }}fdp.exe'), ("body", r'a{{ "\x00" }}b')])
def test_a_type_template_that_renders_what_its_channel_refuses_for_everyone_is_refused(http, part, value):
    """Second round: an in_app title rendering a bidi override (or a body a NUL) saved, and every event
    then failed template_error. The send path's channel rule applies to the dry render."""
    template = {"channel": "in_app", "locale": "en", "title": "Invoice", "body": "Your invoice"} | {part: value}
    r = put(http, "/v1/notification-types/inv", {"name": "Invoice", "category": "billing", "channels": ["in_app"],
                                                "templates": [template]})
    assert r.status_code == 422, r.content
    (field,) = r.json()["error"]["fields"]
    assert (field["field"], field["code"]) == (f"templates.0.{part}", "template_error")
    assert "control character" in field["message"]
    assert not NotificationType.objects.exists()


def test_a_type_template_whose_channel_rule_depends_on_the_data_is_left_to_the_send(http):
    template = {"channel": "in_app", "locale": "en", "title": "{{ data.t }}", "body": "Your invoice"}
    r = put(http, "/v1/notification-types/inv", {"name": "Invoice", "category": "billing", "channels": ["in_app"],
                                                "templates": [template]})
    assert r.status_code == 201, r.content
