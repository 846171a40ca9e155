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
from tests.providers.conftest import PROJECT_ID, fcm_options, free_port

pytestmark = pytest.mark.timeout(30)

TOKEN = "dXNlci1kZXZpY2UtdG9rZW4tMDAx:APA91bH"


def push(notification_id: str, to: str = TOKEN, **kw) -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="push", to=to, title="Order shipped",
                           body="Arrives Tuesday", collapse_key=notification_id, **kw)


def test_send_records_exactly_one_message(fcm, emu, notification_id):
    result = fcm.send(push(notification_id, data={"order": "42"}, priority="high", ttl_seconds=3600))

    assert result.provider == "fcm"
    assert result.provider_message_id.startswith(f"projects/{PROJECT_ID}/messages/0:")
    [recorded] = emu.messages()
    assert recorded == {
        "provider": "fcm", "account": PROJECT_ID, "channel": "push", "to": TOKEN, "title": "Order shipped",
        "body": "Arrives Tuesday",
        "provider_message_id": result.provider_message_id, "notification_id": notification_id,
        "received_at_ms": recorded["received_at_ms"],
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
    assert emu.stats("fcm")["requests"] == 1  # without Retry-After the SDK does not retry a 429


@pytest.mark.timeout(20)
def test_unavailable_is_transient_after_the_sdk_retries(fcm, emu, notification_id):
    emu.fault(provider="fcm", code="UNAVAILABLE")  # times=null: every attempt fails

    with pytest.raises(TransientProviderError) as err:
        fcm.send(push(notification_id))

    assert (err.value.code, err.value.http_status) == ("UNAVAILABLE", 503)
    assert emu.stats("fcm")["rejected"] == 5  # 1 call + the SDK's 4 retries


def test_one_unavailable_answer_is_retried_by_the_sdk(fcm, emu, notification_id):
    emu.fault(provider="fcm", status=500, times=1)

    fcm.send(push(notification_id))

    assert emu.stats("fcm") == {"requests": 2, "accepted": 1, "rejected": 1, "messages": 1, "token_requests": 0}
    assert emu.count(notification_id=notification_id) == 1


@pytest.mark.parametrize(("rule", "code"), [({"status": 401}, "UNAUTHENTICATED"),
                                            ({"code": "THIRD_PARTY_AUTH_ERROR"}, "THIRD_PARTY_AUTH_ERROR")])
def test_auth_errors_are_configuration_errors(fcm, emu, notification_id, rule, code):
    emu.fault(provider="fcm", **rule)

    with pytest.raises(ProviderConfigurationError) as err:
        fcm.send(push(notification_id))

    assert (err.value.code, err.value.http_status) == (code, 401)


@pytest.mark.timeout(10)
def test_timeout_is_transient(emu, notification_id):
    backend = FcmPushBackend(options=fcm_options(emu, TIMEOUT=0.3))
    emu.fault(provider="fcm", latency_ms=1500, status=503)
    started = time.monotonic()

    with pytest.raises(TransientProviderError) as err:
        backend.send(push(notification_id))

    backend.close()
    assert err.value.code == "timeout"
    assert time.monotonic() - started < 2.5  # the SDK retries a read timeout once


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

    from providers.fcm.backend import redirect_fcm

    monkeypatch.setattr(messaging, "_get_messaging_service", lambda app: object())

    with pytest.raises(ProviderConfigurationError) as err:
        redirect_fcm(None, "http://127.0.0.1:1/v1/projects/p/messages:send")

    assert err.value.code == "sdk_hook_missing"
