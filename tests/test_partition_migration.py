"""Migration 0040 on a database that has rows: the append-only tables become partitioned by day, every
row is kept as it was, the timeline view answers the same rows, the ids go on; and back again."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from core import partitions
from notifications.models import APIAuditEntry, APIClient, DeliveryAttempt, DeliveryEvent, Notification
from preferences.models import Device, Recipient

BEFORE = ("notifications", "0039_notification_finished_index")
AFTER = ("notifications", "0040_partition_append_only_tables")
T0 = datetime(2031, 5, 1, 9, 0, tzinfo=UTC)
TABLES = {"notifications_deliveryattempt": "created_at", "notifications_deliveryevent": "created_at",
          "notifications_apiauditentry": "at"}


def migrate(target) -> None:
    """Unapply (``BEFORE``) or apply (``AFTER``) migration 0040 alone: migrations other branches add
    after 0036 stay as they are."""
    executor = MigrationExecutor(connection)
    backwards = target == BEFORE
    if (AFTER in executor.loader.applied_migrations) == backwards:
        executor.migrate([], plan=[(executor.loader.get_migration(*AFTER), backwards)])


def relkind(table: str) -> str:
    with connection.cursor() as cur:
        cur.execute("SELECT relkind FROM pg_class WHERE relname = %s", [table])
        return cur.fetchone()[0]


def snapshot() -> dict:
    with connection.cursor() as cur:
        out = {}
        for table in (*TABLES, "notifications_timeline"):
            cur.execute(f"SELECT * FROM {table} ORDER BY 1")
            out[table] = cur.fetchall()
        return out


def history() -> list[Notification]:
    """A push to two devices (both accepted), an email retried once, receipts and an audit entry,
    over three days."""
    r = Recipient.objects.create(user_id=f"m-{uuid.uuid4().hex[:8]}", email="m@example.com")
    phones = [Device.objects.create(recipient=r, platform="android", push_token=f"tok-{uuid.uuid4().hex}")
              for _ in range(2)]
    push = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="push", body="b", created_at=T0)
    email = Notification.objects.create(id=uuid.uuid4(), recipient=r, channel="email", body="b",
                                        created_at=T0 + timedelta(days=1))
    for d in phones:
        DeliveryAttempt.objects.create(notification=push, number=1, provider="fcm", device=d, outcome="accepted",
                                       created_at=T0 + timedelta(seconds=1))
    DeliveryAttempt.objects.create(notification=email, number=1, provider="sendgrid", outcome="transient",
                                   created_at=T0 + timedelta(days=1, seconds=1))
    DeliveryAttempt.objects.create(notification=email, number=2, provider="sendgrid", outcome="accepted",
                                   provider_message_id="sg-1", created_at=T0 + timedelta(days=2))
    for n in (push, email):
        DeliveryEvent.objects.create(notification=n, kind="accepted", status="queued", created_at=n.created_at)
    DeliveryEvent.objects.create(notification=email, kind="receipt:delivered", status="delivered",
                                 dedup_key="sendgrid:ev-1", created_at=T0 + timedelta(days=2, minutes=1))
    APIAuditEntry.objects.create(client=APIClient.objects.create(name=f"m-{uuid.uuid4().hex[:6]}"), method="POST",
                                 path="/v1/notifications", object_type="notification", status=202, at=T0)
    return [push, email]


@pytest.fixture
def unmigrated(as_migrated):
    """The database at 0036; migrated forward again (and its day partitions dropped) afterwards."""
    migrate(BEFORE)
    yield
    migrate(AFTER)
    for table in TABLES:
        for day in partitions.days(table):
            with connection.cursor() as cur:
                cur.execute(f"DROP TABLE {partitions.partition_name(table, day)}")


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_every_row_and_the_timeline_and_the_ids_go_on(unmigrated):
    assert {relkind(t) for t in TABLES} == {"r"}
    push, email = history()
    before = snapshot()

    migrate(AFTER)

    assert {relkind(t) for t in TABLES} == {"p"}
    assert snapshot() == before
    timeline = [row[1:] for row in before["notifications_timeline"]]
    assert sorted((str(nid), kind, detail) for nid, kind, _s, _r, detail, _at in timeline) == sorted([
        (str(push.pk), "accepted", ""), (str(push.pk), "sent", "accepted for 2 of 2 device(s)"),
        (str(email.pk), "accepted", ""), (str(email.pk), "sent", ""), (str(email.pk), "receipt:delivered", "")])
    assert partitions.days("notifications_deliveryattempt") == [T0.date() + timedelta(days=k) for k in range(3)]
    assert partitions.days("notifications_apiauditentry") == [T0.date()]
    with connection.cursor() as cur:
        for table in TABLES:
            cur.execute(f"SELECT count(*) FROM {partitions.default_name(table)}")
            assert cur.fetchone()[0] == 0
        cur.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = %s",
                    ["notifications_deliveryattempt_pkey"])
        assert cur.fetchone()[0] == "PRIMARY KEY (id, created_at)"
    newest = max(row[0] for row in before["notifications_deliveryattempt"])
    assert DeliveryAttempt.objects.create(notification=email, number=3, provider="sendgrid",
                                          outcome="accepted", created_at=T0).pk > newest


@pytest.mark.django_db(transaction=True)
def test_the_migration_back_makes_plain_tables_with_the_same_rows(unmigrated):
    history()
    migrate(AFTER)
    partitioned = snapshot()

    migrate(BEFORE)

    assert {relkind(t) for t in TABLES} == {"r"}
    assert snapshot() == partitioned
    with connection.cursor() as cur:
        cur.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'event_dedup_key_uniq'")
        assert cur.fetchone()[0].startswith("CREATE UNIQUE INDEX")
