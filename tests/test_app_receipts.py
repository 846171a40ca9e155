"""Receipts from the app (notifications/app_receipts.py, ``POST /v1/notifications/{id}/receipts``):
stored once, monotonic on the ladder sent < delivered < displayed < dismissed < opened, one timeline
entry each, in order; tenancy as for reads; campaign counts and the metric. In-process (Django test
client, rolled-back transactions), the platform clock frozen; no worker processes."""

from __future__ import annotations

import importlib
import json
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from django.apps import apps
from django.db import connection, transaction
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns import admin_views as admin_campaigns
from campaigns import services as campaign_services
from campaigns.selectors import campaign_counts
from core.api.scopes import Scope
from notifications import app_receipts, receipts
from notifications.models import APIAuditEntry, APIClient, DeliveryAttempt, DeliveryEvent, Notification, Reason
from preferences.models import Device, Recipient
from tests.conftest import EVERY_SCOPE
from tests.test_metrics import key, only, prom, scrape  # noqa: F401 - prom: private metrics directory (autouse)

pytestmark = pytest.mark.django_db

NOW = datetime(2031, 5, 6, 12, 0, tzinfo=UTC)
SENT_AT = NOW - timedelta(minutes=10)
NOT_FOUND = {"error": {"status": 404, "code": "not_found",
                       "message": "notification_id: no notification with this id that this API client may read",
                       "fields": [{"field": "notification_id", "code": "not_found",
                                   "message": "no notification with this id that this API client may read"}]}}


@pytest.fixture
def owner():
    return APIClient.objects.create_key(name="app-backend", scopes=EVERY_SCOPE)


@pytest.fixture
def http(owner):
    return Client(headers={"Authorization": f"Api-Key {owner[1]}"})


def post(http, nid, body) -> tuple[int, dict]:
    r = http.post(f"/v1/notifications/{nid}/receipts", data=json.dumps(body), content_type="application/json")
    return r.status_code, r.json()


def push(client, status: str = "sent", channel: str = "push", reason: str = "", **fields) -> Notification:
    """A push (or ``channel``) to a fresh user with one device; a ``sent`` one has its accepted call
    (the timeline's ``sent`` line) at SENT_AT, after its ``accepted`` event."""
    uid = f"u-{uuid.uuid4().hex[:8]}"
    r = Recipient.objects.create(user_id=uid, email=f"{uid}@example.com", phone="+4915112345678")
    device = Device.objects.create(recipient=r, platform="android", push_token=f"tok-{uid}")
    sent = status not in ("scheduled", "queued", "sending", "suppressed", "expired", "cancelled")
    n = Notification.objects.create(id=uuid.uuid4(), client=client, recipient=r, channel=channel, title="t", body="b",
                                    status=status, reason=reason, attempts=1 if status != "scheduled" else 0,
                                    provider="fcm" if sent else "", sent_at=SENT_AT if sent else None,
                                    created_at=SENT_AT - timedelta(seconds=2), **fields)
    DeliveryEvent.objects.create(notification=n, kind="accepted", status="queued",
                                 created_at=SENT_AT - timedelta(seconds=2))
    if sent:
        DeliveryAttempt.objects.create(notification=n, number=1, provider="fcm", device=device, outcome="accepted",
                                       provider_message_id="projects/p/messages/1", created_at=SENT_AT)
    return n


def timeline(http, nid) -> list[tuple]:
    body = http.get(f"/v1/notifications/{nid}").json()
    return [(e["kind"], e["status"], e["at"]) for e in body["timeline"]]


def status_of(n: Notification) -> str:
    n.refresh_from_db()
    return n.status


# --- the worked examples ------------------------------------------------------------------------------

def test_opened_moves_a_sent_push_to_opened_after_delivered_in_the_timeline(http, owner, frozen):
    n = push(owner[0])
    frozen[0] = NOW - timedelta(minutes=5)
    receipts.apply_receipts([receipts.Receipt(provider="fcm", dedup_key=f"fcm:{n.pk}:delivered", kind="delivered",
                                              raw="delivered", notification_id=str(n.pk))])
    frozen[0] = NOW
    assert status_of(n) == "delivered"

    # The app says it was opened 8 minutes ago: before the delivered receipt came in, so stored at it.
    code, body = post(http, n.pk, {"event": "opened", "at": (NOW - timedelta(minutes=8)).isoformat()})

    delivered_at = NOW - timedelta(minutes=5)
    assert (code, body) == (201, {"id": str(n.pk), "event": "opened", "duplicate": False, "status": "opened",
                                  "status_changed": True, "at": delivered_at.isoformat().replace("+00:00", "Z")})
    assert status_of(n) == "opened"
    z = lambda t: t.isoformat().replace("+00:00", "Z")  # noqa: E731
    assert timeline(http, n.pk) == [("accepted", "queued", z(SENT_AT - timedelta(seconds=2))),
                                    ("sent", "sent", z(SENT_AT)),
                                    ("receipt:delivered", "delivered", z(delivered_at)),
                                    ("app_opened", "opened", z(delivered_at))]
    event = DeliveryEvent.objects.get(notification=n, kind="app_opened")
    assert (event.dedup_key, event.detail) == (
        f"app:{n.pk}:opened",
        f"reported by the app: opened; at {(NOW - timedelta(minutes=8)).isoformat()} (stored at "
        f"{delivered_at.isoformat()} to keep the timeline in order); delivered → opened")


def test_a_duplicate_is_stored_once_and_answered_as_such(http, owner, frozen):
    n = push(owner[0])
    first = post(http, n.pk, {"event": "displayed"})
    frozen[0] = NOW + timedelta(seconds=30)
    again = post(http, n.pk, {"event": "displayed", "at": (NOW + timedelta(seconds=20)).isoformat()})

    assert first == (201, {"id": str(n.pk), "event": "displayed", "duplicate": False, "status": "displayed",
                           "status_changed": True, "at": "2031-05-06T12:00:00Z"})
    assert again == (200, {"id": str(n.pk), "event": "displayed", "duplicate": True, "status": "displayed",
                           "status_changed": False, "at": "2031-05-06T12:00:00Z"})
    assert list(DeliveryEvent.objects.filter(notification=n, kind__startswith="app_").values_list("kind", "status")) \
        == [("app_displayed", "displayed")]
    audits = list(APIAuditEntry.objects.order_by("id").values_list("status", "object_type", "object_id", "fields"))
    assert audits == [(201, "notification", str(n.pk), ["status", "timeline"]),
                      (200, "notification", str(n.pk), [])]


def test_a_late_displayed_never_regresses_opened_but_is_one_timeline_entry(http, owner, frozen):
    n = push(owner[0])
    assert post(http, n.pk, {"event": "opened"})[1]["status"] == "opened"
    frozen[0] = NOW + timedelta(seconds=5)
    code, body = post(http, n.pk, {"event": "displayed", "at": (NOW - timedelta(seconds=3)).isoformat()})

    assert (code, body["status"], body["status_changed"], body["duplicate"]) == (201, "opened", False, False)
    assert status_of(n) == "opened"
    assert [(k, s) for k, s, _at in timeline(http, n.pk)] == [
        ("accepted", "queued"), ("sent", "sent"), ("app_displayed", ""), ("app_opened", "opened")]
    assert DeliveryEvent.objects.get(notification=n, kind="app_displayed").detail == (
        "reported by the app: displayed; status stays opened")


@pytest.mark.parametrize(("events", "final"), [
    (["opened", "dismissed"], "opened"),  # dismissed after opened changes nothing
    (["dismissed", "opened"], "opened"),  # opened later (from the inbox): moves up
    (["displayed", "dismissed"], "dismissed"),
    (["dismissed", "displayed"], "dismissed"),
])
def test_the_ladder(http, owner, frozen, events, final):
    n = push(owner[0])
    for event in events:
        assert post(http, n.pk, {"event": event})[0] == 201
    assert status_of(n) == final
    assert DeliveryEvent.objects.filter(notification=n, kind__startswith="app_").count() == 2


# --- who may report, and for what -----------------------------------------------------------------------

def test_another_clients_notification_and_an_unknown_id_are_the_same_404_and_nothing_is_written(http, frozen):
    other, _ = APIClient.objects.create_key(name="someone-else", scopes=EVERY_SCOPE)
    theirs = push(other)
    before = list(DeliveryEvent.objects.order_by("id").values())

    assert post(http, theirs.pk, {"event": "opened"}) == (404, NOT_FOUND)
    assert post(http, uuid.uuid4(), {"event": "opened"}) == (404, NOT_FOUND)
    assert status_of(theirs) == "sent"
    assert list(DeliveryEvent.objects.order_by("id").values()) == before
    assert list(APIAuditEntry.objects.values_list("status", "error_code", "fields")) == [
        (404, "not_found", []), (404, "not_found", [])]


def test_an_admin_made_campaigns_push_is_reported_by_any_client_and_counted(http, owner, frozen):
    """The read rule (notifications.readers): the sends of admin-made campaigns are every client's to read,
    so any app backend reports their receipts; the campaign's counts show displayed and opened."""
    segment, _ = campaign_services.upsert_segment("sale", name="Sale")
    campaign = campaign_services.create_campaign(client=None, idempotency_key=None, segment=segment, channel="push",
                                                 body="Sale", name="Sale").campaign
    rows = [push(None, campaign_id=campaign.pk) for _ in range(4)]
    assert post(http, rows[0].pk, {"event": "opened"})[0] == 201
    assert post(http, rows[1].pk, {"event": "displayed"})[0] == 201
    assert post(http, rows[2].pk, {"event": "dismissed"})[0] == 201

    counts = campaign_counts(campaign)
    assert counts["outcome"] == {"sent": 4, "delivered": 3, "displayed": 3, "opened": 1, "not_sent": 0,
                                      "suppressed": 0, "failed": 0, "expired": 0, "cancelled": 0, "pending": 0}
    assert {s: counts["by_status"][s] for s in ("sent", "displayed", "dismissed", "opened")} == {
        "sent": 1, "displayed": 1, "dismissed": 1, "opened": 1}
    api = http.get(f"/v1/campaigns/{campaign.pk}").json()["counts"]
    assert (api["outcome"]["opened"], api["outcome"]["displayed"], api["by_status"]["opened"]) == (1, 3, 1)
    listing = admin_campaigns.outcome_summary(counts["outcome"])  # the admin's campaign list
    assert listing == ("sent 4 (delivered 3, opened 1) · not sent 0: suppressed 0, failed 0, expired 0 · "
                       "pending 0")
    progress = admin_campaigns.progress(campaign)  # the campaign page and its refresh
    assert {k: progress[k] for k in ("sent", "delivered", "displayed", "opened", "done")} == {
        "sent": 4, "delivered": 3, "displayed": 3, "opened": 1, "done": 4}


def test_a_send_only_key_cannot_report_receipts_of_an_admin_campaign_it_finds(frozen):
    """Issue 23 #12: a key with only notifications:send (and read, to find the send) posted `opened` for an
    admin campaign's push it found under GET /v1/users/{id}/notifications, moving the campaign's counts.
    Receipts have their own scope: without it 403 missing_scope and nothing moves; with it, 201."""
    segment, _ = campaign_services.upsert_segment("sale", name="Sale")
    campaign = campaign_services.create_campaign(client=None, idempotency_key=None, segment=segment, channel="push",
                                                 body="Sale", name="Sale").campaign
    row = push(None, campaign_id=campaign.pk)
    sender = Client(headers={"Authorization": "Api-Key " + APIClient.objects.create_key(
        name="orders", scopes=[Scope.SEND, Scope.READ])[1]})
    found = sender.get(f"/v1/users/{row.recipient_id}/notifications").json()["items"]
    assert [n["id"] for n in found] == [str(row.pk)]
    before = campaign_counts(campaign)["outcome"]

    code, body = post(sender, row.pk, {"event": "opened"})
    assert (code, body["error"]["code"], body["error"]["fields"][0]["field"]) == (403, "missing_scope", "Authorization")
    assert "notifications:receipts" in body["error"]["message"]
    assert campaign_counts(campaign)["outcome"] == before and before["opened"] == 0
    assert status_of(row) == "sent" and not DeliveryEvent.objects.filter(notification=row, kind="app_opened").exists()

    backend = Client(headers={"Authorization": "Api-Key " + APIClient.objects.create_key(
        name="app-backend", scopes=[Scope.RECEIPTS])[1]})
    assert post(backend, row.pk, {"event": "opened"})[0] == 201
    assert campaign_counts(campaign)["outcome"]["opened"] == 1 and status_of(row) == "opened"


def test_receipts_are_not_a_default_scope_and_reporters_keep_it_across_the_migration():
    """New keys do not get notifications:receipts; the migration gives it to keys that posted receipts."""
    assert Scope.RECEIPTS not in APIClient.objects.create_key(name="plain")[0].scopes
    reporter = APIClient.objects.create_key(name="app-backend", scopes=[Scope.SEND, Scope.SEND_HIGH, Scope.READ])[0]
    refused = APIClient.objects.create_key(name="refused", scopes=[Scope.SEND, Scope.READ])[0]
    sender = APIClient.objects.create_key(name="sender", scopes=[Scope.SEND, Scope.READ])[0]
    for client, path, code in ((reporter, "/v1/notifications/{notification_id}/receipts", 201),
                               (refused, "/v1/notifications/{notification_id}/receipts", 404),
                               (sender, "/v1/notifications", 202)):
        APIAuditEntry.objects.create(at=NOW, client=client, method="POST", path=path, status=code)
    migration = importlib.import_module("notifications.migrations.0025_receipts_scope")
    migration.grant_to_receipt_reporters(apps, SimpleNamespace(connection=connection))
    scopes = {c.name: c.scopes for c in APIClient.objects.filter(pk__in=[reporter.pk, refused.pk, sender.pk])}
    assert scopes == {"app-backend": ["notifications:send", "notifications:send_high", "notifications:receipts",
                                      "read"],
                      "refused": ["notifications:send", "read"], "sender": ["notifications:send", "read"]}


def test_sms_and_email_get_no_app_receipts(http, owner, frozen):
    for channel in ("sms", "email"):
        n = push(owner[0], channel=channel)
        code, body = post(http, n.pk, {"event": "opened"})
        message = (f"a {channel} notification gets no receipts from the app: only push and in_app do (its delivery "
                   "is what its provider reports)")
        assert (code, body["error"]["code"], body["error"]["fields"]) == (
            422, "validation_error", [{"field": "event", "code": "not_app_channel", "message": message}])
        assert status_of(n) == "sent"
        assert not DeliveryEvent.objects.filter(notification=n, kind__startswith="app_").exists()


@pytest.mark.parametrize(("status", "reason", "code"), [
    ("suppressed", "opted_out_channel", "notification_suppressed"),
    ("failed", "contact_invalid", "notification_failed"),
    ("expired", "ttl_expired", "notification_expired"),
    ("cancelled", "cancelled_by_client", "notification_cancelled"),
    ("queued", "", "notification_queued"),
    ("scheduled", "quiet_hours", "notification_scheduled"),
])
def test_a_notification_never_sent_is_409_naming_its_status_and_nothing_changes(http, owner, frozen, status, reason,
                                                                               code):
    n = push(owner[0], status=status, reason=reason)
    before = (list(DeliveryEvent.objects.filter(notification=n).values()),
              list(Notification.objects.filter(pk=n.pk).values()))

    got, body = post(http, n.pk, {"event": "displayed"})

    assert (got, body["error"]["code"], [f["field"] for f in body["error"]["fields"]],
            body["error"]["fields"][0]["code"]) == (409, "conflict", ["status"], code)
    why = f" ({reason})" if reason else ""
    assert body["error"]["message"].startswith(f"status: this notification is {status}{why}: ")
    assert (list(DeliveryEvent.objects.filter(notification=n).values()),
            list(Notification.objects.filter(pk=n.pk).values())) == before


@pytest.mark.parametrize(("status", "reason"), [("sending", ""), ("scheduled", Reason.OUTCOME_UNKNOWN),
                                                ("queued", Reason.LEASE_EXPIRED)])
def test_a_receipt_for_an_unrecorded_call_settles_it_as_sent_then_moves_it(http, owner, frozen, status, reason,
                                                                          django_capture_on_commit_callbacks):
    n = push(owner[0], status=status, reason=reason, first_attempt_at=SENT_AT,
             lease_until=NOW + timedelta(seconds=20) if status == "sending" else None)

    with django_capture_on_commit_callbacks(execute=True):
        code, body = post(http, n.pk, {"event": "opened"})

    assert (code, body["status"]) == (201, "opened")
    n.refresh_from_db()
    assert (n.status, n.reason, n.provider, n.sent_at, n.lease_until, n.due_at) == ("opened", "", "app", NOW, None,
                                                                                    None)
    assert list(DeliveryAttempt.objects.filter(notification=n).values_list("number", "provider", "outcome")) == [
        (1, "app", "from_receipt")]
    # As for a provider's receipt: the call shows in the attempts (from_receipt), not as a `sent` line.
    assert [(k, s) for k, s, _at in timeline(http, n.pk)] == [("accepted", "queued"), ("app_opened", "opened")]


# --- bad input --------------------------------------------------------------------------------------------

def error_fields(body) -> list[dict]:
    return body["error"]["fields"]


@pytest.mark.parametrize(("body", "field", "code", "message"), [
    ({"event": "clicked"}, "event", "invalid_choice",
     '"clicked" is not an app receipt event; one of: displayed, opened, dismissed'),
    ({}, "event", "required", "This field is required."),
    ({"event": 1}, "event", "invalid_type", "must be a JSON string, not number"),
    ({"event": "opened", "at": "yesterday"}, "at", "invalid",
     "not an ISO 8601 date-time (e.g. 2026-12-01T09:00:00+01:00)"),
    ({"event": "opened", "at": "2031-05-06T11:00:00"}, "at", "naive_datetime",
     "must include a UTC offset or Z (e.g. 2026-12-01T09:00:00+01:00); naive times are ambiguous"),
    ({"event": "opened", "at": "2031-05-06T12:01:01Z"}, "at", "too_far_ahead",
     "at most 60 seconds ahead of now (the platform clock, UTC)"),
    ({"event": "opened", "seen": True}, "seen", "unknown_field", "unknown field"),
])
def test_bad_input_is_422_naming_the_field_and_nothing_changes(http, owner, frozen, body, field, code, message):
    n = push(owner[0])
    got, answer = post(http, n.pk, body)
    assert (got, answer["error"]["code"], error_fields(answer)) == (
        422, "validation_error", [{"field": field, "code": code, "message": message}])
    assert status_of(n) == "sent"
    assert not DeliveryEvent.objects.filter(notification=n, kind__startswith="app_").exists()


def test_at_a_little_ahead_is_stored_now_and_before_the_send_at_the_sent_line(http, owner, frozen):
    ahead, before = push(owner[0]), push(owner[0])
    assert post(http, ahead.pk, {"event": "opened", "at": "2031-05-06T12:00:59Z"})[1]["at"] == "2031-05-06T12:00:00Z"
    assert post(http, before.pk, {"event": "opened", "at": "2020-01-01T00:00:00+01:00"})[1]["at"] == \
        SENT_AT.isoformat().replace("+00:00", "Z")
    assert post(http, before.pk, {"event": "displayed", "at": None})[1]["at"] == "2031-05-06T12:00:00Z"


# --- the metric ---------------------------------------------------------------------------------------------

def test_each_receipt_is_counted_by_event_channel_and_outcome(http, owner, frozen, client,
                                                              django_capture_on_commit_callbacks):
    n, email, queued = push(owner[0]), push(owner[0], channel="email"), push(owner[0], status="queued")
    with django_capture_on_commit_callbacks(execute=True):
        post(http, n.pk, {"event": "opened"})
        post(http, n.pk, {"event": "opened"})
        post(http, n.pk, {"event": "displayed"})
        post(http, email.pk, {"event": "opened"})
        post(http, queued.pk, {"event": "displayed"})

    name = "notify_app_receipts_total"
    assert only(scrape(client), name) == {
        key(name, event="opened", channel="push", outcome="moved"): 1.0,
        key(name, event="opened", channel="push", outcome="duplicate"): 1.0,
        key(name, event="displayed", channel="push", outcome="unchanged"): 1.0,
        key(name, event="opened", channel="email", outcome="refused"): 1.0,
        key(name, event="displayed", channel="push", outcome="refused"): 1.0,
    }


# --- generated: any sequence of app and provider receipts ----------------------------------------------------

RANK = {"sent": 0, "delivered": 1, "displayed": 2, "dismissed": 3, "opened": 4}
RECEIPT = st.tuples(st.sampled_from(["displayed", "opened", "dismissed", "delivered"]),
                    st.one_of(st.none(), st.integers(-900, 60)))  # at: seconds from now (app receipts only)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sequence=st.lists(RECEIPT, min_size=1, max_size=8), start=st.sampled_from(["sent", "delivered"]))
def test_generated_sequences_end_at_the_highest_rung_reached_each_event_stored_once(frozen, sequence, start):
    with transaction.atomic():
        n = push(None, status=start)
        rows = Notification.objects.filter(pk=n.pk)
        for step, (event, offset) in enumerate(sequence):
            frozen[0] = NOW + timedelta(seconds=step)
            if event == "delivered":
                receipts.apply_receipts([receipts.Receipt(provider="fcm", dedup_key=f"fcm:{n.pk}:delivered",
                                                          kind="delivered", raw="delivered",
                                                          notification_id=str(n.pk))])
            else:
                at = None if offset is None else frozen[0] + timedelta(seconds=min(offset, 0))
                app_receipts.apply_app_receipt(rows, event, at)

        reached = max([start, *(e for e, _ in sequence)], key=RANK.__getitem__)
        assert status_of(n) == reached
        kinds = list(DeliveryEvent.objects.filter(notification=n).exclude(kind="accepted")
                     .values_list("kind", flat=True))
        expected = {("receipt:delivered" if e == "delivered" else f"app_{e}") for e, _ in sequence}
        assert sorted(kinds) == sorted(expected)  # each (notification, event) once
        app_times = DeliveryEvent.objects.filter(notification=n, kind__startswith="app_").values_list("created_at",
                                                                                                     flat=True)
        assert all(SENT_AT <= t <= NOW + timedelta(seconds=len(sequence)) for t in app_times)
        transaction.set_rollback(True)


# --- concurrency ------------------------------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_concurrent_reports_of_one_notification_apply_one_after_the_other():
    """The row's lock orders them: of 6 simultaneous `opened`, one is stored (201), five are duplicates
    (200), never a 500 from the unique key; `displayed` posted alongside is stored once too and never
    regresses `opened` (whichever comes first)."""
    from concurrent.futures import ThreadPoolExecutor
    from threading import Barrier

    from django.db import connection

    client, key_ = APIClient.objects.create_key(name="app-backend", scopes=EVERY_SCOPE)
    n = push(client)
    barrier = Barrier(8)

    def report(event: str) -> int:
        try:
            barrier.wait(timeout=10)
            return post(Client(headers={"Authorization": f"Api-Key {key_}"}), n.pk, {"event": event})[0]
        finally:
            connection.close()

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(report, ["opened"] * 6 + ["displayed"] * 2))

    assert sorted(codes[:6]) == [200, 200, 200, 200, 200, 201]
    assert sorted(codes[6:]) == [200, 201]
    assert status_of(n) == "opened"
    assert sorted(DeliveryEvent.objects.filter(notification=n, kind__startswith="app_")
                  .values_list("kind", flat=True)) == ["app_displayed", "app_opened"]
