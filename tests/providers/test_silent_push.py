"""Silent (data-only) pushes and normal pushes: ``build_message`` for both platforms, and what the
emulator receives through firebase-admin (docs/PROVIDERS.md "Silent pushes and
sender overrides")."""

from __future__ import annotations

import time

import pytest
import requests
from firebase_admin import messaging
from hypothesis import given
from hypothesis import strategies as st

from providers.base import OutboundMessage
from providers.fcm.backend import build_message
from tests.providers.conftest import PROJECT_ID

pytestmark = pytest.mark.timeout(30)

TOKEN = "dXNlci1kZXZpY2UtdG9rZW4tMDAx:APA91bH"


def push(notification_id: str, **kw) -> OutboundMessage:
    fields = {"title": "Order shipped", "body": "Arrives Tuesday", "collapse_key": notification_id, **kw}
    return OutboundMessage(notification_id=notification_id, channel="push", to=TOKEN, **fields)


def encoded(message: OutboundMessage) -> dict:
    """The message as firebase-admin puts it on the wire (the ``message`` object of the request)."""
    return messaging._MessagingService.encode_message(build_message(message))


# --- build_message ---------------------------------------------------------------------------------


@pytest.mark.parametrize("priority", ["standard", "high"])
def test_a_silent_push_is_data_only_for_both_platforms(notification_id, priority):
    wire = encoded(push(notification_id, silent=True, priority=priority, ttl_seconds=60, data={"order": "42"}))

    expiration = wire["apns"]["headers"].pop("apns-expiration")
    assert int(expiration) == pytest.approx(time.time() + 60, abs=5)
    assert wire == {
        "token": TOKEN,
        "data": {"order": "42", "notification_id": notification_id, "title": "Order shipped",
                 "body": "Arrives Tuesday"},
        # Android: normal priority even for a high-priority message (no notification to show).
        "android": {"collapse_key": notification_id, "priority": "normal", "ttl": "60s"},
        # iOS: a background push, priority 5 (Apple refuses 10), content-available and no alert/sound.
        "apns": {"headers": {"apns-push-type": "background", "apns-priority": "5",
                             "apns-collapse-id": notification_id},
                 "payload": {"aps": {"content-available": 1}}},
    }


@pytest.mark.parametrize(("priority", "android", "apns"), [("standard", "normal", "5"), ("high", "high", "10")])
def test_a_normal_push_has_its_notification_block_and_alert_type(notification_id, priority, android, apns):
    wire = encoded(push(notification_id, priority=priority, data={"order": "42"}))

    assert wire == {
        "token": TOKEN,
        "notification": {"title": "Order shipped", "body": "Arrives Tuesday"},
        "data": {"order": "42", "notification_id": notification_id},
        "android": {"collapse_key": notification_id, "priority": android},
        "apns": {"headers": {"apns-push-type": "alert", "apns-priority": apns, "apns-collapse-id": notification_id}},
    }


def test_a_silent_push_leaves_the_callers_title_and_body_keys_alone(notification_id):
    wire = encoded(push(notification_id, silent=True, data={"title": "custom", "body": "own"}))

    assert wire["data"] == {"title": "custom", "body": "own", "notification_id": notification_id}


def test_a_silent_push_without_a_title_has_no_title_key(notification_id):
    wire = encoded(push(notification_id, silent=True, title=None))

    assert wire["data"] == {"notification_id": notification_id, "body": "Arrives Tuesday"}
    assert "notification" not in wire


texts = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)


@given(silent=st.booleans(), priority=st.sampled_from(["standard", "high"]), title=st.none() | texts,
       body=texts, data=st.dictionaries(st.sampled_from(["title", "body", "order", "x"]), texts, max_size=4))
def test_silent_or_not_the_fields_follow_the_rule(silent, priority, title, body, data):
    message = OutboundMessage(notification_id="n-1", channel="push", to=TOKEN, title=title, body=body,
                              data=data, priority=priority, silent=silent)

    wire = encoded(message)

    headers = wire["apns"]["headers"]
    high = priority == "high" and not silent
    assert (headers["apns-priority"], wire["android"]["priority"]) == (("10", "high") if high else ("5", "normal"))
    assert headers["apns-push-type"] == ("background" if silent else "alert")
    expected_data = {**data, "notification_id": "n-1"}
    if silent:
        assert "notification" not in wire
        assert wire["apns"]["payload"] == {"aps": {"content-available": 1}}
        expected_data.setdefault("body", body)
        if title is not None:
            expected_data.setdefault("title", title)
    else:
        assert "payload" not in wire["apns"]
        # firebase-admin leaves out a None notification field.
        assert wire["notification"] == {k: v for k, v in (("title", title), ("body", body)) if v is not None}
    assert wire["data"] == expected_data


# --- through the SDK to the emulator ----------------------------------------------------------------


def test_a_silent_push_arrives_data_only(fcm, emu, notification_id):
    result = fcm.send(push(notification_id, silent=True, priority="high", data={"order": "42"}))

    [recorded] = emu.messages()
    assert (recorded["provider_message_id"], recorded["notification_id"]) == (result.provider_message_id,
                                                                            notification_id)
    # No notification block: nothing for the emulator to record as title and body.
    assert (recorded["title"], recorded["body"]) == (None, None)
    assert recorded["details"] == {"message": {
        "token": TOKEN,
        "data": {"order": "42", "notification_id": notification_id, "title": "Order shipped",
                 "body": "Arrives Tuesday"},
        "android": {"collapse_key": notification_id, "priority": "normal"},
        "apns": {"headers": {"apns-push-type": "background", "apns-priority": "5",
                             "apns-collapse-id": notification_id},
                 "payload": {"aps": {"content-available": 1}}},
    }}
    assert emu.stats("fcm")["requests"] == 1


def test_a_normal_push_still_arrives_with_its_notification_block(fcm, emu, notification_id):
    fcm.send(push(notification_id, priority="high"))

    [recorded] = emu.messages()
    assert (recorded["title"], recorded["body"]) == ("Order shipped", "Arrives Tuesday")
    assert recorded["details"] == {"message": {
        "token": TOKEN,
        "notification": {"title": "Order shipped", "body": "Arrives Tuesday"},
        "data": {"notification_id": notification_id},
        "android": {"collapse_key": notification_id, "priority": "high"},
        "apns": {"headers": {"apns-push-type": "alert", "apns-priority": "10", "apns-collapse-id": notification_id}},
    }}


def test_the_emulator_refuses_a_background_push_with_priority_10(emu):
    message = {"token": TOKEN, "data": {"notification_id": "n-1"},
               "apns": {"headers": {"apns-push-type": "background", "apns-priority": "10"},
                        "payload": {"aps": {"content-available": 1}}}}

    answer = requests.post(f"{emu.url}/v1/projects/{PROJECT_ID}/messages:send", json={"message": message},
                           headers={"Authorization": "Bearer t"}, timeout=5)

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["status"], error["details"][1]["fieldViolations"][0]["field"]) == (
        "INVALID_ARGUMENT", "message.apns.headers")
    assert emu.count() == 0
