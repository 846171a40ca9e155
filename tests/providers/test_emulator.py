"""The emulator's own API: inspection, fault rules, wire-level validation, record file, shutdown."""

from __future__ import annotations

import base64
import json
import time
import urllib.parse

import pytest
import requests

from providers.base import OutboundMessage, TransientProviderError
from providers.sendgrid.backend import SendGridEmailBackend
from providers.twilio.backend import TwilioSmsBackend
from tests.providers.conftest import EmulatorProcess, sendgrid_options, twilio_options

pytestmark = pytest.mark.timeout(30)

TWILIO_PATH = "/2010-04-01/Accounts/AC00000000000000000000000000000000/Messages.json"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def raw(emu, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """(status, headers, decoded JSON or None) of a raw request to the emulator."""
    response = requests.request(method, emu.url + path, data=body, headers=headers, timeout=5)
    return response.status_code, response.headers, response.json() if response.content else None


def sms(notification_id: str, to: str = "+15551230001") -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="sms", to=to, body="hi")


def test_health(emu):
    assert emu.call("GET", "/_emulator/health") == {"status": "ok"}


def test_filters_and_count(emu):
    backend = TwilioSmsBackend(options=twilio_options(emu))
    for i, to in enumerate(["+15550000001", "+15550000002", "+15550000001"]):
        backend.send(sms(f"n{i}", to))
    SendGridEmailBackend(options=sendgrid_options(emu)).send(
        OutboundMessage(notification_id="m1", channel="email", to="a@example.org", title="t", body="b"))

    assert [m["notification_id"] for m in emu.messages(to="+15550000001")] == ["n0", "n2"]
    assert [m["provider"] for m in emu.messages(channel="email")] == ["sendgrid"]
    assert emu.count() == 4
    assert emu.count(provider="twilio") == 3
    assert emu.count(channel="sms", to="+15550000002") == 1
    assert emu.count(notification_id="m1") == 1
    times = [m["received_at_ms"] for m in emu.messages()]
    assert times == sorted(times) and all(isinstance(t, int) for t in times)
    emu.call("DELETE", "/_emulator/messages")
    assert emu.count() == 0
    backend.close()


def test_unknown_filter_is_rejected(emu):
    status, _, _ = raw(emu, "GET", "/_emulator/messages?colour=red")
    assert status == 400


def test_fault_rules_crud(emu):
    first = emu.fault(provider="twilio", status=503, times=2)
    second = emu.fault(provider="fcm", code="UNREGISTERED", to="tok")

    assert first == {"id": first["id"], "provider": "twilio", "to": None, "account": None, "status": 503,
                     "code": None, "latency_ms": 0, "times": 2, "retry_after": None, "rate_limit_per_s": None,
                     "probability": 1.0, "field": None, "smtp_phase": "rcpt", "fired": 0}
    assert [r["id"] for r in emu.call("GET", "/_emulator/faults")] == [first["id"], second["id"]]
    emu.call("DELETE", f"/_emulator/faults/{first['id']}")
    assert [r["id"] for r in emu.call("GET", "/_emulator/faults")] == [second["id"]]
    assert raw(emu, "DELETE", "/_emulator/faults/999999")[0] == 404
    emu.call("DELETE", "/_emulator/faults")
    assert emu.call("GET", "/_emulator/faults") == []


@pytest.mark.parametrize("rule", [{"provider": "mailgun"}, {"status": 99}, {"times": -1}, {"colour": 1}, []])
def test_invalid_fault_rules_are_refused(emu, rule):
    status, _, body = raw(emu, "POST", "/_emulator/faults", json.dumps(rule).encode())
    assert status == 400 and body["error"]


def test_times_limits_a_rule_and_rejections_are_not_recorded(emu):
    emu.fault(provider="twilio", status=503, times=2)
    backend = TwilioSmsBackend(options=twilio_options(emu))
    outcomes = []
    for i in range(3):
        try:
            backend.send(sms(f"n{i}"))
            outcomes.append("ok")
        except TransientProviderError as exc:
            outcomes.append(exc.code)

    assert outcomes == ["503", "503", "ok"]
    assert [m["notification_id"] for m in emu.messages()] == ["n2"]
    assert emu.stats("twilio") == {"requests": 3, "accepted": 1, "rejected": 2, "messages": 1, "list_requests": 0}
    assert emu.call("GET", "/_emulator/faults")[0]["fired"] == 2
    backend.close()


def test_slow_success(emu):
    emu.fault(provider="twilio", latency_ms=300)
    backend = TwilioSmsBackend(options=twilio_options(emu))
    started = time.monotonic()

    backend.send(sms("n1"))

    assert 0.3 <= time.monotonic() - started < 2
    assert emu.count() == 1
    backend.close()


def test_rate_limit_per_second(emu):
    emu.fault(provider="twilio", rate_limit_per_s=3)
    backend = TwilioSmsBackend(options=twilio_options(emu))
    outcomes = []
    for i in range(5):
        try:
            backend.send(sms(f"n{i}"))
            outcomes.append("ok")
        except TransientProviderError as exc:
            outcomes.append((exc.code, exc.retry_after))

    assert outcomes[:3] == ["ok", "ok", "ok"]
    assert outcomes[3:] == [("20429", 1.0), ("20429", 1.0)]
    assert emu.count() == 3
    backend.close()


def test_twilio_requires_basic_auth(emu):
    form = urllib.parse.urlencode({"To": "+15551230001", "From": "+15005550006", "Body": "x"}).encode()
    status, _, body = raw(emu, "POST", TWILIO_PATH, form, FORM)

    assert status == 401
    assert body == {"code": 20003, "message": "Authenticate",
                    "more_info": "https://www.twilio.com/docs/errors/20003", "status": 401}


def test_twilio_success_resource_has_the_documented_keys(emu):
    form = urllib.parse.urlencode({"To": "+15551230001", "From": "+15005550006", "Body": "é" * 71}).encode()
    auth = base64.b64encode(b"AC00000000000000000000000000000000:tok").decode()
    status, _, body = raw(emu, "POST", TWILIO_PATH, form, {**FORM, "Authorization": f"Basic {auth}"})

    assert status == 201
    assert set(body) >= {"sid", "account_sid", "messaging_service_sid", "to", "from", "body", "status",
                         "num_segments", "num_media", "direction", "error_code", "error_message", "price",
                         "price_unit", "api_version", "uri", "subresource_uris", "date_created",
                         "date_updated", "date_sent"}
    assert (body["status"], body["num_segments"]) == ("queued", "1")  # é is in the GSM 03.38 set


def _twilio_auth(account: str = "AC00000000000000000000000000000000") -> dict:
    return {"Authorization": "Basic " + base64.b64encode(f"{account}:tok".encode()).decode()}


def _create_sms(emu, to: str, sender: str, account: str = "AC00000000000000000000000000000000") -> dict:
    form = urllib.parse.urlencode({"To": to, "From": sender, "Body": f"to {to} from {sender}"}).encode()
    status, _, body = raw(emu, "POST", f"/2010-04-01/Accounts/{account}/Messages.json", form,
                          {**FORM, **_twilio_auth(account)})
    assert status == 201
    return body


def _list_sms(emu, account: str = "AC00000000000000000000000000000000", **query) -> tuple[int, dict]:
    path = f"/2010-04-01/Accounts/{account}/Messages.json"
    status, _, body = raw(emu, "GET", path + ("?" + urllib.parse.urlencode(query) if query else ""),
                          headers=_twilio_auth(account))
    return status, body


def test_twilio_message_list_is_newest_first_filtered_and_scoped_to_the_account(emu):
    a, b, f1, f2 = "+15551230001", "+15551230002", "+15005550006", "+15005550007"
    first = _create_sms(emu, a, f1)
    second = _create_sms(emu, b, f1)
    third = _create_sms(emu, a, f2)
    _create_sms(emu, a, f1, account="AC" + "1" * 32)  # another account: never listed for AC00…

    status, page = _list_sms(emu, To=a)

    assert status == 200
    # Each entry is exactly the resource the create answer gave (date_created RFC 2822 included).
    assert page == {
        "messages": [third, first], "page": 0, "page_size": 50, "start": 0, "end": 1,
        "uri": f"{TWILIO_PATH}?To=%2B15551230001&PageSize=50&Page=0",
        "first_page_uri": f"{TWILIO_PATH}?To=%2B15551230001&PageSize=50&Page=0",
        "next_page_uri": None, "previous_page_uri": None,
    }
    assert [m["sid"] for m in _list_sms(emu, To=a, From=f1)[1]["messages"]] == [first["sid"]]
    assert [m["sid"] for m in _list_sms(emu, From=f1)[1]["messages"]] == [second["sid"], first["sid"]]
    assert [m["sid"] for m in _list_sms(emu)[1]["messages"]] == [third["sid"], second["sid"], first["sid"]]
    assert [m["sid"] for m in _list_sms(emu, PageSize=2)[1]["messages"]] == [third["sid"], second["sid"]]
    assert _list_sms(emu, To="+15559999999")[1]["messages"] == []
    assert emu.stats("twilio")["list_requests"] == 6
    # The inspection API shows what the request gave (From), not what only the list needs.
    assert set(emu.messages()[0]) == {"provider", "account", "channel", "to", "title", "body",
                                      "provider_message_id", "notification_id", "received_at_ms", "details"}
    assert [m["details"] for m in emu.messages()] == [
        {"from": f1, "messaging_service_sid": None}, {"from": f1, "messaging_service_sid": None},
        {"from": f2, "messaging_service_sid": None}, {"from": f1, "messaging_service_sid": None}]


@pytest.mark.parametrize("query", [{"DateSent": "2030-01-01"}, {"Page": "1"}, {"PageSize": "0"},
                                   {"PageSize": "1001"}, {"PageSize": "x"}])
def test_twilio_message_list_refuses_what_it_does_not_serve(emu, query):
    status, body = _list_sms(emu, **query)

    assert (status, body["status"], body["code"]) == (400, 400, 20001)


def test_twilio_message_list_requires_basic_auth(emu):
    status, _, body = raw(emu, "GET", TWILIO_PATH)

    assert (status, body["code"]) == (401, 20003)


def test_sendgrid_validates_personalizations(emu):
    payload = {"personalizations": [{"to": [{"email": f"u{i}@example.org"}]} for i in range(1001)],
               "from": {"email": "n@example.com"}, "subject": "s", "content": [{"type": "text/plain", "value": "b"}]}
    status, _, body = raw(emu, "POST", "/v3/mail/send", json.dumps(payload).encode(),
                          {"Authorization": "Bearer SG.x", "Content-Type": "application/json"})

    assert status == 400
    assert body["errors"][0]["field"] == "personalizations"
    assert emu.count() == 0


def test_sendgrid_records_one_message_per_recipient(emu):
    payload = {"personalizations": [{"to": [{"email": "a@example.org"}, {"email": "b@example.org"}],
                                     "custom_args": {"notification_id": "n1"}},
                                    {"to": [{"email": "c@example.org"}], "subject": "own"}],
               "from": {"email": "n@example.com"}, "subject": "s", "custom_args": {"notification_id": "top"},
               "content": [{"type": "text/plain", "value": "b"}]}
    status, headers, _ = raw(emu, "POST", "/v3/mail/send", json.dumps(payload).encode(),
                             {"Authorization": "Bearer SG.x", "Content-Type": "application/json"})

    assert status == 202
    assert [(m["to"], m["title"], m["notification_id"], m["provider_message_id"]) for m in emu.messages()] == [
        ("a@example.org", "s", "n1", headers["X-Message-Id"]),
        ("b@example.org", "s", "n1", headers["X-Message-Id"]),
        ("c@example.org", "own", "top", headers["X-Message-Id"]),
    ]


def test_sendgrid_requires_bearer(emu):
    status, _, body = raw(emu, "POST", "/v3/mail/send", b"{}", {"Content-Type": "application/json"})
    assert status == 401 and body["errors"][0]["message"]


def test_fcm_token_endpoint_checks_the_grant_type(emu):
    bad = urllib.parse.urlencode({"grant_type": "password", "assertion": "a.b.c"}).encode()
    good = urllib.parse.urlencode({"grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                                   "assertion": "a.b.c"}).encode()

    assert raw(emu, "POST", "/token", bad, FORM)[0] == 400
    status, _, body = raw(emu, "POST", "/token", good, FORM)
    assert status == 200
    assert (body["expires_in"], body["token_type"]) == (3599, "Bearer")


def test_fcm_requires_bearer_and_accepts_fid(emu):
    path = "/v1/projects/p1/messages:send"
    message = json.dumps({"message": {"fid": "fid-1", "data": {"notification_id": "n1"}}}).encode()

    status, _, body = raw(emu, "POST", path, message, {"Content-Type": "application/json"})
    assert (status, body["error"]["status"]) == (401, "UNAUTHENTICATED")
    status, _, body = raw(emu, "POST", path, message, {"Authorization": "Bearer t", "Content-Type": "application/json"})
    assert status == 200 and body["name"].startswith("projects/p1/messages/")
    assert [(m["to"], m["notification_id"]) for m in emu.messages()] == [("fid-1", "n1")]


def test_fcm_fault_body_shape(emu):
    emu.fault(provider="fcm", status=404, code="UNREGISTERED")
    message = json.dumps({"message": {"token": "t1"}}).encode()

    status, _, body = raw(emu, "POST", "/v1/projects/p1/messages:send", message,
                          {"Authorization": "Bearer t", "Content-Type": "application/json"})

    assert status == 404
    assert body == {"error": {"code": 404, "message": "Requested entity was not found.", "status": "NOT_FOUND",
                              "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                                           "errorCode": "UNREGISTERED"}]}}


@pytest.mark.timeout(40)
def test_record_file_survives_a_restart(tmp_path):
    record = tmp_path / "messages.jsonl"
    ids = []
    for i in range(2):
        server = EmulatorProcess(record_file=record).start()
        try:
            backend = TwilioSmsBackend(options=twilio_options(server))
            ids.append(backend.send(sms(f"n{i}")).provider_message_id)
            backend.close()
        finally:
            assert server.stop() == 0  # SIGTERM: clean exit

    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert [(r["notification_id"], r["provider_message_id"]) for r in lines] == [("n0", ids[0]), ("n1", ids[1])]
    assert list(lines[0]) == ["provider", "account", "channel", "to", "title", "body", "provider_message_id",
                              "notification_id", "received_at_ms", "details"]
    assert lines[0]["details"] == {"from": "+15005550006", "messaging_service_sid": None}
    assert lines[0]["account"] == "AC" + "0" * 32
