"""Removing inbox items: the periodic prune (past their TTL, or older than the retention period) and
a recipient's erasure. Both move the users' :class:`~notifications.inbox.models.InboxCounts` in the
same transaction as the delete, locking the counts rows first (in user-id order), as every writer of
items does (:mod:`notifications.inbox.marks` explains the order)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from core import clock
from notifications import housekeeping
from notifications.inbox.marks import counted
from notifications.inbox.models import InboxCounts, InboxItem


def _config() -> dict:
    return settings.NOTIFY["INBOX"]


def prune_batch(*, now: datetime | None = None, batch: int | None = None) -> int:
    """Delete up to ``batch`` (default ``NOTIFY["INBOX"]["PRUNE_BATCH"]``) items that expired
    (``expires_at <= now``) or were created more than ``RETENTION_DAYS`` days before ``now`` (UTC;
    default the platform clock), and take them out of their users' counts. Returns how many were
    deleted (fewer than ``batch``: nothing more to prune now)."""
    now = now or clock.now()
    batch = batch or int(_config()["PRUNE_BATCH"])
    cutoff = now - timedelta(days=int(_config()["RETENTION_DAYS"]))
    item_table = InboxItem._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        # Two index range reads (inbox_expires_idx, inbox_created_idx), never a scan of every item.
        cursor.execute(
            f"SELECT notification_id, recipient_id FROM ("
            f"(SELECT notification_id, recipient_id FROM {item_table} WHERE expires_at <= %s LIMIT %s) UNION "
            f"(SELECT notification_id, recipient_id FROM {item_table} WHERE created_at < %s LIMIT %s)) due LIMIT %s",
            [now, batch, cutoff, batch, batch])
        due = cursor.fetchall()
        if not due:
            return 0
        return _delete(cursor, sorted({user for _nid, user in due}), [nid for nid, _user in due])


def prune(*, now: datetime | None = None, max_batches: int = 20) -> int:
    """The beat task's work: :func:`prune_batch` until a batch comes back short, at most
    ``max_batches`` batches (so one tick is bounded; the next tick goes on). Returns items deleted;
    the run's success is recorded for the alert on a stopped prune (:mod:`notifications.housekeeping`)."""
    deleted = 0
    batch = int(_config()["PRUNE_BATCH"])
    for _ in range(max_batches):
        n = prune_batch(now=now, batch=batch)
        deleted += n
        if n < batch:
            break
    housekeeping.succeeded("notifications.prune_inbox")
    return deleted


def erase_inbox(recipient_id: str) -> int:
    """A recipient's erasure, the inbox's part (inside the erasure's transaction): delete every item
    of the user and the counts row. Returns how many items were deleted."""
    item_table, counts_table = InboxItem._meta.db_table, InboxCounts._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {counts_table} WHERE recipient_id = %s FOR UPDATE", [recipient_id])
        cursor.execute(f"DELETE FROM {item_table} WHERE recipient_id = %s", [recipient_id])
        deleted = cursor.rowcount
        cursor.execute(f"DELETE FROM {counts_table} WHERE recipient_id = %s", [recipient_id])
    return deleted


def _delete(cursor, users: list[str], ids: list) -> int:
    item_table, counts_table = InboxItem._meta.db_table, InboxCounts._meta.db_table
    cursor.execute(f"SELECT recipient_id FROM {counts_table} WHERE recipient_id = ANY(%s) "
                   f"ORDER BY recipient_id FOR UPDATE", [users])
    cursor.execute(f"DELETE FROM {item_table} WHERE notification_id = ANY(%s) "
                   f"RETURNING recipient_id, seen_at, read_at, archived_at", [ids])
    deltas: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    rows = cursor.fetchall()
    for user, seen_at, read_at, archived_at in rows:
        for k, v in enumerate(counted(seen_at, read_at, archived_at)):
            deltas[user][k] += v
    changed = sorted((user, d) for user, d in deltas.items() if any(d))
    if changed:
        cursor.execute(
            f"UPDATE {counts_table} c SET total = c.total - d.total, unread = c.unread - d.unread, "
            f"unseen = c.unseen - d.unseen FROM (VALUES "
            + ",".join(["(%s, %s::int, %s::int, %s::int)"] * len(changed))
            + ") AS d(recipient_id, total, unread, unseen) WHERE c.recipient_id = d.recipient_id",
            [v for user, d in changed for v in (user, *d)])
    return len(rows)
