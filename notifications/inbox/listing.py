"""Reading a user's inbox (docs/APP.md): one page of items newest first, and the badge counts.

A page is a keyset range read on the :class:`~notifications.inbox.models.InboxItem` partial index
the status filter chooses (the WHERE repeats its predicate so the planner uses it), from the
cursor's position, ``LIMIT limit + 1``: no OFFSET, so page 500 costs what page 1 does
(tests/test_inbox_plans.py asserts the plans). The cursor is signed by :mod:`core.cursors`, bound
to :data:`CURSOR_SALT` and the listing (user, status, category); a tampered or foreign one is
:class:`BadCursor`, never a query on what it holds.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict

from django.db.models import BooleanField, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils.dateparse import parse_datetime

from core import clock, cursors
from notifications.inbox.models import InboxCounts, InboxItem

#: The status filters and the partial index each reads (the model's Meta.indexes).
STATUSES: dict[str, str] = {
    "all": "inbox_all_idx",  # not archived (the default listing)
    "unread": "inbox_unread_idx",  # not archived, not read
    "unseen": "inbox_unseen_idx",  # not archived, not seen
    "archived": "inbox_archived_idx",  # archived only
}
DEFAULT_STATUS = "all"
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
CURSOR_SALT = "notifications.inbox.cursor"

_STATUS_FILTERS: dict[str, Q] = {
    "all": Q(archived_at__isnull=True),
    "unread": Q(archived_at__isnull=True, read_at__isnull=True),
    "unseen": Q(archived_at__isnull=True, seen_at__isnull=True),
    "archived": Q(archived_at__isnull=False),
}


#: A cursor that is not one of this inbox's ``next_cursor`` values (the one rule: core/cursors.py).
BadCursor = cursors.BadCursor


@dataclass(frozen=True)
class Position:
    """Where a page starts: strictly after the item with this ``created_at`` (UTC) and id."""

    created_at: datetime
    notification_id: uuid.UUID


def _listing(recipient_id: str, status: str, category: str | None, erased: str) -> tuple[str | None, ...]:
    """What a cursor is bound to (the signature's salt): another user's, another status's or another
    category's cursor does not verify, nor one issued before the user's latest erasure (``erased``:
    :meth:`preferences.models.Recipient.erasure_mark`)."""
    return (CURSOR_SALT, recipient_id, erased, status, category)


def encode_cursor(item: InboxItem, recipient_id: str, status: str, category: str | None, erased: str = "") -> str:
    """The cursor of the page after ``item`` in this listing: signed ``[created_at ISO 8601, id]``,
    URL-safe, the listing (user, status, category) in the salt."""
    return cursors.sign([item.created_at.isoformat(), str(item.pk)], _listing(recipient_id, status, category,
                                                                                          erased))


def decode_cursor(cursor: str, recipient_id: str, status: str, category: str | None, erased: str = "") -> Position:
    """The position ``cursor`` holds. Raises :class:`BadCursor` when it was not made by
    :func:`encode_cursor` with this ``SECRET_KEY`` for this listing (bad signature, another user's,
    status's or category's, wrong shape)."""
    value = cursors.unsign(cursor, _listing(recipient_id, status, category, erased))
    try:
        at, nid = value
        created_at = parse_datetime(at)
        notification_id = uuid.UUID(nid)
    except (TypeError, ValueError, AttributeError) as exc:
        raise BadCursor("not a next_cursor of this inbox") from exc
    if created_at is None or created_at.tzinfo is None:
        raise BadCursor("not a next_cursor of this inbox")
    return Position(created_at, notification_id)


def page_query(recipient_id: str, *, status: str = DEFAULT_STATUS, category: str | None = None,
               after: Position | None = None, limit: int = DEFAULT_LIMIT,
               now: datetime | None = None) -> QuerySet:
    """The query of one page (``limit + 1`` rows, to know whether another page follows): the user's
    items in ``status`` (a key of :data:`STATUSES`), of ``category`` if given, not past their
    ``expires_at`` at ``now`` (UTC; default the platform clock), strictly after ``after``, newest
    first. This is exactly what ``GET /v1/users/{id}/inbox`` runs (the plan test EXPLAINs it)."""
    now = now or clock.now()
    qs = InboxItem.objects.filter(_STATUS_FILTERS[status], recipient_id=recipient_id)
    if category is not None:
        qs = qs.filter(category=category)
    qs = qs.filter(Q(expires_at__isnull=True) | Q(expires_at__gt=now))
    if after is not None:
        # A row comparison: one index range condition on (created_at, notification_id), where the
        # OR of two comparisons would be a filter over every row of the user.
        qs = qs.filter(RawSQL("(created_at, notification_id) < (%s, %s)", (after.created_at, after.notification_id),
                              output_field=BooleanField()))
    return qs.order_by("-created_at", "-notification_id")[:limit + 1]


def page(recipient_id: str, *, status: str = DEFAULT_STATUS, category: str | None = None,
         cursor: str | None = None, limit: int = DEFAULT_LIMIT,
         erased: str = "") -> tuple[list[InboxItem], str | None]:
    """One page: ``(items, next_cursor)``, ``next_cursor`` None on the last page. Raises
    :class:`BadCursor` for a cursor that is not ours (before any query)."""
    after = decode_cursor(cursor, recipient_id, status, category, erased) if cursor else None
    rows = list(page_query(recipient_id, status=status, category=category, after=after, limit=limit))
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    return rows, encode_cursor(rows[-1], recipient_id, status, category, erased)


class Counts(TypedDict):
    """A user's badge numbers (items not archived)."""

    unseen: int
    unread: int
    total: int


def counts(recipient_id: str) -> Counts:
    """The badge: ``{"unseen": n, "unread": n, "total": n}`` (items not archived; see
    :class:`~notifications.inbox.models.InboxCounts`), one primary-key lookup; zeros for a user
    with no inbox yet."""
    row = InboxCounts.objects.filter(pk=recipient_id).values("unseen", "unread", "total").first()
    return row or {"unseen": 0, "unread": 0, "total": 0}
