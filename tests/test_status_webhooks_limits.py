"""Status webhooks against hostile or odd endpoints (docs/WEBHOOKS.md, "Delivery" and "Safety"): an
answer dripped a byte at a time is cut at the request's timeout and the endpoint never has two runs;
a run's lease is released by its owner only; ``Retry-After`` values that would mean "now"; IPv6
forms embedding a private IPv4, legacy IPv4 spellings and control characters in a URL; the key of a
typed single send in its ``event.*``. Real local servers, the real database."""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from django.db import connection

from core import clock
from notifications.webhooks import delivery, endpoints, safety, transport
from notifications.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from preferences.models import Recipient
from tests.conftest import make_client
from tests.test_status_webhooks import ORDER, ORDER_TEMPLATES, deliveries_for, http_for, mark_sent, post
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_subscriptions")]


@pytest.fixture
def insecure(settings):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_INSECURE": True}


@pytest.fixture
def production(settings):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_INSECURE": False}


class Dripping:
    """A receiver that answers one byte every ``every`` seconds, so no single read ever waits long:
    ``body``: status and headers at once, then a 100-byte body; ``headers``: the status line, then
    an endless header; ``tls``: a TLS record header announcing 16 KB, then its bytes (a handshake)."""

    def __init__(self, phase: str, every: float = 0.2) -> None:
        self.phase, self.every = phase, every
        self.requests = 0
        self.stopped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.phase == 'tls' else 'http'}://127.0.0.1:{self.port}/hooks"

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            self.requests += 1
            head = {"body": b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
                    "headers": b"HTTP/1.1 200 OK\r\nX-Slow: ", "tls": b"\x16\x03\x03\x3f\xff"}[self.phase]
            try:
                conn.sendall(head)
                for _ in range(100):
                    if self.stopped.wait(self.every):
                        return
                    conn.sendall(b"x")
            except OSError:
                return  # the client cut the connection

    def __enter__(self) -> Dripping:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join()
        self.listener.close()


def fast_limits(settings, timeout: float = 1.0, budget: float = 1.0) -> None:
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_INSECURE": True, "TIMEOUT_SECONDS": timeout,
                         "BATCH_BUDGET_SECONDS": budget}


# --- 1. a dripping endpoint: the whole request has one deadline; one run per endpoint ----------------------

@pytest.mark.parametrize("phase", ["body", "headers"])
@pytest.mark.django_db(transaction=True)
def test_a_dripping_answer_is_cut_at_the_timeout_and_no_second_run_starts_meanwhile(settings, phase):
    """Before: urllib3's timeout bounds each read, so a 100-byte body at 5 bytes/s held the run 20 s,
    its lease (budget + timeout + 5 s) ran out and a second run posted the same delivery."""
    fast_limits(settings)
    client, _ = make_client()
    with Dripping(phase) as server:
        endpoint = endpoints.create(client, server.url, ["notification.sent"])
        [one] = deliveries_for(endpoint)
        result = {}

        def run():
            try:
                result["run"] = delivery.deliver_endpoint(endpoint.pk)
            finally:
                connection.close()

        first = threading.Thread(target=run)
        first.start()
        while server.requests == 0 and first.is_alive():
            time.sleep(0.02)  # the first run has the endpoint and posts
        others = []
        while first.is_alive() and len(others) < 150:  # polls for at most ~30 s
            others.append((delivery.dispatch(), delivery.deliver_endpoint(endpoint.pk)))
            time.sleep(0.2)
        first.join()
        assert server.requests == 1
    # While the first run held the endpoint nobody took it; a poll that raced its release found nothing due.
    idle = (0, {"taken": True, "delivered": 0, "failed": 0, "retrying": 0})
    assert others[:-1] == [(0, {"taken": False})] * (len(others) - 1) and others[-1] in ((0, {"taken": False}), idle)
    assert result["run"] == {"taken": True, "delivered": 0, "failed": 0, "retrying": 1}
    [attempt] = WebhookAttempt.objects.filter(delivery=one)
    assert (attempt.number, attempt.http_status, attempt.error) == (1, None, "timed out after 1 s")
    assert 1000 <= attempt.latency_ms < 3000  # the timeout, not the 20 s the answer would take
    endpoint.refresh_from_db()
    assert (endpoint.busy_until, endpoint.lease) == (None, None)


def test_a_dripped_tls_handshake_is_cut_at_the_timeout(insecure):
    with Dripping("tls") as server:
        conn = transport.Connection(server.url, 1.0)
        answer = conn.post(b"{}", {})
        conn.close()
    assert (answer.status, answer.error) == (None, "timed out after 1 s")
    assert 1000 <= answer.latency_ms < 3000


def test_another_endpoints_delivery_waits_at_most_the_slow_ones_budget_and_timeout(settings):
    """One worker thread runs the dripping endpoint's run, then another client's: that one is
    delivered within budget + timeout (+ slack for the run's own writes), not after the drip."""
    fast_limits(settings)
    slow_client, _ = make_client()
    fast_client, _ = make_client()
    with Dripping("body") as server, Receiver() as receiver:
        slow = endpoints.create(slow_client, server.url, ["notification.sent"])
        fast = endpoints.create(fast_client, receiver.url, ["notification.sent"])
        deliveries_for(slow, 3)
        [theirs] = deliveries_for(fast)
        started = clock.now()
        for endpoint in (slow, fast):
            delivery.deliver_endpoint(endpoint.pk)
    theirs.refresh_from_db()
    assert theirs.state == "delivered" and len(receiver.requests) == 1
    assert (theirs.delivered_at - started).total_seconds() < 1.0 + 1.0 + 2.0
    assert server.requests == 1  # the slow endpoint's rest waits for its next run


@pytest.mark.django_db(transaction=True)
def test_a_run_whose_lease_ran_out_does_not_release_the_run_that_took_over(settings, monkeypatch):
    """Run A's lease runs out while it posts (forced here); run B takes the endpoint; A ends while B
    still posts: A's end must leave B's lease in place (before: A cleared ``busy_until``)."""
    fast_limits(settings)
    client, _ = make_client()
    with Dripping("body") as server:
        endpoint = endpoints.create(client, server.url, ["notification.sent"])
        deliveries_for(endpoint)
        a = threading.Thread(target=lambda: (delivery.deliver_endpoint(endpoint.pk), connection.close()))
        seen = {}
        real_post = transport.Connection.post

        def post_as_b(self, body, headers):
            if threading.current_thread() is a:
                return real_post(self, body, headers)
            a.join()  # B is still posting when A ends
            seen["busy_until"] = WebhookEndpoint.objects.get(pk=endpoint.pk).busy_until
            return transport.Answer(200, 1)

        monkeypatch.setattr(transport.Connection, "post", post_as_b)
        a.start()
        while server.requests == 0:
            time.sleep(0.05)
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(busy_until=clock.now() - timedelta(seconds=1))
        assert delivery.deliver_endpoint(endpoint.pk)["taken"] is True  # B
    assert seen["busy_until"] is not None and seen["busy_until"] > clock.now()
    endpoint.refresh_from_db()
    assert (endpoint.busy_until, endpoint.lease) == (None, None)  # B released its own


# --- 2. Retry-After ------------------------------------------------------------------------------------

NOW = datetime(2026, 12, 4, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize("value, attempt, seconds", [
    ("0", 1, 5.0), ("-30", 2, 10.0), ("NaN", 1, 5.0), ("inf", 3, 20.0), ("-inf", 1, 5.0), ("soon", 2, 10.0),
    (format_datetime(NOW - timedelta(minutes=5), usegmt=True), 1, 5.0),  # a past date
    (format_datetime(NOW, usegmt=True), 2, 10.0),                        # now
    ("1", 3, 5.0), ("0.2", 1, 5.0),                                       # small: floored at the base
    ("30", 1, 30.0), (format_datetime(NOW + timedelta(seconds=120), usegmt=True), 1, 120.0),
    ("999999", 1, 3600.0), ("", 4, 40.0)])
def test_retry_after_now_or_past_or_invalid_falls_back_to_the_backoff_and_small_is_floored(value, attempt, seconds):
    assert delivery.retry_delay(attempt, value, NOW) == seconds


def test_a_503_with_retry_after_0_is_not_tried_again_at_the_next_tick(insecure):
    client, _ = make_client()
    with Receiver(lambda n: (503, {"Retry-After": "0"})) as receiver:
        endpoint = endpoints.create(client, receiver.url, ["notification.sent"])
        [one] = deliveries_for(endpoint)
        before = clock.now()
        delivery.deliver_endpoint(endpoint.pk)
        assert delivery.deliver_endpoint(endpoint.pk)["retrying"] == 0  # not due again yet
    one.refresh_from_db()
    assert 5 <= (one.next_attempt_at - before).total_seconds() < 7 and len(receiver.requests) == 1


# --- 3, 4, 5. URLs and addresses -------------------------------------------------------------------------

EMBEDDING_PRIVATE = ["64:ff9b::7f00:1", "64:ff9b::a00:1", "64:ff9b:1::5db8:d822", "2002:7f00:1::1", "2002:a9fe:a9fe::",
                     "::127.0.0.1", "::10.0.0.1", "::ffff:0:127.0.0.1", "::ffff:0:a9fe:a9fe", "2001:0:7f00:1::1",
                     "2001:0:5db8:d822::8000:f5ff:fffe"]


@pytest.mark.parametrize("address", EMBEDDING_PRIVATE)
def test_an_ipv6_address_embedding_a_private_ipv4_is_refused_at_save_and_at_connect(production, monkeypatch,
                                                                                    address):
    _, key = make_client()
    r = post(http_for(key), "/v1/webhook-endpoints", {"url": f"https://[{address}]/hook",
                                                      "events": ["notification.sent"]})
    assert r.status_code == 422, r.content
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [("url", "url_not_allowed")]
    assert WebhookEndpoint.objects.count() == 0
    monkeypatch.setattr(safety, "getaddrinfo", lambda host, port: [address])
    with pytest.raises(safety.Refused):
        safety.resolve("hooks.example.com", 443)


@pytest.mark.parametrize("address", ["64:ff9b::5db8:d822", "2002:5db8:d822::1", "2606:4700:4700::1111"])
def test_an_ipv6_address_embedding_a_public_ipv4_passes(production, monkeypatch, address):
    monkeypatch.setattr(safety, "getaddrinfo", lambda host, port: [address])
    assert safety.resolve("hooks.example.com", 443) == address


@pytest.mark.parametrize("url", ["https://2130706433/hook", "https://0177.0.0.1/hook", "https://127.1/hook",
                                 "https://0x7f.1/hook", "https://0xa.1.2.3/hook", "https://3232235777/hook"])
def test_decimal_octal_hex_and_short_ipv4_hosts_are_refused_at_save(production, url):
    _, key = make_client()
    r = post(http_for(key), "/v1/webhook-endpoints", {"url": url, "events": ["notification.sent"]})
    assert r.status_code == 422, r.content
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [("url", "url_not_allowed")]
    assert "is not a public address" in r.json()["error"]["fields"][0]["message"]
    assert WebhookEndpoint.objects.count() == 0


@pytest.mark.parametrize("url", ["https://hooks.example.com/a\r\nX-Injected: 1", "https://hooks.example.com/a\nb",
                                 "https://hooks.example.com/a\tb", "https://hooks.example.com/a b",
                                 "https://hooks.example.com/a\x01", "https://hooks.example.com/a\x7f",
                                 "https://hooks.example.com/a\x1bb"])
def test_a_url_with_spaces_or_control_characters_is_refused_at_save(production, url):
    _, key = make_client()
    r = post(http_for(key), "/v1/webhook-endpoints", {"url": url, "events": ["notification.sent"]})
    assert r.status_code == 422, r.content
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [("url", "url_not_allowed")]
    assert WebhookEndpoint.objects.count() == 0


def test_a_stored_url_is_the_one_called(insecure):
    """The path the receiver sees is the stored URL's, byte for byte."""
    client, _ = make_client()
    with Receiver() as receiver:
        endpoint = endpoints.create(client, receiver.url + "/orders?x=1", ["notification.sent"])
        deliveries_for(endpoint)
        delivery.deliver_endpoint(endpoint.pk)
    assert [r["path"] for r in receiver.requests] == ["/hooks/orders?x=1"]


# --- 6. a typed single send's event.* carries its key ----------------------------------------------------

def test_a_typed_single_sends_event_outcome_carries_the_sends_idempotency_key():
    from notifications.events import services as event_services
    from notifications.models import Notification, Status

    client, _ = make_client()
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["event.reached"])
    kind, _ = event_services.save_type(f"order-{uuid.uuid4().hex[:6]}", ORDER, ORDER_TEMPLATES, client=client)
    user = Recipient.objects.create(user_id=f"u-{uuid.uuid4().hex[:6]}", phone="+4915112345678")
    key = f"typed-{uuid.uuid4().hex[:6]}"
    accepted = event_services.accept_event(client=client, idempotency_key=key, fingerprint="f", kind=kind,
                                           recipients=[user], data={"id": 7}, channel="sms")
    Notification.objects.filter(event=accepted.event).update(status=Status.SENDING, claims=1)
    mark_sent(list(Notification.objects.filter(event=accepted.event)))
    [told] = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert (told.event_type, told.payload["data"]["idempotency_key"]) == ("event.reached", key)
    assert json.loads(json.dumps(told.payload))["data"]["user_id"] == user.user_id


def test_a_slow_resolver_ends_the_attempt_at_its_deadline_as_a_timeout_retried_later(production, settings,
                                                                                     monkeypatch):
    """The name is resolved inside the request's deadline: a resolver that answers after 3 s holds
    the worker thread for the 1 s timeout only, and the attempt is a timeout that says so, tried again."""
    settings.WEBHOOKS = {**settings.WEBHOOKS, "TIMEOUT_SECONDS": 1.0, "BATCH_BUDGET_SECONDS": 1.0}
    client, _ = make_client()
    endpoint = endpoints.create(client, "https://hooks.example.com/hooks", ["notification.sent"])

    def slow(host, port):
        time.sleep(3)
        return ["93.184.216.34"]

    monkeypatch.setattr(safety, "getaddrinfo", slow)
    [one] = deliveries_for(endpoint)
    started = time.monotonic()
    assert delivery.deliver_endpoint(endpoint.pk) == {"taken": True, "delivered": 0, "failed": 0, "retrying": 1}
    assert time.monotonic() - started < 1.0 + 1.0
    one.refresh_from_db()
    attempt = WebhookAttempt.objects.get(delivery=one)
    assert (one.state, one.attempts, attempt.http_status) == ("pending", 1, None)
    assert attempt.error == "timed out after 1 s: hooks.example.com did not resolve in time"
    assert 1000 <= attempt.latency_ms < 1500
    assert one.next_attempt_at > attempt.created_at
