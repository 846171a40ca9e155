"""Reading a notification wherever it lives: the live table or the partitioned history
(:class:`~notifications.models.NotificationRecord`, the view of both; docs/ARCHITECTURE.md, "Reading
across live and history"). Support and API reads by id, recipient, campaign or event go through
here or :mod:`notifications.readers`; the send path's own reads stay on the live table.

A record has no reverse relations (its timeline and attempts point at the live model), so
:func:`with_logs` attaches them as lists, read by the record's id: the same rows wherever it lives.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Exists, OuterRef, Q, QuerySet

from core import clock
from notifications.models import (
    REACHED_STATUSES,
    DeliveryAttempt,
    DeliveryEvent,
    Notification,
    NotificationHistory,
    NotificationRecord,
    Status,
    TimelineEntry,
    log_of,
)


def history_expired(since: datetime | None, now: datetime | None = None) -> bool:
    """Whether notifications created at or after ``since`` (an event's or a campaign's first) can have
    been dropped by now: a row is archived at least ``HOT_HOURS`` after it was created and its day
    partition kept ``RETENTION_DAYS`` of the history after that (docs/ARCHITECTURE.md §13, "After the
    history is gone"). True means some of them may be gone, not that all are; ``None``: none made yet."""
    if since is None:
        return False
    return since < (now or clock.now()) - timedelta(days=history_days(), hours=settings.NOTIFY["HOT_HOURS"])


def history_days() -> int:
    """Days the history keeps an archived notification (``RETENTION_NOTIFICATIONS_DAYS``)."""
    return settings.NOTIFY["RETENTION_DAYS"][NotificationHistory._meta.db_table]


def records() -> QuerySet[NotificationRecord]:
    """Every notification, live or archived (read-only)."""
    return NotificationRecord.objects.all()


def of_event(event, users: list[str] | None = None, digest_rows: Iterable = ()) -> QuerySet[NotificationRecord]:
    """The notifications of ``event`` (only ``users``' when given) and the rows ``digest_rows`` (ids of
    the digests it went into), live or archived: the event index of each table and partition."""
    mine = Q(event=event) if users is None else Q(event=event, recipient_id__in=users)
    ids = list(digest_rows)
    return NotificationRecord.objects.filter(mine | Q(pk__in=ids) if ids else mine)


def with_logs(rows: Iterable[NotificationRecord]) -> list[NotificationRecord]:
    """``rows`` with ``timeline`` (TimelineEntry, in order) and ``attempts_log`` (DeliveryAttempt with
    its device, in order) set on each: two queries whatever the number of rows, each read from the
    earliest row's ``created_at`` on (``models.log_of``: older day partitions are skipped)."""
    rows = list(rows)
    timeline: dict = defaultdict(list)
    attempts: dict = defaultdict(list)
    if rows:
        for entry in log_of(TimelineEntry, rows):
            timeline[entry.notification_id].append(entry)
        for attempt in log_of(DeliveryAttempt, rows).select_related("device"):
            attempts[attempt.notification_id].append(attempt)
    for r in rows:
        r.timeline = timeline[r.pk]  # type: ignore[attr-defined]
        r.attempts_log = attempts[r.pk]  # type: ignore[attr-defined]
    return rows


def estimated_count() -> int:
    """Postgres' row estimate of live + history (``reltuples`` of the live table and of each history
    partition; a partitioned parent has none of its own): the admin's unfiltered list never counts
    hundreds of millions of rows. 0 before the first ANALYZE."""
    with connection.cursor() as cur:
        cur.execute("""SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint FROM pg_class c
                        WHERE c.oid = %s::regclass
                           OR c.oid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = %s::regclass)""",
                    [Notification._meta.db_table, NotificationHistory._meta.db_table])
        return int(cur.fetchone()[0])


#: Email receipts that say the message was opened or a link in it clicked (``receipt:<provider word>``,
#: notifications/receipts.py): SendGrid's ``open`` and ``click``.
EMAIL_OPENED_KINDS = ("receipt:open", "receipt:click")


def engaged_since(engagement: str, since) -> QuerySet[NotificationRecord]:
    """Notifications, live or archived, created from ``since`` on, that show the engagement: ``sent``
    (a provider accepted it: ``REACHED_STATUSES``) or ``opened`` (the app reported it opened, or an
    email open/click receipt arrived). Correlate it to a recipient (``.filter(recipient_id=…)``):
    each table and history partition from ``since``'s day on is read through its ``(recipient_id,
    created_at)`` index, older partitions are pruned (docs/SEGMENTS.md, "What engagement costs")."""
    # A row created from ``since`` on was archived after it: the bound on archived_at (the history's
    # partition key; NULL for live rows) prunes the older partitions.
    rows = NotificationRecord.objects.filter(Q(archived_at__isnull=True) | Q(archived_at__gte=since),
                                             created_at__gte=since)
    if engagement == "sent":
        return rows.filter(status__in=REACHED_STATUSES)
    opened_email = DeliveryEvent.objects.filter(notification_id=OuterRef("id"), created_at__gte=since,
                                                kind__in=EMAIL_OPENED_KINDS)
    return rows.filter(Q(status=Status.OPENED) | Q(Exists(opened_email), channel="email"))
