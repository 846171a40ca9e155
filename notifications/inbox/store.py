"""Writing inbox items: what "sending" an ``in_app`` notification is (docs/APP.md).

:func:`write` inserts the items of a batch and moves the users' :class:`~notifications.inbox.models.InboxCounts`
in one transaction. An item's key is its notification's id, so a row written twice (a re-driven
batch, a worker killed after the insert) is one item and counted once.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction
from psycopg.types.json import Jsonb

from core import clock
from notifications.inbox.models import InboxCounts, InboxItem
from notifications.models import Notification
from preferences.models import Recipient


@dataclass(frozen=True)
class NewItem:
    """An item to write: the notification's id and recipient, what the app will show (rendered),
    the type key ("" for single sends and campaigns), the category, and instants in UTC."""

    notification_id: uuid.UUID
    recipient_id: str
    type_key: str
    category: str
    title: str
    body: str
    data: dict | None
    created_at: datetime | None  # None: the platform clock once the users' counts rows are locked
    expires_at: datetime | None


def write(items: list[NewItem]) -> set[uuid.UUID]:
    """Insert ``items`` (those whose notification already has one are skipped) and add each new
    item to its user's counts (total, unread and unseen +1), in one transaction.

    The users' counts rows are locked first (created when missing), in user-id order, so two
    batches for overlapping users never deadlock; an item's ``created_at``, when not given, is taken
    after that lock. A user's items are therefore created in the order they become visible: a write
    that waited for a mark (which holds the counts row) gets a later instant than anything the mark
    could have seen, so ``all_before`` never reaches an item the app has not listed yet.

    Not an item of a recipient erased after its notification was created (it was in flight at the
    erasure). Returns the notification ids of the items inserted now."""
    if not items:
        return set()
    items = sorted(items, key=lambda i: (i.recipient_id, str(i.notification_id)))
    users = sorted({i.recipient_id for i in items})
    item_table, counts_table = InboxItem._meta.db_table, InboxCounts._meta.db_table
    notification_table, recipient_table = Notification._meta.db_table, Recipient._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {counts_table} (recipient_id, total, unread, unseen) SELECT r, 0, 0, 0 FROM "
            f"unnest(%s::text[]) AS t(r) ON CONFLICT (recipient_id) DO UPDATE SET total = {counts_table}.total",
            [users])  # the no-op update takes each row's lock
        now = clock.now()
        # One array per column (unnest): nine parameters whatever the batch's size, so the client
        # does not parse a statement of thousands of placeholders.
        # Not for a recipient erased after the notification was created (Recipient.erased_after): a
        # writer that loaded the row before an erasure that committed meanwhile writes nothing after
        # it (this statement's snapshot, taken after the counts lock, sees the erasure).
        cursor.execute(
            f"INSERT INTO {item_table} (notification_id, recipient_id, type_key, category, title, body, data, "
            f"created_at, expires_at) SELECT t.* FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], "
            f"%s::text[], %s::text[], %s::jsonb[], %s::timestamptz[], %s::timestamptz[]) "
            f"AS t(nid, rid, type_key, category, title, body, data, created_at, expires_at) "
            f"JOIN {notification_table} n ON n.id = t.nid JOIN {recipient_table} r ON r.user_id = t.rid "
            f"WHERE r.erased_at IS NULL OR r.erased_at <= n.created_at "
            f"ON CONFLICT (notification_id) DO NOTHING RETURNING notification_id, recipient_id",
            [[i.notification_id for i in items], [i.recipient_id for i in items], [i.type_key for i in items],
             [i.category for i in items], [i.title for i in items], [i.body for i in items],
             [Jsonb(i.data) if i.data is not None else None for i in items],
             [i.created_at or now for i in items], [i.expires_at for i in items]])
        inserted = cursor.fetchall()
        per_user = sorted(Counter(recipient for _nid, recipient in inserted).items())
        if per_user:
            cursor.execute(
                f"UPDATE {counts_table} c SET total = c.total + t.n, unread = c.unread + t.n, unseen = c.unseen + t.n "
                f"FROM unnest(%s::text[], %s::int[]) AS t(r, n) WHERE c.recipient_id = t.r",
                [[user for user, _n in per_user], [n for _user, n in per_user]])
    return {nid for nid, _recipient in inserted}


def without_item(notification_ids: list[uuid.UUID]) -> set[uuid.UUID]:
    """Those of ``notification_ids`` that have no item (one query; none for an empty list): of the
    ids :func:`write` did not insert, the ones it refused (recipient erased since), not re-driven."""
    if not notification_ids:
        return set()
    return set(notification_ids) - set(InboxItem.objects.filter(pk__in=notification_ids).values_list("pk", flat=True))
