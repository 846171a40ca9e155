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

from core.postgres import array_literal
from notifications.lifecycle.table import Cause, allowed, in_sql, sources
from notifications.models import DeliveryEvent, Notification, Reason, Status

#: Receipt kinds by rank, for receipts of one message at the same instant: positive proof of
#: delivery outranks a failure reported in the same second.
KIND_RANK = {"accepted": 0, "deferred": 1, "failed": 2, "delivered": 3}
#: Reasons of a row failed by a provider's receipt (a newer ``delivered`` may still move it).
RECEIPT_REASONS = (Reason.PROVIDER_UNDELIVERED, Reason.PROVIDER_BOUNCED)
#: Appended to a receipt's timeline entry when a newer receipt had been applied already.
OUT_OF_ORDER = "(out of order: a newer receipt was applied first; not applied)"

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

_OUT_OF_ORDER_SQL = f"""
UPDATE notifications_deliveryevent AS e SET detail = left(e.detail || ' ' || %s, 500)
  FROM unnest(%s::bigint[], %s::timestamptz[], %s::int[]) AS v(id, at, rank), notifications_notification AS n
 WHERE e.id = v.id AND n.id = e.notification_id AND n.status IN ({", ".join(repr(str(s)) for s in _RECORDED)})
   AND n.receipt_at IS NOT NULL AND (n.receipt_at, n.receipt_rank) >= (v.at, v.rank)
RETURNING e.id
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
        return {row[0] for row in cur.fetchall()}


def settle(pk, status: str, fields: dict, at: datetime, rank: int) -> bool:
    """A provider's ``delivered``/``failed`` receipt of order ``(at, rank)`` moves the recorded row
    ``pk`` (``sent``, or the other end set by an older receipt) to ``status`` with ``fields``
    (``delivered`` clears a failure's reason)."""
    if status == Status.DELIVERED:
        recorded = Q(status=Status.SENT) | Q(status=Status.FAILED, reason__in=RECEIPT_REASONS,
                                              receipt_at__isnull=False)
        # The failure's reason goes with it; a sent row keeps what its send said.
        fields = {**fields, "reason": "", "reason_detail": Case(When(status=Status.FAILED, then=Value("")),
                                                                default=F("reason_detail"))}
    else:
        recorded = Q(status__in=[Status.SENT, Status.DELIVERED])
    return bool(Notification.objects.filter(recorded, _newer(at, rank), pk=pk,
                                            status__in=sources(Cause.PROVIDER_RECEIPT, status))
                .update(status=status, receipt_at=at, receipt_rank=rank, **fields))


def settle_unrecorded(pk, source: str, status: str, fields: dict, cause: Cause,
                      order: tuple[datetime, int] | None = None) -> bool:
    """Move the locked row ``pk`` from ``source`` (``sending``, or waiting for a re-send) to
    ``status``: a receipt proved its unrecorded call. ``order``: the receipt's key when it ends the
    row (``delivered``/``failed``)."""
    if not allowed(cause, source, status):
        return False
    if order is not None:
        fields = {**fields, "receipt_at": order[0], "receipt_rank": order[1]}
    return bool(Notification.objects.filter(pk=pk, status=source).update(status=status, **fields))


def mark_events(event_ids: list, status: str, reason: str = "") -> None:
    """The receipts' timeline entries record the state they moved their row to."""
    DeliveryEvent.objects.filter(pk__in=event_ids).update(status=status, reason=reason)


def mark_out_of_order(items: list[tuple]) -> set:
    """Mark the receipts' entries ``[(event id, at, rank)]`` whose row had a newer receipt applied
    already (:data:`OUT_OF_ORDER`); returns the event ids marked."""
    if not items:
        return set()
    with connection.cursor() as cur:
        cur.execute(_OUT_OF_ORDER_SQL, [OUT_OF_ORDER, array_literal(e for e, _a, _r in items),
                                        array_literal(at.isoformat() for _e, at, _r in items),
                                        array_literal(rank for _e, _a, rank in items)])
        return {row[0] for row in cur.fetchall()}


def app_move(n: Notification, target: str, now: datetime) -> bool:
    """An app receipt moves ``n`` up the app's ladder to ``target`` (only from a status below it);
    ``n`` is updated in memory when it moved."""
    moved = Notification.objects.filter(pk=n.pk, status__in=sources(Cause.APP_RECEIPT, target)).update(
        status=target, updated_at=now)
    if moved:
        n.status, n.updated_at = target, now
    return bool(moved)
