"""Delivery receipts the emulator sends back: signed Twilio status callbacks and SendGrid Event Webhooks.

The real backends send through the emulator; a small HTTP receiver on 127.0.0.1 (in a thread)
records what comes back, and the signatures are checked with the providers' own SDK helpers.
"""

from __future__ import annotations

import base64
import itertools
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
import requests
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from sendgrid.helpers.eventwebhook import EventWebhook
from twilio.request_validator import RequestValidator

from providers.base import OutboundMessage
from providers.emulator.webhooks import is_loopback_url
from providers.sendgrid.backend import SendGridEmailBackend
from providers.twilio.backend import TwilioSmsBackend
from tests.providers.conftest import EmulatorProcess, sendgrid_options, twilio_options

pytestmark = pytest.mark.timeout(30)

TOKEN = "emulator-auth-token"  # what twilio_options() authenticates with
TWILIO_KEYS = {"MessageSid", "SmsSid", "MessageStatus", "SmsStatus", "AccountSid", "From", "To", "ApiVersion"}
SENDGRID_KEYS = {"email", "event", "timestamp", "sg_event_id", "sg_message_id", "smtp-id", "notification_id"}
EVENTS_PATH = "/sendgrid/events"


@dataclass
class Hit:
    url: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    @property
    def form(self) -> dict[str, str]:
        return dict(parse_qsl(self.body.decode("utf-8"), keep_blank_values=True))

    @property
    def events(self) -> list[dict[str, Any]]:
        return json.loads(self.body)


class Receiver:
    """A threaded HTTP server recording every POST; ``respond(hit) -> status`` decides the answer."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.hits: list[Hit] = []
        self.respond: Callable[[Hit], int] = lambda hit: 200
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hit = Hit(receiver.base + self.path, urlsplit(self.path).path, dict(self.headers), body,
                          time.monotonic())
                with receiver._lock:
                    receiver.hits.append(hit)
                status = receiver.respond(hit)
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.base = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def received(self, path: str) -> list[Hit]:
        with self._lock:
            return [h for h in self.hits if h.path == path]

    def events_of(self, notification_id: str) -> list[dict[str, Any]]:
        return [e for h in self.received(EVENTS_PATH) for e in h.events if e.get("notification_id") == notification_id]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def signing_key(tmp_path_factory):
    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path_factory.mktemp("keys") / "sendgrid-events.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    return key, path


@pytest.fixture(scope="module")
def wh_server(receiver, signing_key):
    server = EmulatorProcess(env={"EMULATOR_SENDGRID_EVENTS_URL": receiver.base + EVENTS_PATH,
                                  "EMULATOR_SENDGRID_SIGNING_KEY_FILE": str(signing_key[1])}).start()
    yield server
    assert server.stop() == 0


@pytest.fixture
def wh(wh_server, receiver):
    """The webhook-sending emulator, reset; the receiver answers 200 unless a test says otherwise."""
    wh_server.reset()
    receiver.respond = lambda hit: 200
    yield wh_server
    receiver.respond = lambda hit: 200


def wait_until(predicate: Callable[[], Any], timeout: float = 8.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not reached in time")


def settle(emu: EmulatorProcess) -> None:
    """Wait until the emulator has no webhook delivery in progress."""
    wait_until(lambda: emu.call("GET", "/_emulator/webhooks/stats")["pending"] == 0)


def send_sms(emu: EmulatorProcess, receiver: Receiver, to: str = "+15551230001") -> tuple[str, str, str]:
    """Send one SMS with the real backend; returns (notification id, message sid, callback path)."""
    path = f"/twilio/{uuid.uuid4().hex}"
    nid = str(uuid.uuid4())
    backend = TwilioSmsBackend(options=twilio_options(emu, STATUS_CALLBACK_URL=receiver.base + path))
    try:
        result = backend.send(OutboundMessage(notification_id=nid, channel="sms", to=to, body="hi"))
    finally:
        backend.close()
    return nid, result.provider_message_id, path


def send_email(emu: EmulatorProcess, to: str = "user@example.org") -> tuple[str, str]:
    """Send one email with the real backend; returns (notification id, X-Message-Id)."""
    nid = str(uuid.uuid4())
    result = SendGridEmailBackend(options=sendgrid_options(emu)).send(
        OutboundMessage(notification_id=nid, channel="email", to=to, title="t", body="b"))
    return nid, result.provider_message_id


def receipt(emu: EmulatorProcess, **rule: Any) -> dict:
    return emu.call("POST", "/_emulator/receipts", rule)


def public_key(emu: EmulatorProcess) -> str:
    return emu.call("GET", "/_emulator/sendgrid/public-key")["public_key"]


def test_twilio_sent_then_delivered_with_a_valid_signature(wh, receiver):
    nid, sid, path = send_sms(wh, receiver)
    settle(wh)

    hits = receiver.received(path)
    assert [h.form["MessageStatus"] for h in hits] == ["sent", "delivered"]
    first = hits[0]
    assert first.url == f"{receiver.base}{path}?nid={nid}"
    assert first.headers["Content-Type"] == "application/x-www-form-urlencoded"
    assert first.form == {"MessageSid": sid, "SmsSid": sid, "MessageStatus": "sent", "SmsStatus": "sent",
                          "AccountSid": "AC" + "0" * 32, "From": "+15005550006", "To": "+15551230001",
                          "ApiVersion": "2010-04-01"}
    validator = RequestValidator(TOKEN)
    for hit in hits:
        assert set(hit.form) == TWILIO_KEYS
        assert validator.validate(hit.url, hit.form, hit.headers["X-Twilio-Signature"])
    tampered = {**first.form, "MessageStatus": "delivered"}
    assert not validator.validate(first.url, tampered, first.headers["X-Twilio-Signature"])
    assert not RequestValidator("other-token").validate(first.url, first.form, first.headers["X-Twilio-Signature"])

    records = wh.call("GET", "/_emulator/webhooks", notification_id=nid)
    assert [(r["provider"], r["kind"], r["status_code"], r["attempt"], r["url"]) for r in records] == [
        ("twilio", "sent", 200, 1, first.url), ("twilio", "delivered", 200, 1, first.url)]
    assert all(isinstance(r["sent_at_ms"], int) and r["notification_id"] == nid for r in records)


def test_twilio_callback_url_is_used_byte_for_byte(wh, receiver):
    path = f"/twilio/{uuid.uuid4().hex}"
    backend = TwilioSmsBackend(options=twilio_options(wh, STATUS_CALLBACK_URL=f"{receiver.base}{path}?tag=a%2Fb~c"))
    backend.send(OutboundMessage(notification_id="n-1", channel="sms", to="+15551230001", body="x"))
    backend.close()
    settle(wh)

    hits = receiver.received(path)
    assert [h.url for h in hits] == [f"{receiver.base}{path}?tag=a%2Fb~c&nid=n-1"] * 2
    assert all(RequestValidator(TOKEN).validate(h.url, h.form, h.headers["X-Twilio-Signature"]) for h in hits)


def test_sendgrid_processed_then_delivered_signed_and_correlated(wh, receiver, signing_key):
    key = public_key(wh)
    expected = base64.b64encode(signing_key[0].public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)).decode()
    assert key == expected  # EMULATOR_SENDGRID_SIGNING_KEY_FILE is used

    nid, message_id = send_email(wh)
    settle(wh)

    events = receiver.events_of(nid)
    assert [e["event"] for e in events] == ["processed", "delivered"]
    assert set(events[0]) == SENDGRID_KEYS
    assert set(events[1]) == SENDGRID_KEYS | {"response"}
    assert all(e["email"] == "user@example.org" and isinstance(e["timestamp"], int) for e in events)
    assert all(e["sg_message_id"].startswith(message_id + ".filter0001") for e in events)
    assert events[0]["smtp-id"] == events[1]["smtp-id"]
    assert len({e["sg_event_id"] for e in events}) == 2

    verifier = EventWebhook(key)
    hits = [h for h in receiver.received(EVENTS_PATH) if any(e.get("notification_id") == nid for e in h.events)]
    assert len(hits) == 2
    for hit in hits:
        assert hit.headers["Content-Type"] == "application/json"
        sig = hit.headers["X-Twilio-Email-Event-Webhook-Signature"]
        ts = hit.headers["X-Twilio-Email-Event-Webhook-Timestamp"]
        assert verifier.verify_signature(hit.body.decode(), sig, ts)
        assert not verifier.verify_signature(hit.body.decode().replace("user@", "usr@"), sig, ts)
        assert not verifier.verify_signature(hit.body.decode(), sig, str(int(ts) + 1))
    kinds = [(r["kind"], r["status_code"]) for r in wh.call("GET", "/_emulator/webhooks", provider="sendgrid")]
    assert kinds == [("processed", 200), ("delivered", 200)]


def test_sendgrid_batches_a_request_and_merges_custom_args(wh, receiver):
    payload = {"personalizations": [{"to": [{"email": "a@example.org"}, {"email": "b@example.org"}],
                                     "custom_args": {"notification_id": "n-ab"}},
                                    {"to": [{"email": "c@example.org"}]}],
               "from": {"email": "n@example.com"}, "subject": "s", "categories": ["digest"],
               "custom_args": {"notification_id": "n-c", "campaign": "spring"},
               "content": [{"type": "text/plain", "value": "b"}]}
    response = requests.post(wh.url + "/v3/mail/send", json=payload, headers={"Authorization": "Bearer SG.x"},
                             timeout=5)
    assert response.status_code == 202
    settle(wh)

    message_id = response.headers["X-Message-Id"]
    hits = [h for h in receiver.received(EVENTS_PATH) if h.events[0]["sg_message_id"].startswith(message_id)]
    # Events due in the same event-loop step share a POST; how they group depends on timing (a loaded
    # machine splits them), so check the events and each recipient's order, not the grouping.
    events = [(e["event"], e["email"]) for h in hits for e in h.events]
    assert sorted(events) == sorted((kind, f"{who}@example.org") for kind in ("processed", "delivered")
                                    for who in "abc")
    for who in "abc":
        mine = [kind for kind, email in events if email == f"{who}@example.org"]
        assert mine == ["processed", "delivered"]
    assert all(len(h.events) <= 100 for h in hits)
    first = sorted((e for h in hits for e in h.events if e["event"] == "processed"), key=lambda e: e["email"])
    assert [(e["notification_id"], e["campaign"], e["category"]) for e in first] == [
        ("n-ab", "spring", "digest"), ("n-ab", "spring", "digest"), ("n-c", "spring", "digest")]
    assert [e["sg_message_id"].rsplit(".", 1)[1] for e in first] == ["0", "1", "2"]


def test_twilio_undelivered_with_error_code_applies_times(wh, receiver):
    rule = receipt(wh, provider="twilio", to="+15551230002", outcome="undelivered", error_code=30006, times=1)
    assert rule["id"] and rule["fired"] == 0

    _, _, failing = send_sms(wh, receiver, to="+15551230002")
    _, _, later = send_sms(wh, receiver, to="+15551230002")
    settle(wh)

    hits = receiver.received(failing)
    assert [(h.form["MessageStatus"], h.form["SmsStatus"], h.form.get("ErrorCode")) for h in hits] == [
        ("sent", "sent", None), ("undelivered", "undelivered", "30006")]
    assert set(hits[1].form) == TWILIO_KEYS | {"ErrorCode"}
    assert RequestValidator(TOKEN).validate(hits[1].url, hits[1].form, hits[1].headers["X-Twilio-Signature"])
    assert [h.form["MessageStatus"] for h in receiver.received(later)] == ["sent", "delivered"]
    assert wh.call("GET", "/_emulator/receipts")[0]["fired"] == 1


@pytest.mark.parametrize(("rule", "extras"), [
    ({"outcome": "bounce", "bounce_type": "bounce"}, {"type": "bounce", "status": "5.1.1"}),
    ({"outcome": "bounce", "bounce_type": "blocked"}, {"type": "blocked", "status": "5.7.1"}),
    ({"outcome": "dropped", "reason": "Unsubscribed Address"}, {"reason": "Unsubscribed Address"}),
])
def test_sendgrid_failure_outcomes(wh, receiver, rule, extras):
    receipt(wh, provider="sendgrid", to="bad@example.org", **rule)
    nid, _ = send_email(wh, to="bad@example.org")
    settle(wh)

    events = receiver.events_of(nid)
    assert [e["event"] for e in events] == ["processed", rule["outcome"]]
    assert events[1].items() >= extras.items()
    assert events[1]["reason"]
    assert set(events[1]) == SENDGRID_KEYS | ({"reason", "status", "type"} if rule["outcome"] == "bounce"
                                             else {"reason"})


def test_duplicates_send_identical_copies(wh, receiver):
    receipt(wh, provider="*", duplicates=2)
    _, _, path = send_sms(wh, receiver)
    nid, _ = send_email(wh)
    settle(wh)

    hits = receiver.received(path)
    assert [h.form["MessageStatus"] for h in hits] == ["sent"] * 3 + ["delivered"] * 3
    assert len({(h.body, h.headers["X-Twilio-Signature"]) for h in hits[:3]}) == 1
    events = receiver.events_of(nid)
    assert [e["event"] for e in events] == ["processed"] * 3 + ["delivered"] * 3
    assert len({e["sg_event_id"] for e in events[:3]}) == 1
    assert len({e["sg_event_id"] for e in events}) == 2


def test_reorder_sends_the_final_status_first(wh, receiver):
    receipt(wh, reorder=True)
    _, _, path = send_sms(wh, receiver)
    nid, _ = send_email(wh)
    settle(wh)

    assert [h.form["MessageStatus"] for h in receiver.received(path)] == ["delivered", "sent"]
    assert [e["event"] for e in receiver.events_of(nid)] == ["delivered", "processed"]


def test_outcome_none_sends_nothing(wh, receiver):
    receipt(wh, outcome="none")
    _, _, path = send_sms(wh, receiver)
    nid, _ = send_email(wh)
    time.sleep(0.3)

    assert receiver.received(path) == [] and receiver.events_of(nid) == []
    assert wh.call("GET", "/_emulator/webhooks") == []


def test_handlers_do_not_wait_for_webhooks(wh, receiver):
    receipt(wh, delay_ms=0)
    receiver.respond = lambda hit: time.sleep(0.8) or 200
    started = time.monotonic()
    _, _, path = send_sms(wh, receiver)
    send_sms(wh, receiver)
    elapsed = time.monotonic() - started

    assert elapsed < 1.2  # waiting for the receiver would take >= 1.6 s (two sends x 0.8 s)
    settle(wh)
    assert [h.form["MessageStatus"] for h in receiver.received(path)] == ["sent", "delivered"]


def test_a_500_is_retried_and_recorded(wh, receiver):
    answers = iter([500])
    receiver.respond = lambda hit: next(answers, 200)
    nid, _, path = send_sms(wh, receiver)
    settle(wh)

    hits = receiver.received(path)
    assert [h.form["MessageStatus"] for h in hits] == ["sent", "sent", "delivered"]
    assert hits[0].body == hits[1].body
    assert hits[1].at - hits[0].at >= 0.45
    records = wh.call("GET", "/_emulator/webhooks", notification_id=nid)
    assert [(r["kind"], r["attempt"], r["status_code"]) for r in records] == [
        ("sent", 1, 500), ("sent", 2, 200), ("delivered", 1, 200)]
    assert records[0]["error"] == "HTTP 500"
    stats = wh.call("GET", "/_emulator/webhooks/stats")
    assert (stats["retries"], stats["dropped"], stats["succeeded"]) == (1, 0, 2)


def test_a_receipt_is_dropped_after_three_retries(wh, receiver):
    receiver.respond = lambda hit: 503 if hit.form.get("MessageStatus") == "sent" else 200
    nid, _, path = send_sms(wh, receiver)
    settle(wh)

    hits = receiver.received(path)
    assert [h.form["MessageStatus"] for h in hits] == ["sent"] * 4 + ["delivered"]
    gaps = [b.at - a.at for a, b in itertools.pairwise(hits[:4])]
    assert all(wait - 0.05 <= gap < wait + 0.3 for gap, wait in zip(gaps, (0.5, 1.0, 2.0), strict=True)), gaps
    records = wh.call("GET", "/_emulator/webhooks", notification_id=nid)
    assert [(r["attempt"], r["status_code"]) for r in records] == [(1, 503), (2, 503), (3, 503), (4, 503), (1, 200)]
    stats = wh.call("GET", "/_emulator/webhooks/stats")
    assert (stats["attempts"], stats["retries"], stats["dropped"], stats["refused"]) == (5, 3, 1, 0)


def test_non_loopback_urls_are_never_contacted(wh, receiver):
    try:
        other = Receiver(host="127.0.0.2")  # reachable, but not an allowed host
    except OSError:
        pytest.skip("cannot bind 127.0.0.2")
    try:
        urls = [other.base + "/cb", "http://127.0.0.1@example.com/cb", "https://notify.example.com/cb"]
        nids = []
        for url in urls:
            backend = TwilioSmsBackend(options=twilio_options(wh, STATUS_CALLBACK_URL=url))
            nids.append(str(uuid.uuid4()))
            backend.send(OutboundMessage(notification_id=nids[-1], channel="sms", to="+15551230001", body="x"))
            backend.close()
        time.sleep(0.3)

        assert other.hits == []
        records = wh.call("GET", "/_emulator/webhooks")
        assert [(r["notification_id"], r["kind"], r["attempt"], r["status_code"], r["error"]) for r in records] == [
            (nid, kind, 0, None, "refused: non-loopback host") for nid in nids for kind in ("sent", "delivered")]
        stats = wh.call("GET", "/_emulator/webhooks/stats")
        assert (stats["refused"], stats["dropped"], stats["attempts"]) == (6, 6, 0)
    finally:
        other.stop()


@pytest.mark.parametrize(("url", "allowed"), [
    ("http://127.0.0.1:8000/x?nid=1", True), ("http://localhost/x", True), ("https://[::1]:9/x", True),
    ("http://127.0.0.2/x", False), ("http://127.0.0.1@example.com/", False), ("http://localhost.example.com/", False),
    ("ftp://127.0.0.1/x", False), ("http://127.0.0.1:99999/", False), ("not a url", False), ("", False),
])
def test_loopback_check(url, allowed):
    assert is_loopback_url(url) is allowed


def test_receipt_rules_crud(wh):
    first = receipt(wh, provider="twilio", outcome="failed")
    second = receipt(wh, provider="sendgrid", to="x@example.org", outcome="bounce", bounce_type="blocked")

    assert first == {"id": first["id"], "provider": "twilio", "to": None, "outcome": "failed", "error_code": None,
                     "bounce_type": None, "reason": None, "delay_ms": 50, "duplicates": 0, "reorder": False,
                     "times": None, "queued_share": 0.0, "fired": 0}
    assert [r["id"] for r in wh.call("GET", "/_emulator/receipts")] == [first["id"], second["id"]]
    wh.call("DELETE", f"/_emulator/receipts/{first['id']}")
    assert [r["id"] for r in wh.call("GET", "/_emulator/receipts")] == [second["id"]]
    wh.call("DELETE", "/_emulator/receipts")
    assert wh.call("GET", "/_emulator/receipts") == []
    assert requests.get(wh.url + "/_emulator/webhooks?colour=red", timeout=5).status_code == 400


@pytest.mark.parametrize("rule", [
    {"provider": "fcm"}, {"provider": "twilio", "outcome": "bounce"}, {"outcome": "bounce"},
    {"provider": "sendgrid", "outcome": "delivered", "error_code": 30003},
    {"provider": "sendgrid", "outcome": "bounce", "bounce_type": "soft"}, {"duplicates": -1},
    {"delay_ms": "50"}, {"reorder": "yes"}, {"colour": 1}, [],
])
def test_invalid_receipt_rules_are_refused(wh, rule):
    response = requests.post(wh.url + "/_emulator/receipts", json=rule, timeout=5)
    assert response.status_code == 400 and response.json()["error"]


def test_receipts_can_be_turned_off(receiver):
    server = EmulatorProcess(env={"EMULATOR_RECEIPTS": "0",
                                  "EMULATOR_SENDGRID_EVENTS_URL": receiver.base + EVENTS_PATH}).start()
    try:
        _, _, path = send_sms(server, receiver)
        nid, _ = send_email(server)
        time.sleep(0.3)

        assert receiver.received(path) == [] and receiver.events_of(nid) == []
        stats = server.call("GET", "/_emulator/webhooks/stats")
        assert (stats["enabled"], stats["attempts"]) == (False, 0)
        EventWebhook(public_key(server))  # a generated key, in the format EventWebhook takes
    finally:
        assert server.stop() == 0


def test_queued_share_sends_queued_first_for_that_share_and_stats_count_events_by_kind(wh, receiver):
    """``bench --receipts``: Twilio posts ``queued`` first for some messages (half here: every
    second one), each signed; the stats count every event answered 2xx by provider and kind."""
    receipt(wh, provider="twilio", queued_share=0.5)
    paths = [send_sms(wh, receiver, to=f"+1555123{i:04d}")[2] for i in range(4)]
    nid, _ = send_email(wh)
    settle(wh)

    statuses = [[h.form["MessageStatus"] for h in receiver.received(path)] for path in paths]
    assert statuses == [["sent", "delivered"], ["queued", "sent", "delivered"]] * 2
    for path in paths:
        for hit in receiver.received(path):
            assert RequestValidator(TOKEN).validate(hit.url, hit.form, hit.headers["X-Twilio-Signature"])
    assert [e["event"] for e in receiver.events_of(nid)] == ["processed", "delivered"]
    stats = wh.call("GET", "/_emulator/webhooks/stats")
    assert stats["events_delivered"] == {"twilio:queued": 2, "twilio:sent": 4, "twilio:delivered": 4,
                                         "sendgrid:processed": 1, "sendgrid:delivered": 1}
    assert stats["events_dropped"] == {}


@pytest.mark.parametrize("rule", [{"provider": "twilio", "queued_share": 1.5},
                                  {"provider": "twilio", "queued_share": "half"},
                                  {"provider": "sendgrid", "queued_share": 0.5}])
def test_a_queued_share_out_of_range_or_not_for_twilio_is_refused(wh, rule):
    r = requests.post(f"{wh.url}/_emulator/receipts", json=rule, timeout=5)
    assert r.status_code == 400 and "queued_share" in r.text
