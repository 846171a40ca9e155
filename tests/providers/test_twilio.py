"""TwilioSmsBackend against the emulator: what is recorded, and how each error is classified."""

from __future__ import annotations

import dataclasses
import http.server
import inspect
import json
import logging
import threading
import time
from datetime import UTC, datetime, timedelta

import aiohttp
import pytest

from providers.base import (
    CallTimeouts,
    ContactInvalidError,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    SendResult,
    TransientProviderError,
)
from providers.twilio.backend import TwilioSmsBackend, clamp_validity_period, status_callback_url
from tests.providers.conftest import free_port, settle_until, twilio_options, wait_for

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
        "details": {"from": "+15005550006", "messaging_service_sid": None},
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


@pytest.mark.timeout(10)
def test_a_timeout_names_the_configured_timeout_that_applied(emu, notification_id):
    # Issue 23 #4: the reason said "no answer within 20.0 s" (the whole request's 2 × TIMEOUT) when the
    # 10 s read timeout had expired. Here TIMEOUT 0.4 s, so TOTAL_TIMEOUT 0.8 s: the read one applies.
    backend = TwilioSmsBackend(options=twilio_options(emu, TIMEOUT=0.4))
    emu.fault(provider="twilio", latency_ms=2000)

    with pytest.raises(TransientProviderError) as err:
        backend.send(sms(notification_id))
    backend.close()

    assert (err.value.code, err.value.message) == ("timeout", "no answer within 0.4 s (TIMEOUT) (SocketTimeoutError)")


@pytest.mark.parametrize(("exc", "reason"), [
    (aiohttp.ConnectionTimeoutError("Connection timeout to host"), "no connection within 3 s (CONNECT_TIMEOUT)"),
    (aiohttp.SocketTimeoutError("Timeout on reading data from socket"), "no answer within 10 s (TIMEOUT)"),
    (TimeoutError(), "no complete answer within 25 s (TOTAL_TIMEOUT)"),
])
def test_each_kind_of_timeout_names_its_own_option_and_value(exc, reason):
    timeouts = CallTimeouts.from_options({"TIMEOUT": 10, "TOTAL_TIMEOUT": 25})
    assert timeouts.expired(exc) == reason


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
    from twilio.http.async_http_client import AsyncTwilioHttpClient

    assert list(inspect.signature(AsyncTwilioHttpClient.request).parameters) == params
    assert "max_retries" in inspect.signature(AsyncTwilioHttpClient).parameters


def test_edge_and_region_environment_cannot_break_the_redirect(emu, notification_id, monkeypatch):
    """TWILIO_EDGE/REGION rewrite hosts (127.0.0.1 -> 127.ie1.0.1); the redirect runs after that."""
    monkeypatch.setenv("TWILIO_EDGE", "dublin")
    monkeypatch.setenv("TWILIO_REGION", "ie1")
    backend = TwilioSmsBackend(options=twilio_options(emu))

    backend.send(sms(notification_id))

    backend.close()
    assert emu.count(notification_id=notification_id) == 1


# --- No retries inside the SDK (docs/PROVIDERS.md, "The SDKs' own retries and async paths") ---------


def test_a_server_error_is_one_request(twilio, emu, notification_id):
    rule = emu.fault(provider="twilio", status=500)  # times=null: a retry would be refused and counted too

    with pytest.raises(TransientProviderError) as err:
        twilio.send(sms(notification_id))

    assert (err.value.code, err.value.http_status) == ("500", 500)
    assert emu.fired(rule) == 1


@pytest.mark.timeout(15)
def test_a_timeout_is_one_request(emu, notification_id):
    timeout, latency = 0.3, 1.5
    backend = TwilioSmsBackend(options=twilio_options(emu, TIMEOUT=timeout))
    rule = emu.fault(provider="twilio", latency_ms=int(latency * 1000))  # slow success: recorded when answered
    started = time.monotonic()

    with pytest.raises(TransientProviderError) as err:
        backend.send(sms(notification_id))
    backend.close()
    settle_until(started + 2 * timeout + latency + 1.0)  # a re-sent request would be recorded by now

    assert err.value.code == "timeout"
    assert emu.fired(rule) == 1
    assert emu.count(notification_id=notification_id) == 1


def test_no_adapter_of_the_live_session_retries(twilio):
    """Fails if twilio (or requests) starts mounting a retrying adapter on the session we send with."""
    adapters = dict(twilio._http.session.adapters)

    assert {"http://", "https://"} <= set(adapters)
    for prefix, adapter in adapters.items():
        assert (prefix, adapter.max_retries.total, bool(adapter.max_retries.status_forcelist)) == (prefix, 0, False)


# --- find_accepted: the message an unanswered call may have created -------------------------------


@pytest.mark.timeout(40)
def test_the_message_of_a_timed_out_call_is_found(twilio, emu, notification_id):
    since = datetime.now(UTC)
    rule = emu.fault(provider="twilio", latency_ms=12_000)  # answered (and recorded) after 12 s; TIMEOUT is 2 s
    # A body of its own: the lookup matches To, body and the second of creation, and an earlier test's
    # message to the same number in the same second was found instead (under load, twice).
    message = dataclasses.replace(sms(notification_id), body=f"Your code is {notification_id[:8]}")

    with pytest.raises(TransientProviderError) as err:
        twilio.send(message)
    assert err.value.code == "timeout"
    [recorded] = wait_for(lambda: emu.messages(notification_id=notification_id), 20)

    found = twilio.find_accepted(message, since)

    assert found == SendResult(provider="twilio", provider_message_id=recorded["provider_message_id"],
                               raw_status="queued")
    assert (emu.fired(rule), emu.stats("twilio")["list_requests"]) == (1, 1)


def test_lookup_matches_the_body_and_the_creation_time(twilio, emu, notification_id):
    message = sms(notification_id)
    sent = twilio.send(message)
    [recorded] = emu.messages()
    created = datetime.fromtimestamp(recorded["received_at_ms"] / 1000, UTC)
    expected = SendResult(provider="twilio", provider_message_id=sent.provider_message_id, raw_status="queued")

    # date_created has whole seconds: a `since` later in the same second still finds it.
    assert twilio.find_accepted(message, created) == expected
    assert twilio.find_accepted(message, created - timedelta(minutes=5)) == expected
    assert twilio.find_accepted(message, (created - timedelta(minutes=5)).replace(tzinfo=None)) == expected
    assert twilio.find_accepted(message, created + timedelta(seconds=1)) is None
    assert twilio.find_accepted(dataclasses.replace(message, body="Your code is 654321"), created) is None
    assert twilio.find_accepted(dataclasses.replace(message, to="+15551230002"), created) is None
    assert emu.stats("twilio")["list_requests"] == 6


def test_lookup_is_scoped_to_the_sender_and_the_account(emu, notification_id):
    since = datetime.now(UTC) - timedelta(seconds=1)
    message = sms(notification_id)
    primary = TwilioSmsBackend(options=twilio_options(emu))
    other_sender = TwilioSmsBackend(options=twilio_options(emu, FROM_NUMBER="+15005550007"))
    other_account = TwilioSmsBackend(options=twilio_options(emu, ACCOUNT_SID="AC" + "1" * 32))
    sent = primary.send(message)

    assert other_sender.find_accepted(message, since) is None
    assert other_account.find_accepted(message, since) is None
    assert primary.find_accepted(message, since).provider_message_id == sent.provider_message_id
    for backend in (primary, other_sender, other_account):
        backend.close()


def test_of_two_matching_messages_the_oldest_is_found(twilio, emu, notification_id):
    since = datetime.now(UTC) - timedelta(seconds=1)
    first = twilio.send(sms(notification_id))
    twilio.send(sms(notification_id))

    assert twilio.find_accepted(sms(notification_id), since).provider_message_id == first.provider_message_id


def test_lookup_with_twilio_unreachable_is_none(emu, notification_id, caplog):
    backend = TwilioSmsBackend(options=twilio_options(emu, BASE_URL=f"http://127.0.0.1:{free_port()}"))

    with caplog.at_level(logging.WARNING, logger="providers.twilio.backend"):
        assert backend.find_accepted(sms(notification_id), datetime.now(UTC)) is None

    assert f"lookup of notification {notification_id} failed (ConnectionError)" in caplog.text


class _StubTwilio(http.server.BaseHTTPRequestHandler):
    """Answers every GET with the server's ``status``/``body`` after ``delay`` seconds, counting them."""

    def do_GET(self):
        self.server.requests += 1
        time.sleep(self.server.delay)
        payload = json.dumps(self.server.body).encode()
        try:
            self.send_response(self.server.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except OSError:  # the client gave up (the timeout case)
            pass

    def log_message(self, *args):
        pass


@pytest.fixture
def stub_twilio():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StubTwilio)
    server.requests, server.delay, server.status, server.body = 0, 0.0, 200, {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize(
    ("status", "body", "delay"),
    [
        (500, {"code": 20500, "message": "Internal Server Error", "more_info": "", "status": 500}, 0.0),
        (404, {"code": 20404, "message": "The requested resource was not found", "more_info": "", "status": 404},
         0.0),
        (200, {"unexpected": "shape", "of": "answer"}, 0.0),
        (200, {"messages": [], "next_page_uri": None}, 1.0),  # no answer within TIMEOUT
    ],
)
def test_a_failed_lookup_is_none_after_one_request(stub_twilio, notification_id, status, body, delay):
    stub_twilio.status, stub_twilio.body, stub_twilio.delay = status, body, delay
    backend = TwilioSmsBackend(options={
        "ACCOUNT_SID": "AC" + "0" * 32, "AUTH_TOKEN": "t", "FROM_NUMBER": "+15005550006",
        "BASE_URL": f"http://127.0.0.1:{stub_twilio.server_address[1]}", "TIMEOUT": 0.3,
    })

    assert backend.find_accepted(sms(notification_id), datetime.now(UTC)) is None

    backend.close()
    assert stub_twilio.requests == 1


def test_twilio_supports_lookup():
    assert TwilioSmsBackend.supports_lookup is True
