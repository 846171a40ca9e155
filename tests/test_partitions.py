"""The partition manager (core/partitions.py) against the real, migrated database: days created
ahead of the platform clock, strays moved out of DEFAULT, whole partitions dropped past their
retention, the clock moved between runs, two runs at once, a registry naming a plain table."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, date, datetime, timedelta

import pytest
from django.db import connection, connections

from core import partitions
from notifications.models import APIAuditEntry, APIClient, DeliveryAttempt, DeliveryEvent, Notification
from preferences.models import Recipient

NOW = datetime(2031, 3, 10, 12, 0, tzinfo=UTC)
ATTEMPTS, EVENTS, AUDIT = "notifications_deliveryattempt", "notifications_deliveryevent", "notifications_apiauditentry"
HISTORY = "notifications_notificationhistory"
#: Every registered table, in the registry's order (config/settings.py).
REGISTERED = (HISTORY, ATTEMPTS, EVENTS, AUDIT)
AHEAD = [date(2031, 3, 10) + timedelta(days=n) for n in range(8)]


def names(table: str) -> list[str]:
    """The partitions of ``table`` as Postgres lists them."""
    with connection.cursor() as cur:
        cur.execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                    "WHERE i.inhparent = %s::regclass ORDER BY 1", [table])
        return [r[0] for r in cur.fetchall()]


def count(relation: str) -> int:
    with connection.cursor() as cur:
        cur.execute(f"SELECT count(*) FROM ONLY {relation}")
        return cur.fetchone()[0]


def notification(created_at: datetime) -> Notification:
    uid = f"p-{uuid.uuid4().hex[:8]}"
    r = Recipient.objects.create(user_id=uid, email=f"{uid}@example.com")
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="email", body="b", created_at=created_at)


def attempt(n: Notification, at: datetime) -> DeliveryAttempt:
    return DeliveryAttempt.objects.create(notification=n, number=1, provider="sendgrid", outcome="accepted",
                                          created_at=at)


def day_names(table: str, days: list[date]) -> list[str]:
    return [partitions.partition_name(table, d) for d in days]


@pytest.mark.django_db
def test_each_registered_table_gets_todays_and_seven_days_ahead_of_the_platform_clock(frozen):
    run = partitions.maintain()

    assert [t.table for t in run.tables] == list(REGISTERED)
    for t in run.tables:
        assert t.created == tuple(day_names(t.table, AHEAD))
        assert (t.moved, t.dropped, t.expired_in_default) == ({}, (), 0)
        assert names(t.table) == sorted([*day_names(t.table, AHEAD), f"{t.table}_default"])
    again = partitions.maintain()
    assert [(t.created, t.dropped) for t in again.tables] == [((), ())] * len(REGISTERED)
    assert partitions.last_run()["outcome"] == "ok"
    assert partitions.last_run()["success_at"] == NOW


@pytest.mark.django_db
def test_rows_of_a_past_day_in_default_move_into_that_days_new_partition(frozen):
    partitions.maintain()
    n = notification(NOW - timedelta(days=5))
    stray = [attempt(n, NOW - timedelta(days=3, hours=h)) for h in (1, 2)]
    expired = attempt(n, NOW - timedelta(days=40))  # attempts are kept 30 days
    event = DeliveryEvent.objects.create(notification=n, kind="accepted", created_at=NOW - timedelta(days=3))
    assert count(f"{ATTEMPTS}_default") == 3 and count(f"{EVENTS}_default") == 1

    run = partitions.maintain()

    by_table = {t.table: t for t in run.tables}
    assert by_table[ATTEMPTS].created == (f"{ATTEMPTS}_p20310307",)
    assert by_table[ATTEMPTS].moved == {f"{ATTEMPTS}_p20310307": 2}
    assert by_table[ATTEMPTS].expired_in_default == 1
    assert by_table[EVENTS].moved == {f"{EVENTS}_p20310307": 1}
    assert count(f"{ATTEMPTS}_default") == 0 and count(f"{EVENTS}_default") == 0
    assert count(f"{ATTEMPTS}_p20310307") == 2 and count(f"{EVENTS}_p20310307") == 1
    assert sorted(DeliveryAttempt.objects.values_list("id", flat=True)) == sorted(a.pk for a in stray)
    assert not DeliveryAttempt.objects.filter(pk=expired.pk).exists()
    assert DeliveryEvent.objects.get(pk=event.pk).notification_id == n.pk
    # The sequence goes on past the moved rows: a new row gets a new id.
    assert attempt(n, NOW).pk > max(a.pk for a in stray)


@pytest.mark.django_db
def test_the_clock_moved_forward_drops_whole_partitions_past_retention_and_keeps_younger_rows(frozen):
    partitions.maintain()
    n = notification(NOW)
    old = attempt(n, NOW + timedelta(hours=1))            # 2031-03-10
    young = attempt(n, NOW + timedelta(days=6))           # 2031-03-16
    event = DeliveryEvent.objects.create(notification=n, kind="accepted", created_at=NOW)

    frozen[0] = NOW + timedelta(days=36)  # 2031-04-15 12:00: attempts kept since 2031-03-16 12:00
    with connection.cursor() as cur:  # as if committed (deferred FK checks): beat runs in its own transaction
        cur.execute("SET CONSTRAINTS ALL IMMEDIATE")
    run = partitions.maintain()

    attempts_run = {t.table: t for t in run.tables}[ATTEMPTS]
    assert attempts_run.dropped == tuple(day_names(ATTEMPTS, AHEAD[:6]))  # 03-10 … 03-15
    assert attempts_run.created == tuple(day_names(ATTEMPTS, [date(2031, 4, 15) + timedelta(days=k)
                                                              for k in range(8)]))
    assert not set(day_names(ATTEMPTS, AHEAD[:6])) & set(names(ATTEMPTS))
    assert f"{ATTEMPTS}_p20310316" in names(ATTEMPTS)
    assert list(DeliveryAttempt.objects.values_list("id", flat=True)) == [young.pk]
    assert not DeliveryAttempt.objects.filter(pk=old.pk).exists()
    # Events are kept 90 days: nothing of theirs dropped.
    assert {t.table: t for t in run.tables}[EVENTS].dropped == ()
    assert DeliveryEvent.objects.filter(pk=event.pk).exists()


@pytest.mark.django_db
def test_a_registered_table_that_is_not_partitioned_is_refused_and_nothing_changes(frozen, settings):
    settings.NOTIFY = {**settings.NOTIFY, "RETENTION_DAYS": {ATTEMPTS: 30, "notifications_notification": 90}}
    before = names(ATTEMPTS)

    with pytest.raises(partitions.NotPartitioned, match="'notifications_notification'"):
        partitions.maintain()

    assert names(ATTEMPTS) == before
    assert partitions.last_run()["outcome"].startswith("error: NotPartitioned: NOTIFY['RETENTION_DAYS'] names "
                                                       "'notifications_notification'")


@pytest.fixture
def drop_day_partitions():
    """Transactional tests leave their DDL behind: drop the day partitions they made."""
    yield
    for table in partitions.registry():
        for d in partitions.days(table):
            with connection.cursor() as cur:
                cur.execute(f"DROP TABLE {partitions.partition_name(table, d)}")


@pytest.mark.django_db(transaction=True)
def test_two_maintenance_runs_at_once_both_end_and_each_day_is_made_once(frozen, drop_day_partitions):
    start = threading.Barrier(2)
    runs, errors = [], []

    def run():
        try:
            start.wait()
            runs.append(partitions.maintain(NOW))
        except Exception as exc:  # the test reports any failure
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    assert errors == []
    made = [name for r in runs for t in r.tables for name in t.created]
    expected = [name for table in REGISTERED for name in day_names(table, AHEAD)]
    assert sorted(made) == sorted(expected)  # each once, whichever run made it
    for table in REGISTERED:
        assert partitions.days(table) == AHEAD


@pytest.mark.django_db
def test_the_audit_log_is_partitioned_on_its_at_column(frozen):
    partitions.maintain()
    client = APIClient.objects.create(name="partition-test")
    entry = APIAuditEntry.objects.create(client=client, method="POST", path="/v1/x", object_type="recipient",
                                         status=201, at=NOW)
    assert count(f"{AUDIT}_p20310310") == 1
    assert APIAuditEntry.objects.get(pk=entry.pk).at == NOW


@pytest.mark.django_db
def test_the_timeline_of_one_notification_reads_only_partitions_from_its_creation_on(frozen):
    from notifications.models import TimelineEntry, log_of

    frozen[0] = NOW - timedelta(days=6)
    partitions.maintain()  # 03-04 … 03-11
    frozen[0] = NOW
    partitions.maintain()  # … 03-17
    n = notification(NOW)
    attempt(n, NOW + timedelta(minutes=1))
    DeliveryEvent.objects.create(notification=n, kind="accepted", created_at=NOW)

    with connection.cursor() as cur:
        sql, params = log_of(TimelineEntry, [n]).query.sql_with_params()
        cur.execute(f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) {sql}", params)
        plan = [r[0] for r in cur.fetchall()]

    # Pruned at planning or at executor start (the subqueries' bound is known then): an older day's
    # partition is never shown, or shown "never executed".
    read = {line.split(" on ")[1].split()[0][-8:] for line in plan
            if " on notifications_" in line and "_p2031" in line and "never executed" not in line}
    assert read and min(read) == "20310310", "\n".join(plan)
    assert list(log_of(TimelineEntry, [n]).values_list("kind", flat=True)) == ["accepted", "sent"]


@pytest.mark.django_db
@pytest.mark.parametrize("status,kind", [("delivered", "delivered"), ("undelivered", "failed")],
                         ids=["bulk path", "one by one"])
def test_a_receipt_repeated_days_later_is_stored_once_across_day_partitions(frozen, status, kind):
    """No unique index can hold ``dedup_key`` on a table partitioned by day: the receipts module
    stores each key once itself, whichever partition the first copy landed in."""
    from notifications import receipts

    partitions.maintain()
    n = notification(NOW - timedelta(minutes=5))
    Notification.objects.filter(pk=n.pk).update(status="sent", provider="twilio", provider_message_id="SM1")
    receipt = receipts.Receipt(provider="twilio", dedup_key=f"twilio:SM1:{status}:", kind=kind, raw=status,
                               notification_id=str(n.pk), provider_message_id="SM1")

    assert receipts.apply_receipts([receipt])["applied"] == 1
    frozen[0] = NOW + timedelta(days=2)  # the provider's retry, two days later
    assert receipts.apply_receipts([receipt, receipt]) == {"applied": 0, "duplicate": 2, "unknown": 0}

    stored = DeliveryEvent.objects.filter(dedup_key=f"twilio:SM1:{status}:")
    assert list(stored.values_list("created_at", flat=True)) == [NOW]


@pytest.mark.django_db
def test_metrics_show_each_tables_partitions_oldest_age_and_the_last_successful_run(frozen, client, settings):
    from prometheus_client.parser import text_string_to_metric_families

    settings.METRICS_TOKEN = ""
    frozen[0] = NOW - timedelta(days=2)
    partitions.maintain()  # 03-08 … 03-15
    frozen[0] = NOW
    partitions.maintain()  # … 03-17

    response = client.get("/metrics")

    assert response.status_code == 200
    found = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for family in text_string_to_metric_families(response.content.decode()) for s in family.samples
             if s.name.startswith("notify_partition")}
    assert found == {
        **{("notify_partitions", (("table", t),)): 10.0 for t in REGISTERED},
        **{("notify_partition_oldest_age_days", (("table", t),)): 2.0 for t in REGISTERED},
        ("notify_partition_maintenance_last_success_timestamp", ()): NOW.timestamp(),
    }


@pytest.mark.django_db
def test_the_provider_health_page_shows_retention_partitions_oldest_day_and_the_last_run(frozen, admin_client,
                                                                                      settings):
    partitions.maintain()
    frozen[0] = NOW + timedelta(hours=1)
    settings.NOTIFY = {**settings.NOTIFY, "RETENTION_DAYS": {**settings.NOTIFY["RETENTION_DAYS"],
                                                             "notifications_notification": 90}}
    with pytest.raises(partitions.NotPartitioned):
        partitions.maintain()
    settings.NOTIFY = {**settings.NOTIFY, "RETENTION_DAYS": {ATTEMPTS: 30, EVENTS: 90, AUDIT: 365}}
    n = notification(NOW)
    attempt(n, NOW - timedelta(days=400))  # a stray in DEFAULT

    response = admin_client.get("/admin/provider-health/")

    assert response.status_code == 200
    state = response.context_data["partitions"]
    assert [(t["table"], t["retention_days"], t["partitions"], t["oldest_day"], t["default_rows"])
            for t in state["tables"]] == [(ATTEMPTS, 30, 8, date(2031, 3, 10), 1),
                                          (EVENTS, 90, 8, date(2031, 3, 10), 0),
                                          (AUDIT, 365, 8, date(2031, 3, 10), 0)]
    assert state["last_run"]["at"] == NOW + timedelta(hours=1)
    assert state["last_run"]["success_at"] == NOW
    html = response.content.decode()
    assert "<td>notifications_deliveryattempt</td><td>30 days</td>\n<td>8</td><td>2031-03-10</td><td>1</td>" in html
    assert "<b>error: NotPartitioned:" in html
    assert "(last success\n2031-03-10 12:00:00 UTC)" in html


@pytest.mark.django_db
def test_the_provider_health_page_flags_a_maintenance_run_older_than_two_intervals_as_stale(frozen, admin_client):
    partitions.maintain()
    frozen[0] = NOW + timedelta(hours=2)  # two intervals: not yet stale
    fresh = admin_client.get("/admin/provider-health/")
    assert (fresh.context_data["partitions"]["stale"], 'id="partitions-stale"' in fresh.content.decode()) == (
        False, False)

    frozen[0] = NOW + timedelta(days=15)  # beat stopped: the seven days ahead have run out
    n = notification(NOW)
    attempt(n, frozen[0])  # lands in DEFAULT
    response = admin_client.get("/admin/provider-health/")

    assert response.context_data["partitions"]["stale"] is True
    html = response.content.decode()
    assert "<b>ok</b> (last success\n2031-03-10 12:00:00 UTC)" in html
    assert '<p class="errornote" id="partitions-stale"><b>Stale</b>: no successful partition\nmaintenance in ' \
           "the last 2.0 h" in html
    assert [t["default_rows"] for t in response.context_data["partitions"]["tables"]
            if t["table"] == ATTEMPTS] == [1]


def test_a_maintenance_never_recorded_as_successful_is_stale(frozen):
    assert partitions.stale_after() == timedelta(hours=2)
    assert partitions.is_stale(None) is True
    assert partitions.is_stale(NOW - timedelta(hours=2)) is False
    assert partitions.is_stale(NOW - timedelta(hours=2, seconds=1)) is True


def test_beat_queues_the_maintenance_as_it_starts_and_again_at_each_restart(monkeypatch):
    """django_celery_beat dates a never-run entry's last run at its creation: without the hook the
    first run came an hour after a fresh start, every row in DEFAULT meanwhile."""
    from celery.beat import Service
    from celery.signals import beat_init

    from config.celery import app

    sent = []
    monkeypatch.setattr(app, "send_task", lambda name, **options: sent.append((name, options)))
    for _start in range(2):  # a start, then a restart
        beat_init.send(sender=Service(app=app))

    assert sent == [("notifications.maintain_partitions", {"queue": "maintenance", "expires": 600})] * 2


@pytest.mark.django_db
def test_beat_runs_the_maintenance_hourly_on_the_maintenance_queue(frozen, settings):
    from notifications import tasks

    entry = settings.CELERY_BEAT_SCHEDULE["maintain-partitions"]
    assert (entry["task"], entry["schedule"], entry["options"]["queue"]) == (
        "notifications.maintain_partitions", 3600.0, "maintenance")
    assert tasks.maintain_partitions.name == entry["task"]

    done = tasks.maintain_partitions()

    assert done["skipped"] is False
    assert sorted(done["created"]) == sorted(n for t in REGISTERED for n in day_names(t, AHEAD))
    assert done["dropped"] == []


@pytest.mark.django_db(transaction=True)
def test_the_same_receipt_at_a_second_worker_meanwhile_waits_and_is_a_duplicate(frozen):
    """Worker 1 is storing a receipt (its transaction open); worker 2 gets the same receipt: it waits
    on the key's lock, then finds worker 1's event, so the key is stored once with no unique index."""
    from django.db import transaction

    from notifications import receipts

    n = notification(NOW - timedelta(minutes=5))
    Notification.objects.filter(pk=n.pk).update(status="sent", provider="twilio", provider_message_id="SM2")
    key = "twilio:SM2:delivered:"
    receipt = receipts.Receipt(provider="twilio", dedup_key=key, kind="delivered", raw="delivered",
                               notification_id=str(n.pk), provider_message_id="SM2")
    second: dict = {}

    def worker_2():
        try:
            second.update(receipts.apply_receipts([receipt]))
        finally:
            connections.close_all()

    with transaction.atomic():
        receipts._lock_dedup_keys([key])
        DeliveryEvent.objects.create(notification=n, kind="receipt:delivered", dedup_key=key, created_at=NOW)
        thread = threading.Thread(target=worker_2)
        thread.start()
        thread.join(timeout=1.0)
        assert thread.is_alive()  # waiting for worker 1's key
    thread.join(timeout=30)

    assert second == {"applied": 0, "duplicate": 1, "unknown": 0}
    assert DeliveryEvent.objects.filter(dedup_key=key).count() == 1


@pytest.mark.parametrize("retention,ahead,problem", [
    ({ATTEMPTS: 0}, 7, 'NOTIFY["RETENTION_DAYS"]["notifications_deliveryattempt"] must be a whole number of days '
                       ">= 1, got 0"),
    ({"attempts; DROP TABLE x": 30}, 7, "NOTIFY[\"RETENTION_DAYS\"] key 'attempts; DROP TABLE x' must be a table "
                                        "name"),
    ({ATTEMPTS: 30}, 0, "PARTITIONS_AHEAD_DAYS must be a whole number of days >= 1, got 0"),
])
def test_manage_py_check_names_a_retention_setting_out_of_range(settings, retention, ahead, problem):
    from django.core import checks

    settings.NOTIFY = {**settings.NOTIFY, "RETENTION_DAYS": retention, "PARTITIONS_AHEAD_DAYS": ahead}

    errors = [e for e in checks.run_checks() if e.id == "notifications.E002"]

    assert len(errors) == 1 and errors[0].msg.startswith(problem), errors
