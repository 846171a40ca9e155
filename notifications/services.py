"""Writes for single notifications: accept (with idempotency) and cancel.

The send path lives in :mod:`notifications.delivery`; the scheduler and reconciler in
:mod:`notifications.scheduler`.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Exists, OuterRef, Q
from django.utils.crypto import constant_time_compare, salted_hmac

from core import clock
from core.redaction import erase_contacts, sensitive_content
from notifications import lifecycle
from notifications.acceptance.rules import contact_mark
from notifications.admission import Admission, ArchivedRequest, Road, admit, original, refuse_archived, replay_refusals
from notifications.enqueue import enqueue_on_commit
from notifications.ids import single_send_id
from notifications.inbox.models import InboxItem
from notifications.models import (
    DEAD_LETTERS,
    REACHED_STATUSES,
    APIClient,
    DeliveryAttempt,
    DeliveryEvent,
    Notification,
    NotificationHistory,
    NotificationRecord,
    Reason,
    Status,
)
from notifications.webhooks import outbox
from preferences.models import Recipient


class IdempotencyKeyReused(Exception):
    """The idempotency key was already used by this client with a different request body (any road
    that takes a key: a single send, typed or not, an event). ``notification``: the row it made,
    when it made one."""

    def __init__(self, notification: Notification | None = None) -> None:
        super().__init__("idempotency key already used with a different request body")
        self.notification = notification


class NotCancellable(Exception):
    """Nothing could be cancelled: the notification (``notification``) was already claimed by a
    worker or has finished, or nothing of an event is left (the message says which)."""

    def __init__(self, notification: Notification | None = None, message: str = "") -> None:
        if message:
            text = message
        elif notification is None:
            text = ("nothing of this event is left to cancel: every notification was claimed by a worker or has "
                    "finished")
        elif notification.status in (Status.SCHEDULED, Status.QUEUED) and notification.reason in lifecycle.MAYBE_SENT:
            text = (f"notification is {notification.status} ({notification.reason}): its worker's call may have "
                    "reached the provider, so it is looked up before anything else and cannot be cancelled")
        elif notification.status in (Status.SCHEDULED, Status.QUEUED):  # the in_app row whose item is written
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

#: The salt of :func:`keyed_fingerprint` (``salted_hmac``: HMAC-SHA256 with a key derived from SECRET_KEY).
FINGERPRINT_SALT = "notifications.request_fingerprint"
#: A fingerprint stored before it was keyed: a plain SHA-256 (migration 0036 rewrites them).
_PLAIN = re.compile(r"[0-9a-f]{64}")


def request_fingerprint(body: object) -> str:
    """What an idempotency key is stored with, to tell a replay from a reuse: a keyed hash of the
    request body as canonical JSON (sorted keys, no whitespace). Keyed, as a plain SHA-256 of a
    body holding a 6-digit code gives the code back by trying the million (docs/SECURITY.md)."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return keyed_fingerprint(hashlib.sha256(canonical.encode()).hexdigest())


def keyed_fingerprint(plain_hash: str) -> str:
    """``"rf-"`` + HMAC-SHA256 (key from SECRET_KEY) of the plain SHA-256, 64 characters in all.
    Over the plain hash, so a stored plain one is turned into it without the body (migration 0036)."""
    return "rf-" + salted_hmac(FINGERPRINT_SALT, plain_hash, algorithm="sha256").hexdigest()[:61]


def same_request(stored: str, fingerprint: str) -> bool:
    """Whether ``fingerprint`` is the stored one of a key's first request (a replay). A stored
    plain SHA-256 (written by a process still on the code before the keyed one) matches its keyed
    form; an erased fingerprint (``""``) matches no request's."""
    if constant_time_compare(stored, fingerprint):
        return True
    return bool(_PLAIN.fullmatch(stored)) and constant_time_compare(keyed_fingerprint(stored), fingerprint)


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
    metadata: dict | None = None,
) -> Accepted:
    """Store a validated send request durably and, if it is due now, enqueue it after commit.

    The id is derived from ``(client, idempotency_key)`` and unique, so repeated requests create one
    row; a repeat with the same ``fingerprint`` returns it (``replayed=True``). The gate (road
    ``single`` of :func:`notifications.admission.admit`) runs before anything is written.
    ``content`` is already validated for the channel; ``scheduled_at`` ``None`` or past means now;
    ``ttl_seconds`` counts from when it was due (``None``: no expiry).

    Raises:
        IdempotencyKeyReused: same key, different fingerprint.
        MissingScope, ValidationError, AcceptanceLimited, AcceptanceLimitsUnavailable: the gate's
        403 / 422 / 429 / 503, nothing written.
    """
    now = clock.now()
    nid = single_send_id(str(client.pk), idempotency_key)
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
        metadata=metadata,
        sensitive=sensitive,
        limit_contact=contact_mark(recipient, channel),
        status=status,
        accepted_status=status,
        scheduled_at=scheduled_at,
        due_at=due,
        queued_at=None if due else now,
        expires_at=start + timedelta(seconds=ttl_seconds) if ttl_seconds else None,
    )
    decision = admit(Admission(road=Road.SINGLE, now=now, client=client, priority=priority, category=category or "",
                               channels=[channel], recipients=[recipient], content=content,
                               request=(Notification, nid)))
    try:
        # An error on the way is logged (Django's 500) without a sensitive notification's content.
        with decision, sensitive_content([notification] if sensitive else ()), transaction.atomic():
            notification.save(force_insert=True)
            if decision.replayed:  # the gate saw the key's row; it may have been archived since: then it answers
                refuse_archived(nid, now)
            DeliveryEvent.objects.create(notification=notification, kind="accepted", status=status,
                                         detail=f"due {due.isoformat()}" if due else "")
            outbox.emit_created([notification], now)  # a row created final is told as its move would be
            if status == Status.QUEUED:
                enqueue_on_commit([(nid, priority, channel)])
    except (IntegrityError, ArchivedRequest) as exc:
        # The same (client, key) was committed first, possibly by a concurrent request that held
        # the unique index until it committed, or archived since; read the winner.
        existing = exc.row if isinstance(exc, ArchivedRequest) else original(nid, now)
        if existing is None:
            raise
        if not same_request(existing.request_fingerprint, fingerprint):
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
        notification = qs.first()
        if notification is None:  # archived: it has finished (docs/ARCHITECTURE.md, "Where a row lives")
            mine = Q(pk=notification_id) & (Q(client=client) if client is not None else Q())
            moved = lifecycle.archive.archived(mine, datetime.min.replace(tzinfo=UTC))
            if moved:
                raise NotCancellable(moved[0])
            raise Notification.DoesNotExist
        if not lifecycle.cancel([notification.pk], lifecycle.Cause.CLIENT_CANCEL, Reason.CANCELLED_BY_CLIENT,
                                clock.now()):
            raise NotCancellable(notification)
        notification.refresh_from_db()
        if notification.event_id:  # an event's channel: a fallback waiting behind it is cancelled too
            from notifications.events import fallback

            fallback.settle([(notification.pk, Status.CANCELLED, Reason.CANCELLED_BY_CLIENT, notification.channel)])
    return notification


def replay_dead_letters(notification_ids, *, by: str, refused: dict | None = None) -> int:
    """Send dead-lettered notifications again: same id (so the sent marker and the claim still
    guard against a double send), attempt budget reset, ``queued`` and enqueued after commit. Records
    who replayed and when in the timeline. Only rows still ``failed`` and dead-lettered move, and not
    a fallback channel whose next channel has reached the user since (the replay would send twice),
    and only what the gate admits (:func:`notifications.admission.replay_refusals`: the rest stays
    dead-lettered with a ``replay_refused`` timeline event saying why; given ``refused``, a dict, it
    gets ``{id: why}`` of those too). Not a dead letter of a recipient erased since it was created
    (:data:`~notifications.models.DEAD_LETTERS`).

    Returns how many were replayed.
    """
    now = clock.now()
    with transaction.atomic():
        rows = list(Notification.objects.select_for_update(skip_locked=True, of=("self",))
                    .filter(DEAD_LETTERS, pk__in=list(notification_ids))
                    .exclude(Exists(Notification.objects.filter(fallback_after=OuterRef("pk"),
                                                                status__in=REACHED_STATUSES)))
                    .values_list("pk", "priority", "channel"))
        refusals = replay_refusals([r[0] for r in rows], now)
        if refusals:
            DeliveryEvent.objects.bulk_create([
                DeliveryEvent(notification_id=i, kind="replay_refused", status=Status.FAILED,
                              detail=f"replay by {by} refused: {why}"[:500]) for i, why in refusals.items()])
            rows = [r for r in rows if r[0] not in refusals]
            if refused is not None:
                refused.update(refusals)
        if not rows:
            return 0
        rows = lifecycle.replay([r[0] for r in rows], now, f"dead letter replayed by {by} at {now.isoformat()}")
        enqueue_on_commit(rows)
    return len(rows)


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
                       .exclude(WRITTEN_TO_INBOX).exclude(reason__in=lifecycle.MAYBE_SENT)
                       .values_list("pk", flat=True)[:limit])
        if not pending:
            return 0
        moved = lifecycle.cancel(pending, lifecycle.Cause.CAMPAIGN_CANCEL, Reason.CAMPAIGN_CANCELLED, now,
                                 detail=CAMPAIGN_CANCELLED_DETAIL)
    return len(moved)


def erase_notification_content(recipient_id: str, contacts: list[str], *, by: str) -> dict[str, int]:
    """Personal-data erasure, this layer's part (inside the erasure's transaction): cancel the
    recipient's notifications no worker has claimed and its fallback channels a bounce could reopen
    (``recipient_erased``, with a timeline event), take its dead letters off the replayable list
    (``dead_letter_withdrawn``), remove every notification's content (title, body, html, data) and
    the data and fingerprints of the requests sent to this recipient alone, and erase the recipient's
    ``contacts`` (any case) and every other address or number (:func:`_scrub`) wherever a provider
    echoed them into a reason, attempt error or event detail. Rows, statuses and timelines stay, so
    counts by status, channel and reason survive.

    Returns ``{"notifications_erased": rows whose content was removed, "notifications_cancelled": n}``.
    """
    now = clock.now()
    mine = Notification.objects.filter(recipient_id=recipient_id)
    # The history too (docs/ARCHITECTURE.md, "Where a row lives"): finished rows, nothing to cancel.
    moved = NotificationHistory.objects.filter(recipient_id=recipient_id)
    anywhere = NotificationRecord.objects.filter(recipient_id=recipient_id)
    # Not sent yet, and the fallback channels a send made "not needed": a late bounce would reopen
    # those and send the erased user's content (to whoever holds the id next).
    unsent = Q(status__in=[Status.SCHEDULED, Status.QUEUED]) | Q(status=Status.SUPPRESSED,
                                                                 reason=Reason.FALLBACK_NOT_NEEDED)
    pending = list(mine.filter(unsent).values_list("pk", flat=True))
    cancelled = lifecycle.cancel(pending, lifecycle.Cause.ERASURE, Reason.RECIPIENT_ERASED, now,
                                 detail=f"recipient's personal data erased by {by}"[:500])
    erased = 0
    for rows in (mine, moved):
        # Its dead letters leave the list: their content is gone, so a replay would send an empty
        # message to whoever holds the user id and contacts next (they stay failed, with their reason).
        withdrawn = list(rows.filter(status=Status.FAILED, dead_lettered_at__isnull=False)
                         .values_list("pk", flat=True))
        if withdrawn:
            rows.filter(pk__in=withdrawn).update(dead_lettered_at=None, updated_at=now)
            DeliveryEvent.objects.bulk_create([
                DeliveryEvent(notification_id=pk, kind="dead_letter_withdrawn", status=Status.FAILED, created_at=now,
                              detail=f"not replayable: the recipient's personal data was erased by {by}"[:500])
                for pk in withdrawn])
        erased += rows.filter(~Q(title="") | ~Q(body="") | ~Q(html="") | Q(data__isnull=False)
                              | Q(metadata__isnull=False)).update(
            title="", body="", html="", data=None, metadata=None, updated_at=now)
    # The data of the events sent to this recipient alone (template input: an address, an order);
    # an event to many users carries data they share, which stays.
    from notifications.events.models import Event

    events = Event.objects.filter(pk__in=anywhere.filter(event__isnull=False).values("event_id"),
                                  user_ids=[recipient_id])
    events.exclude(data={}).update(data={})
    for rows in (mine, moved):
        # The fingerprints of those requests, too (a keyed hash of the content): a retry of an erased
        # request's key is then a reuse (422), never a replay of content that is gone.
        rows.exclude(request_fingerprint="").update(request_fingerprint="")
        rows.exclude(limit_contact="").update(limit_contact="")  # a keyed mark of the erased phone or address
        _scrub(rows, "reason_detail", contacts)
    events.exclude(request_fingerprint="").update(request_fingerprint="")
    ids = anywhere.values("id")
    _scrub(DeliveryAttempt.objects.filter(notification_id__in=ids), "error_message", contacts)
    _scrub(DeliveryEvent.objects.filter(notification_id__in=ids), "detail", contacts)
    return {"notifications_erased": erased, "notifications_cancelled": len(cancelled)}


def _scrub(rows, field: str, contacts: list[str]) -> None:
    """``field`` of ``rows`` (an erased recipient's) through :func:`core.redaction.erase_contacts`.
    No record keeps which addresses and numbers the user's messages went to (an address changed
    since, a provider's own spelling of it), so every one in their rows goes, not only ``contacts``:
    those rows are about this user alone."""
    model, size = rows.model, rows.model._meta.get_field(field).max_length
    changed = []
    for pk, text in rows.exclude(**{field: ""}).values_list("pk", field).iterator(chunk_size=2000):
        scrubbed = erase_contacts(text, contacts)[:size]
        if scrubbed != text:
            changed.append(model(pk=pk, **{field: scrubbed}))
    model.objects.bulk_update(changed, [field], batch_size=1000)
