"""Status changes by receipts: a provider's (delivered, failed, accepted) and the app's
(docs/ARCHITECTURE.md §5, "Receipt order"). :mod:`notifications.receipts` and
:mod:`notifications.app_receipts` decide what a receipt means; the moves are made here.

A provider's ``delivered``/``failed`` receipt carries an order key ``(at, rank)``: the provider's
event time (else the instant we received it) and :data:`KIND_RANK`. The row keeps the key of the
last one applied (``receipt_at``, ``receipt_rank``); an older one does not move it, so two receipt
workers applying a message's receipts in either order end in the same state.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.db.models import Case, F, Q, Value, When

from core import clock
from core.postgres import array_literal
from notifications.lifecycle import archive
from notifications.lifecycle.table import Cause, allowed, in_sql, sources
from notifications.models import Notification, NotificationHistory, Reason, Status
from notifications.webhooks import outbox

#: Receipt kinds by rank, for receipts of one message at the same instant: positive proof of
#: delivery outranks a failure reported in the same second.
KIND_RANK = {"accepted": 0, "deferred": 1, "failed": 2, "delivered": 3}
#: Reasons of a row failed by a provider's receipt (a newer ``delivered`` may still move it).
RECEIPT_REASONS = (Reason.PROVIDER_UNDELIVERED, Reason.PROVIDER_BOUNCED)
#: Appended to a receipt's timeline entry when a newer receipt had been applied already.
OUT_OF_ORDER = "(out of order: a newer receipt was applied first; not applied)"
#: Appended to an applied receipt's timeline entry that a newer receipt, listed before it (received
#: first, applied second), overruled: the row no longer says what this entry moved it to.
OVERRULED = "(out of order: applied, then overruled by a newer receipt received before it)"

#: :func:`settle`'s answer when a row failed by a receipt took a newer failure (no new transition:
#: its frequency-cap slot and fallback were released by the first).
REFAILED = "refailed"

_RECORDED = (Status.SENT, Status.DELIVERED, Status.FAILED)

_DELIVERED_SQL = f"""
UPDATE notifications_notification AS n
   SET status = 'delivered', reason = '', delivered_at = %s, lease_until = NULL, updated_at = %s,
       reason_detail = CASE WHEN n.status = 'failed' THEN '' ELSE n.reason_detail END,
       receipt_at = v.at, receipt_rank = v.rank
  FROM unnest(%s::uuid[], %s::timestamptz[], %s::int[]) AS v(id, at, rank)
 WHERE n.id = v.id AND {in_sql(Cause.PROVIDER_RECEIPT, Status.DELIVERED, "n.status")}
   AND (n.status = 'sent' OR (n.status = 'failed' AND n.receipt_at IS NOT NULL
                              AND n.reason IN ({", ".join(repr(str(r)) for r in RECEIPT_REASONS)})))
   AND (n.receipt_at IS NULL OR (n.receipt_at, n.receipt_rank) < (v.at, v.rank))
RETURNING n.id
"""

# Against the row where it lives: the live table, or the history from an archival instant on (pruned).
_OUT_OF_ORDER_SQL = {table: f"""
UPDATE notifications_deliveryevent AS e SET detail = left(e.detail || ' ' || %s, 500)
  FROM unnest(%s::bigint[], %s::timestamptz[], %s::int[]) AS v(id, at, rank), {table} AS n
 WHERE e.id = v.id AND n.id = e.notification_id AND n.status IN ({", ".join(repr(str(s)) for s in _RECORDED)})
   AND n.receipt_at IS NOT NULL AND (n.receipt_at, n.receipt_rank) >= (v.at, v.rank){since}
RETURNING e.id
""" for table, since in ((Notification._meta.db_table, ""),
                         (NotificationHistory._meta.db_table, " AND n.archived_at >= %s"))}

#: Marks receipts' entries with the state they moved their row to and, for an end, marks the
#: entries of receipts it overruled that are listed after it (:data:`OVERRULED`): one statement.
_MARK_SQL = f"""
WITH mine AS (UPDATE notifications_deliveryevent SET status = %s, reason = %s WHERE id = ANY(%s::bigint[])
              RETURNING id, notification_id, created_at)
UPDATE notifications_deliveryevent AS e SET detail = left(e.detail || ' ' || %s, 500)
  FROM mine
 WHERE %s AND e.notification_id = mine.notification_id AND e.id <> mine.id AND e.kind LIKE 'receipt:%%'
   AND e.status IN ('{Status.DELIVERED}', '{Status.FAILED}') AND (e.created_at, e.id) > (mine.created_at, mine.id)
   AND strpos(e.detail, %s) = 0
"""


def _newer(at: datetime, rank: int) -> Q:
    """Rows whose last applied receipt is older than ``(at, rank)`` (or that have none)."""
    return Q(receipt_at__isnull=True) | Q(receipt_at__lt=at) | Q(receipt_at=at, receipt_rank__lt=rank)


def deliver(items: list[tuple], now: datetime) -> set:
    """``→ delivered`` for ``[(id, at, rank)]`` of recorded rows (``sent``, or failed by an older
    receipt) where the receipt is newer than the last applied; returns the ids that moved."""
    with connection.cursor() as cur:
        cur.execute(_DELIVERED_SQL, [now, now, array_literal(str(pk) for pk, _a, _r in items),
                                     array_literal(at.isoformat() for _p, at, _r in items),
                                     array_literal(rank for _p, _a, rank in items)])
        moved = {row[0] for row in cur.fetchall()}
    outbox.emit_ids(moved, Status.DELIVERED, now)
    return moved


def settle(pk, status: str, fields: dict, at: datetime, rank: int, *, archived_at: datetime | None = None) -> str:
    """A provider's ``delivered``/``failed`` receipt of order ``(at, rank)`` moves the recorded row
    ``pk`` (``sent``, or an end set by an older receipt) to ``status`` with ``fields``
    (``delivered`` clears a failure's reason; ``failed`` clears ``delivered_at``, and a newer failure
    of a row failed by a receipt replaces its reason detail: the provider's last word). Returns
    :data:`REFAILED` for that last move, ``"moved"`` for any other, ``""`` when it did not move.
    ``archived_at``: the row is in the history, this its :func:`.archive.partition_key` (the same
    rules, one partition read)."""
    by_receipt = Q(status=Status.FAILED, reason__in=RECEIPT_REASONS, receipt_at__isnull=False)
    if status == Status.DELIVERED:
        tries = [(Q(status=Status.SENT) | by_receipt, "moved")]
        # The failure's reason goes with it; a sent row keeps what its send said.
        fields = {**fields, "reason": "", "reason_detail": Case(When(status=Status.FAILED, then=Value("")),
                                                                default=F("reason_detail"))}
    else:
        tries = [(Q(status__in=[Status.SENT, Status.DELIVERED]), "moved"), (by_receipt, REFAILED)]
        fields = {**fields, "delivered_at": None}
    rows = Notification.objects.filter(pk=pk) if archived_at is None else archive.in_history(pk, archived_at)
    for recorded, outcome in tries:
        if (rows.filter(recorded, _newer(at, rank), status__in=sources(Cause.PROVIDER_RECEIPT, status))
                .update(status=status, receipt_at=at, receipt_rank=rank, **fields)):
            table = (Notification if archived_at is None else NotificationHistory)._meta.db_table
            outbox.emit_ids([pk], status, clock.now(), table=table, created_at=archived_at)
            return outcome
    return ""


def settle_unrecorded(pk, source: str, status: str, fields: dict, cause: Cause,
                      order: tuple[datetime, int] | None = None) -> bool:
    """Move the locked row ``pk`` from ``source`` (``sending``, or waiting for a re-send) to
    ``status``: a receipt proved its unrecorded call. ``order``: the receipt's key when it ends the
    row (``delivered``/``failed``)."""
    if not allowed(cause, source, status):
        return False
    if order is not None:
        fields = {**fields, "receipt_at": order[0], "receipt_rank": order[1]}
    moved = bool(Notification.objects.filter(pk=pk, status=source).update(status=status, **fields))
    if moved:
        outbox.emit_ids([pk], status, clock.now())
    return moved


def mark_events(event_ids: list, status: str, reason: str = "") -> None:
    """The receipts' timeline entries record the state they moved their row to. A receipt that
    ended its row (``delivered``/``failed``) overrules every receipt applied before it (all older in
    the provider's order): the entries of those listed after it (received later, applied first by
    another worker) get :data:`OVERRULED`, so no entry below it claims the row's state."""
    if not event_ids:
        return
    with connection.cursor() as cur:
        cur.execute(_MARK_SQL, [str(status), str(reason), array_literal(event_ids), OVERRULED,
                                status in (Status.DELIVERED, Status.FAILED), OVERRULED])


def mark_out_of_order(items: list[tuple], *, archived_since: datetime | None = None) -> set:
    """Mark the receipts' entries ``[(event id, at, rank)]`` whose row had a newer receipt applied
    already (:data:`OUT_OF_ORDER`); returns the event ids marked. ``archived_since``: their rows are
    in the history, archived then or later."""
    if not items:
        return set()
    params = [OUT_OF_ORDER, array_literal(e for e, _a, _r in items),
              array_literal(at.isoformat() for _e, at, _r in items), array_literal(rank for _e, _a, rank in items)]
    table = (NotificationHistory if archived_since is not None else Notification)._meta.db_table
    with connection.cursor() as cur:
        cur.execute(_OUT_OF_ORDER_SQL[table], params + ([archived_since] if archived_since is not None else []))
        return {row[0] for row in cur.fetchall()}


def app_move(n: Notification, target: str, now: datetime) -> bool:
    """An app receipt moves ``n`` up the app's ladder to ``target`` (only from a status below it),
    where it lives: the live table, or an archived row's one history partition (the same moves);
    ``n`` is updated in memory when it moved."""
    rows = archive.in_history(n.pk, archive.partition_key(n)) if n.archived else Notification.objects.filter(pk=n.pk)
    moved = rows.filter(status__in=sources(Cause.APP_RECEIPT, target)).update(status=target, updated_at=now)
    if moved:
        n.status, n.updated_at = target, now
        outbox.emit_rows([n], target, now)
    return bool(moved)
