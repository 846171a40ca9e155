"""Writes for single notifications: accept (with idempotency) and cancel.

The send path lives in :mod:`notifications.delivery`; the scheduler and reconciler in
:mod:`notifications.scheduler`.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef

from core import clock
from core.redaction import sensitive_content
from notifications import lifecycle
from notifications.acceptance.rules import limit_acceptance
from notifications.enqueue import enqueue_on_commit
from notifications.models import (
    NOTIFICATION_ID_NAMESPACE,
    REACHED_STATUSES,
    APIClient,
    DeliveryAttempt,
    DeliveryEvent,
    InboxItem,
    Notification,
    Reason,
    Status,
)
from preferences.models import Recipient


class IdempotencyKeyReused(Exception):
    """The idempotency key was already used by this client with a different request body."""

    def __init__(self, notification: Notification) -> None:
        super().__init__("idempotency key already used with a different request body")
        self.notification = notification


class NotCancellable(Exception):
    """The notification was already claimed by a worker or has finished."""

    def __init__(self, notification: Notification) -> None:
        if notification.status in (Status.SCHEDULED, Status.QUEUED):  # the in_app row whose item is written
            text = (f"notification is {notification.status}, but its item is already in the user's inbox: it was "
                    "sent (its delivery is being recorded)")
        else:
            text = f"notification is {notification.status}; only scheduled or queued ones can be cancelled"
        super().__init__(text)
        self.notification = notification


@dataclass(frozen=True)
class Accepted:
    """Result of :func:`accept_notification`. ``replayed`` is True when the key was seen before."""

    notification: Notification
    replayed: bool


#: An in_app row whose item is already in the inbox (its worker died between the write and the
#: record): it was sent, whatever its status says, so no cancel may claim it; its re-drive records
#: it ``sent`` at once (delivery/load.py, the inbox lookup).
WRITTEN_TO_INBOX = Exists(InboxItem.objects.filter(notification_id=OuterRef("pk")))

def request_fingerprint(body: object) -> str:
    """SHA-256 hex of the request body as canonical JSON (sorted keys, no whitespace)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()


def notification_id_for(client_id: str, idempotency_key: str) -> uuid.UUID:
    """Deterministic id of an API send: uuid5 over the client and its idempotency key."""
    return uuid.uuid5(NOTIFICATION_ID_NAMESPACE, f"{client_id}:{idempotency_key}")


def accept_notification(
    *,
    client: APIClient,
    idempotency_key: str,
    fingerprint: str,
    recipient: Recipient,
    channel: str,
    priority: str,
    content: dict,
    category: str = "",
    scheduled_at: datetime | None = None,
    ttl_seconds: int | None = None,
    sensitive: bool = False,
) -> Accepted:
    """Store a validated send request durably and, if it is due now, enqueue it after commit.

    Idempotency (IETF Idempotency-Key draft, Stripe's practice): the id is derived from
    ``(client, idempotency_key)`` and a unique constraint rejects a second row, so concurrent or
    repeated requests create exactly one notification. A repeat with the same ``fingerprint``
    returns the stored notification (``replayed=True``).

    Args:
        content: ``{"title"?, "body", "html"?, "data"?}`` already validated for the channel.
        scheduled_at: aware datetime; ``None`` or a past instant means "now".
        ttl_seconds: the message expires this many seconds after it was due (``scheduled_at``, or
            acceptance for immediate sends); ``None`` = no expiry.

    Abuse limits (:func:`notifications.acceptance.rules.limit_acceptance`) are checked after the
    replay lookup (a replay is never counted) and before anything is written.

    Raises:
        IdempotencyKeyReused: same key, different fingerprint.
        AcceptanceLimited, AcceptanceLimitsUnavailable: (``core.api.refusals``) 429 / 503, nothing written.
    """
    now = clock.now()
    nid = notification_id_for(str(client.pk), idempotency_key)
    due = scheduled_at if scheduled_at and scheduled_at > now else None
    status = Status.SCHEDULED if due else Status.QUEUED
    start = scheduled_at or now
    notification = Notification(
        id=nid,
        client=client,
        idempotency_key=idempotency_key,
        request_fingerprint=fingerprint,
        recipient=recipient,
        channel=channel,
        priority=priority,
        category=category or "",
        title=content.get("title") or "",
        body=content["body"],
        html=content.get("html") or "",
        data=content.get("data"),
        sensitive=sensitive,
        status=status,
        accepted_status=status,
        scheduled_at=scheduled_at,
        due_at=due,
        queued_at=None if due else now,
        expires_at=start + timedelta(seconds=ttl_seconds) if ttl_seconds else None,
    )
    reservation = limit_acceptance(Notification, nid, client=client, recipients=[recipient], type_key="",
                                   category=category or "", channels=[channel], now=now)
    try:
        # An error on the way is logged (Django's 500) without a sensitive notification's content.
        with reservation, sensitive_content([notification] if sensitive else ()), transaction.atomic():
            notification.save(force_insert=True)
            DeliveryEvent.objects.create(notification=notification, kind="accepted", status=status,
                                         detail=f"due {due.isoformat()}" if due else "")
            if status == Status.QUEUED:
                enqueue_on_commit([(nid, priority, channel)])
    except IntegrityError:
        # The same (client, key) was committed first, possibly by a concurrent request that held
        # the unique index until it committed; read the winner.
        existing = Notification.objects.get(pk=nid)
        if existing.request_fingerprint != fingerprint:
            raise IdempotencyKeyReused(existing) from None
        return Accepted(existing, replayed=True)
    return Accepted(notification, replayed=False)


def cancel_notification(notification_id: uuid.UUID, client: APIClient | None = None) -> Notification:
    """Cancel a notification that no worker has claimed yet (``scheduled`` or ``queued``).

    A conditional UPDATE does it, so it races safely with the scheduler and the workers: whichever
    moves the row first wins, and a worker's claim (``queued → sending``) skips cancelled rows.

    Raises:
        Notification.DoesNotExist: no such notification (for this client, when given).
        NotCancellable: it is already sending or finished.
    """
    qs = Notification.objects.filter(pk=notification_id)
    if client is not None:
        qs = qs.filter(client=client)
    with transaction.atomic():
        notification = qs.get()
        if not lifecycle.cancel([notification.pk], lifecycle.Cause.CLIENT_CANCEL, Reason.CANCELLED_BY_CLIENT,
                                clock.now()):
            raise NotCancellable(notification)
        notification.refresh_from_db()
        if notification.event_id:  # an event's channel: a fallback waiting behind it is cancelled too
            from notifications.events import fallback

            fallback.settle([(notification.pk, Status.CANCELLED, Reason.CANCELLED_BY_CLIENT, notification.channel)])
    return notification


def replay_dead_letters(notification_ids, *, by: str) -> int:
    """Send dead-lettered notifications again: same id (so the sent marker and the claim still
    guard against a double send), attempt budget reset, ``queued`` and enqueued after commit. Records
    who replayed and when in the timeline. Only rows still ``failed`` and dead-lettered move, and not
    a fallback channel whose next channel has reached the user since (the replay would send twice).

    Returns how many were replayed.
    """
    now = clock.now()
    with transaction.atomic():
        rows = list(Notification.objects.select_for_update(skip_locked=True)
                    .filter(pk__in=list(notification_ids), status=Status.FAILED, dead_lettered_at__isnull=False)
                    .exclude(Exists(Notification.objects.filter(fallback_after=OuterRef("pk"),
                                                                status__in=REACHED_STATUSES)))
                    .values_list("pk", "priority", "channel"))
        if not rows:
            return 0
        rows = lifecycle.replay([r[0] for r in rows], now, f"dead letter replayed by {by} at {now.isoformat()}")
        enqueue_on_commit(rows)
    return len(rows)


ERASED = "[erased]"

#: The reason detail of a notification cancelled with its campaign (row and timeline event).
CAMPAIGN_CANCELLED_DETAIL = "its campaign was cancelled"


def cancel_campaign_notifications(campaign_id, *, limit: int = 5000) -> int:
    """Cancel up to ``limit`` of a campaign's notifications that no worker has claimed (``scheduled``
    or ``queued`` → ``cancelled``, reason ``campaign_cancelled``, each with its timeline event), in
    one short transaction; rows locked by the scheduler or a claim right now are skipped and left
    for the next call (a claimed row finishes its send, or is cancelled at send time). Returns how
    many were cancelled: fewer than ``limit`` means none is left (bar the skipped ones).

    Campaigns call it in chunks (a 1 M-recipient campaign is never one long UPDATE holding locks
    while an API request waits on it)."""
    now = clock.now()
    with transaction.atomic():
        pending = list(Notification.objects.select_for_update(skip_locked=True)
                       .filter(campaign_id=campaign_id, status__in=[Status.SCHEDULED, Status.QUEUED])
                       .exclude(WRITTEN_TO_INBOX).values_list("pk", flat=True)[:limit])
        if not pending:
            return 0
        moved = lifecycle.cancel(pending, lifecycle.Cause.CAMPAIGN_CANCEL, Reason.CAMPAIGN_CANCELLED, now,
                                 detail=CAMPAIGN_CANCELLED_DETAIL)
    return len(moved)


def erase_notification_content(recipient_id: str, contacts: list[str], *, by: str) -> dict[str, int]:
    """Personal-data erasure, this layer's part (inside the erasure's transaction): cancel the
    recipient's notifications no worker has claimed (``cancelled_by_client``, with a timeline event
    saying why), take its dead letters off the replayable list (timeline event ``dead_letter_withdrawn``),
    remove every notification's content (title, body, html, data) and the data of the
    events sent to this recipient alone, and replace the
    recipient's ``contacts`` wherever a provider echoed them into a reason, attempt error or event
    detail. Rows, statuses and timelines stay, so counts by status, channel and reason survive.

    Returns ``{"notifications_erased": rows whose content was removed, "notifications_cancelled": n}``.
    """
    from django.db.models import Q, Value
    from django.db.models.functions import Replace

    now = clock.now()
    mine = Notification.objects.filter(recipient_id=recipient_id)
    pending = list(mine.filter(status__in=[Status.SCHEDULED, Status.QUEUED]).values_list("pk", flat=True))
    cancelled = lifecycle.cancel(pending, lifecycle.Cause.ERASURE, Reason.CANCELLED_BY_CLIENT, now, detail=None,
                     event_detail=f"recipient's personal data erased by {by}"[:500])
    # Its dead letters leave the list: their content is gone, so a replay would send an empty message
    # to whoever holds the user id and contacts next (they stay failed, with their reason).
    withdrawn = list(mine.filter(status=Status.FAILED, dead_lettered_at__isnull=False).values_list("pk", flat=True))
    if withdrawn:
        Notification.objects.filter(pk__in=withdrawn).update(dead_lettered_at=None, updated_at=now)
        DeliveryEvent.objects.bulk_create([
            DeliveryEvent(notification_id=pk, kind="dead_letter_withdrawn", status=Status.FAILED, created_at=now,
                          detail=f"not replayable: the recipient's personal data was erased by {by}"[:500])
            for pk in withdrawn])
    erased = mine.filter(~Q(title="") | ~Q(body="") | ~Q(html="") | Q(data__isnull=False)).update(
        title="", body="", html="", data=None, updated_at=now)
    # The data of the events sent to this recipient alone (template input: an address, an order);
    # an event to many users carries data they share, which stays.
    from notifications.events.models import Event

    Event.objects.filter(pk__in=mine.filter(event__isnull=False).values("event_id"), user_ids=[recipient_id]).exclude(
        data={}).update(data={})
    for contact in contacts:
        mine.filter(reason_detail__contains=contact).update(
            reason_detail=Replace("reason_detail", Value(contact), Value(ERASED)))
        DeliveryAttempt.objects.filter(notification__recipient_id=recipient_id,
                                       error_message__contains=contact).update(
            error_message=Replace("error_message", Value(contact), Value(ERASED)))
        DeliveryEvent.objects.filter(notification__recipient_id=recipient_id, detail__contains=contact).update(
            detail=Replace("detail", Value(contact), Value(ERASED)))
    return {"notifications_erased": erased, "notifications_cancelled": len(cancelled)}
