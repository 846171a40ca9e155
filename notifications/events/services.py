"""Writes for notification types and events: save a type with its templates, accept an event
(idempotent, expanded into its notifications in the same transaction), cancel one (docs/TYPES.md).

Ids are derived, never random (:mod:`notifications.ids`: :func:`~notifications.ids.event_id`,
:func:`~notifications.ids.event_notification_id`), so a retried request or a crashed expansion
creates nothing twice (the primary keys refuse a copy).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q

from core import clock
from notifications import lifecycle, metrics
from notifications.acceptance.rules import contact_mark
from notifications.admission import Admission, ArchivedRequest, Road, admit, original, refuse_archived
from notifications.enqueue import enqueue_on_commit
from notifications.events import digests
from notifications.events.models import (
    Event,
    NotificationType,
    Routing,
    TypeTemplate,
)
from notifications.ids import event_id, event_notification_id, single_send_id, typed_send_event_id
from notifications.models import APIClient, DeliveryEvent, Notification, NotificationRecord, Priority, Reason, Status
from notifications.rendering import RenderError
from notifications.services import WRITTEN_TO_INBOX, IdempotencyKeyReused, NotCancellable, same_request
from notifications.webhooks import outbox

TYPE_FIELDS = ("name", "description", "category", "priority", "channels", "routing", "quiet_hours",
               "in_app_quiet_hours", "required",
               "sensitive", "ttl_seconds", "collapse_key", "sms_from", "email_from", "email_reply_to",
               "required_data", "default_locale", "digest")
TEMPLATE_FIELDS = ("channel", "locale", "title", "body", "html", "data")


class DigestKeyFailed(Exception):
    """The type's digest key template failed to render with the event's data (the message says why)."""


@dataclass(frozen=True)
class AcceptedEvent:
    """Result of :func:`accept_event`: the event, its notifications in answer order (the users as
    given, each in the type's channel order), and whether this replays an earlier acceptance."""

    event: Event
    notifications: list[Notification] | list[NotificationRecord]
    replayed: bool
    #: A digest type's event: the digests it went into (one per user, in the users' order); its
    #: ``notifications`` are then empty (they are the digests', made when each closes).
    digests: list = field(default_factory=list)


def save_type(key: str, fields: dict, templates: list[dict], *, client: APIClient | None,
              may_high: bool = True) -> tuple[NotificationType, bool]:
    """Create or replace type ``key`` with ``fields`` (:data:`TYPE_FIELDS`, validated by
    :func:`notifications.events.validation.type_problems`) and exactly ``templates`` (the old ones
    go). ``client``: the API client making it (its owner when created; only its owner may replace
    it), ``None`` from the admin (no owner check). ``may_high``: whether a ``high`` type may be made
    or changed. Both checks run under the row's lock, so two concurrent requests cannot both pass.
    Returns ``(type, created)``.

    Raises:
        TypeNotOwned: the type exists and ``client`` is not its owner.
        HighNotAllowed: the type is or would be ``high`` and ``may_high`` is false.
    """
    now = clock.now()
    with transaction.atomic():
        existing = NotificationType.objects.select_for_update().filter(pk=key).first()
        if existing is None:
            try:
                with transaction.atomic():  # a concurrent create of the same key: one wins
                    NotificationType.objects.create(key=key, name=fields.get("name", key), client=client,
                                                    category=fields.get("category", ""), created_at=now)
                created = True
            except IntegrityError:
                created = False
            existing = NotificationType.objects.select_for_update().get(pk=key)
            if not created:
                _check_owner(existing, client)
        else:
            created = False
            _check_owner(existing, client)
        if not may_high and Priority.HIGH in (fields.get("priority"), None if created else existing.priority):
            raise HighNotAllowed()
        kind = existing
        for name in TYPE_FIELDS:
            if name in fields:
                setattr(kind, name, fields[name])
        kind.updated_at = now
        kind.save()
        kind.templates.all().delete()
        TypeTemplate.objects.bulk_create([
            TypeTemplate(type=kind, updated_at=now, **{f: t.get(f) or ({} if f == "data" else "")
                                                       for f in TEMPLATE_FIELDS}) for t in templates])
    return kind, created


class TypeNotOwned(Exception):
    """The type belongs to another API client, or was made in the admin (``admin_made``)."""

    def __init__(self, admin_made: bool) -> None:
        super().__init__("admin" if admin_made else "other client")
        self.admin_made = admin_made


class HighNotAllowed(Exception):
    """A high-priority type made or changed without the right to."""


def _check_owner(kind: NotificationType, client: APIClient | None) -> None:
    if client is not None and kind.client_id != client.pk:
        raise TypeNotOwned(admin_made=kind.client_id is None)


def accept_event(*, client: APIClient, idempotency_key: str, fingerprint: str, kind: NotificationType,
                 recipients: list, data: dict, scheduled_at: datetime | None = None, ttl_seconds: int | None = None,
                 collapse_key: str = "", channel: str | None = None, metadata: dict | None = None) -> AcceptedEvent:
    """Store an event and its notifications in one transaction; enqueue those due now after commit.

    One notification per recipient and channel of the type (``fallback``: the next channels wait,
    :mod:`notifications.events.fallback`); a digest type's event is appended to each recipient's open
    digest instead (:mod:`notifications.events.digests`). ``channel`` makes it a typed single send
    (one recipient, that channel, the single send's id and key). ``metadata``: the client's object,
    stored on each notification (:mod:`notifications.metadata`). The gate (roads ``typed`` and
    ``event`` of :func:`notifications.admission.admit`) runs before anything is written; a replay
    returns the stored event. docs/TYPES.md, "Events"; docs/ARCHITECTURE.md §6, "Roads in".

    Raises:
        IdempotencyKeyReused: same key, different fingerprint.
        MissingScope, AcceptanceLimited, AcceptanceLimitsUnavailable: the gate's 403 / 429 / 503.
        DigestKeyFailed: the type's digest key template failed with ``data``.
    """
    now = clock.now()
    single = None
    if channel is not None:
        single = single_send_id(str(client.pk), idempotency_key)
        eid = typed_send_event_id(single)
    else:
        eid = event_id(str(client.pk), idempotency_key)
    channels = [channel] if channel is not None else list(kind.channels)
    ttl = ttl_seconds or kind.ttl_seconds
    due = scheduled_at if scheduled_at and scheduled_at > now else None
    start = scheduled_at or now
    event = Event(id=eid, client=client, idempotency_key=None if single else idempotency_key,
                  request_fingerprint=fingerprint, type=kind,
                  data=data, user_ids=[r.user_id for r in recipients], channels=channels,
                  routing=kind.routing if len(channels) > 1 else Routing.ALL, scheduled_at=scheduled_at,
                  ttl_seconds=ttl_seconds, collapse_key=collapse_key, sensitive=kind.sensitive, created_at=now)
    # Standard-tier rows due now wait for the scheduler (beat, every second), which releases due rows
    # to the queues in batches: events of one or a few users each would otherwise be one send task
    # per row, and a worker's per-batch cost paid per notification (docs/PERFORMANCE.md, "Event
    # blast"). The high tier is enqueued at once, one row per task, as every high send.
    coalesce = kind.priority != Priority.HIGH
    rows = []
    digest_key = None
    if kind.digest and single is None:  # a digest type: items now, notifications when the window closes
        try:
            digest_key = digests.rendered_key(kind, data)
        except RenderError as exc:
            raise DigestKeyFailed(str(exc)) from None
    for recipient in recipients if digest_key is None else ():
        before = None
        for index, on in enumerate(channels):
            waiting = event.routing == Routing.FALLBACK and index > 0
            status = Status.SCHEDULED if (waiting or due or coalesce) else Status.QUEUED
            nid = single or event_notification_id(eid, recipient.user_id, on)
            rows.append(Notification(
                id=nid, client=client, idempotency_key=idempotency_key if single else None,
                request_fingerprint=fingerprint if single else "", recipient=recipient, channel=on,
                priority=kind.priority, category=kind.category, body="", sensitive=kind.sensitive, event=event,
                metadata=metadata,
                notification_type=kind, limit_contact=contact_mark(recipient, on),
                fallback_after=before if waiting else None, status=status,
                reason=Reason.FALLBACK_WAITING if waiting else "", accepted_status=status, scheduled_at=scheduled_at,
                due_at=None if waiting else (due or now), queued_at=now if status == Status.QUEUED else None,
                expires_at=start + timedelta(seconds=ttl) if ttl else None, created_at=now, updated_at=now))
            before = nid
    decision = admit(Admission(road=Road.EVENT if single is None else Road.TYPED, now=now, client=client,
                               priority=kind.priority, category=kind.category, channels=channels,
                               recipients=recipients, kind=kind,
                               request=(Event, eid) if single is None else (Notification, single)))
    try:
        with decision, transaction.atomic():
            event.save(force_insert=True)
            into = digests.append(event, kind, recipients, digest_key, now) if digest_key is not None else []
            Notification.objects.bulk_create(rows, batch_size=2000)
            if single and decision.replayed:  # the gate saw the key's row; it may have been archived: it answers
                refuse_archived(single, now)
            DeliveryEvent.objects.bulk_create([
                DeliveryEvent(notification_id=n.pk, kind="accepted", status=n.status, created_at=now,
                              reason=n.reason, detail=_accepted_detail(n, kind)) for n in rows], batch_size=2000)
            outbox.emit_created(rows, now)  # a row created final is told as its move would be
            enqueue_on_commit([(n.pk, n.priority, n.channel) for n in rows if n.status == Status.QUEUED])
            transaction.on_commit(lambda: metrics.events_accepted(1, len(rows)))
    except (IntegrityError, ArchivedRequest) as exc:
        # The same (client, key) was committed first, possibly by a concurrent request (or archived since).
        if single:  # the key may have been used by an untyped single send as well
            first = exc.row if isinstance(exc, ArchivedRequest) else original(single, now)
            if first is None:  # the key's row is gone (past the history's retention): the key is spent
                raise IdempotencyKeyReused() from None
            if not same_request(first.request_fingerprint, fingerprint) or (event_of_first := first.event) is None:
                raise IdempotencyKeyReused() from None
            return AcceptedEvent(event_of_first, [first], replayed=True)
        existing = Event.objects.filter(pk=eid).first()
        if existing is None:
            raise
        if not same_request(existing.request_fingerprint, fingerprint):
            raise IdempotencyKeyReused() from None
        by_user = digests.digests_of(existing)
        return AcceptedEvent(existing, notifications_of(existing), replayed=True,
                             digests=[by_user[u] for u in existing.user_ids if u in by_user])
    return AcceptedEvent(event, rows, replayed=False, digests=into)


def _accepted_detail(n: Notification, kind: NotificationType) -> str:
    if n.reason == Reason.FALLBACK_WAITING:
        return f"type {kind.key}: waits for the channel before it in the fallback order"
    if n.due_at and n.scheduled_at:
        return f"type {kind.key}; due {n.due_at.isoformat()}"
    if n.due_at:
        return f"type {kind.key}; released to its queue by the scheduler, with others, within a second"
    return f"type {kind.key}"


def notifications_of(event: Event) -> list[NotificationRecord]:
    """The event's notifications in answer order (users as given, channels in the event's order),
    archived ones too (a replay answers as the first request did)."""
    order = {(u, c): i for i, (u, c) in enumerate((u, c) for u in event.user_ids for c in event.channels)}
    rows = list(NotificationRecord.objects.filter(event=event).defer("body", "html", "title", "data"))
    return sorted(rows, key=lambda n: order.get((n.recipient_id, n.channel), len(order)))


def cancel_event(event: Event) -> int:
    """Cancel every notification of ``event`` that no worker has claimed (``scheduled`` — fallback
    waits included — or ``queued``), and the fallback channels made ``fallback_not_needed`` (a later
    bounce would reopen them) → ``cancelled``, reason ``cancelled_by_client``, each with its
    timeline event) and stamp the event. Returns how many were cancelled (notifications, plus digest
    items withdrawn).

    An event of a digest type is taken out of the digests still open (its items removed: the digest
    is sent without it, or not at all if it was the only one); a digest already closed is shared
    with other events and is not cancelled by one of them.

    Raises NotCancellable when none was left to cancel."""
    now = clock.now()
    with transaction.atomic():
        # Not yet claimed, and the fallback channels a send made "not needed": a bounce could still
        # reopen those (fallback.reopen), and a cancelled event must send nothing more.
        open_rows = (Q(status__in=[Status.SCHEDULED, Status.QUEUED])
                     | Q(status=Status.SUPPRESSED, reason=Reason.FALLBACK_NOT_NEEDED))
        pending = list(Notification.objects.select_for_update(skip_locked=True).filter(open_rows, event=event)
                       .exclude(WRITTEN_TO_INBOX).values_list("pk", flat=True))
        moved = len(lifecycle.cancel(pending, lifecycle.Cause.EVENT_CANCEL, Reason.CANCELLED_BY_CLIENT, now,
                                     detail="its event was cancelled"))
        withdrawn = digests.withdraw(event)
        if not moved and not withdrawn:
            closed = digests.digests_of(event)
            if closed:
                raise NotCancellable(message=(
                    f"nothing of this event is left to cancel: the digest it went into closed (digest "
                    f"{next(iter(closed.values())).pk}) and its notifications are shared with the digest's other "
                    "events; cancel those notifications with POST /v1/notifications/{id}/cancel"))
            raise NotCancellable()
        Event.objects.filter(pk=event.pk, cancelled_at__isnull=True).update(cancelled_at=now)
    return moved + withdrawn
