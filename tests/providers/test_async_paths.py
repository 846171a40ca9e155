"""The async SDK paths (docs/PROVIDERS.md, "Async SDK paths"): the private hooks they rely on, batches
through ``send_each_async`` / ``create_async`` against the emulator, a connection broken after the
request was sent, pooling across batches, and a forked child building its own clients."""

from __future__ import annotations

import contextlib
import http.server
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from providers.base import ContactInvalidError, OutboundMessage, ProviderConfigurationError, SendResult
from providers.fcm.backend import FcmPushBackend
from providers.twilio.backend import TwilioSmsBackend
from tests.providers.conftest import fcm_options, twilio_options

pytestmark = pytest.mark.timeout(60)


def push(i: int, **kw) -> OutboundMessage:
    nid = str(uuid.uuid4())
    fields = {"to": f"dG9rZW4t{i:05d}:APA91bH", "title": "Sale", "body": f"Hello {i}", **kw}
    return OutboundMessage(notification_id=nid, channel="push", collapse_key=nid, **fields)


def sms(i: int, **kw) -> OutboundMessage:
    return OutboundMessage(notification_id=str(uuid.uuid4()), channel="sms", **{"to": f"+1555100{i:04d}",
                                                                                 "body": f"code {i}", **kw})


# --- the private firebase-admin hooks (providers/fcm/sdk_hooks.py) -----------------------------------


def test_the_async_client_hooks_still_exist_and_nothing_retries(emu):
    """Fails if firebase-admin drops ``_async_client``/``_fcm_url``, or if the client
    ``send_each_async`` uses were still the SDK's retrying one (``HttpxRetryTransport`` re-sends 500/503)."""
    from firebase_admin import _http_client, messaging

    from providers.fcm.async_client import PooledFcmClient

    assert hasattr(_http_client, "HttpxAsyncClient")  # what we replace: still how the SDK builds it
    backend = FcmPushBackend(options=fcm_options(emu))
    backend.open()
    try:
        service = messaging._get_messaging_service(backend._app)
        client = service._async_client
        assert isinstance(client, PooledFcmClient)
        assert not isinstance(client, _http_client.HttpxAsyncClient)
        assert service._fcm_url == f"{emu.url}/v1/projects/emulator-project/messages:send"
        assert backend.send(push(0)).provider_message_id.startswith("projects/")
        assert type(client.session).__name__ == "ClientSession"  # aiohttp, no retry wrapper
    finally:
        backend.close()
    assert client.closed and client.session.closed
    assert emu.stats("fcm")["requests"] == 1


@pytest.mark.parametrize("hook", ["install_async_client", "redirect_fcm"])
def test_a_vanished_hook_fails_loudly(monkeypatch, hook):
    from firebase_admin import messaging

    from providers.fcm import sdk_hooks

    monkeypatch.setattr(messaging, "_get_messaging_service", lambda app: object())

    with pytest.raises(ProviderConfigurationError) as err:
        getattr(sdk_hooks, hook)(None, "x")

    assert err.value.code == "sdk_hook_missing"


# --- batches ------------------------------------------------------------------------------------------


def test_fcm_batch_of_600_is_two_calls_with_each_outcome_in_input_order(fcm, emu):
    messages = [push(i) for i in range(600)]
    emu.fault(provider="fcm", to=messages[42].to, code="UNREGISTERED")
    emu.fault(provider="fcm", to=messages[555].to, status=503, retry_after=30)

    results = fcm.send_batch(messages, concurrency=50)

    assert [i for i, r in enumerate(results) if not isinstance(r, SendResult)] == [42, 555]
    assert isinstance(results[42], ContactInvalidError) and results[42].reason == "unregistered_token"
    assert (results[555].code, results[555].retry_after) == ("UNAVAILABLE", 30.0)
    assert emu.stats("fcm")["requests"] == 600  # one request per message, none re-sent
    recorded = {m["notification_id"]: m["provider_message_id"] for m in emu.messages()}
    assert recorded == {m.notification_id: r.provider_message_id for m, r in zip(messages, results, strict=True)
                        if isinstance(r, SendResult)}


def test_fcm_message_the_sdk_cannot_encode_fails_alone(fcm, emu):
    messages = [push(0), push(1, ttl_seconds=-5), push(2)]  # a negative TTL: the SDK's ValueError

    results = fcm.send_batch(messages, concurrency=3)

    assert [type(r).__name__ for r in results] == ["SendResult", "PermanentProviderError", "SendResult"]
    assert results[1].code == "invalid_message"
    assert sorted(m["notification_id"] for m in emu.messages()) == sorted(
        [messages[0].notification_id, messages[2].notification_id])


def test_twilio_batch_reuses_one_pooled_session_and_never_retries(emu):
    twilio = TwilioSmsBackend(options=twilio_options(emu, TIMEOUT=10))  # a busy machine is no failure here
    try:
        first = twilio.send_batch([sms(i) for i in range(30)], concurrency=10)
        session = twilio._async_http.session
        rule = emu.fault(provider="twilio", status=503)
        second = twilio.send_batch([sms(i) for i in range(30, 40)], concurrency=10)
        same_session = twilio._async_http.session is session and not session.closed
    finally:
        twilio.close()

    assert [r for r in first if not isinstance(r, SendResult)] == []
    assert [(r.code, r.http_status) for r in second] == [("503", 503)] * 10
    assert same_session
    assert type(session).__name__ == "ClientSession"  # not aiohttp-retry's RetryClient
    assert emu.fired(rule) == 10
    assert emu.count() == 30


def test_a_configuration_error_is_every_messages_answer(emu):
    backend = TwilioSmsBackend(options={"ACCOUNT_SID": "AC1", "AUTH_TOKEN": "t"})

    results = backend.send_batch([sms(0), sms(1)], concurrency=2)

    assert [type(r) for r in results] == [ProviderConfigurationError] * 2


# --- a connection broken after the request was sent ---------------------------------------------------


@pytest.fixture
def hang_up_server():
    """Reads each request's first bytes, then closes the connection without an answer."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    conn.recv(65536)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(2)
    listener.close()


def test_twilio_connection_closed_after_the_request_is_connection_lost(emu, hang_up_server):
    backend = TwilioSmsBackend(options=twilio_options(emu, BASE_URL=hang_up_server))
    try:
        [result] = backend.send_batch([sms(0)])
    finally:
        backend.close()

    assert (type(result).__name__, result.code) == ("TransientProviderError", "connection_lost")


def test_fcm_connection_closed_after_the_request_is_connection_lost(emu, fcm, hang_up_server):
    # The token comes from the emulator; only the push endpoint hangs up.
    backend = FcmPushBackend(options=fcm_options(emu, FCM_URL=hang_up_server + "/v1/projects/{0}/messages:send"))
    try:
        [result] = backend.send_batch([push(0)])
    finally:
        backend.close()

    assert (type(result).__name__, result.code) == ("TransientProviderError", "connection_lost")


# --- fork: a child never uses the parent's loop, sessions or sockets -----------------------------------


def _child_sends(backend, message, pipe):
    try:
        [result] = backend.send_batch([message])
        pipe.send(type(result).__name__ if isinstance(result, SendResult) else repr(result))
    except BaseException as exc:  # reported to the parent, which asserts on it
        pipe.send(repr(exc))


def fork_scenario(kind: str, options: dict) -> dict:
    """A parent whose loop and pooled client exist forks; the child sends through the same backend
    object (so it must build its own client and loop), then the parent sends again. Run in a fresh
    interpreter (see the test): forking the pytest process itself, with the suite's other threads in
    it (heartbeats, other loops, servers), can deadlock the child on a lock one of them held, which
    is not the situation of a Celery prefork parent (it never sends)."""
    backend = TwilioSmsBackend(options=options) if kind == "twilio" else FcmPushBackend(options=options)
    make = sms if kind == "twilio" else push
    parent_before = backend.send_batch([make(0)])  # the parent's loop and pooled client exist now
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child_sends, args=(backend, make(1), sender))
    child.start()
    child.join(60)
    parent_after = backend.send_batch([make(2)])
    backend.close()
    return {"child": [child.exitcode, receiver.recv() if receiver.poll(1) else "no answer"],
            "parent": [r if isinstance(r, Exception) else "ok" for r in parent_before + parent_after]}


@pytest.mark.parametrize("kind", ["twilio", "fcm"])
def test_a_forked_child_builds_its_own_client_and_the_parents_keeps_working(emu, kind):
    options = (twilio_options if kind == "twilio" else fcm_options)(emu, TIMEOUT=10)  # busy machine: no failure
    code = ("import json, sys, django; django.setup(); "
            "from tests.providers.test_async_paths import fork_scenario; "
            "print(json.dumps(fork_scenario(sys.argv[1], json.loads(sys.argv[2]))))")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "config.test_settings")}
    done = subprocess.run([sys.executable, "-c", code, kind, json.dumps(options)], capture_output=True, text=True,
                          timeout=120, env=env, cwd=str(Path(__file__).resolve().parents[2]))

    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"child": [0, "SendResult"], "parent": ["ok", "ok"]}
    assert emu.count() == 3


# --- bounded concurrency: never more requests in flight than asked for --------------------------------


class _CountingHandler(http.server.BaseHTTPRequestHandler):
    """Answers every POST after 0.3 s with a minimal Twilio Message or FCM name, counting how many
    requests are open at once."""

    protocol_version = "HTTP/1.1"

    def do_POST(self):
        server = self.server
        with server.lock:
            server.open_now += 1
            server.most = max(server.most, server.open_now)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(0.3)
        with server.lock:
            server.open_now -= 1
            server.served += 1
            n = server.served
        body = json.dumps({"sid": f"SM{n:032d}", "status": "queued", "name": f"projects/p/messages/{n}"}).encode()
        self.send_response(201 if "Messages.json" in self.path else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def counting_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _CountingHandler)
    server.daemon_threads = True
    server.lock, server.open_now, server.most, server.served = threading.Lock(), 0, 0, 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("kind", ["twilio", "fcm"])
def test_no_more_requests_in_flight_than_the_concurrency(emu, counting_server, kind):
    url = f"http://127.0.0.1:{counting_server.server_address[1]}"
    if kind == "twilio":
        backend, messages = TwilioSmsBackend(options=twilio_options(emu, BASE_URL=url)), [sms(i) for i in range(24)]
    else:
        backend = FcmPushBackend(options=fcm_options(emu, FCM_URL=url + "/v1/projects/{0}/messages:send"))
        messages = [push(i) for i in range(24)]
    try:
        results = backend.send_batch(messages, concurrency=4)
    finally:
        backend.close()

    assert all(isinstance(r, SendResult) for r in results)
    assert counting_server.served == 24
    assert counting_server.most == 4  # 24 requests of 0.3 s each: the gate, not luck, keeps it at 4
