"""Status webhooks to the calling services (docs/WEBHOOKS.md): the endpoints API and its URL rule,
events written by the lifecycle in the status move's transaction (only for subscribed clients, one
INSERT per batch), and deliveries to a real local HTTP server, verified with the Standard Webhooks
reference library. In-process against the real database."""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from standardwebhooks import Webhook

from campaigns.models import Campaign, Segment
from core import clock
from notifications import lifecycle
from notifications.lifecycle.table import Cause
from notifications.models import Notification, Reason, Status
from notifications.webhooks import delivery, endpoints, outbox, safety
from notifications.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from preferences.models import Recipient
from tests.conftest import make_client
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fresh_subscriptions")]


@pytest.fixture
def insecure(settings):
    """Local development's rule: http and loopback allowed (the receiver listens on 127.0.0.1)."""
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_INSECURE": True}


@pytest.fixture
def production(settings):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_INSECURE": False}


def http_for(key: str) -> Client:
    return Client(headers={"Authorization": f"Api-Key {key}"})


def post(http: Client, path: str, body: dict | None = None):
    return http.post(path, data=json.dumps(body) if body is not None else None, content_type="application/json")


def sending(client, n: int = 1, **fields) -> list[Notification]:
    """``n`` claimed (``sending``) SMS rows of ``client``, each to a fresh user."""
    rows = []
    for _ in range(n):
        uid = f"u-{uuid.uuid4().hex[:10]}"
        r = Recipient.objects.create(user_id=uid, phone="+4915112345678")
        rows.append(Notification.objects.create(id=uuid.uuid4(), client=client, recipient=r, channel="sms", body="b",
                                                status=Status.SENDING, claims=1, attempts=1,
                                                idempotency_key=f"key-{uid}", **fields))
    return rows


def mark_sent(rows: list[Notification]) -> set[str]:
    return lifecycle.sent(clock.now(), "twilio", [n.pk for n in rows], [n.claims for n in rows],
                          [f"SM{i}" for i in range(len(rows))], ["" for _ in rows])


# --- the endpoints API ---------------------------------------------------------------------------------

def test_create_answers_the_secret_once_and_reads_never_show_it(production):
    client, key = make_client()
    http = http_for(key)
    r = post(http, "/v1/webhook-endpoints", {"url": "https://hooks.example.com/notify",
                                             "events": ["notification.sent", "notification.delivered"],
                                             "description": "orders"})
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["secret"].startswith("whsec_") and len(body["secret"]) > 30
    assert r.headers["Location"] == f"/v1/webhook-endpoints/{body['id']}"
    endpoint = WebhookEndpoint.objects.get(pk=body["id"])
    assert (endpoint.client_id, endpoint.events, endpoint.secret) == (
        client.pk, ["notification.sent", "notification.delivered"], body["secret"])
    Webhook(body["secret"])  # the reference library reads it
    one = http.get(f"/v1/webhook-endpoints/{body['id']}").json()
    listed = http.get("/v1/webhook-endpoints").json()
    assert "secret" not in one and body["secret"] not in json.dumps(listed)
    assert [e["id"] for e in listed["items"]] == [body["id"]] and listed["next_cursor"] is None
    assert one == {k: v for k, v in body.items() if k != "secret"}


def test_another_clients_endpoint_is_not_found_and_delete_removes_its_own(production):
    mine, key = make_client()
    _, other_key = make_client()
    endpoint = endpoints.create(mine, "https://hooks.example.com/a", ["notification.sent"])
    other = http_for(other_key)
    for r in (other.get(f"/v1/webhook-endpoints/{endpoint.pk}"), other.delete(f"/v1/webhook-endpoints/{endpoint.pk}"),
              post(other, f"/v1/webhook-endpoints/{endpoint.pk}/test")):
        assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    assert other.get("/v1/webhook-endpoints").json()["items"] == []
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert http_for(key).delete(f"/v1/webhook-endpoints/{endpoint.pk}").status_code == 204
    assert not WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()


@pytest.mark.parametrize("url", ["https://127.0.0.1/hook", "https://10.1.2.3/hook", "https://169.254.169.254/latest",
                                 "https://[::1]/hook", "https://[::ffff:127.0.0.1]/hook", "https://localhost/hook",
                                 "http://hooks.example.com/hook", "ftp://hooks.example.com/hook"])
def test_a_url_to_a_non_public_address_or_not_https_is_refused_at_save_naming_url(production, url):
    _, key = make_client()
    r = post(http_for(key), "/v1/webhook-endpoints", {"url": url, "events": ["notification.sent"]})
    assert r.status_code == 422, r.content
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [("url", "url_not_allowed")]
    assert r.json()["error"]["message"].startswith("url: ")
    assert WebhookEndpoint.objects.count() == 0


def test_an_unknown_event_is_refused_naming_it(production):
    _, key = make_client()
    r = post(http_for(key), "/v1/webhook-endpoints", {"url": "https://hooks.example.com/a",
                                                      "events": ["notification.sent", "notification.queued"]})
    assert r.status_code == 422
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [("events.1", "invalid_choice")]
    assert WebhookEndpoint.objects.count() == 0


def test_the_test_call_queues_a_signed_test_event(production):
    client, key = make_client()
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["notification.sent"])
    r = post(http_for(key), f"/v1/webhook-endpoints/{endpoint.pk}/test")
    assert r.status_code == 202
    sent = WebhookDelivery.objects.get(endpoint=endpoint)
    assert r.json() == {"delivery_id": f"msg_{sent.pk.hex}", "event": "webhook.test"}
    assert (sent.event_type, sent.state, sent.payload["data"]) == ("webhook.test", "pending",
                                                                   {"endpoint_id": str(endpoint.pk)})


# --- events from the lifecycle -------------------------------------------------------------------------

def test_a_status_move_writes_one_delivery_per_subscribed_endpoint_for_its_own_client_only(monkeypatch):
    mine, _ = make_client()
    other, _ = make_client()
    endpoint = endpoints.create(mine, "https://hooks.example.com/a", ["notification.sent"])
    endpoints.create(mine, "https://hooks.example.com/b", ["notification.delivered"])  # not this event
    rows = sending(mine, 2) + sending(other, 1)
    copies = []
    real_copy = outbox.copy_rows
    monkeypatch.setattr(outbox, "copy_rows", lambda *a: copies.append(len(a[2])) or real_copy(*a))
    outbox.subscribers("notification.sent")  # the per-process read (once per TTL), outside the count
    with CaptureQueriesContext(connection) as queries:
        assert len(mark_sent(rows)) == 3
    assert copies == [2]  # one write (COPY) for the batch's deliveries
    # the move's UPDATE, one SELECT of the subscribed rows, one of their endpoints (still there: locked
    # FOR KEY SHARE until the commit, tests/test_webhook_endpoint_delete.py)
    assert len(queries.captured_queries) == 3, [q["sql"][:80] for q in queries.captured_queries]
    assert queries.captured_queries[2]["sql"].endswith("FOR KEY SHARE SKIP LOCKED")
    got = WebhookDelivery.objects.order_by("notification_id")
    assert sorted((d.endpoint_id, d.notification_id, d.event_type) for d in got) == sorted(
        (endpoint.pk, n.pk, "notification.sent") for n in rows[:2])
    data = WebhookDelivery.objects.get(notification_id=rows[0].pk).payload
    assert data["type"] == "notification.sent"
    assert {k: v for k, v in data["data"].items() if k not in ("at",)} == {
        "notification_id": str(rows[0].pk), "channel": "sms", "status": "sent", "reason": None,
        "idempotency_key": rows[0].idempotency_key,
        "metadata": {"user_id": rows[0].recipient_id, "priority": "standard", "category": None, "campaign_id": None,
                     "event_id": None, "client": None}}


def test_no_subscriber_no_query_the_send_path_pays_nothing():
    """Zero extra cost for clients without endpoints: once the subscriptions are read (per process,
    per TTL), a move runs exactly its own UPDATE, whether or not other clients subscribe elsewhere."""
    mine, _ = make_client()
    other, _ = make_client()
    endpoints.create(other, "https://hooks.example.com/a", ["notification.delivered"])
    rows = sending(mine, 3)
    outbox.subscribers("notification.sent")  # warm
    with CaptureQueriesContext(connection) as queries:
        assert len(mark_sent(rows)) == 3
    assert len(queries.captured_queries) == 1, [q["sql"][:80] for q in queries.captured_queries]
    assert WebhookDelivery.objects.count() == 0


def test_a_campaigns_rows_belong_to_the_client_that_launched_it_and_admin_campaigns_send_none():
    launcher, _ = make_client()
    endpoint = endpoints.create(launcher, "https://hooks.example.com/a", ["notification.sent"])
    segment = Segment.objects.create(segment_id=f"s-{uuid.uuid4().hex[:6]}", name="S", client=launcher)
    theirs = Campaign.objects.create(client=launcher, segment=segment, channel="sms", body="x")
    admins = Campaign.objects.create(client=None, segment=segment, channel="sms", body="x")
    rows = sending(None, 1, campaign_id=theirs.pk) + sending(None, 1, campaign_id=admins.pk)
    mark_sent(rows)
    assert [(d.endpoint_id, d.notification_id) for d in WebhookDelivery.objects.all()] == [(endpoint.pk, rows[0].pk)]
    assert WebhookDelivery.objects.get().payload["data"]["metadata"]["campaign_id"] == str(theirs.pk)


def test_a_new_endpoint_is_seen_at_once_in_its_process_and_a_change_elsewhere_after_the_ttl(monkeypatch):
    client, _ = make_client()
    now = [1000.0]
    monkeypatch.setattr(outbox, "_cache_clock", lambda: now[0])
    assert outbox.subscribers("notification.sent") == {}
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["notification.sent"])  # post_save
    assert outbox.subscribers("notification.sent") == {client.pk: [endpoint.pk]}
    # Another process disables it (no signal here): read again once the TTL has passed.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(active=False)
    assert outbox.subscribers("notification.sent") == {client.pk: [endpoint.pk]}
    now[0] += 5.1
    assert outbox.subscribers("notification.sent") == {}


def test_subscriptions_are_read_again_when_the_clock_moved_back(monkeypatch):
    """A clock moved back (the platform clock's offset reset, an NTP step) must not keep a read for the
    months it was moved forward: the e2e stack's webhooks went silent after a test moved the clock."""
    client, _ = make_client()
    now = [10_000_000.0]  # moved months ahead
    monkeypatch.setattr(outbox, "_cache_clock", lambda: now[0])
    assert outbox.subscribers("notification.sent") == {}
    now[0] = 1000.0  # back to today; another process saves an endpoint (no signal reaches this one)
    WebhookEndpoint.objects.bulk_create([WebhookEndpoint(client=client, url="https://hooks.example.com/b",
                                                         events=["notification.sent"], secret="whsec_x")])
    assert list(outbox.subscribers("notification.sent")) == [client.pk]


@pytest.mark.parametrize("event, move", [
    ("notification.suppressed", lambda n: lifecycle.suppress([n], {n.pk: "opted out"}, Reason.OPTED_OUT_CHANNEL,
                                                             clock.now())),
    ("notification.failed", lambda n: lifecycle.record_one(n, Status.FAILED, {"reason": Reason.PERMANENT_ERROR,
                                                                              "updated_at": clock.now()},
                                                           kind="failed")),
    ("notification.expired", lambda n: lifecycle.record_one(n, Status.EXPIRED, {"reason": Reason.TTL_EXPIRED},
                                                            kind="expired")),
])
def test_each_end_of_the_send_path_is_an_event(event, move):
    client, _ = make_client()
    endpoints.create(client, "https://hooks.example.com/a", [event])
    n = sending(client)[0]
    move(n)
    got = WebhookDelivery.objects.get()
    assert (got.event_type, got.notification_id, got.payload["data"]["status"]) == (event, n.pk, event.split(".")[1])


def test_a_receipt_a_cancel_and_an_app_receipt_are_events():
    client, _ = make_client()
    endpoints.create(client, "https://hooks.example.com/a",
                     ["notification.delivered", "notification.cancelled", "notification.opened"])
    sent_row, queued_row = sending(client, 2)
    mark_sent([sent_row])
    lifecycle.deliver([(sent_row.pk, clock.now(), 3)], clock.now())
    Notification.objects.filter(pk=queued_row.pk).update(status=Status.QUEUED)
    lifecycle.cancel([queued_row.pk], Cause.CLIENT_CANCEL, Reason.CANCELLED_BY_CLIENT, clock.now())
    sent_row.refresh_from_db()
    lifecycle.app_move(sent_row, Status.OPENED, clock.now())
    assert sorted((d.event_type, d.notification_id) for d in WebhookDelivery.objects.all()) == sorted([
        ("notification.delivered", sent_row.pk), ("notification.cancelled", queued_row.pk),
        ("notification.opened", sent_row.pk)])


# --- delivery ------------------------------------------------------------------------------------------

def deliveries_for(endpoint, n: int = 1) -> list[WebhookDelivery]:
    rows = sending(endpoint.client, n)
    mark_sent(rows)
    return list(WebhookDelivery.objects.filter(endpoint=endpoint).order_by("created_at", "id"))


def test_a_delivery_is_signed_so_the_reference_library_verifies_it(insecure):
    client, _ = make_client()
    with Receiver() as receiver:
        endpoint = endpoints.create(client, receiver.url, ["notification.sent"])
        [one] = deliveries_for(endpoint)
        assert delivery.deliver_endpoint(endpoint.pk) == {"taken": True, "delivered": 1, "failed": 0, "retrying": 0}
    [request] = receiver.requests
    assert request["path"] == "/hooks"
    assert request["headers"]["webhook-id"] == f"msg_{one.pk.hex}"
    verified = Webhook(endpoint.secret).verify(request["body"], request["headers"])
    assert verified == one.payload
    one.refresh_from_db()
    assert (one.state, one.attempts, one.last_http_status) == ("delivered", 1, 200)
    [attempt] = WebhookAttempt.objects.filter(delivery=one)
    assert (attempt.number, attempt.http_status, attempt.retry_at) == (1, 200, None)
    assert attempt.latency_ms is not None


def test_a_run_reads_the_next_batch_while_the_endpoint_keeps_up(insecure, settings):
    """Before: one batch per run (WEBHOOKS_BATCH_SIZE), so a busy endpoint got 100 webhooks a second
    however fast it answered. Now a full batch delivered reads the next, within the run's budget."""
    settings.WEBHOOKS = {**settings.WEBHOOKS, "BATCH_SIZE": 10}
    client, _ = make_client()
    with Receiver() as receiver:
        endpoint = endpoints.create(client, receiver.url, ["notification.sent"])
        rows = deliveries_for(endpoint, 25)
        assert delivery.deliver_endpoint(endpoint.pk) == {"taken": True, "delivered": 25, "failed": 0,
                                                          "retrying": 0}
    assert sorted(r["headers"]["webhook-id"] for r in receiver.requests) == sorted(d.message_id for d in rows)
    assert WebhookDelivery.objects.filter(endpoint=endpoint, state="delivered").count() == 25
    assert WebhookAttempt.objects.filter(delivery__endpoint=endpoint).count() == 25


def test_503_with_retry_after_is_tried_again_then_delivered_with_the_same_webhook_id(insecure):
    client, _ = make_client()
    with Receiver(lambda n: (503, {"Retry-After": "7"}) if n == 1 else (200, {})) as receiver:
        endpoint = endpoints.create(client, receiver.url, ["notification.sent"])
        first, second = deliveries_for(endpoint, 2)
        before = clock.now()
        assert delivery.deliver_endpoint(endpoint.pk)["retrying"] == 1  # the rest waits for the next run
        first.refresh_from_db()
        assert first.state == "pending" and 7 <= (first.next_attempt_at - before).total_seconds() < 9
        assert delivery.deliver_endpoint(endpoint.pk)["delivered"] == 1  # the second; the first is not due yet
        WebhookDelivery.objects.filter(pk=first.pk).update(next_attempt_at=clock.now())
        assert delivery.deliver_endpoint(endpoint.pk)["delivered"] == 1
    assert [r["headers"]["webhook-id"] for r in receiver.requests] == [
        first.message_id, second.message_id, first.message_id]
    assert list(WebhookAttempt.objects.filter(delivery=first).values_list("http_status", flat=True)) == [503, 200]
    endpoint.refresh_from_db()
    assert endpoint.failing_since is None and endpoint.active


@pytest.fixture
def days_ahead(settings, tmp_path):
    """The platform clock three days ahead of the host's, as the end-to-end tests move it."""
    offset_file = tmp_path / "clock-offset"
    offset_file.write_text(str(3 * 86400))
    settings.NOTIFY = {**settings.NOTIFY, "CLOCK_OFFSET_FILE": str(offset_file)}
    return timedelta(days=3)


def test_the_wire_carries_the_hosts_time_while_the_platform_clock_is_moved(insecure, days_ahead):
    """A receiver checks ``webhook-timestamp`` against its own clock (the reference library refuses
    5 minutes off) and means its own wall time by an HTTP-date ``Retry-After``: both are the host's
    real time; what is recorded stays on the platform clock."""
    client, _ = make_client()
    retry_after = {}

    def answer(n):
        retry_after["at"] = datetime.now(UTC) + timedelta(seconds=120)
        return (503, {"Retry-After": format_datetime(retry_after["at"], usegmt=True)}) if n == 1 else (200, {})

    with Receiver(answer) as receiver:
        endpoint = endpoints.create(client, receiver.url, ["notification.sent"])
        [one] = deliveries_for(endpoint)
        before = clock.now()
        assert before - datetime.now(UTC) > days_ahead - timedelta(minutes=1)
        assert delivery.deliver_endpoint(endpoint.pk)["retrying"] == 1
        one.refresh_from_db()
        assert 110 <= (one.next_attempt_at - before).total_seconds() <= 121  # not the 5 s backoff
        WebhookDelivery.objects.filter(pk=one.pk).update(next_attempt_at=clock.now())
        assert delivery.deliver_endpoint(endpoint.pk)["delivered"] == 1
    signer = Webhook(endpoint.secret)
    assert [signer.verify(r["body"], r["headers"]) for r in receiver.requests] == [one.payload, one.payload]
    assert all(a.created_at >= before for a in WebhookAttempt.objects.filter(delivery=one))
    one.refresh_from_db()
    assert one.delivered_at >= before


@pytest.mark.parametrize("status, state, retried", [(400, "failed", False), (410, "failed", False),
                                                    (302, "failed", False), (429, "pending", True),
                                                    (500, "pending", True)])
def test_only_429_5xx_and_no_answer_are_retried(insecure, status, state, retried):
    client, _ = make_client()
    with Receiver(lambda n: (status, {"Location": "http://127.0.0.1:9/elsewhere"})) as receiver:
        endpoint = endpoints.create(client, receiver.url, ["notification.sent"])
        [one] = deliveries_for(endpoint)
        delivery.deliver_endpoint(endpoint.pk)
    one.refresh_from_db()
    attempt = WebhookAttempt.objects.get(delivery=one)
    assert (one.state, attempt.http_status, attempt.retry_at is not None) == (state, status, retried)
    assert len(receiver.requests) == 1  # a redirect is not followed


def test_retries_end_after_the_window_and_an_endpoint_failing_for_days_is_disabled(insecure, monkeypatch):
    client, _ = make_client()
    with Receiver(lambda n: (503, {})) as receiver:
        endpoint = endpoints.create(client, receiver.url, ["notification.sent"])
        [one] = deliveries_for(endpoint)
        delivery.deliver_endpoint(endpoint.pk)
        endpoint.refresh_from_db()
        assert endpoint.failing_since is not None and endpoint.active
        # The clock moved: a day later the window is over; three days later the endpoint is disabled.
        later = clock.now() + timedelta(days=3, seconds=1)
        WebhookDelivery.objects.filter(pk=one.pk).update(next_attempt_at=later - timedelta(seconds=1))
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(failing_since=later - timedelta(days=3, seconds=1))
        monkeypatch.setattr(clock, "now", lambda: later)
        delivery.deliver_endpoint(endpoint.pk)
    one.refresh_from_db()
    endpoint.refresh_from_db()
    assert one.state == "failed" and one.last_error.endswith("retries ran out")
    assert not endpoint.active
    assert endpoint.disabled_reason.startswith("disabled automatically: no successful delivery since")
    assert len(receiver.requests) == 2


def test_a_name_that_resolves_to_loopback_is_refused_at_connect(production, monkeypatch):
    """DNS rebinding: the URL passed at save (a public name); at send the name answers 127.0.0.1,
    which is checked and refused before any connection is made."""
    client, _ = make_client()
    with Receiver() as receiver:
        endpoint = endpoints.create(client, "https://hooks.example.com/hooks", ["notification.sent"])
        port = receiver.server.server_address[1]
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(url=f"https://hooks.example.com:{port}/hooks")
        monkeypatch.setattr(safety, "getaddrinfo", lambda host, port: ["127.0.0.1"])
        [one] = deliveries_for(endpoint)
        delivery.deliver_endpoint(endpoint.pk)
    assert receiver.requests == []
    attempt = WebhookAttempt.objects.get(delivery=one)
    assert (attempt.http_status, attempt.error) == (
        None, "refused: 127.0.0.1 is not a public address (loopback, private, link-local or reserved): refused")


@pytest.mark.parametrize("address", ["127.0.0.1", "10.0.0.8", "169.254.169.254", "::1", "fd00::1", "192.168.1.1",
                                     "100.64.0.1", "0.0.0.0"])  # noqa: S104 - refused, never bound
def test_every_non_global_address_is_refused(production, address):
    with pytest.raises(safety.Refused):
        safety.check_address(address)
    safety.check_address("93.184.216.34")  # a public one passes


def test_a_slow_endpoint_stops_at_its_budget_and_leaves_the_rest_for_later(insecure, settings):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "BATCH_BUDGET_SECONDS": 0.0}
    client, _ = make_client()
    with Receiver() as receiver:
        endpoint = endpoints.create(client, receiver.url, ["notification.sent"])
        deliveries_for(endpoint, 3)
        assert delivery.deliver_endpoint(endpoint.pk) == {"taken": True, "delivered": 0, "failed": 0, "retrying": 0}
    assert WebhookDelivery.objects.filter(state="pending").count() == 3
    endpoint.refresh_from_db()
    assert endpoint.busy_until is None  # released for the next run


def test_an_endpoint_in_flight_is_not_taken_twice(insecure):
    client, _ = make_client()
    endpoint = endpoints.create(client, "http://127.0.0.1:9/hooks", ["notification.sent"])
    deliveries_for(endpoint)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(busy_until=clock.now() + timedelta(seconds=30))
    assert delivery.deliver_endpoint(endpoint.pk) == {"taken": False}
    assert delivery.dispatch() == 0
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(busy_until=None)
    assert WebhookAttempt.objects.count() == 0


def test_replay_makes_a_failed_delivery_due_with_a_fresh_window(insecure):
    client, _ = make_client()
    endpoint = endpoints.create(client, "http://127.0.0.1:9/hooks", ["notification.sent"])
    [one] = deliveries_for(endpoint)
    WebhookDelivery.objects.filter(pk=one.pk).update(state="failed", give_up_at=clock.now())
    assert delivery.replay([one]) == delivery.Replayed(due=1, disabled=0, already_due=0, disabled_endpoints=[])
    one.refresh_from_db()
    assert (one.state, one.give_up_at) == ("pending", None) and one.next_attempt_at <= clock.now()


# --- an event's outcome per user -------------------------------------------------------------------------

ORDER = {"name": "Order", "category": "shipping", "channels": ["sms", "email"]}
ORDER_TEMPLATES = [{"channel": "sms", "locale": "en", "body": "Order {{ data.id }}"},
                   {"channel": "email", "locale": "en", "title": "Order", "body": "Order {{ data.id }}"}]


def event_rows(client, users: list[str]) -> dict[tuple[str, str], Notification]:
    """An ``order`` event (sms and email, routing all) to ``users``; its rows claimed (``sending``),
    by (user, channel)."""
    from notifications.events import services as event_services

    kind, _ = event_services.save_type(f"order-{uuid.uuid4().hex[:6]}", ORDER, ORDER_TEMPLATES, client=client)
    recipients = [Recipient.objects.create(user_id=u, email=f"{u}@example.com", phone="+4915112345678")
                  for u in users]
    event = event_services.accept_event(client=client, idempotency_key=f"evt-{uuid.uuid4().hex[:6]}",
                                        fingerprint="f", kind=kind, recipients=recipients, data={"id": 7}).event
    Notification.objects.filter(event=event).update(status=Status.SENDING, claims=1)
    return {(n.recipient_id, n.channel): n for n in Notification.objects.filter(event=event)}


def test_an_events_user_is_reached_or_not_once_when_the_last_channel_decides():
    client, _ = make_client()
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["event.reached", "event.not_reached"])
    alice, bob = f"alice-{uuid.uuid4().hex[:6]}", f"bob-{uuid.uuid4().hex[:6]}"
    rows = event_rows(client, [alice, bob])
    fail = {"reason": Reason.PERMANENT_ERROR, "updated_at": clock.now()}
    lifecycle.record_one(rows[(alice, "sms")], Status.FAILED, fail, kind="failed")
    assert WebhookDelivery.objects.count() == 0  # alice's email is not decided yet: pending
    mark_sent([rows[(alice, "email")]])
    lifecycle.deliver([(rows[(alice, "email")].pk, clock.now(), 3)], clock.now())  # still reached: told once
    lifecycle.record_one(rows[(bob, "sms")], Status.FAILED, fail, kind="failed")
    lifecycle.record_one(rows[(bob, "email")], Status.FAILED, fail, kind="failed")
    got = {d.payload["data"]["user_id"]: d for d in WebhookDelivery.objects.filter(endpoint=endpoint)}
    assert {user: d.event_type for user, d in got.items()} == {alice: "event.reached", bob: "event.not_reached"}
    data = got[alice].payload["data"]
    assert (data["outcome"], data["event_id"]) == ("reached", str(rows[(alice, "sms")].event_id))
    assert sorted((n["channel"], n["status"]) for n in data["notifications"]) == [("email", "sent"),
                                                                                  ("sms", "failed")]


# --- support in the admin --------------------------------------------------------------------------------

def staff_in(group: str):
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user(f"{group}-{uuid.uuid4().hex[:6]}", is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


def test_support_sees_each_attempt_and_replays_a_delivery_but_changes_no_endpoint(client, as_migrated, insecure):
    api_client, _ = make_client()
    with Receiver(lambda n: (503, {})) as receiver:
        endpoint = endpoints.create(api_client, receiver.url, ["notification.sent"])
        [one] = deliveries_for(endpoint)
        delivery.deliver_endpoint(endpoint.pk)
    WebhookDelivery.objects.filter(pk=one.pk).update(state="failed")
    client.force_login(staff_in("support"))
    page = client.get(f"/admin/notifications/webhookdelivery/{one.pk}/change/")
    assert page.status_code == 200
    [attempt] = page.context["inline_admin_formsets"][0].formset.queryset
    assert (attempt.number, attempt.http_status) == (1, 503)
    assert endpoint.secret not in page.content.decode()
    assert client.get(f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/").status_code == 200  # read
    assert endpoint.secret not in client.get(f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/"
                                             ).content.decode()
    r = client.post(f"/admin/notifications/webhookendpoint/{endpoint.pk}/change/", {"active": "", "description": "x"})
    assert r.status_code == 403
    r = client.post("/admin/notifications/webhookdelivery/", {"action": "replay", "_selected_action": [str(one.pk)]})
    assert r.status_code == 302
    one.refresh_from_db()
    assert (one.state, one.give_up_at) == ("pending", None)
    client.force_login(staff_in("marketing"))
    assert client.get(f"/admin/notifications/webhookdelivery/{one.pk}/change/").status_code == 403


def test_a_campaign_completes_with_one_webhook_to_the_client_that_launched_it():
    from campaigns.fanout import reconcile_campaigns
    from campaigns.models import CampaignStatus

    launcher, _ = make_client()
    endpoint = endpoints.create(launcher, "https://hooks.example.com/a", ["campaign.completed"])
    segment = Segment.objects.create(segment_id=f"s-{uuid.uuid4().hex[:6]}", name="S", client=launcher)
    theirs = Campaign.objects.create(client=launcher, segment=segment, channel="sms", body="x",
                                     status=CampaignStatus.SENDING)
    Campaign.objects.create(client=None, segment=segment, channel="sms", body="x", status=CampaignStatus.SENDING)
    assert reconcile_campaigns()["completed"] == 2
    assert reconcile_campaigns()["completed"] == 0
    [done] = WebhookDelivery.objects.all()
    assert (done.endpoint_id, done.event_type, done.payload["data"]["campaign_id"]) == (
        endpoint.pk, "campaign.completed", str(theirs.pk))


def test_an_answer_is_read_up_to_the_cap_and_no_further(insecure, settings):
    """A receiver answering 8 MB: the worker reads WEBHOOKS_MAX_RESPONSE_BYTES and closes, so the
    receiver's write fails part way (read to its end, it would succeed)."""
    settings.WEBHOOKS = {**settings.WEBHOOKS, "MAX_RESPONSE_BYTES": 1024}
    client, _ = make_client()
    with Receiver(lambda n: (200, {}, b"x" * 8_000_000)) as receiver:
        endpoint = endpoints.create(client, receiver.url, ["notification.sent"])
        assert len(deliveries_for(endpoint)) == 1
        assert delivery.deliver_endpoint(endpoint.pk)["delivered"] == 1
        time.sleep(0.5)  # the receiver's write notices the closed connection
    assert receiver.requests[0]["write_error"] in ("BrokenPipeError", "ConnectionResetError")


def test_a_timeout_is_an_attempt_tried_again(insecure, settings):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "TIMEOUT_SECONDS": 0.3}
    client, _ = make_client()
    with Receiver(lambda n: time.sleep(1.0) or (200, {})) as receiver:
        endpoint = endpoints.create(client, receiver.url, ["notification.sent"])
        [one] = deliveries_for(endpoint)
        assert delivery.deliver_endpoint(endpoint.pk)["retrying"] == 1
    attempt = WebhookAttempt.objects.get(delivery=one)
    assert (attempt.http_status, attempt.error, attempt.retry_at is not None) == (None, "timed out after 0.3 s", True)
    one.refresh_from_db()
    assert one.state == "pending"


def test_a_lost_worker_a_later_receipt_and_a_receipt_of_an_unrecorded_call_are_events():
    """The lifecycle's other writers: a lease that ran out on the last attempt (``worker_lost``), a
    provider's failure receipt after ``delivered``, a receipt proving a call that was never recorded."""
    client, _ = make_client()
    endpoints.create(client, "https://hooks.example.com/a",
                     ["notification.failed", "notification.delivered", "notification.sent"])
    lost, delivered, unrecorded = sending(client, 3)
    now = clock.now()
    Notification.objects.filter(pk=lost.pk).update(lease_until=now - timedelta(seconds=1), attempts=99)
    lifecycle.expire_leases({"now": now, "limit": 100, "max_high": 5, "max_standard": 8,
                             "standard_due": now + timedelta(seconds=60)})
    mark_sent([delivered])
    lifecycle.deliver([(delivered.pk, now, 3)], now)
    lifecycle.settle_receipt(delivered.pk, Status.FAILED, {"reason": Reason.PROVIDER_UNDELIVERED},
                             now + timedelta(seconds=1), 2)
    lifecycle.settle_unrecorded(unrecorded.pk, Status.SENDING, Status.SENT, {}, Cause.PROVIDER_RECEIPT)
    got = sorted((d.event_type, d.notification_id) for d in WebhookDelivery.objects.all())
    assert got == sorted([("notification.failed", lost.pk), ("notification.sent", delivered.pk),
                          ("notification.delivered", delivered.pk), ("notification.failed", delivered.pk),
                          ("notification.sent", unrecorded.pk)])
    assert WebhookDelivery.objects.get(notification_id=lost.pk).payload["data"]["reason"] == "worker_lost"


#: Lifecycle writers whose moves never reach an event's status (claimed, rescheduled, released, replayed,
#: reopened; the receipts' timeline marks).
NO_EVENT_WRITERS = {"claim", "reschedule", "release_due", "replay", "reopen", "mark_events", "mark_out_of_order"}


def test_every_status_writer_of_the_lifecycle_emits_or_is_known_not_to():
    """A new writer in notifications/lifecycle/ that moves a status without telling the outbox fails
    here until it emits (or is listed above, with why)."""
    import ast
    import inspect

    from notifications.lifecycle import manual, receipts, send

    emitting, silent = set(), []
    for module in (send, receipts, manual):
        tree = ast.parse(inspect.getsource(module))
        constants = {t.id for node in tree.body if isinstance(node, ast.Assign | ast.AnnAssign)
                     for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                     if isinstance(t, ast.Name) and "UPDATE notifications_notification" in ast.unparse(node.value)}
        for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")):
            source = ast.unparse(fn)
            writes = ".update(" in source or any(name in source for name in constants)
            if not writes or fn.name in NO_EVENT_WRITERS:
                continue
            (emitting.add(fn.name) if "outbox." in source else silent.append(f"{module.__name__}.{fn.name}"))
    assert silent == []
    assert emitting == {"sent", "suppress", "record_one", "expire_leases", "deliver", "settle", "settle_unrecorded",
                        "app_move", "cancel", "fallback"}


def test_a_campaign_member_created_suppressed_at_fan_out_is_a_suppressed_event_of_the_launchers():
    """A row created final never moves, so fan-out tells it: the launcher's endpoint hears
    ``notification.suppressed`` (with the reason) for the member suppressed on the page and nothing
    for the one queued; an admin campaign's suppressed member is nobody's."""
    from tests.fanout_helpers import make_campaign, make_recipient, run_fan_out

    launcher, _ = make_client()
    endpoint = endpoints.create(launcher, "https://hooks.example.com/a", ["notification.suppressed",
                                                                         "notification.sent"])
    tag = uuid.uuid4().hex[:6]
    make_recipient(f"ok-{tag}")
    make_recipient(f"bad-{tag}", phone_invalid=True)
    theirs = make_campaign([f"ok-{tag}", f"bad-{tag}"], channel="sms")
    Campaign.objects.filter(pk=theirs.pk).update(client=launcher)
    rows = {n.recipient_id: n for n in run_fan_out(theirs)}
    assert {u: (n.status, n.reason) for u, n in rows.items()} == {
        f"ok-{tag}": ("queued", ""), f"bad-{tag}": ("suppressed", "phone_invalid")}
    [told] = WebhookDelivery.objects.all()
    data = told.payload["data"]
    assert (told.endpoint_id, told.event_type, told.notification_id) == (
        endpoint.pk, "notification.suppressed", rows[f"bad-{tag}"].pk)
    assert (data["status"], data["reason"], data["metadata"]["campaign_id"]) == (
        "suppressed", "phone_invalid", str(theirs.pk))
    make_recipient(f"bad2-{tag}", phone_invalid=True)
    run_fan_out(make_campaign([f"bad2-{tag}"], channel="sms"))  # an admin campaign: nobody's
    assert WebhookDelivery.objects.count() == 1


def test_a_digests_events_are_reached_when_the_digest_is_sent():
    """An event that went into a digest has no notification of its own: when the digest's row is
    sent, the client hears ``notification.sent`` of that row and ``event.reached`` of every event
    in the digest, each with its own key and the digest's notifications; once."""
    from notifications.events import digests
    from notifications.events import services as event_services

    client, _ = make_client()
    endpoint = endpoints.create(client, "https://hooks.example.com/a", ["event.reached", "notification.sent"])
    kind, _ = event_services.save_type(f"likes-{uuid.uuid4().hex[:6]}", {
        "channels": ["sms"], "priority": "standard", "category": "social",
        "digest": {"window_seconds": 60, "key": "{{ data.post }}"}},
        [{"channel": "sms", "locale": "en", "body": "{{ items|length }} likes"}], client=client)
    user = Recipient.objects.create(user_id=f"u-{uuid.uuid4().hex[:8]}", phone="+4915112345678")
    events = [event_services.accept_event(client=client, idempotency_key=f"like-{i}", fingerprint="f", kind=kind,
                                          recipients=[user], data={"post": "p1"}).event for i in range(2)]
    (digest,) = digests.Digest.objects.filter(recipient=user)
    (row,) = digests.close(digests.Digest.objects.get(pk=digest.pk), digest.closes_at)
    assert WebhookDelivery.objects.count() == 0  # closed, not yet decided
    Notification.objects.filter(pk=row.pk).update(status=Status.SENDING, claims=1)
    row.refresh_from_db()
    mark_sent([row])
    mark_sent([row])  # no second move, nothing told twice
    got = sorted((d.event_type, d.payload["data"].get("event_id"), d.payload["data"]["idempotency_key"])
                 for d in WebhookDelivery.objects.filter(endpoint=endpoint))
    assert got == sorted([("notification.sent", None, None)]
                         + [("event.reached", str(e.pk), f"like-{i}") for i, e in enumerate(events)])
    reached = WebhookDelivery.objects.filter(event_type="event.reached").first().payload["data"]
    assert (reached["user_id"], reached["notifications"]) == (user.user_id, [
        {"notification_id": str(row.pk), "channel": "sms", "status": "sent", "reason": None}])
