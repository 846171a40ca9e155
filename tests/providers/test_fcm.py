"""FcmPushBackend (firebase-admin) against the emulator."""

from __future__ import annotations

import time

import pytest

from providers.base import (
    ContactInvalidError,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    TransientProviderError,
)
from providers.fcm.backend import FcmPushBackend, build_message
from tests.providers.conftest import PROJECT_ID, fcm_options, free_port, settle_until

pytestmark = pytest.mark.timeout(30)

TOKEN = "dXNlci1kZXZpY2UtdG9rZW4tMDAx:APA91bH"


def push(notification_id: str, to: str = TOKEN, **kw) -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="push", to=to, title="Order shipped",
                           body="Arrives Tuesday", collapse_key=notification_id, **kw)


def push_counts(emu) -> dict:
    """The emulator's FCM send counters, without ``token_requests`` (the shared backend's OAuth token
    is fetched by whichever test uses it first)."""
    counts = emu.stats("fcm")
    del counts["token_requests"]
    return counts


def test_send_records_exactly_one_message(fcm, emu, notification_id):
    result = fcm.send(push(notification_id, data={"order": "42"}, priority="high", ttl_seconds=3600))

    assert result.provider == "fcm"
    assert result.provider_message_id.startswith(f"projects/{PROJECT_ID}/messages/0:")
    [recorded] = emu.messages()
    message = recorded.pop("details")["message"]
    assert recorded == {
        "provider": "fcm", "account": PROJECT_ID, "channel": "push", "to": TOKEN, "title": "Order shipped",
        "body": "Arrives Tuesday",
        "provider_message_id": result.provider_message_id, "notification_id": notification_id,
        "received_at_ms": recorded["received_at_ms"],
    }
    expiration = message["apns"]["headers"].pop("apns-expiration")
    assert int(expiration) == pytest.approx(time.time() + 3600, abs=5)
    assert message == {
        "token": TOKEN, "notification": {"title": "Order shipped", "body": "Arrives Tuesday"},
        "data": {"order": "42", "notification_id": notification_id},
        "android": {"collapse_key": notification_id, "priority": "high", "ttl": "3600s"},
        "apns": {"headers": {"apns-push-type": "alert", "apns-priority": "10", "apns-collapse-id": notification_id}},
    }


def test_message_shape(notification_id):
    from firebase_admin import messaging

    encoded = messaging._MessagingService.encode_message(build_message(push(notification_id, ttl_seconds=60)))

    assert encoded["token"] == TOKEN
    assert encoded["data"] == {"notification_id": notification_id}
    assert encoded["android"] == {"collapse_key": notification_id, "priority": "normal", "ttl": "60s"}
    headers = encoded["apns"]["headers"]
    assert (headers["apns-collapse-id"], headers["apns-priority"]) == (notification_id, "5")
    assert int(headers["apns-expiration"]) == pytest.approx(time.time() + 60, abs=5)


@pytest.mark.parametrize(
    ("rule", "code", "status"),
    [
        ({"code": "UNREGISTERED"}, "UNREGISTERED", 404),
        ({"status": 404}, "UNREGISTERED", 404),
        ({"code": "SENDER_ID_MISMATCH"}, "SENDER_ID_MISMATCH", 403),
    ],
)
def test_dead_tokens_are_contact_invalid(fcm, emu, notification_id, rule, code, status):
    emu.fault(provider="fcm", to=TOKEN, **rule)

    with pytest.raises(ContactInvalidError) as err:
        fcm.send(push(notification_id))

    assert (err.value.code, err.value.reason, err.value.http_status) == (code, "unregistered_token", status)
    assert emu.count() == 0


def test_invalid_argument_on_the_token_is_invalid_token(fcm, emu, notification_id):
    emu.fault(provider="fcm", to=TOKEN, code="INVALID_ARGUMENT")

    with pytest.raises(ContactInvalidError) as err:
        fcm.send(push(notification_id))

    assert (err.value.code, err.value.reason, err.value.http_status) == ("INVALID_ARGUMENT", "invalid_token", 400)


def test_malformed_token_is_rejected_by_the_emulator(fcm, emu, notification_id):
    with pytest.raises(ContactInvalidError) as err:
        fcm.send(push(notification_id, to="not a token"))

    assert err.value.reason == "invalid_token"


def test_oversized_data_is_a_permanent_payload_error(fcm, emu, notification_id):
    with pytest.raises(PermanentProviderError) as err:
        fcm.send(push(notification_id, data={"blob": "x" * 5000}))

    assert not isinstance(err.value, ContactInvalidError)
    assert (err.value.code, err.value.http_status) == ("INVALID_ARGUMENT", 400)
    assert "x" * 50 not in str(err.value)
    assert emu.count() == 0


def test_quota_exceeded_is_transient(fcm, emu, notification_id):
    emu.fault(provider="fcm", code="QUOTA_EXCEEDED")

    with pytest.raises(TransientProviderError) as err:
        fcm.send(push(notification_id))

    assert (err.value.code, err.value.http_status, err.value.retry_after) == ("QUOTA_EXCEEDED", 429, None)
    assert emu.stats("fcm")["requests"] == 1


@pytest.mark.parametrize(("status", "code"), [(503, "UNAVAILABLE"), (500, "INTERNAL")])
def test_server_errors_are_transient_and_sent_once(fcm, emu, notification_id, status, code):
    rule = emu.fault(provider="fcm", status=status)  # times=null: a retry would fail too, and be counted

    with pytest.raises(TransientProviderError) as err:
        fcm.send(push(notification_id))

    assert (err.value.code, err.value.http_status) == (code, status)
    # firebase-admin's own urllib3 Retry re-sent a 500/503 four times (five requests).
    assert emu.fired(rule) == 1
    assert push_counts(emu) == {"requests": 1, "accepted": 0, "rejected": 1, "messages": 0}


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("status", "code"), [(429, "QUOTA_EXCEEDED"), (503, "UNAVAILABLE")])
def test_retry_after_is_reported_not_slept(fcm, emu, notification_id, status, code):
    rule = emu.fault(provider="fcm", status=status, retry_after=120)
    started = time.monotonic()

    with pytest.raises(TransientProviderError) as err:
        fcm.send(push(notification_id))

    # With the SDK's Retry(respect_retry_after_header=True) the call slept 120 s before re-sending.
    assert time.monotonic() - started < 60
    assert (err.value.code, err.value.http_status, err.value.retry_after) == (code, status, 120.0)
    assert emu.fired(rule) == 1
    assert emu.stats("fcm")["requests"] == 1


@pytest.mark.parametrize(("rule", "code"), [({"status": 401}, "UNAUTHENTICATED"),
                                            ({"code": "THIRD_PARTY_AUTH_ERROR"}, "THIRD_PARTY_AUTH_ERROR")])
def test_auth_errors_are_configuration_errors(fcm, emu, notification_id, rule, code):
    emu.fault(provider="fcm", **rule)

    with pytest.raises(ProviderConfigurationError) as err:
        fcm.send(push(notification_id))

    assert (err.value.code, err.value.http_status) == (code, 401)


@pytest.mark.timeout(40)
def test_a_slow_answer_within_the_timeout_is_accepted_once(emu, notification_id):
    # Before: httpTimeout was TIMEOUT / 2 = 5 s, so the read timed out and the SDK re-sent the push.
    backend = FcmPushBackend(options=fcm_options(emu, TIMEOUT=10))
    rule = emu.fault(provider="fcm", latency_ms=6000)
    try:
        result = backend.send(push(notification_id))
    finally:
        backend.close()

    [recorded] = emu.messages(notification_id=notification_id)
    assert recorded["provider_message_id"] == result.provider_message_id
    assert emu.fired(rule) == 1


@pytest.mark.timeout(20)
def test_timeout_is_transient_and_the_push_is_sent_once(emu, notification_id):
    timeout, latency = 0.5, 1.5
    backend = FcmPushBackend(options=fcm_options(emu, TIMEOUT=timeout))
    rule = emu.fault(provider="fcm", latency_ms=int(latency * 1000))  # a slow success: recorded when answered
    started = time.monotonic()
    try:
        with pytest.raises(TransientProviderError) as err:
            backend.send(push(notification_id))
    finally:
        backend.close()
    # Any re-sent request would be answered (and recorded) by now.
    settle_until(started + 2 * timeout + latency + 1.0)

    assert err.value.code == "timeout"
    # The SDK's Retry(read=1) re-sent the push after the read timeout: two messages for one call.
    assert emu.fired(rule) == 1
    assert emu.count(notification_id=notification_id) == 1


def test_connection_refused_is_transient(emu, notification_id):
    dead = f"http://127.0.0.1:{free_port()}"
    backend = FcmPushBackend(options=fcm_options(emu, FCM_URL=dead + "/v1/projects/{0}/messages:send"))

    with pytest.raises(TransientProviderError) as err:
        backend.send(push(notification_id))

    backend.close()
    assert err.value.code == "connection_error"


def test_each_backend_has_its_own_firebase_app(emu):
    import firebase_admin

    first, second = FcmPushBackend(options=fcm_options(emu)), FcmPushBackend(options=fcm_options(emu))
    first.open()
    second.open()
    names = {first._app.name, second._app.name}
    first.close()
    second.close()

    assert len(names) == 2
    assert not names & set(firebase_admin._apps)


def test_sdk_redirect_hook_still_exists(emu):
    """Fails if firebase-admin drops the private hooks providers/fcm/backend.py relies on."""
    from firebase_admin import messaging

    assert messaging._MessagingService.FCM_URL == "https://fcm.googleapis.com/v1/projects/{0}/messages:send"
    backend = FcmPushBackend(options=fcm_options(emu))
    backend.open()
    service = messaging._get_messaging_service(backend._app)
    backend.close()
    assert service._fcm_url == f"{emu.url}/v1/projects/{PROJECT_ID}/messages:send"


def test_redirect_fails_loudly_if_the_private_hook_is_gone(emu, monkeypatch):
    from firebase_admin import messaging

    from providers.fcm.sdk_hooks import redirect_fcm

    monkeypatch.setattr(messaging, "_get_messaging_service", lambda app: object())

    with pytest.raises(ProviderConfigurationError) as err:
        redirect_fcm(None, "http://127.0.0.1:1/v1/projects/p/messages:send")

    assert err.value.code == "sdk_hook_missing"
