"""App receipts and inbox marks of a notification archived to the history (issue 25; docs/APP.md,
docs/ARCHITECTURE.md §13): applied there by the same rules as for a live row (the ladder, dismissal,
duplicates, tenancy, never-sent refusals), the timeline entry written alike, ``GET`` showing it; the
lookup a key probe of every history partition. Rows are made at T0, the platform clock stands
``HOT_HOURS`` + 1 h later and the archiver moves them before each receipt."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test import Client
from django.test.utils import CaptureQueriesContext

from core.api.scopes import Scope
from notifications import app_receipts
from notifications.inbox import store
from notifications.inbox.models import InboxCounts, InboxItem
from notifications.lifecycle import archive
from notifications.models import APIClient, DeliveryAttempt, DeliveryEvent, Notification, NotificationHistory
from notifications.readers import readable_archived_notifications, readable_live_notifications
from preferences.models import Device, Recipient
from tests.conftest import EVERY_SCOPE
from tests.test_app_receipts import NOT_FOUND
from tests.test_archive import _waiting_on_a_lock, where
from tests.test_history_plans import DAYS, aged, notification_scans  # noqa: F401 - aged: a fixture

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=7)


@pytest.fixture
def owner():
    return APIClient.objects.create_key(name="app-backend", scopes=EVERY_SCOPE)


@pytest.fixture
def http(owner):
    return Client(headers={"Authorization": f"Api-Key {owner[1]}"})


def post(http, nid, body) -> tuple[int, dict]:
    r = http.post(f"/v1/notifications/{nid}/receipts", data=json.dumps(body), content_type="application/json")
    return r.status_code, r.json()


def push(client, status: str = "sent", channel: str = "push", reason: str = "") -> Notification:
    """A push (or ``channel``) sent at T0 to a fresh user with one device: ``accepted`` then its call."""
    uid = f"u-{uuid.uuid4().hex[:8]}"
    r = Recipient.objects.create(user_id=uid, email=f"{uid}@example.com", phone="+4915112345678")
    device = Device.objects.create(recipient=r, platform="android", push_token=f"tok-{uid}")
    n = Notification.objects.create(id=uuid.uuid4(), client=client, recipient=r, channel=channel, title="t",
                                    body="b", status=status, reason=reason, attempts=1, provider="fcm",
                                    sent_at=T0, created_at=T0 - timedelta(seconds=2), updated_at=T0)
    DeliveryEvent.objects.create(notification=n, kind="accepted", status="queued", created_at=T0 - timedelta(seconds=2))
    DeliveryAttempt.objects.create(notification=n, number=1, provider="fcm", device=device, outcome="accepted",
                                   provider_message_id="projects/p/messages/1", created_at=T0)
    return n


def archived(*rows: Notification) -> None:
    assert archive.archive(NOW, 100) == len(rows)
    assert where(*rows) == ["history"] * len(rows)


def shown(http, nid) -> tuple[str, list[tuple]]:
    body = http.get(f"/v1/notifications/{nid}").json()
    return body["status"], [(e["kind"], e["status"], e["at"]) for e in body["timeline"]]


def history_row(n: Notification) -> NotificationHistory:
    return NotificationHistory.objects.get(pk=n.pk)


# --- the receipt reaches the history ---------------------------------------------------------------

def test_displayed_then_opened_of_an_archived_push_move_it_in_the_history(http, owner, frozen):
    n = push(owner[0])
    archived(n)
    frozen[0] = NOW + timedelta(hours=10)  # opened the next morning
    displayed_at, opened_at = NOW + timedelta(hours=9), NOW + timedelta(hours=10)
    assert post(http, n.pk, {"event": "displayed", "at": displayed_at.isoformat()}) == (201, {
        "id": str(n.pk), "event": "displayed", "duplicate": False, "status": "displayed", "status_changed": True,
        "at": "2026-11-03T01:00:00Z"})
    assert post(http, n.pk, {"event": "opened"}) == (201, {
        "id": str(n.pk), "event": "opened", "duplicate": False, "status": "opened", "status_changed": True,
        "at": "2026-11-03T02:00:00Z"})
    assert where(n) == ["history"]  # written where it lives, never moved back
    moved = history_row(n)
    assert (moved.status, moved.updated_at, moved.created_at) == ("opened", opened_at, n.created_at)
    assert shown(http, n.pk) == ("opened", [
        ("accepted", "queued", "2026-11-02T08:59:58Z"), ("sent", "sent", "2026-11-02T09:00:00Z"),
        ("app_displayed", "displayed", "2026-11-03T01:00:00Z"), ("app_opened", "opened", "2026-11-03T02:00:00Z")])
    assert list(DeliveryEvent.objects.filter(notification_id=n.pk, kind__startswith="app_").order_by("id")
                .values_list("kind", "status", "dedup_key", "detail")) == [
        ("app_displayed", "displayed", f"app:{n.pk}:displayed", "reported by the app: displayed; sent → displayed"),
        ("app_opened", "opened", f"app:{n.pk}:opened", "reported by the app: opened; displayed → opened")]


def test_the_same_receipt_twice_for_an_archived_row_is_one_change(http, owner, frozen):
    n = push(owner[0])
    archived(n)
    assert post(http, n.pk, {"event": "opened"})[0] == 201
    frozen[0] = NOW + timedelta(minutes=5)
    assert post(http, n.pk, {"event": "opened"}) == (200, {
        "id": str(n.pk), "event": "opened", "duplicate": True, "status": "opened", "status_changed": False,
        "at": "2026-11-02T16:00:00Z"})
    assert (history_row(n).status, history_row(n).updated_at) == ("opened", NOW)
    assert DeliveryEvent.objects.filter(notification_id=n.pk, kind="app_opened").count() == 1


@pytest.mark.parametrize(("events", "final"), [
    (["opened", "dismissed"], "opened"),  # dismissed after opened changes nothing
    (["dismissed", "opened"], "opened"),
    (["displayed", "dismissed"], "dismissed"),
    (["dismissed", "displayed"], "dismissed"),
])
def test_the_ladder_and_dismissal_rules_hold_in_the_history(http, owner, frozen, events, final):
    moved = push(owner[0])
    archived(moved)
    live = push(owner[0])  # the control
    for event in events:
        assert post(http, live.pk, {"event": event})[0] == post(http, moved.pk, {"event": event})[0] == 201
    assert Notification.objects.get(pk=live.pk).status == history_row(moved).status == final
    assert DeliveryEvent.objects.filter(notification_id=moved.pk, kind__startswith="app_").count() == 2


@pytest.mark.parametrize(("status", "reason", "code"), [("failed", "provider_undelivered", "notification_failed"),
                                                        ("suppressed", "opted_out", "notification_suppressed"),
                                                        ("cancelled", "", "notification_cancelled")])
def test_an_archived_notification_never_reached_is_409_as_live_and_nothing_changes(http, owner, frozen, status,
                                                                                   reason, code):
    n = push(owner[0], status=status, reason=reason)
    archived(n)
    got, body = post(http, n.pk, {"event": "opened"})
    assert (got, body["error"]["code"], [f["code"] for f in body["error"]["fields"]]) == (409, "conflict", [code])
    assert history_row(n).status == status
    assert not DeliveryEvent.objects.filter(notification_id=n.pk, kind__startswith="app_").exists()


def test_an_archived_sms_is_422_not_app_channel_as_live(http, owner, frozen):
    n = push(owner[0], channel="sms")
    archived(n)
    got, body = post(http, n.pk, {"event": "displayed"})
    assert (got, [(f["field"], f["code"]) for f in body["error"]["fields"]]) == (422, [("event", "not_app_channel")])
    assert history_row(n).status == "sent"


# --- who may report it ------------------------------------------------------------------------------

def test_another_clients_key_gets_the_live_answer_for_an_archived_row_and_its_owner_applies_it(http, owner, frozen):
    other, other_key = APIClient.objects.create_key(name="someone-else", scopes=EVERY_SCOPE)
    mine, others = push(owner[0]), push(other)
    archived(mine, others)
    intruder = Client(headers={"Authorization": f"Api-Key {other_key}"})
    events = DeliveryEvent.objects.count()
    assert post(intruder, mine.pk, {"event": "opened"}) == (404, NOT_FOUND)
    assert post(intruder, uuid.uuid4(), {"event": "opened"}) == (404, NOT_FOUND)
    assert (history_row(mine).status, DeliveryEvent.objects.count()) == ("sent", events)
    assert post(http, mine.pk, {"event": "opened"})[0] == 201  # its owner's key reaches it
    assert post(intruder, others.pk, {"event": "opened"})[0] == 201  # and the other key its own
    assert (history_row(mine).status, history_row(others).status) == ("opened", "opened")


# --- the inbox ----------------------------------------------------------------------------------------

def in_app(r: Recipient) -> Notification:
    n = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="in_app", status="sent", body="b",
                                    created_at=T0, updated_at=T0)
    store.write([store.NewItem(n.pk, r.pk, "", "", "t", "b", None, T0, None)])
    return n


def test_an_inbox_mark_by_ids_of_an_archived_notification_does_what_it_does_live(frozen):
    r = Recipient.objects.create(user_id=f"inbox-{uuid.uuid4().hex[:8]}")
    old = in_app(r)
    archived(old)
    young = in_app(r)  # live: the control
    _, key = APIClient.objects.create_key(name="app", scopes=[Scope.INBOX])
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    marked = http.post(f"/v1/users/{r.pk}/inbox/mark", content_type="application/json",
                       data=json.dumps({"ids": [str(old.pk), str(young.pk)], "status": "read"}))
    assert (marked.status_code, marked.json()) == (200, {"changed": 2, "more": False})
    assert {i: (seen, read) for i, seen, read in InboxItem.objects.filter(recipient=r).values_list(
        "notification_id", "seen_at", "read_at")} == {old.pk: (NOW, NOW), young.pk: (NOW, NOW)}
    assert InboxCounts.objects.filter(pk=r.pk).values("total", "unread", "unseen").get() == {
        "total": 2, "unread": 0, "unseen": 0}
    assert (history_row(old).status, Notification.objects.get(pk=young.pk).status) == ("opened", "opened")
    for n in (old, young):
        assert list(DeliveryEvent.objects.filter(notification_id=n.pk).values_list("kind", "status")) == [
            ("app_opened", "opened")]


def test_an_app_receipt_of_an_archived_in_app_notification_marks_its_item(http, owner, frozen):
    r = Recipient.objects.create(user_id=f"inbox-{uuid.uuid4().hex[:8]}")
    n = in_app(r)
    Notification.objects.filter(pk=n.pk).update(client=owner[0])
    archived(n)
    assert post(http, n.pk, {"event": "dismissed"})[0] == 201
    assert InboxItem.objects.filter(pk=n.pk).values_list("archived_at", flat=True).get() == NOW
    assert InboxCounts.objects.filter(pk=r.pk).values("total", "unread", "unseen").get() == {
        "total": 0, "unread": 0, "unseen": 0}
    assert history_row(n).status == "dismissed"


# --- the archiver racing the receipt -------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_receipt_that_waited_for_the_archiver_applies_it_in_the_history(monkeypatch):
    monkeypatch.setattr("core.clock.now", lambda: NOW)
    client, _ = APIClient.objects.create_key(name="race", scopes=EVERY_SCOPE)
    n = push(client)
    moving, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def archiver():
        try:
            with transaction.atomic():
                outcome["moved"] = archive.archive(NOW, 100)
                moving.set()
                release.wait(15)
        finally:
            connection.close()

    def receipt():
        try:
            applied = app_receipts.apply_app_receipt(
                readable_live_notifications(client).filter(pk=n.pk), "opened",
                archived=readable_archived_notifications(client).filter(pk=n.pk))
            outcome["receipt"] = (applied.status_changed, applied.notification.status)
        finally:
            connection.close()

    a = threading.Thread(target=archiver)
    a.start()
    assert moving.wait(15)
    b = threading.Thread(target=receipt)
    b.start()
    _waiting_on_a_lock()  # the receipt found the row live and waits on the archiver's lock
    release.set()
    a.join(15)
    b.join(15)
    assert outcome == {"moved": 1, "receipt": (True, "opened")}
    assert where(n) == ["history"]
    assert history_row(n).status == "opened"
    assert list(DeliveryEvent.objects.filter(notification_id=n.pk, kind__startswith="app_")
                .values_list("kind", "status")) == [("app_opened", "opened")]


# --- what the lookup costs ------------------------------------------------------------------------------

def test_the_archived_lookup_probes_each_partitions_primary_key(aged):  # noqa: F811 - the fixture
    client, nid = aged["client"], aged["id"]
    with CaptureQueriesContext(connection) as ran, pytest.raises(app_receipts.WrongChannel):  # an sms
        app_receipts.apply_app_receipt(readable_live_notifications(client).filter(pk=nid), "opened",
                                       archived=readable_archived_notifications(client).filter(pk=nid))
    (lookup,) = [q["sql"] for q in ran.captured_queries if "notifications_notificationhistory" in q["sql"]]
    assert "FOR NO KEY UPDATE" in lookup
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN {lookup}")
        plan = "\n".join(row[0] for row in cur.fetchall())
    scans = notification_scans(plan)
    assert not [s for s in scans if "Seq Scan" in s], plan
    assert all("pkey" in s for s in scans), plan
    assert len(scans) == DAYS + 1, plan  # ten days and DEFAULT: a key probe each
