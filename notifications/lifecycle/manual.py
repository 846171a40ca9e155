"""Status changes asked for by someone: cancels (a client, an event, a campaign, an erasure), the
replay of dead letters, and the fallback order's settlement (docs/ARCHITECTURE.md §5). Each is one
conditional UPDATE … RETURNING over candidate ids the caller chose (its tenancy, its locks), and
writes one timeline event for each row that moved, in the caller's transaction.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection

from core.postgres import array_literal
from notifications.inbox.models import InboxItem
from notifications.lifecycle.table import Cause, in_sql
from notifications.models import DeliveryEvent, Reason, Status
from notifications.webhooks import outbox

#: A row written to its user's inbox already is never cancelled (the app may have shown it).
_NOT_IN_INBOX = (f"NOT EXISTS (SELECT 1 FROM {InboxItem._meta.db_table} AS i "
                 f"WHERE i.{InboxItem._meta.pk.column} = n.id)")

#: A row waiting after an unknown outcome (its worker's call may have been accepted) is as good as
#: ``sending``: a cancel leaves it, and its re-drive looks the call up before anything else.
MAYBE_SENT = (Reason.LEASE_EXPIRED, Reason.OUTCOME_UNKNOWN)
_NOT_MAYBE_SENT = f"n.reason NOT IN ({', '.join(repr(str(r)) for r in MAYBE_SENT)})"

_CANCEL_GUARDS = {
    Cause.CLIENT_CANCEL: f"{_NOT_IN_INBOX} AND {_NOT_MAYBE_SENT}",
    Cause.CAMPAIGN_CANCEL: f"{_NOT_IN_INBOX} AND {_NOT_MAYBE_SENT}",
    Cause.EVENT_CANCEL: f"{_NOT_IN_INBOX} AND {_NOT_MAYBE_SENT} AND (n.status <> 'suppressed' OR n.reason = "
                        "'fallback_not_needed')",
    Cause.ERASURE: "(n.status <> 'suppressed' OR n.reason = 'fallback_not_needed')",
}

_CANCEL_SQL = {cause: f"""
UPDATE notifications_notification AS n
   SET status = 'cancelled', reason = %s, reason_detail = COALESCE(%s, n.reason_detail), due_at = NULL,
       lease_until = NULL, updated_at = %s
 WHERE n.id = ANY(%s::uuid[]) AND {in_sql(cause, Status.CANCELLED, "n.status")} AND {guard}
RETURNING n.id
""" for cause, guard in _CANCEL_GUARDS.items()}

_REPLAY_SQL = f"""
UPDATE notifications_notification AS n
   SET status = 'queued', reason = '', reason_detail = '', attempts = 0, first_attempt_at = NULL,
       dead_lettered_at = NULL, due_at = NULL, lease_until = NULL, queued_at = %s, updated_at = %s
 WHERE n.id = ANY(%s::uuid[]) AND {in_sql(Cause.REPLAY, Status.QUEUED, "n.status")}
   AND n.dead_lettered_at IS NOT NULL
RETURNING n.id, n.priority, n.channel
"""

# The waiting channel behind each of the ids: released (queued), not needed (suppressed) or cancelled.
_FALLBACK_SQL: dict[str, str] = {status: f"""
UPDATE notifications_notification AS n
   SET status = %s, reason = %s, reason_detail = %s, updated_at = %s, queued_at = %s, due_at = NULL
 WHERE n.fallback_after = ANY(%s::uuid[]) AND {in_sql(Cause.FALLBACK, status, "n.status")}
   AND n.status = 'scheduled' AND n.reason = 'fallback_waiting'
RETURNING n.id, n.priority, n.channel
""" for status in (Status.QUEUED, Status.SUPPRESSED, Status.CANCELLED)}

# Reopened: the channel a send made not needed is released (queued), the ones behind it wait again.
_REOPEN_SQL: dict[str, str] = {status: f"""
UPDATE notifications_notification AS n
   SET status = %s, reason = %s, reason_detail = %s, updated_at = %s, queued_at = %s, due_at = NULL
 WHERE n.fallback_after = ANY(%s::uuid[]) AND {in_sql(Cause.FALLBACK, status, "n.status")}
   AND n.status = 'suppressed' AND n.reason = 'fallback_not_needed'
   AND (n.expires_at IS NULL OR n.expires_at > %s)
RETURNING n.id, n.priority, n.channel
""" for status in (Status.QUEUED, Status.SCHEDULED)}


def cancel(ids, cause: Cause, reason: str, now: datetime, *, detail: str | None = "",
           event_detail: str | None = None) -> list:
    """``→ cancelled`` with ``reason`` for the candidate ``ids`` that ``cause`` may cancel (the
    table, plus: never one written to the inbox, bar an erasure), one ``cancelled`` event each.
    ``detail``: the row's reason detail (None: kept); ``event_detail``: the event's (default
    ``detail``). Returns the ids that moved."""
    ids = list(ids)
    if not ids:
        return []
    with connection.cursor() as cur:
        cur.execute(_CANCEL_SQL[cause], [reason, detail, now, array_literal(str(i) for i in ids)])
        moved = [row[0] for row in cur.fetchall()]
    text = (detail or "") if event_detail is None else event_detail
    DeliveryEvent.objects.bulk_create([
        DeliveryEvent(notification_id=pk, kind="cancelled", status=Status.CANCELLED, reason=reason, detail=text,
                      created_at=now) for pk in moved], batch_size=5000)
    outbox.emit_ids(moved, Status.CANCELLED, now)
    return moved


def replay(ids, now: datetime, detail: str) -> list[tuple]:
    """Dead letters ``failed → queued`` with a fresh attempt budget, one ``replayed`` event each;
    returns ``[(id, priority, channel)]`` of the rows that moved."""
    with connection.cursor() as cur:
        cur.execute(_REPLAY_SQL, [now, now, array_literal(str(i) for i in ids)])
        rows = cur.fetchall()
    DeliveryEvent.objects.bulk_create([DeliveryEvent(notification_id=pk, kind="replayed", status=Status.QUEUED,
                                                     detail=detail) for pk, _p, _c in rows])
    return rows


def fallback(behind: list, status: str, reason: str, detail: str, now: datetime) -> list[tuple]:
    """The channels waiting (``fallback_waiting``) behind the rows ``behind`` → ``status`` (queued:
    released; suppressed: not needed; cancelled), one event each; returns ``[(id, priority, channel)]``."""
    text = "" if status == Status.QUEUED else detail
    with connection.cursor() as cur:
        cur.execute(_FALLBACK_SQL[status], [status, reason, text, now, now if status == Status.QUEUED else None,
                                            array_literal(str(pk) for pk in behind)])
        rows = cur.fetchall()
    DeliveryEvent.objects.bulk_create([
        DeliveryEvent(notification_id=pk, kind="released" if status == Status.QUEUED else str(status), status=status,
                      reason=reason, detail=detail, created_at=now) for pk, _p, _c in rows])
    if status != Status.QUEUED:
        outbox.emit_ids([pk for pk, _p, _c in rows], status, now)
    return rows


def reopen(behind: list, status: str, detail: str, now: datetime) -> list[tuple]:
    """The channels a send behind ``behind`` made ``fallback_not_needed`` (not expired) →
    ``queued`` (released, event ``released``) or ``scheduled`` (waits again, event ``scheduled``);
    returns ``[(id, priority, channel)]``."""
    queued = status == Status.QUEUED
    reason = "" if queued else Reason.FALLBACK_WAITING
    with connection.cursor() as cur:
        cur.execute(_REOPEN_SQL[status], [status, reason, "", now, now if queued else None,
                                          array_literal(str(pk) for pk in behind), now])
        rows = cur.fetchall()
    DeliveryEvent.objects.bulk_create([
        DeliveryEvent(notification_id=pk, kind="released" if queued else "scheduled", status=status, reason=reason,
                      detail=detail if queued else f"waits again: {detail}"[:500], created_at=now)
        for pk, _p, _c in rows])
    return rows
