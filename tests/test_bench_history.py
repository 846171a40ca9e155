"""The bench's history fill (bench/history.py) and its EXPLAIN of the hot queries (bench/explain.py),
small: 2 days × 2,000 notifications. What the fill reports is what it wrote; statuses are mixed as
production has them; attempts and events belong to real notifications; the same request is not
filled twice; the reset before a run removes the run's rows and keeps the fill."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection

from bench import explain, history
from bench.runner import RESET_TABLES
from campaigns.models import Campaign
from core import clock, partitions
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification
from preferences.models import Recipient

DAYS, PER_DAY = 2, 2_000


@pytest.fixture
def filled(transactional_db):
    report = history.ensure_history(DAYS, PER_DAY, RESET_TABLES, progress=lambda _m: None)
    yield report
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {history.RECORD_TABLE}")


def _count(sql: str, params=()) -> int:
    with connection.cursor() as cur:
        cur.execute(sql, params)
        return cur.fetchone()[0]


def _notifications_sql() -> str:
    """Every notification row, live or (when the table exists) history."""
    if history.table_exists(history.HISTORY_TABLE):  # the live columns (the history adds archived_at)
        columns = ", ".join(f.column for f in Notification._meta.concrete_fields)
        return (f"(SELECT {columns} FROM {history.LIVE_TABLE} "
                f"UNION ALL SELECT {columns} FROM {history.HISTORY_TABLE})")
    return history.LIVE_TABLE


def test_the_fill_writes_the_rows_it_reports(filled):
    assert filled["days"] == DAYS and filled["per_day"] == PER_DAY and filled["reused"] is False
    rows = filled["rows"]
    for table, count in rows.items():
        assert _count(f"SELECT count(*) FROM {table}") == count, table
    notifications = rows[history.LIVE_TABLE] + rows.get(history.HISTORY_TABLE, 0)
    assert notifications == DAYS * PER_DAY
    assert rows["notifications_deliveryattempt"] > notifications * 0.8
    assert rows["notifications_deliveryevent"] > notifications
    assert 2 <= rows["campaigns_campaign"] == Campaign.objects.count()
    assert filled["recipients"] == Recipient.objects.filter(user_id__startswith="bh-").count() == 1_000
    # Spread over the days before the fill's instant, never after it.
    now = clock.now()
    table = _notifications_sql()
    assert _count(f"SELECT count(*) FROM {table} n WHERE created_at < %s OR created_at >= %s OR updated_at >= %s",
                  [now - timedelta(days=DAYS, minutes=1), now, now]) == 0
    assert set(filled["bytes"]) == set(rows)
    assert all(b["table_bytes"] > 0 and b["index_bytes"] > 0 for b in filled["bytes"].values()), filled["bytes"]


def test_statuses_are_mixed_as_production_has_them(filled):
    table = _notifications_sql()
    with connection.cursor() as cur:
        cur.execute(f"SELECT status, count(*) FROM {table} n GROUP BY status")
        statuses = dict(cur.fetchall())
        cur.execute(f"SELECT count(*) FILTER (WHERE campaign_id IS NOT NULL), count(*) FILTER (WHERE event_id IS "
                    f"NOT NULL), count(*) FILTER (WHERE idempotency_key IS NOT NULL), count(*) FILTER (WHERE "
                    f"dead_lettered_at IS NOT NULL), count(*) FILTER (WHERE status = 'failed' AND reason = "
                    f"'attempts_exhausted') FROM {table} n")
        campaign, typed, single, dead, exhausted = cur.fetchone()
    total = DAYS * PER_DAY
    assert set(statuses) == {"delivered", "sent", "failed", "suppressed", "cancelled", "expired"}
    assert statuses["delivered"] + statuses["sent"] > 0.85 * total
    assert statuses["failed"] < 0.05 * total
    assert campaign + typed + single == total and min(campaign, typed, single) > 0.1 * total
    assert dead == exhausted > 0  # dead letters: attempts ran out
    assert _count(f"SELECT count(*) FROM {table} n WHERE status IN ('suppressed', 'cancelled', 'expired', "
                  "'failed') AND reason = ''") == 0


def test_attempts_and_events_belong_to_real_notifications(filled):
    table = _notifications_sql()
    for child in ("notifications_deliveryattempt", "notifications_deliveryevent"):
        assert _count(f"SELECT count(*) FROM {child} c WHERE NOT EXISTS "
                      f"(SELECT 1 FROM {table} n WHERE n.id = c.notification_id)") == 0
    # One attempt row per call: the row's attempt count; a sent or delivered row's last call accepted.
    assert _count(f"SELECT count(*) FROM {table} n WHERE n.attempts <> (SELECT count(*) FROM "
                  "notifications_deliveryattempt a WHERE a.notification_id = n.id)") == 0
    assert _count(f"SELECT count(*) FROM {table} n WHERE n.status IN ('sent', 'delivered') AND NOT EXISTS "
                  "(SELECT 1 FROM notifications_deliveryattempt a WHERE a.notification_id = n.id AND "
                  "a.outcome = 'accepted' AND a.provider_message_id = n.provider_message_id)") == 0
    assert _count("SELECT count(*) FROM notifications_deliveryattempt WHERE outcome = 'transient'") > 0
    # A retried call was scheduled and released again before the next one.
    assert _count("SELECT count(*) FROM notifications_deliveryevent WHERE kind = 'retry'") == _count(
        "SELECT count(*) FROM notifications_deliveryevent WHERE kind = 'released'") > 0
    # A delivered row has its provider's delivered receipt, stored once by its dedup key.
    assert _count(f"SELECT count(*) FROM {table} n WHERE n.status = 'delivered' AND NOT EXISTS (SELECT 1 FROM "
                  "notifications_deliveryevent e WHERE e.notification_id = n.id AND e.kind = 'receipt:delivered' "
                  "AND e.dedup_key IS NOT NULL)") == 0


def test_a_second_request_for_the_same_history_is_not_filled_again(filled, monkeypatch):
    monkeypatch.setattr(history.Filler, "fill", lambda self: pytest.fail("filled again"))
    again = history.ensure_history(DAYS, PER_DAY, RESET_TABLES, progress=lambda _m: None)
    assert again["reused"] is True
    assert again["rows"] == filled["rows"] and again["filled_at"] == filled["filled_at"]
    assert Notification.objects.count() == filled["rows"][history.LIVE_TABLE]


def test_the_reset_before_a_run_removes_the_runs_rows_and_keeps_the_fill(filled):
    # What a run makes: a campaign and its notification, with an attempt and an event.
    recipient = Recipient.objects.filter(user_id__startswith="bh-").first()
    campaign = Campaign.objects.create(name="run", segment_id=history.SEGMENT, channel="email")
    n = Notification.objects.create(id="00000000-0000-4000-8000-000000000001", recipient=recipient, channel="email",
                                    body="run", campaign_id=campaign.pk)
    DeliveryAttempt.objects.create(notification=n, number=1, provider="sendgrid", outcome="accepted")
    DeliveryEvent.objects.create(notification=n, kind="released")
    rows = filled["rows"]

    deleted = history.reset_run_rows(RESET_TABLES)

    assert deleted[history.LIVE_TABLE] == 1 and deleted["campaigns_campaign"] == 1
    assert deleted["notifications_deliveryattempt"] == 1 and deleted["notifications_deliveryevent"] == 1
    for table in (history.LIVE_TABLE, "notifications_deliveryattempt", "notifications_deliveryevent",
                  "campaigns_campaign", "notifications_event"):
        assert _count(f"SELECT count(*) FROM {table}") == rows[table], table
    assert not Notification.objects.filter(pk=n.pk).exists()


def test_without_a_fill_the_reset_empties_the_tables_and_a_new_request_refills(transactional_db):
    history.ensure_history(1, 500, RESET_TABLES, progress=lambda _m: None)
    try:
        assert Notification.objects.count() + _count(
            f"SELECT count(*) FROM {history.HISTORY_TABLE}" if history.table_exists(history.HISTORY_TABLE)
            else "SELECT 0") == 500
        refilled = history.ensure_history(1, 300, RESET_TABLES, progress=lambda _m: None)
        assert refilled["reused"] is False and history.recorded()["per_day"] == 300
        # The first fill's attempts and events went with it (partitioned: no foreign key cascades to them).
        assert DeliveryAttempt.objects.count() == refilled["rows"]["notifications_deliveryattempt"]
        assert DeliveryEvent.objects.count() == refilled["rows"]["notifications_deliveryevent"]
        history.wipe(RESET_TABLES)
        assert history.recorded() is None
        history.reset_run_rows(RESET_TABLES)  # no fill: TRUNCATE, as the bench always did
        assert Notification.objects.count() == DeliveryAttempt.objects.count() == Campaign.objects.count() == 0
    finally:
        with connection.cursor() as cur:
            cur.execute(f"DROP TABLE IF EXISTS {history.RECORD_TABLE}")


def test_the_hot_queries_are_explained_with_the_code_s_own_sql(filled):
    plans = explain.hot_queries()
    assert set(plans) == {"claim", "due_scan", "expired_leases", "stale_queued", "receipt_by_provider_message_id",
                          "campaign_completion", "recipient_history_page", "notification_by_id"}
    for name, plan in plans.items():
        assert "error" not in plan, (name, plan)
        assert plan["statements"] >= 1 and plan["node_types"] and plan["seq_scan"] in (True, False), name
    assert plans["claim"]["sql"][0].startswith("UPDATE notifications_notification SET status = 'sending'")
    # The API's read of one notification: the row, its timeline (events and attempts), its attempts.
    assert plans["notification_by_id"]["statements"] == 3
    read = plans["notification_by_id"]["relations"]  # the day partitions (or DEFAULT) of each table
    for table in ("notifications_deliveryattempt", "notifications_deliveryevent"):
        assert any(r == table or r.startswith(f"{table}_") for r in read), (table, read)
    assert Notification.objects.filter(status="sending").count() == 0  # the write paths never ran


def test_a_sequential_scan_counts_only_on_a_big_table(monkeypatch):
    rows = {"notifications_deliveryevent": 10_001.0, "notifications_notificationtype": 10_000.0}
    monkeypatch.setattr(explain, "row_estimate", rows.__getitem__)

    def plan(relation: str) -> list:
        return [[{"Plan": {"Node Type": "Limit", "Plans": [{"Node Type": "Seq Scan", "Relation Name": relation}]}}]]

    big = explain.summarize(plan("notifications_deliveryevent"), ["SELECT 1"])
    assert big["seq_scan"] is True and big["seq_scans"] == ["notifications_deliveryevent"]
    assert big["node_types"] == ["Limit", "Seq Scan"]
    small = explain.summarize(plan("notifications_notificationtype"), ["SELECT 1"])
    assert small["seq_scan"] is False and small["seq_scans"] == []


@pytest.fixture
def history_table(transactional_db):
    """``notifications_notificationhistory`` as issue 25's design makes it (the live table's columns,
    by day on ``created_at``, a DEFAULT partition), and attempts and events without their foreign key
    to the live table (``db_constraint=False`` there); made here, and put back afterwards, only where
    the migrations have not made them so already."""
    children = ("notifications_deliveryattempt", "notifications_deliveryevent")
    made = not history.table_exists(history.HISTORY_TABLE)
    with connection.cursor() as cur:
        cur.execute("SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint "
                    "WHERE contype = 'f' AND confrelid = 'notifications_notification'::regclass "
                    "AND conrelid::regclass::text = ANY(%s)", [list(children)])
        fks = cur.fetchall()
        for table, name, _definition in fks:
            cur.execute(f"ALTER TABLE {table} DROP CONSTRAINT {name}")
        if made:
            cur.execute(f"CREATE TABLE {history.HISTORY_TABLE} (LIKE notifications_notification INCLUDING "
                        "DEFAULTS) PARTITION BY RANGE (created_at)")
            cur.execute(f"CREATE TABLE {history.HISTORY_TABLE}_default PARTITION OF {history.HISTORY_TABLE} "
                        "DEFAULT")
            cur.execute(f"CREATE INDEX ON {history.HISTORY_TABLE} (recipient_id, created_at DESC)")
    yield
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {history.RECORD_TABLE}")
        cur.execute(f"{'DROP TABLE' if made else 'TRUNCATE'} {history.HISTORY_TABLE}")
        cur.execute(f"TRUNCATE {', '.join(children)}")
        for table, name, definition in fks:
            cur.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")


def test_with_a_history_table_rows_finished_before_the_hot_hours_go_there(history_table, settings, monkeypatch):
    settings.NOTIFY = {**settings.NOTIFY, "HOT_HOURS": 6}
    with connection.cursor() as cur:  # no day partitions yet (an earlier test's fill made some)
        for table in partitions.registry():
            for day in partitions.days(table):
                cur.execute(f"DROP TABLE {partitions.partition_name(table, day)}")
    made_days = []  # (table, rows moved in from DEFAULT) of each day partition made
    create_day = partitions.create_day
    monkeypatch.setattr(partitions, "create_day",
                        lambda table, column, day: made_days.append((table, create_day(table, column, day)))
                        or made_days[-1][1])
    report = history.ensure_history(DAYS, PER_DAY, RESET_TABLES, progress=lambda _m: None)
    rows = report["rows"]
    filled_at = history.recorded()["filled_at"]
    hot_before = filled_at - timedelta(hours=6)
    # The fill's days had their partitions before the COPY: no row went through DEFAULT.
    assert {t for t, _moved in made_days} == set(partitions.registry())
    assert [m for _t, m in made_days if m] == []
    for table in partitions.registry():
        assert _count(f"SELECT count(*) FROM {partitions.default_name(table)}") == 0, table
    # Archived as the archiver would: HOT_HOURS to an hour more after it finished, before the fill's now.
    assert _count(f"""SELECT count(*) FROM {history.HISTORY_TABLE} WHERE archived_at >= %s
                       OR archived_at < updated_at + interval '6 hours'
                       OR archived_at > updated_at + interval '7 hours'""", [filled_at]) == 0
    assert 0 < report["vacuum_seconds"] <= report["fill_seconds"]
    live, archived = rows[history.LIVE_TABLE], rows[history.HISTORY_TABLE]
    assert live + archived == DAYS * PER_DAY
    assert _count(f"SELECT count(*) FROM {history.HISTORY_TABLE}") == archived > live > 0
    assert _count(f"SELECT count(*) FROM {history.HISTORY_TABLE} WHERE updated_at >= %s", [hot_before]) == 0
    assert _count(f"SELECT count(*) FROM {history.LIVE_TABLE} WHERE updated_at < %s",  # archived within the hour
                  [hot_before - timedelta(hours=1)]) == 0
    assert report["bytes"][history.HISTORY_TABLE]["table_bytes"] > 0  # summed over the partitions
    table = _notifications_sql()
    for child in ("notifications_deliveryattempt", "notifications_deliveryevent"):
        assert _count(f"SELECT count(*) FROM {child} c WHERE NOT EXISTS "
                      f"(SELECT 1 FROM {table} n WHERE n.id = c.notification_id)") == 0
    # A run's row in the live table goes with the reset; the history stays.
    recipient = Recipient.objects.filter(user_id__startswith="bh-").first()
    n = Notification.objects.create(id="00000000-0000-4000-8000-000000000002", recipient=recipient,
                                    channel="sms", body="run")
    # Attempts and events have no foreign key to the live table here: the reset finds them by name.
    DeliveryAttempt.objects.create(notification=n, number=1, provider="twilio", outcome="accepted")
    DeliveryEvent.objects.create(notification=n, kind="released")
    deleted = history.reset_run_rows(RESET_TABLES)
    assert deleted[history.LIVE_TABLE] == 1 and deleted[history.HISTORY_TABLE] == 0
    assert deleted["notifications_deliveryattempt"] == deleted["notifications_deliveryevent"] == 1
    assert _count(f"SELECT count(*) FROM {history.HISTORY_TABLE}") == archived
    assert Notification.objects.count() == live
    assert DeliveryAttempt.objects.count() == rows["notifications_deliveryattempt"]
    # Without a fill the reset empties them too, as TRUNCATE … CASCADE did through the foreign key.
    history.wipe(RESET_TABLES)
    history.reset_run_rows(RESET_TABLES)
    assert DeliveryAttempt.objects.count() == DeliveryEvent.objects.count() == 0
