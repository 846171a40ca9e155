"""Push ``data`` keys FCM refuses (``from``, ``message_type``, ``google.*``, ``gcm.*``, any case) and the
one the platform sets itself (``notification_id``) are refused when a push is accepted, on sends and
campaigns alike: 422 ``reserved_key`` naming ``content.data.<key>``, and nothing is written.
One rule: :func:`providers.fcm.data_keys.data_key_problem`. In-process (Django test client)."""

from __future__ import annotations

import itertools
import json

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns.models import Campaign, Segment
from notifications.models import APIClient, DeliveryEvent, Notification
from preferences.models import Device, Recipient
from providers.base import OutboundMessage
from providers.fcm.backend import build_message
from providers.fcm.data_keys import data_key_problem
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
_keys = itertools.count()


@pytest.fixture
def http():
    _, key = APIClient.objects.create_key(name="push-data", scopes=EVERY_SCOPE)
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def user():
    r = Recipient.objects.create(user_id="alice", email="alice@example.com")
    Device.objects.create(recipient=r, platform="android", push_token="tok-alice")
    return r


@pytest.fixture
def segment(user):
    vip = Segment.objects.create(segment_id="vip", name="VIP")
    vip.members.create(recipient=user)
    return vip


def post(http, path, body):
    return http.post(path, data=json.dumps(body), content_type="application/json",
                     headers={"Idempotency-Key": f"pd-{next(_keys)}"})


def push(data, **over):
    return {"user_id": "alice", "channel": "push", "content": {"title": "Hi", "body": "x", "data": data}, **over}


def campaign(data):
    return {"segment_id": "vip", "channel": "push", "content": {"title": "Hi", "body": "x", "data": data}}


def assert_refused_key(r, field: str, message: str) -> None:
    """``r`` is the 422 of exactly one refused data key: ``field``, ``reserved_key``, ``message``."""
    assert r.json() == {"error": {"status": 422, "code": "validation_error", "message": f"{field}: {message}",
                                  "fields": [{"field": field, "code": "reserved_key", "message": message}]}}


def assert_nothing_written():
    assert Notification.objects.count() == 0
    assert DeliveryEvent.objects.count() == 0
    assert Campaign.objects.count() == 0


def test_fcm_reserved_word_is_422_naming_the_key_and_writes_nothing(http, user):
    r = post(http, "/v1/notifications", push({"screen": "offers", "From": "me"}))
    assert r.status_code == 422, r.content
    message = "data key 'From' is reserved by FCM (\"from\", \"message_type\", any case); use another key"
    assert_refused_key(r, "content.data.From", message)
    assert_nothing_written()


def test_fcm_reserved_prefix_is_422_naming_the_key_and_writes_nothing(http, user):
    r = post(http, "/v1/notifications", push({"GCM.notification.title": "x"}))
    assert r.status_code == 422, r.content
    message = "data key 'GCM.notification.title' starts with 'gcm.' (any case), a prefix FCM reserves; use another key"
    assert_refused_key(r, "content.data.GCM.notification.title", message)
    assert_nothing_written()


def test_notification_id_is_refused_not_silently_overwritten(http, user):
    r = post(http, "/v1/notifications", push({"notification_id": "mine"}))
    assert r.status_code == 422, r.content
    message = ("data key 'notification_id': 'notification_id' is set by the platform in every push (the "
               "notification's id); use another key")
    assert_refused_key(r, "content.data.notification_id", message)
    assert_nothing_written()


def test_every_refused_key_is_named(http, user):
    r = post(http, "/v1/notifications", push({"from": "a", "message_type": "b", "google.c_sender_id": "c",
                                             "ok": "d"}))
    assert r.status_code == 422
    assert {(f["field"], f["code"]) for f in r.json()["error"]["fields"]} == {
        ("content.data.from", "reserved_key"), ("content.data.message_type", "reserved_key"),
        ("content.data.google.c_sender_id", "reserved_key")}
    assert_nothing_written()


def test_ordinary_keys_and_near_misses_are_accepted(http, user):
    data = {"screen": "offers", "fromage": "brie", "google": "x", "gcm": "y", "googleplay": "z",
            "my.google.key": "w", "notification": "v"}
    r = post(http, "/v1/notifications", push(data))
    assert r.status_code == 202, r.content
    assert Notification.objects.get().data == data


def test_email_custom_args_are_not_push_data(http, user):
    """The rule is FCM's: an email's ``data`` (SendGrid custom args) may use these keys."""
    r = post(http, "/v1/notifications", {"user_id": "alice", "channel": "email",
                                         "content": {"title": "Hi", "body": "x", "data": {"from": "crm"}}})
    assert r.status_code == 202, r.content


def test_campaign_with_reserved_push_data_key_is_422_and_not_written(http, segment):
    r = post(http, "/v1/campaigns", campaign({"message_type": "promo"}))
    assert r.status_code == 422, r.content
    message = ("data key 'message_type' is reserved by FCM (\"from\", \"message_type\", any case); "
               "use another key")
    assert_refused_key(r, "content.data.message_type", message)
    assert_nothing_written()


def test_the_platform_key_is_the_one_build_message_sets():
    message = OutboundMessage(notification_id="n-1", channel="push", to="tok", body="x", data={"a": "b"})
    assert build_message(message).data == {"a": "b", "notification_id": "n-1"}
    assert data_key_problem("notification_id") is not None


# Keys near the rule: reserved words and prefixes in random case, with random tails; ordinary keys.
def _random_case(word: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda flips: "".join(c.upper() if f else c for c, f in zip(word, flips, strict=True)))


TAIL = st.text(st.sampled_from("abc._-1"), max_size=4)
NEAR = st.sampled_from(["from", "message_type", "notification_id", "google.", "gcm.", "google", "gcm", "fro"])
KEYS = st.one_of(st.tuples(NEAR.flatmap(_random_case), TAIL).map("".join),
                 st.text(st.sampled_from("abcdefgmo._"), min_size=0, max_size=8))


def _refused(key: str) -> bool:
    """The rule, restated: FCM's words and prefixes and the platform's key, ignoring case; no empty key."""
    k = key.lower()
    return k == "" or k in ("from", "message_type", "notification_id") or k.startswith(("google.", "gcm."))


@SETTINGS
@given(data=st.dictionaries(KEYS, st.just("v"), max_size=4), channel=st.sampled_from(["push", "email"]))
def test_generated_push_data_keys(http, user, data, channel):
    before = (Notification.objects.count(), DeliveryEvent.objects.count())
    r = post(http, "/v1/notifications", push(data, channel=channel))
    # Email: FCM's words are fine in SendGrid custom_args; only the platform's own key is refused.
    refused = ({k for k in data if _refused(k)} if channel == "push"
               else {k for k in data if k.lower() == "notification_id"})
    if refused:
        assert r.status_code == 422, r.content
        assert {(f["field"], f["code"]) for f in r.json()["error"]["fields"]} == {
            (f"content.data.{k}", "reserved_key") for k in refused}
        assert (Notification.objects.count(), DeliveryEvent.objects.count()) == before
    else:
        assert r.status_code == 202, r.content
        assert Notification.objects.count() == before[0] + 1
