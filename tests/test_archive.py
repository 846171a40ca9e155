"""The archiver and the writes that must reach archived rows (docs/ARCHITECTURE.md, "Where a row
lives"): which rows move and when, the move racing a receipt or a claim, provider receipts, erasure,
idempotent retries and cancels of a row that is no longer live."""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, connections, transaction
from django.test import Client

from campaigns.models import Campaign, Segment
from notifications import lifecycle, scheduler
from notifications.lifecycle import archive
from notifications.lifecycle.table import TRANSITIONS, Cause
from notifications.models import (
    DeliveryAttempt,
    DeliveryEvent,
    Notification,
    NotificationHistory,
    NotificationRecord,
    Status,
    TimelineEntry,
)
from notifications.receipts import apply_receipts
from preferences.api.erasure import erase_user
from preferences.models import Recipient
from providers.receipts import DELIVERED, Receipt
from tests.conftest import make_client
from tests.test_webhooks import _public_url, sg_event, sg_key, sg_post, twilio_post  # noqa: F401 - fixtures

#: The platform clock of the tests using ``frozen``: rows are made at T0, the clock stands 7 h later.
T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(hours=7)


def recipient(prefix: str = "arc") -> Recipient:
    uid = f"{prefix}-{uuid.uuid4().hex[:8]}"
    return Recipient.objects.create(user_id=uid, email=f"{uid}@example.com", phone="+4915112345678")


def row(status: str = "sent", *, r: Recipient | None = None, at: datetime = T0, channel: str = "sms",
        **fields) -> Notification:
    return Notification.objects.create(
        id=uuid.uuid4(), recipient=r or recipient(), channel=channel, body="hello", status=status,
        provider_message_id=fields.pop("provider_message_id", f"SM{uuid.uuid4().hex}"), created_at=at,
        updated_at=at, **fields)


def where(*rows: Notification) -> list[str]:
    """Where each row lives now: ``live``, ``history`` (or ``both``/``gone``: never right)."""
    out = []
    for n in rows:
        live = Notification.objects.filter(pk=n.pk).exists()
        moved = NotificationHistory.objects.filter(pk=n.pk).count()
        out.append({(True, 0): "live", (False, 1): "history", (False, 0): "gone"}.get((live, moved), "both"))
    return out


# --- what moves, and when -----------------------------------------------------------------------

@pytest.mark.django_db
def test_the_archiver_moves_finished_rows_once_the_platform_clock_passes_hot_hours(frozen):
    finished = [row(s) for s in ("sent", "delivered", "failed", "suppressed", "expired", "cancelled", "opened")]
    moving = [row(s) for s in ("scheduled", "queued", "sending")]
    frozen[0] = T0 + timedelta(hours=5, minutes=59)
    assert scheduler.archive() == 0
    assert where(*finished, *moving) == ["live"] * 10
    frozen[0] = T0 + timedelta(hours=6, seconds=1)
    assert scheduler.archive() == 7
    assert where(*finished) == ["history"] * 7
    assert where(*moving) == ["live"] * 3
    kept = NotificationHistory.objects.get(pk=finished[1].pk)
    assert (kept.status, kept.body, kept.created_at, kept.recipient_id) == ("delivered", "hello", T0,
                                                                          finished[1].recipient_id)
    assert scheduler.archive() == 0  # nothing twice


@pytest.mark.django_db
def test_a_row_changed_within_hot_hours_stays_however_old_it_is(frozen):
    n = row("delivered", at=T0 - timedelta(days=3))
    Notification.objects.filter(pk=n.pk).update(updated_at=NOW - timedelta(hours=1))
    assert scheduler.archive() == 0
    assert where(n) == ["live"]


@pytest.mark.django_db
def test_dead_letters_stay_until_replayed_or_dead_letter_days(frozen, settings):
    young = row("failed", dead_lettered_at=T0, reason="attempts_exhausted")
    old = row("failed", at=T0 - timedelta(days=15), dead_lettered_at=T0 - timedelta(days=15),
              reason="attempts_exhausted")
    replayed_then_failed = row("failed", reason="provider_undelivered")  # dead_lettered_at cleared by its replay
    assert scheduler.archive() == 2
    assert where(young, old, replayed_then_failed) == ["live", "history", "history"]
    frozen[0] = T0 + timedelta(days=settings.NOTIFY["DEAD_LETTER_DAYS"], seconds=1)
    assert scheduler.archive() == 1
    assert where(young) == ["history"]


@pytest.mark.django_db
def test_a_row_of_a_campaign_still_fanning_out_stays(frozen):
    segment = Segment.objects.create(name="s")
    fanning = Campaign.objects.create(segment=segment, channel="sms", body="x", status="fanning_out")
    done = Campaign.objects.create(segment=segment, channel="sms", body="x", status="sending")
    a, b = row(campaign_id=fanning.pk), row(campaign_id=done.pk)
    assert scheduler.archive() == 1
    assert where(a, b) == ["live", "history"]
    Campaign.objects.filter(pk=fanning.pk).update(status="sending")
    assert scheduler.archive() == 1
    assert where(a) == ["history"]


@pytest.mark.django_db
def test_a_fallback_pair_moves_only_when_its_partner_no_longer_moves(frozen):
    from notifications.events.models import Event, NotificationType

    kind = NotificationType.objects.create(key=f"t{uuid.uuid4().hex[:6]}", name="t", channels=["push", "sms"],
                                           routing="fallback")
    r = recipient()
    event = Event.objects.create(id=uuid.uuid4(), client=make_client()[0], type=kind, user_ids=[r.user_id],
                                 channels=["push", "sms"])
    first = row("failed", r=r, event=event, channel="push", reason="contact_invalid")
    waiting = row("scheduled", r=r, event=event, reason="fallback_waiting", fallback_after=first.pk)
    sent = row("sent", r=r, event=event, channel="push")
    not_needed = row("suppressed", r=r, event=event, reason="fallback_not_needed", fallback_after=sent.pk)
    assert scheduler.archive() == 1  # only `sent`: the waiting one holds `first`, `sent` holds `not_needed`
    assert where(first, waiting, sent, not_needed) == ["live", "live", "history", "live"]
    assert scheduler.archive() == 1  # its predecessor gone, the channel behind it follows
    assert where(not_needed) == ["history"]
    lifecycle.fallback([first.pk], Status.QUEUED, "", "released", NOW)  # the waiting one is released
    assert scheduler.archive() == 1
    assert where(first, waiting) == ["history", "live"]
    digest_first = row("failed", r=r, channel="push", reason="contact_invalid")  # a digest's: no event
    row("scheduled", r=r, reason="fallback_waiting", fallback_after=digest_first.pk)
    assert scheduler.archive() == 0
    assert where(digest_first) == ["live"]


def test_finished_is_what_no_step_of_the_send_path_leaves():
    send_path = {Cause.CLAIM, Cause.RECORD, Cause.LEASE_EXPIRY, Cause.SCHEDULER}
    left_by_send_path = {s for t in TRANSITIONS if t.cause in send_path for s in t.sources}
    assert set(lifecycle.FINISHED) == set(Status.values) - left_by_send_path
    leaving = {t.cause for t in TRANSITIONS if set(t.sources) & set(lifecycle.FINISHED)}
    assert leaving == {Cause.PROVIDER_RECEIPT, Cause.APP_RECEIPT, Cause.REPLAY, Cause.FALLBACK, Cause.EVENT_CANCEL,
                       Cause.ERASURE}


@pytest.mark.django_db
def test_a_batch_is_an_index_scan_of_the_live_table_never_a_seq_scan():
    row("sent")
    params = {"cutoff": NOW, "expired": NOW, "limit": 5000, "archived_at": NOW}
    for candidates, order in ((archive.FINISHED_ROWS, "updated_at"), (archive.EXPIRED_DEAD_LETTERS,
                                                                      "dead_lettered_at")):
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute("SET LOCAL enable_seqscan = off")
            cur.execute("EXPLAIN " + archive._move_sql(candidates, order), params)
            plan = "\n".join(r[0] for r in cur.fetchall())
        assert "Seq Scan on notifications_notification" not in plan, plan
        assert "Index Scan using notification_" in plan or "Bitmap Index Scan on notification_" in plan, plan
        if order == "updated_at":
            # A plain or a bitmap index scan, as the test database's statistics make it (both read
            # the finished index, never the table; a bitmap scan failed a full run once).
            assert ("Index Scan using notification_finished_idx on notifications_notification n" in plan
                    or "Bitmap Index Scan on notification_finished_idx" in plan), plan


# --- the move racing other writers --------------------------------------------------------------

def _waiting_on_a_lock(timeout: float = 10.0) -> None:
    """Until another backend waits on a row lock (the receipt's UPDATE behind the archiver's DELETE)."""
    with connections["default"].cursor() as cur:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            cur.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                        "AND datname = current_database()")
            if cur.fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the receipt never waited for the archiver")


@pytest.mark.django_db(transaction=True)
def test_a_receipt_that_found_the_row_live_applies_it_in_the_history_when_the_archiver_won(monkeypatch):
    monkeypatch.setattr("core.clock.now", lambda: NOW)
    n = row("sent")
    archived, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def archiver():
        try:
            with transaction.atomic():
                outcome["moved"] = archive.archive(NOW, 100)
                archived.set()
                release.wait(15)
        finally:
            connection.close()

    def receipt():
        try:
            outcome["receipt"] = apply_receipts([Receipt(
                provider="twilio", dedup_key=f"twilio:{n.provider_message_id}:delivered", kind=DELIVERED,
                raw="delivered", provider_message_id=n.provider_message_id, received_at=NOW)])
        finally:
            connection.close()

    a = threading.Thread(target=archiver)
    a.start()
    assert archived.wait(15)
    b = threading.Thread(target=receipt)
    b.start()
    _waiting_on_a_lock()  # the receipt found the row live and waits on the archiver's lock
    release.set()
    a.join(15)
    b.join(15)
    assert outcome == {"moved": 1, "receipt": {"applied": 1, "duplicate": 0, "unknown": 0}}
    assert where(n) == ["history"]
    moved = NotificationHistory.objects.get(pk=n.pk)
    assert (moved.status, moved.delivered_at) == ("delivered", NOW)
    assert list(DeliveryEvent.objects.filter(notification_id=n.pk).values_list("kind", "status")) == [
        ("receipt:delivered", "delivered")]


@pytest.mark.django_db(transaction=True)
def test_archive_and_claim_at_once_lose_and_duplicate_nothing():
    r = recipient()
    done = [row("delivered", r=r) for _ in range(60)]
    queued = [row("queued", r=r) for _ in range(60)]
    results: dict = {}

    def run(name, work):
        try:
            results[name] = work()
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=("archive", lambda: archive.archive(NOW, 1000))),
               threading.Thread(target=run, args=("claim", lambda: lifecycle.claim(
                   [str(n.pk) for n in queued + done], NOW + timedelta(seconds=30), NOW)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results["archive"] == 60 and len(results["claim"]) == 60
    assert where(*done) == ["history"] * 60
    assert where(*queued) == ["live"] * 60
    assert set(Notification.objects.filter(recipient=r).values_list("status", flat=True)) == {"sending"}
    assert NotificationRecord.objects.filter(recipient=r).count() == 120


# --- receipts, erasure, idempotency and cancels of an archived row ------------------------------

@pytest.mark.django_db
def test_a_twilio_receipt_for_an_archived_row_moves_the_history_row(frozen):
    n = row("sent", channel="sms")
    assert archive.archive(NOW, 100) == 1
    assert twilio_post(n, "undelivered", code="30006").status_code == 204
    moved = NotificationHistory.objects.get(pk=n.pk)
    assert (moved.status, moved.reason) == ("failed", "provider_undelivered")
    assert "30006" in moved.reason_detail
    assert twilio_post(n, "delivered").status_code == 204  # the provider's last word, as for a live row
    moved = NotificationHistory.objects.get(pk=n.pk)
    assert (moved.status, moved.reason, moved.reason_detail) == ("delivered", "", "")
    assert where(n) == ["history"]
    assert list(DeliveryEvent.objects.filter(notification_id=n.pk).order_by("id").values_list("kind", "status")) == [
        ("receipt:undelivered", "failed"), ("receipt:delivered", "delivered")]


@pytest.mark.django_db
def test_a_sendgrid_receipt_for_an_archived_row_moves_the_history_row_by_its_message_id(frozen, sg_key):  # noqa: F811
    n = row("sent", channel="email")
    assert archive.archive(NOW, 100) == 1
    event = sg_event(n, "delivered")
    del event["notification_id"]  # found by the provider's message id and the address
    assert sg_post(sg_key, [event]).status_code == 204
    assert NotificationHistory.objects.get(pk=n.pk).status == "delivered"
    assert where(n) == ["history"]


@pytest.mark.django_db
def test_a_receipt_past_the_receipt_window_is_unknown(frozen):
    n = row("sent")
    assert archive.archive(NOW, 100) == 1
    frozen[0] = NOW + archive.RECEIPT_WINDOW + timedelta(seconds=1)  # 72 h after it was archived
    assert twilio_post(n, "delivered").status_code == 204
    assert NotificationHistory.objects.get(pk=n.pk).status == "sent"
    assert not DeliveryEvent.objects.filter(notification_id=n.pk).exists()


@pytest.mark.django_db
def test_erasure_scrubs_an_archived_rows_content_and_its_log(frozen):
    r = recipient()
    n = row("failed", r=r, title="Hi", reason="provider_undelivered",
            reason_detail=f"twilio undelivered to {r.phone}")
    DeliveryAttempt.objects.create(notification=n, number=1, provider="twilio", outcome="permanent",
                                   error_message=f"refused {r.phone}")
    assert archive.archive(NOW, 100) == 1
    erase_user(r, requested_by="test")
    moved = NotificationHistory.objects.get(pk=n.pk)
    assert (moved.title, moved.body, moved.data, moved.status) == ("", "", None, "failed")
    assert r.phone not in moved.reason_detail and "[erased]" in moved.reason_detail
    assert DeliveryAttempt.objects.get(notification_id=n.pk).error_message == "refused [erased]"


def _send(http, key: str, body: str = "Your code is 1"):
    return http.post("/v1/notifications", data=json.dumps({"user_id": "arc-idem", "channel": "sms",
                                                           "content": {"body": body}}),
                     content_type="application/json", headers={"Idempotency-Key": key})


@pytest.mark.django_db
def test_an_idempotent_retry_after_archive_answers_the_original_and_creates_nothing(frozen):
    Recipient.objects.create(user_id="arc-idem", phone="+4915112345678")
    client, key = make_client()
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    frozen[0] = T0
    first = _send(http, "k-1")
    assert first.status_code == 202
    # Recorded sent by a worker; made at T0 (the model's default clock is the host's, not the frozen one).
    Notification.objects.filter(pk=first.json()["id"]).update(status="sent", created_at=T0, updated_at=T0)
    frozen[0] = NOW
    assert archive.archive(NOW, 100) == 1
    again = _send(http, "k-1")
    assert (again.status_code, again.json(), again.headers["Idempotent-Replayed"]) == (202, first.json(), "true")
    assert (Notification.objects.filter(client=client).count(),
            NotificationHistory.objects.filter(client=client).count()) == (0, 1)
    assert DeliveryEvent.objects.filter(notification_id=first.json()["id"]).count() == 1  # the first's `accepted`
    reused = _send(http, "k-1", body="another body")
    assert (reused.status_code, reused.json()["error"]["fields"]) == (422, [{
        "field": "Idempotency-Key", "code": "idempotency_key_reused",
        "message": "this Idempotency-Key was already used with a different request body"}])
    assert (Notification.objects.filter(client=client).count(),
            NotificationHistory.objects.filter(client=client).count()) == (0, 1)


@pytest.mark.django_db
def test_cancel_of_an_archived_row_is_a_409_as_for_a_finished_one(frozen):
    Recipient.objects.create(user_id="arc-idem", phone="+4915112345678")
    _client, key = make_client()
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    frozen[0] = T0
    nid = _send(http, "k-cancel").json()["id"]
    Notification.objects.filter(pk=nid).update(status="delivered", created_at=T0, updated_at=T0)
    frozen[0] = NOW
    assert archive.archive(NOW, 100) == 1
    r = http.post(f"/v1/notifications/{nid}/cancel")
    assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["fields"]) == (409, "conflict", [{
        "field": "status", "code": "not_cancellable",
        "message": "notification is delivered; only scheduled or queued ones can be cancelled"}])
    assert http.post(f"/v1/notifications/{uuid.uuid4()}/cancel").status_code == 404


@pytest.mark.django_db
def test_an_archived_rows_timeline_and_attempts_stay_readable(frozen):
    n = row("sent")
    DeliveryEvent.objects.create(notification=n, kind="accepted", status="queued", created_at=T0)
    DeliveryAttempt.objects.create(notification=n, number=1, provider="twilio", outcome="accepted",
                                   created_at=T0 + timedelta(seconds=1))
    assert archive.archive(NOW, 100) == 1
    assert list(TimelineEntry.objects.filter(notification_id=n.pk).values_list("kind", flat=True)) == [
        "accepted", "sent"]
    assert list(DeliveryAttempt.objects.filter(notification_id=n.pk).values_list("outcome", flat=True)) == [
        "accepted"]


@pytest.mark.django_db
def test_a_typed_send_and_an_event_retried_after_archive_answer_as_the_first_time(frozen):
    from tests.test_events_api import make_type

    kind = make_type(key=f"shipped_{uuid.uuid4().hex[:6]}", channels=("sms",))
    Recipient.objects.create(user_id="arc-idem", phone="+4915112345678")
    client, key = make_client()
    http = Client(headers={"Authorization": f"Api-Key {key}"})

    def typed():
        return http.post("/v1/notifications", data=json.dumps({"user_id": "arc-idem", "channel": "sms",
                                                               "type": kind.key, "data": {"order_id": "1"}}),
                         content_type="application/json", headers={"Idempotency-Key": "typed-1"})

    def event():
        return http.post("/v1/events", data=json.dumps({"type": kind.key, "user_id": "arc-idem",
                                                        "data": {"order_id": "2"}}),
                         content_type="application/json", headers={"Idempotency-Key": "event-1"})

    frozen[0] = T0
    first_typed, first_event = typed(), event()
    assert (first_typed.status_code, first_event.status_code) == (202, 202)
    Notification.objects.filter(client=client).update(status="sent", created_at=T0, updated_at=T0)
    frozen[0] = NOW
    assert archive.archive(NOW, 100) == 2
    again_typed, again_event = typed(), event()
    assert (again_typed.status_code, again_typed.json(), again_typed.headers["Idempotent-Replayed"]) == (
        202, first_typed.json(), "true")
    assert (again_event.status_code, again_event.json(), again_event.headers["Idempotent-Replayed"]) == (
        202, first_event.json(), "true")
    assert (Notification.objects.filter(client=client).count(),
            NotificationHistory.objects.filter(client=client).count()) == (0, 2)
    frozen[0] = NOW + timedelta(days=60)  # the old one-week window answered 500 here (event key taken)
    late = typed()
    assert (late.status_code, late.json(), late.headers["Idempotent-Replayed"]) == (202, first_typed.json(), "true")
    NotificationHistory.objects.filter(client=client, event__isnull=False, idempotency_key="typed-1").delete()
    spent = typed()  # its row dropped with its day partition; its event row remains: the key is spent
    assert (spent.status_code, spent.json()["error"]["fields"][0]["code"]) == (422, "idempotency_key_reused")


@pytest.mark.django_db(transaction=True)
def test_a_retry_racing_the_archiver_waits_for_the_move_and_answers_the_original(monkeypatch):
    from notifications import services

    monkeypatch.setattr("core.clock.now", lambda: NOW)
    client, _key = make_client()
    r = recipient()
    send = {"client": client, "idempotency_key": "race-1", "fingerprint": "rf-same", "recipient": r,
            "channel": "sms", "priority": "standard", "content": {"body": "hello"}}
    first = services.accept_notification(**send).notification
    Notification.objects.filter(pk=first.pk).update(status="sent", created_at=T0, updated_at=T0)
    archived, release = threading.Event(), threading.Event()
    outcome: dict = {}

    def archiver():
        try:
            with transaction.atomic():
                outcome["moved"] = archive.archive(NOW, 100)
                archived.set()
                release.wait(15)
        finally:
            connection.close()

    def retry():
        try:
            result = services.accept_notification(**send)
            outcome["retry"] = (result.replayed, result.notification.pk, result.notification.archived)
        finally:
            connection.close()

    a = threading.Thread(target=archiver)
    a.start()
    assert archived.wait(15)
    b = threading.Thread(target=retry)
    b.start()
    _waiting_on_a_lock()  # the retry's INSERT waits for the archiver's DELETE to commit or roll back
    release.set()
    a.join(15)
    b.join(15)
    assert outcome == {"moved": 1, "retry": (True, first.pk, True)}
    assert (Notification.objects.filter(client=client).count(),
            NotificationHistory.objects.filter(client=client).count()) == (0, 1)
    assert DeliveryEvent.objects.filter(notification_id=first.pk).count() == 1  # the first's `accepted` only


def test_beat_runs_the_archiver_every_minute_on_the_maintenance_queue(settings):
    from config.celery import app

    app.loader.import_default_modules()
    entry = settings.CELERY_BEAT_SCHEDULE["archive-notifications"]
    assert (entry["task"], entry["schedule"], entry["options"]["queue"]) == ("notifications.archive", 60.0,
                                                                             "maintenance")
    assert entry["task"] in app.tasks
    assert settings.NOTIFY["RETENTION_DAYS"]["notifications_notificationhistory"] == 90


@pytest.mark.django_db
def test_the_gate_sees_an_archived_request_as_a_replay_so_no_limit_is_charged(settings):
    from notifications.admission import Admission, Road, admit

    n = row("sent", at=NOW - timedelta(days=6))
    assert archive.archive(NOW, 100) == 1
    asked = Admission(road=Road.SINGLE, now=NOW, request=(Notification, n.pk))
    assert admit(asked).replayed is True
    later = Admission(road=Road.SINGLE, now=NOW + timedelta(days=60), request=(Notification, n.pk))
    assert admit(later).replayed is True  # a key lives as long as its row: never a second row of one id
