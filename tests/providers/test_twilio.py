"""TwilioSmsBackend against the emulator: what is recorded, and how each error is classified."""

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
from providers.twilio.backend import TwilioSmsBackend, clamp_validity_period, status_callback_url
from tests.providers.conftest import free_port, twilio_options

pytestmark = pytest.mark.timeout(30)

TO = "+15551230001"


def sms(notification_id: str, to: str = TO, **kw) -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="sms", to=to, body="Your code is 123456", **kw)


def test_send_records_exactly_one_message(twilio, emu, notification_id):
    result = twilio.send(sms(notification_id, ttl_seconds=600))

    assert result.provider == "twilio"
    assert result.raw_status == "queued"
    assert result.provider_message_id.startswith("SM") and len(result.provider_message_id) == 34
    [recorded] = emu.messages()
    assert recorded == {
        "provider": "twilio", "account": "AC" + "0" * 32, "channel": "sms", "to": TO, "title": None,
        "body": "Your code is 123456",
        "provider_message_id": result.provider_message_id, "notification_id": notification_id,
        "received_at_ms": recorded["received_at_ms"],
    }
    assert abs(recorded["received_at_ms"] - time.time() * 1000) < 5000
    assert emu.stats("twilio") == {"requests": 1, "accepted": 1, "rejected": 0, "messages": 1, "list_requests": 0}


def test_invalid_number_is_rejected_by_the_emulator(twilio, emu, notification_id):
    with pytest.raises(ContactInvalidError) as err:
        twilio.send(sms(notification_id, to="12345"))

    assert (err.value.code, err.value.reason, err.value.http_status) == ("21211", "invalid_number", 400)
    assert "Your code" not in str(err.value)
    assert emu.count() == 0


@pytest.mark.parametrize(
    ("code", "reason"), [(21211, "invalid_number"), (21610, "opted_out"), (21614, "not_mobile")],
)
def test_contact_errors(twilio, emu, notification_id, code, reason):
    emu.fault(provider="twilio", to=TO, status=400, code=code)

    with pytest.raises(ContactInvalidError) as err:
        twilio.send(sms(notification_id))

    assert (err.value.code, err.value.reason, err.value.http_status) == (str(code), reason, 400)
    assert emu.count() == 0
    assert emu.stats("twilio")["rejected"] == 1


def test_fault_only_for_the_matching_number(twilio, emu, notification_id):
    emu.fault(provider="twilio", to="+15559999999", code=21610)

    twilio.send(sms(notification_id))

    assert emu.count(to=TO) == 1


@pytest.mark.parametrize(("status", "code"), [(401, None), (None, 20003), (400, 21606), (400, 21659), (400, 21408)])
def test_configuration_errors(twilio, emu, notification_id, status, code):
    emu.fault(provider="twilio", status=status, code=code)

    with pytest.raises(ProviderConfigurationError) as err:
        twilio.send(sms(notification_id))

    assert err.value.code == str(code or 20003)
    assert err.value.http_status == (status or 401)


def test_server_error_is_transient(twilio, emu, notification_id):
    emu.fault(provider="twilio", status=503, times=1)

    with pytest.raises(TransientProviderError) as err:
        twilio.send(sms(notification_id))
    result = twilio.send(sms(notification_id))  # times=1: the next request succeeds

    assert (err.value.code, err.value.http_status, err.value.retry_after) == ("503", 503, None)
    assert [m["provider_message_id"] for m in emu.messages()] == [result.provider_message_id]


def test_rate_limited_with_retry_after(twilio, emu, notification_id):
    emu.fault(provider="twilio", status=429, retry_after=7)

    with pytest.raises(TransientProviderError) as err:
        twilio.send(sms(notification_id))

    assert (err.value.code, err.value.http_status, err.value.retry_after) == ("20429", 429, 7.0)


def test_other_client_error_is_permanent(twilio, emu, notification_id):
    emu.fault(provider="twilio", status=400, code=21617)

    with pytest.raises(PermanentProviderError) as err:
        twilio.send(sms(notification_id))

    assert not isinstance(err.value, ContactInvalidError)
    assert err.value.code == "21617"


@pytest.mark.timeout(10)
def test_timeout_is_transient_and_quick(emu, notification_id):
    backend = TwilioSmsBackend(options=twilio_options(emu, TIMEOUT=0.3))
    emu.fault(provider="twilio", latency_ms=2000, status=503)
    started = time.monotonic()

    with pytest.raises(TransientProviderError) as err:
        backend.send(sms(notification_id))

    assert err.value.code == "timeout"
    assert time.monotonic() - started < 1.5
    backend.close()


def test_connection_refused_is_transient(emu, notification_id):
    backend = TwilioSmsBackend(options=twilio_options(emu, BASE_URL=f"http://127.0.0.1:{free_port()}"))

    with pytest.raises(TransientProviderError) as err:
        backend.send(sms(notification_id))

    assert err.value.code == "connection_error"


def test_missing_option_names_the_setting():
    backend = TwilioSmsBackend(options={"ACCOUNT_SID": "AC1", "AUTH_TOKEN": "t"})

    with pytest.raises(ProviderConfigurationError, match=r'OPTIONS\["FROM_NUMBER"\]'):
        backend.open()


def test_validity_period_and_callback_helpers():
    assert [clamp_validity_period(v) for v in (None, 0, 600, 10**6)] == [None, 1, 600, 36000]
    assert status_callback_url(None, "n1") is None
    assert status_callback_url("https://x.test/cb?a=1&nid=old", "n1") == "https://x.test/cb?a=1&nid=n1"


def test_sdk_redirect_hook_still_exists():
    """Fails if twilio changes the HttpClient.request contract our redirecting client overrides."""
    from twilio.http.http_client import TwilioHttpClient

    params = list(inspect.signature(TwilioHttpClient.request).parameters)
    assert params == ["self", "method", "url", "params", "data", "headers", "auth", "timeout", "allow_redirects"]
    assert "http_client" in inspect.signature(__import__("twilio.rest", fromlist=["Client"]).Client).parameters


def test_edge_and_region_environment_cannot_break_the_redirect(emu, notification_id, monkeypatch):
    """TWILIO_EDGE/REGION rewrite hosts (127.0.0.1 -> 127.ie1.0.1); the redirect runs after that."""
    monkeypatch.setenv("TWILIO_EDGE", "dublin")
    monkeypatch.setenv("TWILIO_REGION", "ie1")
    backend = TwilioSmsBackend(options=twilio_options(emu))

    backend.send(sms(notification_id))

    backend.close()
    assert emu.count(notification_id=notification_id) == 1
