"""The history and the view keep the live table's columns (docs/ARCHITECTURE.md, "Where a row
lives"): the archiver moves rows by the live columns' names and the view reads both, so a column
added to the live table and not to the history (or the view not recreated) must fail here. The
history adds ``archived_at``, its partition key."""

import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection

from notifications.migrations._history_sql import HISTORY, LIVE, VIEW
from notifications.models import Notification, NotificationRecord
from preferences.models import Recipient
from tests.history import archive

pytestmark = pytest.mark.django_db

ARCHIVED_AT = ("archived_at", "timestamp with time zone")


def columns(table: str) -> list[tuple[str, str, str]]:
    with connection.cursor() as cur:
        cur.execute("""SELECT column_name, data_type, is_nullable FROM information_schema.columns
                        WHERE table_name = %s ORDER BY ordinal_position""", [table])
        return cur.fetchall()


def test_the_history_has_the_live_columns_and_archived_at_and_the_view_adds_archived_at_and_live():
    live = columns(LIVE)
    assert len(live) == len(Notification._meta.concrete_fields)
    assert sorted(columns(HISTORY)) == sorted([*live, (*ARCHIVED_AT, "NO")])
    assert [c[:2] for c in columns(VIEW)] == [c[:2] for c in live] + [ARCHIVED_AT, ("live", "boolean")]


def test_the_history_is_partitioned_by_day_of_archival_with_a_default_partition():
    with connection.cursor() as cur:
        cur.execute("SELECT pg_get_partkeydef(%s::regclass)", [HISTORY])
        assert cur.fetchone()[0] == "RANGE (archived_at)"
        cur.execute("""SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i
                         JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass""", [HISTORY])
        assert cur.fetchall() == [(f"{HISTORY}_default", "DEFAULT")]


def test_the_record_model_reads_a_row_in_either_place():
    recipient = Recipient.objects.create(user_id=f"hist-{uuid.uuid4().hex[:8]}")
    live = Notification.objects.create(id=uuid.uuid4(), recipient=recipient, channel="sms", body="live one")
    archived = Notification.objects.create(id=uuid.uuid4(), recipient=recipient, channel="email", body="old one")
    at = datetime(2031, 1, 2, 3, 4, tzinfo=UTC)
    assert archive(archived.pk, at=at) == 1
    rows = {(r.pk, r.body, r.live, r.archived_at, r.recipient_id)
            for r in NotificationRecord.objects.filter(recipient=recipient)}
    assert rows == {(live.pk, "live one", True, None, recipient.pk), (archived.pk, "old one", False, at, recipient.pk)}
    assert not Notification.objects.filter(pk=archived.pk).exists()
