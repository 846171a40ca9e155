"""Delivery receipts: normalised provider events applied to notifications.

The provider webhooks publish provider-neutral :class:`providers.receipts.Receipt` events
(:func:`providers.receipts.publish`); this app subscribes :func:`accept_receipts`, which queues them
for the receipts worker (:func:`apply_wire` → :func:`apply_receipts`), so providers import nothing of
this module. Each receipt is stored once (``dedup_key``), moves its row only forward or to the
provider's newer word (:func:`order_key`), settles a row whose call was never recorded, and applies
the contact consequences (bounces, STOP, unsubscribes). A row archived to the history is found and
moved there by the same rules (docs/ARCHITECTURE.md §13). The rules in full: docs/PROVIDERS.md,
"Delivery receipts"; the order: docs/ARCHITECTURE.md §5, "Receipt order".
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.db.models.functions import Lower, Trim

from core import clock
from core.postgres import array_literal
from core.queues import RECEIPTS_DRAIN_TASK, RECEIPTS_QUEUE
from core.redis_client import get_redis
from notifications import lifecycle, metrics, receipt_contacts, receipts_buffer, sent_markers
from notifications.delivery import caps, record
from notifications.events import fallback
from notifications.lifecycle import archive
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification, Reason, Status
from providers.receipts import (
    ACCEPTED,
    DEFERRED,
    DELIVERED,
    ENGAGEMENT,
    FAILED,
    Receipt,
)

log = logging.getLogger(__name__)

UNKNOWN_COUNTER_KEY = "receipts:unknown"

#: ``scheduled``/``queued`` rows with these reasons wait for a re-send after a call whose outcome
#: was never learned: a delivered/failed receipt settles them (module docstring).
RESEND_PENDING_REASONS = frozenset({Reason.OUTCOME_UNKNOWN, Reason.LEASE_EXPIRED})


def _find(receipt: Receipt) -> Notification | None:
    """The notification of one receipt (:func:`_find_all`'s rule), or None."""
    return _find_all([receipt]).get(0)


def accept_receipts(receipts: list[Receipt]) -> None:
    """What a provider webhook calls once it verified the request: the receipts go to the receipts
    buffer and the ``receipts`` queue's worker applies them in batches (:func:`drain_buffer`,
    :mod:`notifications.receipts_buffer`), so the request answers
    at once and a burst of provider callbacks (two per SMS of a campaign) never holds the API's
    threads while an OTP waits to be accepted. When the broker cannot take them they are applied
    here, in the request (slower, never lost). A receipt queued and then lost with the broker
    (Redis flushed) leaves its notification ``sent`` instead of ``delivered``: receipts inform, the
    delivery itself is already recorded."""
    if not receipts:
        return
    now = clock.now()
    if settings.NOTIFY["RECEIPTS_INLINE"]:
        apply_receipts(stamped(receipts, now))
        return
    try:
        first = receipts_buffer.push([to_wire(r, received_at=now) for r in receipts])
    except Exception as exc:  # redis raises many types; all mean "not buffered"
        log.warning("receipts buffer unavailable (%s); applying %d receipt(s) in the request", exc, len(receipts))
        apply_receipts(stamped(receipts, now))
        return
    if first:  # else the pending drain takes them
        queue_drain()


def queue_drain() -> None:
    """Queue the drain of the receipts buffer (the caller took its flag); drain here if the queue
    cannot take it."""
    try:
        current_app.send_task(RECEIPTS_DRAIN_TASK, queue=RECEIPTS_QUEUE, routing_key=RECEIPTS_QUEUE, exchange="")
    except Exception as exc:  # kombu/redis raise many types; all mean "not queued"
        log.warning("receipts queue unavailable (%s); draining the receipts buffer here", exc)
        drain_buffer()


def requeue_stranded() -> bool:
    """The reconciler's tick: queue a drain when receipts wait with none pending. Returns whether it did."""
    try:
        if not receipts_buffer.stranded():
            return False
    except Exception as exc:  # redis down: the next tick tries again
        log.warning("receipts buffer unreadable (%s)", exc)
        return False
    log.warning("receipts waited in the buffer with no drain pending; a drain is queued")
    queue_drain()
    return True


def drain_buffer() -> dict[str, int]:
    """Apply every receipt waiting in the buffer (:mod:`notifications.receipts_buffer`), in batches
    (``NOTIFY["RECEIPTS_DRAIN_LINGER"]``: seconds a drain waits after a batch that was not full)."""
    return receipts_buffer.drain(apply_wire, settings.NOTIFY.get("RECEIPTS_DRAIN_LINGER", 0.0))


def stamped(receipts: list[Receipt], now: datetime | None = None) -> list[Receipt]:
    """``receipts`` with ``received_at`` set to ``now`` (default: the clock's) where it is not set
    yet: the instant we received them orders a message's receipts when the provider gives no time
    of its own (Twilio)."""
    now = now or clock.now()
    return [r if r.received_at is not None else dataclasses.replace(r, received_at=now) for r in receipts]


def order_key(receipt: Receipt) -> tuple[datetime, int]:
    """Where ``receipt`` stands among its message's receipts (docs/ARCHITECTURE.md §5, "Receipt
    order"): the provider's event time, else the instant we received it; then the kind's rank."""
    at = receipt.occurred_at or receipt.received_at or clock.now()
    return at, lifecycle.KIND_RANK.get(receipt.kind, 0)


def _received(receipt: Receipt, now: datetime) -> datetime:
    """A receipt's timeline instant: when we received it (so two receipt workers applying a
    message's receipts in either order list them in the order they came), never after ``now``."""
    return min(receipt.received_at or now, now)


def to_wire(receipt: Receipt, received_at: datetime | None = None) -> dict:
    """``receipt`` as JSON-serialisable fields (instants as ISO 8601) for the receipts buffer, as
    :func:`stamped` with ``received_at`` would have it (without a copy of each receipt). Its fields
    are flat: a shallow copy (``dataclasses.asdict`` deep-copies every value, for nothing)."""
    fields = {name: getattr(receipt, name) for name in _FIELDS}
    if fields["received_at"] is None:
        fields["received_at"] = received_at
    for name in _INSTANTS:
        if fields[name] is not None:
            fields[name] = fields[name].isoformat()
    return fields


_INSTANTS = ("occurred_at", "received_at")
_FIELDS = tuple(f.name for f in dataclasses.fields(Receipt))


def apply_wire(items: list[dict]) -> dict[str, int]:
    """:func:`apply_receipts` for receipts as :func:`to_wire` wrote them (unknown keys ignored)."""
    receipts = []
    for item in items:
        fields = {k: v for k, v in item.items() if k in _FIELDS}
        for name in _INSTANTS:
            if fields.get(name):
                fields[name] = datetime.fromisoformat(fields[name])
        receipts.append(Receipt(**fields))
    return apply_receipts(receipts)


def apply_receipts(receipts: list[Receipt]) -> dict[str, int]:
    """Apply receipts in order. Returns ``{"applied", "duplicate", "unknown"}`` counts. Never raises
    for bad data: a webhook must answer 2xx for anything it verified.

    A provider batch (SendGrid posts up to hundreds of events at once) is applied in bulk where
    nothing depends on order: the receipts that only store an event or settle a ``sent`` row as
    ``delivered`` (no failure, no contact consequence, for a notification with at most one settling
    receipt in the batch) take one lookup, one INSERT and one UPDATE for the whole batch. Every
    other receipt goes through :func:`_apply_one`, one by one, in order."""
    counts = {"applied": 0, "duplicate": 0, "unknown": 0}
    receipts = stamped(receipts)
    found = _find_all(receipts)
    bulk, single = _plan(receipts, found)
    if bulk:
        for outcome in _apply_bulk(bulk):
            counts[outcome] += 1
    for receipt in single:
        counts[_apply_one(receipt)] += 1
    if receipts:
        metrics.receipts_counted(receipts[0].provider, counts)
    if counts["unknown"]:
        log.info("%d receipt(s) for unknown messages from %s", counts["unknown"], receipts[0].provider)
        try:
            get_redis().incrby(UNKNOWN_COUNTER_KEY, counts["unknown"])
        except Exception as exc:  # redis down: the log line above still counts
            log.warning("unknown-receipt counter not updated: %s", exc)
    return counts


def _find_all(receipts: list[Receipt]) -> dict[int, Notification]:
    """The notification of each receipt (by position): by our id when the provider echoed it, else
    by the provider's message id: for a receipt with an ``address`` (a SendGrid request id, shared by
    a batch's recipients) only the row of that id sent to that address (compared case-insensitively),
    never any row of the batch. A receipt matching nothing is absent (counted as unknown by
    :func:`apply_receipts`). Receipts whose row is not live look in the history among rows archived
    within the receipt window (``archive.receipt_window``, whenever they were created: the bound
    prunes the day partitions read)."""
    found = _lookup(receipts, lambda q: list(_with_recipient().filter(q)))
    if len(found) < len(receipts):  # the rest may have been archived
        since = archive.receipt_window(clock.now())
        positions = [i for i in range(len(receipts)) if i not in found]
        more = _lookup([receipts[i] for i in positions], lambda q: archive.archived(q, since, **_ADDRESS))
        found.update({positions[j]: n for j, n in more.items()})
    return found


def _lookup(receipts: list[Receipt], load: Callable[[Q], Sequence[Notification]]) -> dict[int, Notification]:
    """:func:`_find_all` in one table (``load`` runs a filter there). Two index lookups at most: by
    primary key, then, for the receipts it did not find, by provider message id. One query OR-ing
    both (and the address, a column of the joined recipient) could use no index: it scanned the
    table, ~20 ms per SendGrid batch at 20,000 rows and growing with it."""
    ids = set()
    for r in receipts:
        if r.notification_id:
            with contextlib.suppress(ValueError):  # not ours: unknown
                ids.add(uuid.UUID(str(r.notification_id)))
    rows = list(load(Q(pk__in=ids))) if ids else []
    by_id = {str(n.pk): n for n in rows}
    rest = [r for r in receipts if not (r.notification_id and str(r.notification_id) in by_id)]
    message_ids = {r.provider_message_id for r in rest if r.provider_message_id and r.address is None}
    batch_ids = {r.provider_message_id for r in rest if r.provider_message_id and r.address}
    addresses = {_address_key(r.address) for r in rest if r.provider_message_id and r.address}
    if message_ids or batch_ids:
        # A batch's rows are narrowed to the receipts' addresses in the query: one failure receipt of
        # a 1,000-recipient request reads its own row, not the request's thousand.
        rows = list(load(Q(provider_message_id__in=message_ids | batch_ids)
                         & (Q(provider_message_id__in=message_ids)
                            | Q(provider_message_id__in=batch_ids, receipt_address__in=addresses))))
    else:
        rows = []
    by_message: dict[tuple[str, str | None], Notification] = {}
    for n in rows:
        if n.provider_message_id:
            by_message.setdefault((n.provider_message_id, None), n)
            if n.recipient.email:
                by_message[(n.provider_message_id, _address_key(n.recipient.email))] = n
    found: dict[int, Notification] = {}
    for index, r in enumerate(receipts):
        hit: Notification | None = by_id.get(str(r.notification_id)) if r.notification_id else None
        if hit is None and r.provider_message_id and r.address != "":
            address = None if r.address is None else _address_key(r.address)
            hit = by_message.get((r.provider_message_id, address))
        if hit is not None:
            found[index] = hit
    return found


#: The recipient's email as receipts match it (a batch's receipts name their address).
_ADDRESS = {"receipt_address": Lower(Trim("recipient__email"))}


def _with_recipient():
    """Notifications with their recipient loaded and its email as receipts match it."""
    return Notification.objects.select_related("recipient").annotate(**_ADDRESS)


def _address_key(address: str) -> str:
    """An address as receipts are matched on it: blanks around it and case ignored."""
    return address.strip().lower()


def _plan(receipts: list[Receipt], found: dict[int, Notification]) -> tuple[list, list[Receipt]]:
    """Split into ``[(receipt, notification)]`` for the bulk path and receipts for :func:`_apply_one`
    (see :func:`apply_receipts`); unknown ones go to the single path, which counts them."""
    settling: dict = {}
    slow_rows = set()
    for index, r in enumerate(receipts):
        n = found.get(index)
        if n is None:
            continue
        if r.kind in (DELIVERED, FAILED):
            settling[n.pk] = settling.get(n.pk, 0) + 1
        if r.kind not in _BULK_KINDS or r.invalid_address or r.error_code or n.status in _UNRECORDED or n.archived:
            slow_rows.add(n.pk)
    slow_rows.update(pk for pk, k in settling.items() if k > 1)
    bulk, single = [], []
    for index, r in enumerate(receipts):
        n = found.get(index)
        if n is not None and n.pk not in slow_rows:
            bulk.append((r, n))
        else:
            single.append(r)
    return bulk, single


#: States of a row whose provider call may have happened unrecorded (still being recorded, or
#: waiting for a re-send after an unknown outcome): a receipt for it goes one by one.
_UNRECORDED = frozenset({Status.SENDING, Status.SCHEDULED, Status.QUEUED})

#: Receipt kinds the bulk path applies: store the event; ``delivered`` also settles the row.
_BULK_KINDS = frozenset({ACCEPTED, DEFERRED, ENGAGEMENT, DELIVERED})

#: Advisory-lock class of receipt dedup keys (two-int form: apart from every bigint lock).
_DEDUP_LOCK_CLASS = 7301

_LOCK_KEYS_SQL = """
SELECT pg_advisory_xact_lock(%s::int, h)
  FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(%s::text[]) AS k) AS keys
 ORDER BY h
"""

#: A receipt's event, once per ``dedup_key``: the table is partitioned by day (docs/ARCHITECTURE.md
#: §13), so no unique index can hold the key; under :func:`_lock_dedup_keys` this looks for the key
#: from the notification's creation on (no earlier event is its) and inserts the first of each key
#: in the batch that is not there yet, in the batch's order (ids order a timeline's equal instants).
_INSERT_EVENTS_SQL = """
INSERT INTO notifications_deliveryevent (notification_id, kind, status, reason, detail, dedup_key, created_at)
SELECT first.notification_id, first.kind, '', '', first.detail, first.dedup_key, first.created_at
  FROM (SELECT DISTINCT ON (v.dedup_key) v.*
          FROM unnest(%s::uuid[], %s::text[], %s::text[], %s::text[], %s::timestamptz[], %s::timestamptz[])
               WITH ORDINALITY AS v(notification_id, kind, detail, dedup_key, created_at, since, n)
         WHERE NOT EXISTS (SELECT 1 FROM notifications_deliveryevent AS e
                            WHERE e.dedup_key = v.dedup_key AND e.created_at >= v.since)
         ORDER BY v.dedup_key, v.n) AS first
 ORDER BY first.n
RETURNING id, dedup_key
"""


def _lock_dedup_keys(keys: list[str]) -> None:
    """Hold each receipt key's advisory lock to the end of the transaction (in one order, so two
    workers never deadlock): one writer at a time decides whether a key is stored yet."""
    with connection.cursor() as cur:
        cur.execute(_LOCK_KEYS_SQL, [_DEDUP_LOCK_CLASS, array_literal(keys)])


def _stored_before(key: str, n: Notification) -> bool:
    """Whether receipt ``key`` of ``n`` is stored (call under :func:`_lock_dedup_keys`)."""
    return DeliveryEvent.objects.filter(dedup_key=key, created_at__gte=n.created_at).exists()


def _apply_bulk(pairs: list[tuple[Receipt, Notification]]) -> list[str]:
    """Apply ``pairs`` in one transaction; returns one ``"applied"``/``"duplicate"`` per pair."""
    now = clock.now()
    keys = [r.dedup_key[:200] for r, _n in pairs]
    with transaction.atomic():
        _lock_dedup_keys(keys)
        with connection.cursor() as cur:
            cur.execute(_INSERT_EVENTS_SQL, [array_literal(str(n.pk) for _r, n in pairs),
                                             array_literal(f"receipt:{r.raw}"[:32] for r, _n in pairs),
                                             array_literal(receipt_contacts.stored_details(pairs)), array_literal(keys),
                                             array_literal(_received(r, now).isoformat() for r, _n in pairs),
                                             array_literal(n.created_at.isoformat() for _r, n in pairs)])
            events = {key: pk for pk, key in cur.fetchall()}
        outcomes, delivered = [], {}
        for (r, n), key in zip(pairs, keys, strict=True):
            event_id = events.pop(key, None)  # a key twice in the batch: the second is a duplicate
            outcomes.append("applied" if event_id is not None else "duplicate")
            if event_id is not None:
                metrics.receipt_applied(n, r)
                if r.kind == DELIVERED:
                    delivered[n.pk] = (r, n, event_id)
        if delivered:
            moved = lifecycle.deliver([(pk, *order_key(r)) for pk, (r, _n, _e) in delivered.items()], now)
            fields = {"lease_until": None, "updated_at": now, "delivered_at": now}
            for pk, (r, n, _event) in delivered.items():
                if (pk in moved or _settle_unrecorded(n, r, Status.DELIVERED, fields, now)
                        or _settle_moved(n, Status.DELIVERED, fields, *order_key(r))):
                    moved.add(pk)
                    metrics.receipt_transitioned(n, Status.DELIVERED)
            lifecycle.mark_events([delivered[pk][2] for pk in moved], Status.DELIVERED)
            lifecycle.mark_out_of_order([(event, *order_key(r)) for pk, (r, _n, event) in delivered.items()
                                         if pk not in moved])
    return outcomes


def _apply_one(receipt: Receipt) -> str:
    n = _find(receipt)
    if n is None:
        return "unknown"
    key = receipt.dedup_key[:200]
    with transaction.atomic():
        _lock_dedup_keys([key])
        if _stored_before(key, n):
            return "duplicate"
        detail = receipt_contacts.stored_detail(n, receipt)
        event = DeliveryEvent.objects.create(notification=n, kind=f"receipt:{receipt.raw}"[:32], dedup_key=key,
                                             detail=detail, created_at=_received(receipt, clock.now()))
        now = clock.now()
        if receipt.kind in (DELIVERED, FAILED):
            _settle(n, receipt, event, detail, now)
        elif (receipt.kind == ACCEPTED and n.status in _UNRECORDED
              and _settle_unrecorded(n, receipt, Status.SENT, {"lease_until": None, "updated_at": now}, now)):
            # The provider has it (Twilio queued/sent, SendGrid processed): a call whose answer we
            # never got, or have not recorded yet, was accepted; a pending re-send must not happen.
            lifecycle.mark_events([event.pk], Status.SENT)
        receipt_contacts.contact_hygiene(n, receipt, now)
        metrics.receipt_applied(n, receipt)
    return "applied"


def _settle(n: Notification, receipt: Receipt, event: DeliveryEvent, detail: str, now: datetime) -> None:
    """Move ``n`` to ``delivered``/``failed`` for a delivered/failure ``receipt`` if its state allows
    (module docstring), a failure with the receipt's stored ``detail``
    (:func:`~notifications.receipt_contacts.stored_detail`) as its reason detail; the receipt's
    event then records the state it moved the row to. Runs inside the receipt's transaction. The
    common case (``sent``) costs one conditional UPDATE."""
    fields: dict = {"lease_until": None, "updated_at": now}
    if receipt.kind == DELIVERED:
        status, reason = Status.DELIVERED, ""
        fields["delivered_at"] = now
    else:
        status = Status.FAILED
        reason = Reason.PROVIDER_BOUNCED if n.channel == "email" else Reason.PROVIDER_UNDELIVERED
        fields.update(reason=reason, reason_detail=detail)
    at, rank = order_key(receipt)
    settled = (lifecycle.settle_receipt(n.pk, status, fields, at, rank, archived_at=n.archived_at) if n.archived
               else lifecycle.settle_receipt(n.pk, status, fields, at, rank))
    moved = bool(settled) or _settle_unrecorded(n, receipt, status, fields, now)
    if not moved and not n.archived and (since := _settle_moved(n, status, fields, at, rank)):
        moved, settled, n = True, "moved", since
    if not moved:
        lifecycle.mark_out_of_order([(event.pk, at, rank)], archived_since=n.archived_at if n.archived else None)
        return
    lifecycle.mark_events([event.pk], status, reason)
    if settled != lifecycle.REFAILED:  # a newer failure of a failed row only says the provider's last word
        metrics.receipt_transitioned(n, status, reason)
        if status == Status.FAILED:  # it did not reach the recipient after all:
            caps.give_back([n])  # its frequency-cap slot is free again
            if record.from_event(n):  # a fallback type's next channel goes
                fallback.reopen([(n.pk, n.channel)], f"{n.channel}: {reason}")


def _settle_moved(n: Notification, status: str, fields: dict, at: datetime, rank: int) -> Notification | None:
    """A live row the archiver moved after the receipt found it: settle it in the history (the same
    rules); returns its archived copy when it moved there."""
    if n.archived:
        return None
    for moved in archive.archived_by_id([n.pk], n.updated_at):  # archived after its last live change
        if lifecycle.settle_receipt(n.pk, status, fields, at, rank, archived_at=moved.archived_at):
            return moved
    return None


def _settle_unrecorded(n: Notification, receipt: Receipt, status: str, fields: dict, now: datetime,
                       cause: lifecycle.Cause = lifecycle.Cause.PROVIDER_RECEIPT) -> bool:
    """The row was not ``sent``: lock and read it, and settle it with ``fields`` plus what the receipt
    tells about the unrecorded call if it is ``sending`` or waiting for a re-send (module docstring);
    one its worker recorded meanwhile (``sent``) is settled plainly. Returns whether it moved."""
    if n.archived:  # a finished row: never unrecorded
        return False
    row = (Notification.objects.select_for_update(no_key=True).filter(pk=n.pk)
           .values("status", "reason", "attempts", "provider", "provider_message_id", "sent_at",
                   "first_attempt_at", "created_at").first())
    if row is None:
        return False
    ends = status in (Status.DELIVERED, Status.FAILED)
    if row["status"] == Status.SENT:  # recorded meanwhile: an end moves it as usual; sent it is already
        return bool(lifecycle.settle_receipt(n.pk, status, fields, *order_key(receipt))) if ends else True
    waiting = row["status"] in (Status.SCHEDULED, Status.QUEUED) and row["reason"] in RESEND_PENDING_REASONS
    if row["status"] != Status.SENDING and not waiting:
        return False
    message_id = receipt.provider_message_id[:255] or row["provider_message_id"]
    fields = {**fields, "provider": row["provider"] or receipt.provider[:32], "provider_message_id": message_id,
              "sent_at": row["sent_at"] or _sent_at(receipt, row["first_attempt_at"] or row["created_at"], now),
              "due_at": None}
    if status in (Status.SENT, Status.DELIVERED):
        fields.update(reason="", reason_detail="")  # outcome_unknown/lease_expired no longer hold
    if not lifecycle.settle_unrecorded(n.pk, row["status"], status, fields, cause,
                                       order_key(receipt) if ends else None):
        return False
    DeliveryAttempt.objects.create(
        notification_id=n.pk, number=row["attempts"] or 1, provider=receipt.provider[:32],
        outcome=DeliveryAttempt.Outcome.LEARNED_FROM_RECEIPT, provider_message_id=message_id)
    transaction.on_commit(lambda: sent_markers.mark_sent([n.pk]))  # after the row says so, as the send path
    metrics.receipt_transitioned(n, Status.SENT)  # counted at each step (sent, then delivered/failed)
    return True


def settle_as_sent(n: Notification, receipt: Receipt, now: datetime) -> bool:
    """Settle ``n`` as ``sent`` when its provider call was never recorded (``sending``, or waiting
    for a re-send with reason ``outcome_unknown``/``lease_expired``) and ``receipt`` proves the
    message got through (module docstring, "A receipt proves a provider call"): the same rule as an
    ``accepted`` provider receipt, for other sources of proof (the app's receipts,
    :mod:`notifications.app_receipts`). Call inside a transaction. Returns whether it moved (a
    ``sent`` row also answers True, unchanged); other states are left alone (False)."""
    return _settle_unrecorded(n, receipt, Status.SENT, {"lease_until": None, "updated_at": now}, now,
                              lifecycle.Cause.APP_RECEIPT)


def _sent_at(receipt: Receipt, claimed_at: datetime, now: datetime) -> datetime:
    """When the provider took the message: its event time if that can be this message's call (not
    before ``claimed_at``, the row's first claim, counting that claim's whole second since providers
    give whole seconds; not after ``now``, the receipt's arrival), else ``now``."""
    at = receipt.occurred_at
    if at is None or not claimed_at.replace(microsecond=0) <= at <= now:
        return now
    return max(at, claimed_at)
