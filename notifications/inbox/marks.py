"""Marking a user's inbox items seen, read, unread or archived (``POST /v1/users/{id}/inbox/mark``).

What each status changes (only rows where it changes something; a timestamp once set never moves
later, so a repeat is ``changed: 0``): docs/APP.md, "Marking items". A mark locks the user's
:class:`~notifications.inbox.models.InboxCounts` row first, then updates the items
(``UPDATE … RETURNING`` the old state) and moves the counts by the deltas of the rows it changed,
in one transaction; every writer of a user's items holds that lock (the locking order and why:
docs/ARCHITECTURE.md §6, the ``in_app`` calls stage).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from core import clock
from notifications.inbox.models import InboxCounts, InboxItem

STATUSES = ("seen", "read", "unread", "archived")
#: At most this many ids in one mark (a larger selection: ``all_before``).
MAX_IDS = 1000
#: At most this many items change in one ``all_before`` mark, the newest first: one request stays
#: well under a second (a million items in one UPDATE took ~40 s, the indexes' upkeep); the caller
#: repeats the call while the answer says ``more``.
MAX_PER_CALL = 10_000

# status → (SET clause, the WHERE that selects the rows it changes)
_CHANGES: dict[str, tuple[str, str]] = {
    "seen": ("seen_at = %(now)s", "i.seen_at IS NULL"),
    "read": ("read_at = %(now)s, seen_at = COALESCE(i.seen_at, %(now)s)", "i.read_at IS NULL"),
    "unread": ("read_at = NULL", "i.read_at IS NOT NULL"),
    "archived": ("archived_at = %(now)s", "i.archived_at IS NULL"),
}


class UnknownItems(LookupError):
    """Some ids are not this user's items (unknown, or another user's); ``ids`` lists them in the
    order given. Nothing was changed."""

    def __init__(self, ids: list[uuid.UUID]) -> None:
        super().__init__(f"not this user's inbox items: {', '.join(map(str, ids))}")
        self.ids = ids


def counted(seen_at, read_at, archived_at) -> tuple[int, int, int]:
    """What one item adds to its user's ``(total, unread, unseen)``."""
    if archived_at is not None:
        return 0, 0, 0
    return 1, int(read_at is None), int(seen_at is None)


def mark(recipient_id: str, status: str, *, ids: Sequence[uuid.UUID] | None = None,
         all_before: datetime | None = None, now: datetime | None = None) -> list[uuid.UUID]:
    """Mark the user's items ``ids`` (at most :data:`MAX_IDS`), or every item created at or before
    ``all_before`` (UTC-aware), as ``status`` (one of :data:`STATUSES`) at ``now`` (UTC; default the
    platform clock). Exactly one of ``ids`` / ``all_before``.

    An id of an item past its ``expires_at`` (no longer listed) counts as unknown.

    Returns the ids of the items that changed (none for a repeat); an ``all_before`` mark changes at
    most :data:`MAX_PER_CALL` (the newest first), so a return of exactly that many means there may be
    more. Raises :class:`UnknownItems` (nothing changed) when any id is not one of this user's
    items; ValueError for a bad call (both or neither selection, an unknown status, too many ids)."""
    if status not in _CHANGES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}")
    if (ids is None) == (all_before is None):
        raise ValueError("give exactly one of ids and all_before")
    wanted = list(dict.fromkeys(ids)) if ids is not None else []
    if len(wanted) > MAX_IDS:
        raise ValueError(f"at most {MAX_IDS} ids")
    now = now or clock.now()
    item_table, counts_table = InboxItem._meta.db_table, InboxCounts._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {counts_table} WHERE recipient_id = %s FOR UPDATE", [recipient_id])
        has_counts = cursor.fetchone() is not None
        if ids is not None:
            found: set[uuid.UUID] = set()
            if wanted and has_counts:
                # An item past its TTL is no longer listed: the app cannot have shown it.
                cursor.execute(f"SELECT notification_id FROM {item_table} WHERE recipient_id = %s "
                               f"AND notification_id = ANY(%s) AND (expires_at IS NULL OR expires_at > %s)",
                               [recipient_id, wanted, now])
                found = {row[0] for row in cursor.fetchall()}
            missing = [i for i in wanted if i not in found]
            if missing:
                raise UnknownItems(missing)
            if not wanted:
                return []
            selection = "i.notification_id = ANY(%(ids)s)"
            params: dict[str, Any] = {"ids": wanted}  # SQL parameters
        else:
            if not has_counts:
                return []  # no counts row: no items (store.write creates both in one transaction)
            selection, params = "i.created_at <= %(before)s", {"before": all_before}
        set_clause, changes = _CHANGES[status]
        bound = "" if ids is not None else (f" ORDER BY i.created_at DESC, i.notification_id DESC "
                                            f"LIMIT {MAX_PER_CALL}")
        # The CTE reads each row's state before the UPDATE (the counts row's lock keeps it stable).
        cursor.execute(
            f"WITH old AS (SELECT i.notification_id, i.seen_at, i.read_at, i.archived_at FROM {item_table} i "
            f"WHERE i.recipient_id = %(user)s AND {selection} AND {changes}{bound}) "
            f"UPDATE {item_table} i SET {set_clause} FROM old WHERE i.notification_id = old.notification_id "
            f"RETURNING old.seen_at, old.read_at, old.archived_at, i.seen_at, i.read_at, i.archived_at, "
            f"i.notification_id",
            {"user": recipient_id, "now": now, **params})
        rows = cursor.fetchall()
        total = unread = unseen = 0
        for old_seen, old_read, old_archived, new_seen, new_read, new_archived, _id in rows:
            before, after = counted(old_seen, old_read, old_archived), counted(new_seen, new_read, new_archived)
            total += after[0] - before[0]
            unread += after[1] - before[1]
            unseen += after[2] - before[2]
        if total or unread or unseen:
            cursor.execute(f"UPDATE {counts_table} SET total = total + %s, unread = unread + %s, "
                           f"unseen = unseen + %s WHERE recipient_id = %s", [total, unread, unseen, recipient_id])
    return [row[-1] for row in rows]
