"""Text that shows nothing is empty on every road (third round: a template part without template
syntax skipped every save-time check, and single sends delivered bodies of braille blanks): single
sends, type templates and campaign templates and content, at save; the send path's rule is the same
(``core.identifiers.shows_nothing``)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from campaigns.models import Template
from notifications.events.models import NotificationType
from notifications.models import APIClient, Notification
from preferences.models import Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

BLANKS = ["\u2800\u2800", "\u115f", "\u2062", "\ufe0f", "\U000e0041", "\u17b5", "   "]


@pytest.fixture
def http() -> Client:
    _, key = APIClient.objects.create_key(name="tool", scopes=list(EVERY_SCOPE))
    return Client(headers={"Authorization": f"Api-Key {key}"})


def call(http, method, path, body, **headers):
    return getattr(http, method)(path, data=json.dumps(body), content_type="application/json", headers=headers)


def fields(resp) -> set:
    return {(f["field"], f["code"]) for f in resp.json()["error"]["fields"]}


@pytest.mark.parametrize("body", BLANKS)
def test_a_type_template_without_template_syntax_that_shows_nothing_is_refused(http, body):
    r = call(http, "put", "/v1/notification-types/blank", {
        "name": "x", "category": "c", "channels": ["sms"], "templates": [{"channel": "sms", "locale": "en",
                                                                            "body": body}]})
    assert r.status_code == 422, r.content
    assert "templates.0.body" in {f for f, _ in fields(r)}
    assert not NotificationType.objects.exists()


@pytest.mark.parametrize(("channel", "part", "value", "words"), [
    ("sms", "body", "x" * 1700, "at most 1600"),
    ("in_app", "body", "x" * 6000, "at most 5000"),
    ("push", "body", "x" * 5000, "bytes; at most"),
])
def test_a_literal_type_template_its_channel_refuses_is_refused(http, channel, part, value, words):
    template = {"channel": channel, "locale": "en", "title": "T", "body": "b"} | {part: value}
    if channel == "sms":
        template.pop("title")
    r = call(http, "put", "/v1/notification-types/lit", {"name": "x", "category": "c", "channels": [channel],
                                                         "templates": [template]})
    assert r.status_code == 422, r.content
    assert any(f["field"] == f"templates.0.{part}" and words in f["message"] for f in r.json()["error"]["fields"])
    assert not NotificationType.objects.exists()


def test_a_campaign_template_without_syntax_that_shows_nothing_is_refused(http):
    r = call(http, "put", "/v1/templates/tb", {"name": "T", "default_locale": "en",
                                              "variants": [{"locale": "en", "title": "Hi", "body": "\u2800\u2800"}]})
    assert r.status_code == 422 and ("variants.0.body", "empty_body") in fields(r), r.content
    assert not Template.objects.exists()


@pytest.mark.parametrize(("channel", "content", "field"), [
    ("sms", {"body": "\u2800\u2800"}, "content.body"),
    ("in_app", {"title": "t", "body": "\u2800"}, "content.body"),
    ("email", {"title": "Hi", "body": "\u115f"}, "content.body"),
    ("email", {"title": "\u2800", "body": "real body"}, "content.title"),
])
def test_a_single_send_that_shows_nothing_is_refused(http, channel, content, field):
    Recipient.objects.create(user_id="c1", email="c1@example.com", phone="+4915112345678")
    r = call(http, "post", "/v1/notifications", {"user_id": "c1", "channel": channel, "content": content},
             **{"Idempotency-Key": f"k-{channel}-{field}"})
    assert r.status_code == 422, r.content
    assert field in {f for f, _ in fields(r)}
    assert not Notification.objects.exists()


def test_the_admin_recipient_form_saves_empty_attributes_as_none(admin_client, fast_password_hashing):
    r = admin_client.post("/admin/preferences/recipient/add/", {"user_id": "Zed", "attributes": ""})
    assert r.status_code in (200, 302)
    if r.status_code == 302:
        assert Recipient.objects.get(pk="Zed").attributes == {}
