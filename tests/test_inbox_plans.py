"""The inbox listing of a user with 1,000,000 items reads its first and its 500th page through the
status filter's partial index (issue 16, "Done when"): ``EXPLAIN (FORMAT JSON)`` of the exact query
``GET /v1/users/{id}/inbox`` runs (:func:`notifications.inbox.listing.page_query`) shows an Index
Scan on the expected index, and no Seq Scan and no Sort anywhere in the plan: no OFFSET, no sort of
the user's items, for every status filter and for a category.

The million rows are one ``INSERT … SELECT generate_series`` (no ORM), in the test's transaction
(rolled back at the end; see the fixture for what it drops and rebuilds inside that transaction),
then ANALYZE.
Runs in ``make test`` (no marker): 12–22 s on 2 cores, as loaded (the insert and the index builds).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.db import connection

from notifications.inbox import listing
from notifications.inbox.models import InboxItem
from preferences.models import Recipient

pytestmark = pytest.mark.django_db

N = 1_000_000
USER = "million"
NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
PAGE = listing.DEFAULT_LIMIT

# Which rows are in which state: every 2nd seen, every 4th read (and seen), every 7th archived, every
# 10th in the category "billing"; so each status's index holds a large share of the million.
_STATE_SQL = f"""
INSERT INTO {InboxItem._meta.db_table}
    (notification_id, recipient_id, type_key, category, title, body, data, created_at, seen_at, read_at,
     archived_at, expires_at)
SELECT lpad(to_hex(g + %(offset)s), 32, '0')::uuid, %(user)s, 'order',
       CASE WHEN g %% 10 = 0 THEN 'billing' ELSE '' END, 'Title', 'Body', NULL,
       %(now)s - g * interval '1 second',
       CASE WHEN g %% 2 = 0 THEN %(now)s END, CASE WHEN g %% 4 = 0 THEN %(now)s END,
       CASE WHEN g %% 7 = 0 THEN %(now)s END, NULL
FROM generate_series(1, %(n)s) AS g
"""


@pytest.fixture
def million():
    Recipient.objects.create(user_id=USER)
    Recipient.objects.create(user_id="neighbour")
    table = InboxItem._meta.db_table
    with connection.cursor() as cursor:
        # For this transaction only (Postgres DDL rolls back with it): the items' foreign keys are
        # dropped (a million notification rows are not what this test is about, and Django's TestCase
        # checks deferred constraints before it rolls back), and the indexes are built once after the
        # insert, from their own definitions, instead of row by row (seconds instead of a minute).
        cursor.execute("SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'f'", [table])
        for (name,) in cursor.fetchall():
            cursor.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s AND indexname NOT IN "
                       "(SELECT conname FROM pg_constraint WHERE conrelid = %s::regclass)", [table, table])
        indexes = cursor.fetchall()
        assert {name for name, _ in indexes} >= set(listing.STATUSES.values())
        for name, _definition in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
        cursor.execute(_STATE_SQL, {"user": USER, "now": NOW, "n": N, "offset": 0})
        # A neighbour with items of their own, so the recipient condition matters too.
        cursor.execute(_STATE_SQL, {"user": "neighbour", "now": NOW, "n": 10_000, "offset": N})
        cursor.execute("SET LOCAL maintenance_work_mem = '256MB'")
        for _name, definition in indexes:
            cursor.execute(definition)
        cursor.execute(f"ANALYZE {table}")
    return USER


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def plan_of(qs) -> dict:
    raw = qs.explain(format="json")
    return (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]


def position_of_page_500(status: str, category: str | None) -> listing.Position:
    """Where page 500 starts: after the last item of page 499, built from the data (the test's own
    OFFSET query; the API hands out the same position as page 499's ``next_cursor``, checked below
    by reading it back)."""
    where = {"all": "archived_at IS NULL", "unread": "archived_at IS NULL AND read_at IS NULL",
             "unseen": "archived_at IS NULL AND seen_at IS NULL", "archived": "archived_at IS NOT NULL"}[status]
    if category is not None:
        where += " AND category = %(category)s"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT created_at, notification_id FROM {InboxItem._meta.db_table} WHERE recipient_id = "
                       f"%(user)s AND {where} ORDER BY created_at DESC, notification_id DESC OFFSET %(skip)s LIMIT 1",
                       {"user": USER, "category": category, "skip": 499 * PAGE - 1})
        created_at, notification_id = cursor.fetchone()
    position = listing.Position(created_at, notification_id)
    cursor_of = listing.encode_cursor(InboxItem(notification_id=notification_id, created_at=created_at), USER,
                                      status, category)
    assert listing.decode_cursor(cursor_of, USER, status, category) == position
    return position


CASES = [
    ("all", None, "inbox_all_idx"),
    ("unread", None, "inbox_unread_idx"),
    ("unseen", None, "inbox_unseen_idx"),
    ("archived", None, "inbox_archived_idx"),
    ("all", "billing", "inbox_category_idx"),
]


def test_page_1_and_page_500_read_the_status_index_without_seq_scan_or_sort(million):
    # One test for every case: the million rows are inserted once (the insert is most of the time).
    for status, category, index in CASES:
        after = position_of_page_500(status, category)
        for start in (None, after):
            qs = listing.page_query(USER, status=status, category=category, after=start, limit=PAGE, now=NOW)
            plan = plan_of(qs)
            kinds = [n["Node Type"] for n in nodes(plan)]
            scans = [(n["Node Type"], n.get("Index Name")) for n in nodes(plan) if "Scan" in n["Node Type"]]
            assert scans == [("Index Scan", index)], (status, category, start, kinds)
            assert "Seq Scan" not in kinds and "Sort" not in kinds and "Incremental Sort" not in kinds, kinds
            if start is not None:
                scan = next(n for n in nodes(plan) if n["Node Type"] == "Index Scan")
                assert "created_at" in scan["Index Cond"] and "notification_id" in scan["Index Cond"], scan
            rows = list(qs)
            assert len(rows) == PAGE + 1  # a full page, and the row that says another follows
            if start is not None:
                assert (rows[0].created_at, rows[0].pk) < (start.created_at, start.notification_id)
