"""Status changes of the send path: claim, record, the scheduler's release and the reconciler's
lease expiry (docs/ARCHITECTURE.md §5–6). Bulk where the send path is bulk (one UPDATE over
``unnest`` arrays, timeline events by COPY); each UPDATE's allowed from-states come from
:mod:`.table`. Callers (``delivery/claim.py``, ``delivery/record.py``, ``scheduler.py``) keep the
rest: leases held, attempt rows, metrics, fallback, enqueueing.

A claim and a ``sent`` write no timeline event of their own: the attempt row is that line
(``models.TimelineEntry``), one row fewer per notification on the hot path.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import connection
from django.db.models import Q

from core import clock
from core.postgres import array_literal, copy_rows
from notifications.lifecycle.table import Cause, in_sql, sources
from notifications.models import DeliveryEvent, Notification, Reason, Status
from notifications.webhooks import outbox

EVENTS_TABLE = DeliveryEvent._meta.db_table
EVENT_COLUMNS = ("notification_id", "kind", "status", "reason", "detail", "created_at")

_CLAIM_SQL = f"""
UPDATE notifications_notification
   SET status = 'sending', lease_until = %s, attempts = attempts + 1, claims = claims + 1, updated_at = %s,
       first_attempt_at = COALESCE(first_attempt_at, %s)
 WHERE id = ANY(%s::uuid[]) AND {in_sql(Cause.CLAIM, Status.SENDING)}
RETURNING id, claims
"""

# Arrays travel as one text literal each (array_literal): Django's client-side binding would
# otherwise quote every element in Python (~60 µs per row measured on a 500-row batch).
_SENT_SQL = f"""
UPDATE notifications_notification AS n
   SET status = 'sent', reason = '', reason_detail = v.detail, lease_until = NULL, due_at = NULL, updated_at = %s,
       sent_at = %s, provider = %s, provider_message_id = v.pmid
  FROM unnest(%s::uuid[], %s::int[], %s::text[], %s::text[]) AS v(id, claims, pmid, detail)
 WHERE n.id = v.id AND n.claims = v.claims AND {in_sql(Cause.RECORD, Status.SENT, "n.status")}
   AND (n.status = 'sending' OR n.reason = 'lease_expired')
RETURNING n.id
"""

_RESCHEDULE_SQL = f"""
UPDATE notifications_notification AS n
   SET status = 'scheduled', reason = %s, reason_detail = %s, lease_until = NULL, updated_at = %s,
       due_at = %s, attempts = n.attempts - %s
  FROM unnest(%s::uuid[], %s::int[]) AS v(id, claims)
 WHERE n.id = v.id AND {in_sql(Cause.RECORD, Status.SCHEDULED, "n.status")} AND n.claims = v.claims
RETURNING n.id
"""

_SUPPRESS_SQL = f"""
UPDATE notifications_notification AS n
   SET status = 'suppressed', reason = %s, reason_detail = v.detail, lease_until = NULL, updated_at = %s
  FROM unnest(%s::uuid[], %s::int[], %s::text[]) AS v(id, claims, detail)
 WHERE n.id = v.id AND {in_sql(Cause.RECORD, Status.SUPPRESSED, "n.status")} AND n.claims = v.claims
RETURNING n.id
"""

_RELEASE_SQL = f"""
WITH due AS (
    SELECT id FROM notifications_notification
     WHERE status = 'scheduled' AND due_at <= %(now)s
     ORDER BY due_at
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE notifications_notification n
   SET status = 'queued', queued_at = %(now)s, due_at = NULL, updated_at = %(now)s
  FROM due
 WHERE n.id = due.id AND {in_sql(Cause.SCHEDULER, Status.QUEUED, "n.status")}
RETURNING n.id, n.priority, n.channel
"""

# The three ends of an expired lease share their from-states (the table: sending).
_EXPIRED_LEASES_SQL = f"""
WITH stuck AS (
    SELECT id, CASE WHEN attempts >= (CASE WHEN priority = 'high' THEN %(max_high)s ELSE %(max_standard)s END)
                    THEN 'failed' WHEN priority = 'high' OR channel = 'in_app' THEN 'queued'
                    ELSE 'scheduled' END AS next
      FROM notifications_notification
     WHERE status = 'sending' AND lease_until < %(now)s
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE notifications_notification n
   SET status = stuck.next, lease_until = NULL, updated_at = %(now)s,
       reason = CASE WHEN stuck.next = 'failed' THEN 'worker_lost' ELSE 'lease_expired' END,
       reason_detail = CASE WHEN stuck.next = 'failed'
                            THEN 'its worker died or stalled on attempt ' || n.attempts
                                 || ' (the last allowed): dead-lettered'
                            ELSE 'its worker stopped renewing the lease on attempt ' || n.attempts
                                 || '; its call may have been made, so it is checked before any re-send' END,
       queued_at = CASE WHEN stuck.next = 'queued' THEN %(now)s ELSE n.queued_at END,
       due_at = CASE WHEN stuck.next = 'scheduled' THEN %(standard_due)s ELSE n.due_at END,
       dead_lettered_at = CASE WHEN stuck.next = 'failed' THEN %(now)s ELSE n.dead_lettered_at END
  FROM stuck
 WHERE n.id = stuck.id AND {in_sql(Cause.LEASE_EXPIRY, Status.QUEUED, "n.status")}
RETURNING n.id, n.priority, n.channel, n.status, n.reason, n.reason_detail
"""


def claim(ids: Iterable, lease: datetime, now: datetime) -> list[tuple]:
    """``queued → sending`` for ``ids`` with a lease until ``lease``; ``[(id, claim number)]`` claimed."""
    with connection.cursor() as cur:
        cur.execute(_CLAIM_SQL, [lease, now, now, array_literal(ids)])
        return cur.fetchall()


def sent(now: datetime, provider: str, ids: list, claims: list, message_ids: list, details: list) -> set[str]:
    """``→ sent`` for claimed rows (or rows taken back after their lease, not claimed again) whose
    call ``provider`` accepted; returns the ids (as strings) that moved."""
    with connection.cursor() as cur:
        cur.execute(_SENT_SQL, [now, now, provider, array_literal(ids), array_literal(claims),
                                array_literal(message_ids), array_literal(details)])
        moved = {str(row[0]) for row in cur.fetchall()}
    outbox.emit_ids(moved, Status.SENT, now)
    return moved


def reschedule(rows: list[Notification], until: datetime, reason: str, detail: str, kind: str, now: datetime, *,
               give_back_attempt: bool) -> set[str]:
    """``sending → scheduled`` until ``until`` for claimed ``rows`` (one UPDATE), one ``kind`` event
    each by COPY; returns the ids (as strings) that moved."""
    with connection.cursor() as cur:
        cur.execute(_RESCHEDULE_SQL, [reason, detail, now, until, 1 if give_back_attempt else 0,
                                      array_literal(n.pk for n in rows), array_literal(n.claims for n in rows)])
        moved = {str(row[0]) for row in cur.fetchall()}
    copy_rows(EVENTS_TABLE, EVENT_COLUMNS, [(n.pk, kind, Status.SCHEDULED.value, str(reason), detail, now)
                                            for n in rows if str(n.pk) in moved])
    for n in rows:
        if str(n.pk) in moved:
            n.status, n.reason = Status.SCHEDULED, reason
    return moved


def suppress(rows: list[Notification], details: dict, reason: str, now: datetime) -> list[Notification]:
    """``sending → suppressed`` with ``reason`` for claimed ``rows`` (``details``: id → detail), one
    ``suppressed`` event each by COPY; returns the rows that moved (updated in memory)."""
    with connection.cursor() as cur:
        cur.execute(_SUPPRESS_SQL, [reason, now, array_literal(n.pk for n in rows),
                                    array_literal(n.claims for n in rows),
                                    array_literal(details[n.pk] for n in rows)])
        moved = {str(row[0]) for row in cur.fetchall()}
    done = [n for n in rows if str(n.pk) in moved]
    copy_rows(EVENTS_TABLE, EVENT_COLUMNS, [(n.pk, "suppressed", Status.SUPPRESSED.value, str(reason),
                                             details[n.pk], now) for n in done])
    for n in done:
        n.status, n.reason, n.reason_detail, n.lease_until, n.updated_at = (
            Status.SUPPRESSED, reason, details[n.pk], None, now)
    outbox.emit_rows(done, Status.SUPPRESSED, now)
    return done


def record_one(n: Notification, status: str, fields: dict, *, kind: str) -> bool:
    """Move the claimed row ``n`` (our claim number) to ``status`` with ``fields`` (reason,
    reason_detail, …), with its ``kind`` event (none for ``sent``: its attempt row is that line);
    ``n`` is updated in memory when it moved. Returns whether it moved."""
    ours = Q(status__in=sources(Cause.RECORD, status))
    if status == Status.SENT:  # scheduled/queued only when taken back after its lease
        ours &= Q(status=Status.SENDING) | Q(reason=Reason.LEASE_EXPIRED)
    else:
        ours &= Q(status=Status.SENDING)
    moved = Notification.objects.filter(ours, pk=n.pk, claims=n.claims).update(status=status, **fields)
    if moved:
        if status != Status.SENT:
            DeliveryEvent.objects.create(notification=n, kind=kind, status=status, reason=fields.get("reason", ""),
                                         detail=fields.get("reason_detail", ""))
        n.status = status
        for key, value in fields.items():
            setattr(n, key, value)
        outbox.emit_rows([n], status, fields.get("updated_at") or clock.now())
    return bool(moved)


def release_due(now: datetime, limit: int) -> list[tuple]:
    """``scheduled → queued`` for up to ``limit`` due rows (locked ones skipped), one ``released``
    event each; returns ``[(id, priority, channel)]``."""
    with connection.cursor() as cur:
        cur.execute(_RELEASE_SQL, {"now": now, "limit": limit})
        rows = cur.fetchall()
    DeliveryEvent.objects.bulk_create([DeliveryEvent(notification_id=r[0], kind="released", status=Status.QUEUED)
                                       for r in rows])
    return rows


def expire_leases(params: dict) -> list[tuple]:
    """``sending →`` queued / scheduled (``lease_expired``) or failed (``worker_lost``, the last
    allowed attempt) for rows whose lease ran out, one event each; returns ``[(id, priority,
    channel, status, reason, detail)]``."""
    with connection.cursor() as cur:
        cur.execute(_EXPIRED_LEASES_SQL, params)
        rows = cur.fetchall()
    outbox.emit_ids([r[0] for r in rows if r[3] == Status.FAILED], Status.FAILED, params["now"])
    DeliveryEvent.objects.bulk_create([
        DeliveryEvent(notification_id=pk, kind="dead_lettered" if status == "failed" else "lease_expired",
                      status=status, reason=reason, detail=detail)
        for pk, _priority, _channel, status, reason, detail in rows])
    return rows
