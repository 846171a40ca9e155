"""SendGridEmailBackend against the emulator."""

from __future__ import annotations

import inspect
import time

import pytest

from providers.base import (
    ContactInvalidError,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    TransientProviderError,
)
from providers.sendgrid.backend import SendGridEmailBackend, build_request_body
from tests.providers.conftest import free_port, sendgrid_options, settle_until

pytestmark = pytest.mark.timeout(30)

TO = "ada@example.org"


def mail(notification_id: str, to: str = TO, **kw) -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="email", to=to, title="Welcome",
                           body="Hello Ada", **kw)


def test_send_records_exactly_one_message(sendgrid, emu, notification_id):
    result = sendgrid.send(mail(notification_id, html="<p>Hello Ada</p>", data={"campaign": "c1"}))

    assert result.provider == "sendgrid"
    assert len(result.provider_message_id) == 22
    assert emu.messages() == [{
        "provider": "sendgrid", "account": None, "channel": "email", "to": TO, "title": "Welcome",
        "body": "Hello Ada",
        "provider_message_id": result.provider_message_id, "notification_id": notification_id,
        "received_at_ms": emu.messages()[0]["received_at_ms"],
        "details": {"from": {"email": "notify@example.com", "name": "Notify"}, "reply_to": None},
    }]


def test_request_body_shape(notification_id):
    body = build_request_body(mail(notification_id, html="<b>x</b>", data={"k": "v"}), "Notify <n@example.com>")

    assert body == {
        "personalizations": [{"to": [{"email": TO}]}],
        "from": {"email": "n@example.com", "name": "Notify"},
        "subject": "Welcome",
        "content": [{"type": "text/plain", "value": "Hello Ada"}, {"type": "text/html", "value": "<b>x</b>"}],
        "custom_args": {"k": "v", "notification_id": notification_id},
    }


def test_invalid_address_is_a_permanent_payload_error(sendgrid, emu, notification_id):
    with pytest.raises(PermanentProviderError) as err:
        sendgrid.send(mail(notification_id, to="not-an-address"))

    assert not isinstance(err.value, ContactInvalidError)
    assert (err.value.code, err.value.http_status) == ("400", 400)
    assert "personalizations.0.to.0.email" in err.value.message
    assert "Hello Ada" not in str(err.value)
    assert emu.count() == 0


def test_injected_400(sendgrid, emu, notification_id):
    emu.fault(provider="sendgrid", to=TO, status=400, code="Invalid content")

    with pytest.raises(PermanentProviderError) as err:
        sendgrid.send(mail(notification_id))

    assert (err.value.code, err.value.message) == ("400", "Invalid content")
    assert emu.count() == 0


@pytest.mark.parametrize("status", [401, 403])
def test_auth_errors_are_configuration_errors(sendgrid, emu, notification_id, status):
    emu.fault(provider="sendgrid", status=status)

    with pytest.raises(ProviderConfigurationError) as err:
        sendgrid.send(mail(notification_id))

    assert (err.value.code, err.value.http_status) == (str(status), status)


def test_rate_limited_uses_rate_limit_reset(sendgrid, emu, notification_id):
    emu.fault(provider="sendgrid", status=429, retry_after=30)

    with pytest.raises(TransientProviderError) as err:
        sendgrid.send(mail(notification_id))

    assert (err.value.code, err.value.http_status) == ("429", 429)
    assert 28 <= err.value.retry_after <= 31


@pytest.mark.parametrize("status", [500, 502, 503])
def test_server_errors_are_transient(sendgrid, emu, notification_id, status):
    emu.fault(provider="sendgrid", status=status, times=1)

    with pytest.raises(TransientProviderError) as err:
        sendgrid.send(mail(notification_id))

    assert (err.value.code, err.value.http_status) == (str(status), status)
    assert emu.stats("sendgrid") == {"requests": 1, "accepted": 0, "rejected": 1, "messages": 0}


@pytest.mark.timeout(10)
def test_timeout_is_transient_and_quick(emu, notification_id):
    backend = SendGridEmailBackend(options=sendgrid_options(emu, TIMEOUT=0.3))
    emu.fault(provider="sendgrid", latency_ms=2000, status=503)
    started = time.monotonic()

    with pytest.raises(TransientProviderError) as err:
        backend.send(mail(notification_id))

    assert err.value.code == "timeout"
    assert time.monotonic() - started < 1.5


def test_connection_refused_is_transient(emu, notification_id):
    backend = SendGridEmailBackend(options=sendgrid_options(emu, HOST=f"http://127.0.0.1:{free_port()}"))

    with pytest.raises(TransientProviderError) as err:
        backend.send(mail(notification_id))

    assert err.value.code == "connection_error"


def test_sdk_redirect_hook_still_exists():
    """Fails if SendGridAPIClient loses its documented ``host`` parameter or the post timeout."""
    from sendgrid import SendGridAPIClient

    assert "host" in inspect.signature(SendGridAPIClient).parameters
    client = SendGridAPIClient(api_key="SG.x", host="http://127.0.0.1:1")
    assert client.client.host == "http://127.0.0.1:1"
    assert "timeout" in inspect.signature(client.client.mail.send.post).parameters


@pytest.mark.timeout(15)
def test_a_timeout_is_one_request(emu, notification_id):
    timeout, latency = 0.3, 1.5
    backend = SendGridEmailBackend(options=sendgrid_options(emu, TIMEOUT=timeout))
    rule = emu.fault(provider="sendgrid", latency_ms=int(latency * 1000))  # slow success: recorded when answered
    started = time.monotonic()

    with pytest.raises(TransientProviderError) as err:
        backend.send(mail(notification_id))
    settle_until(started + 2 * timeout + latency + 1.0)  # a re-sent request would be recorded by now

    assert err.value.code == "timeout"
    assert emu.fired(rule) == 1
    assert emu.count(notification_id=notification_id) == 1


def test_a_503_is_one_request(sendgrid, emu, notification_id):
    rule = emu.fault(provider="sendgrid", status=503)  # times=null: a retry would be refused and counted too

    with pytest.raises(TransientProviderError) as err:
        sendgrid.send(mail(notification_id))

    assert (err.value.code, err.value.http_status) == ("503", 503)
    assert emu.fired(rule) == 1
