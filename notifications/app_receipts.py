"""Receipts from the app: ``displayed``, ``opened``, ``dismissed`` (docs/APP.md, "Receipts from the app").

The app is the only party that knows a push was shown or opened; the product's backend reports it
with ``POST /v1/notifications/{id}/receipts`` (``notifications/api/app_receipts.py``), and
:func:`apply_app_receipt` applies it like a provider receipt (:mod:`notifications.receipts`): push and
in_app only (:class:`WrongChannel`), stored once per (notification, event), only up the
:data:`LADDER`, an unrecorded call settled as ``sent`` first (``receipts.settle_as_sent``), a row never
sent refused (:class:`NotReached`), the inbox item marked alongside (:func:`from_inbox_mark` mirrors
the other way), ``at`` clamped into the timeline's order (:data:`MAX_FUTURE_SKEW`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from datetime import datetime, timedelta

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Max, QuerySet

from core import clock
from core.queues import RECEIPTS_QUEUE
from notifications import lifecycle, metrics
from notifications.inbox import marks
from notifications.models import DeliveryEvent, Notification, NotificationHistory, Status, TimelineEntry, log_of
from notifications.receipts import RESEND_PENDING_REASONS, Receipt, settle_as_sent

log = logging.getLogger(__name__)

#: What the app reports, in the order the API lists them.
EVENTS = ("displayed", "opened", "dismissed")
#: Channels an app receives (``in_app``: the inbox channel, issue 16).
APP_CHANNELS = frozenset({"push", "in_app"})
#: The statuses a receipt may start from or move to, by rank: a receipt moves the status up only.
LADDER: dict[str, int] = {Status.SENT: 0, Status.DELIVERED: 1, Status.DISPLAYED: 2, Status.DISMISSED: 3,
                          Status.OPENED: 4}
#: The status each event moves a row to (when that is up the ladder).
EVENT_STATUS = {"displayed": Status.DISPLAYED, "opened": Status.OPENED, "dismissed": Status.DISMISSED}
#: How far ahead of the platform clock ``at`` may be (the app's and our clocks differ a little).
MAX_FUTURE_SKEW = timedelta(seconds=60)
#: Timeline kinds of app receipts: ``app_displayed``, ``app_opened``, ``app_dismissed``.
KIND_PREFIX = "app_"
#: The provider a row settled by an app receipt names when it named none before.
APP_PROVIDER = "app"


class WrongChannel(Exception):
    """The notification's channel has no app to report it (sms, email)."""

    def __init__(self, channel: str) -> None:
        self.channel = channel
        super().__init__(f"a {channel} notification gets no receipts from the app: only push and in_app do "
                         f"(its delivery is what its provider reports)")


class NotReached(Exception):
    """The notification was not sent (yet, or ever): ``status`` is its status (``channel`` its
    channel); ``code`` is ``notification_<status>``."""

    def __init__(self, status: str, reason: str, channel: str) -> None:
        self.status, self.code, self.channel = status, f"notification_{status}", channel
        why = f" ({reason})" if reason else ""
        if status in (Status.SCHEDULED, Status.QUEUED):
            text = f"this notification is {status}{why}: it has not been sent, so no app can have received it"
        else:
            text = f"this notification is {status}{why}: it never reached the recipient"
        super().__init__(f"{text}; nothing recorded")


@dataclasses.dataclass(frozen=True)
class Applied:
    """What :func:`apply_app_receipt` did: the notification (as it is now), the event, whether it
    was a duplicate (nothing written), whether the status moved, and the timeline entry's instant
    (UTC; the first one's for a duplicate)."""

    notification: Notification
    event: str
    duplicate: bool
    status_changed: bool
    at: datetime


def dedup_key(notification_id, event: str) -> str:
    return f"app:{notification_id}:{event}"


def apply_app_receipt(rows: QuerySet[Notification], event: str, at: datetime | None = None, *,
                      archived: QuerySet[NotificationHistory] | None = None, mark_item: bool = True) -> Applied:
    """Apply one app receipt (module docstring) to the notification ``rows`` selects (the caller's
    tenancy rule, filtered by id), in one transaction holding the row's lock, so concurrent receipts
    for one notification apply one after the other. ``archived``: the same selection in the history,
    read (and locked) when no live row is found: a row archived ``HOT_HOURS`` after its last change
    takes its receipts there by the same rules (docs/ARCHITECTURE.md §13).

    ``event``: one of :data:`EVENTS`. ``at``: aware instant the app saw it, or None (now); the
    caller checks it is not more than :data:`MAX_FUTURE_SKEW` ahead. ``mark_item``: an in_app notification's item is
    marked too (False when the receipt mirrors that very mark: :func:`from_inbox_mark`).

    Raises ``Notification.DoesNotExist`` (no such row for the caller), :class:`WrongChannel`,
    :class:`NotReached`; nothing is written then.
    """
    if event not in EVENT_STATUS:
        raise ValueError(f"unknown app receipt event {event!r}")
    try:
        return _apply(rows, archived, event, at, mark_item)
    except (WrongChannel, NotReached) as exc:  # counted once the refusal's rollback is over
        metrics.app_receipt(event, exc.channel, "refused")
        raise


def _apply(rows: QuerySet[Notification], archived: QuerySet[NotificationHistory] | None, event: str,
           at: datetime | None, mark_item: bool) -> Applied:
    with transaction.atomic():
        n = rows.select_for_update(of=("self",), no_key=True).first()
        if n is None and archived is not None:  # not live (any more): moved rows only go this way
            n = lifecycle.archive.locked(archived)
        if n is None:
            raise Notification.DoesNotExist
        if n.channel not in APP_CHANNELS:
            raise WrongChannel(n.channel)
        key = dedup_key(n.pk, event)
        first = DeliveryEvent.objects.filter(dedup_key=key).values_list("created_at", flat=True).first()
        if first is not None:
            metrics.app_receipt(event, n.channel, "duplicate")
            return Applied(n, event, duplicate=True, status_changed=False, at=first)
        now = clock.now()
        _settle_unrecorded(n, event, at, now)
        current = n.status
        target = EVENT_STATUS[event]
        moved = LADDER[target] > LADDER[current]
        if moved:
            moved = lifecycle.app_move(n, target, now)
        stored = _in_order(n, at or now, now)
        DeliveryEvent.objects.create(notification=n, kind=f"{KIND_PREFIX}{event}", status=target if moved else "",
                                     dedup_key=key, detail=_detail(event, at, stored, current, moved),
                                     created_at=stored)
        if n.channel == "in_app" and mark_item:
            _mark_item(n, event)
        metrics.app_receipt(event, n.channel, "moved" if moved else "unchanged")
    return Applied(n, event, duplicate=False, status_changed=moved, at=stored)


def _mark_item(n: Notification, event: str) -> None:
    """An in_app notification's receipt is also its inbox item's state (the reverse of
    :func:`from_inbox_mark`): ``displayed`` → seen, ``opened`` → read, ``dismissed`` → archived, with
    the badge moved; an item gone (pruned, erased) or past its TTL is left alone."""
    with contextlib.suppress(marks.UnknownItems):
        marks.mark(n.recipient_id, _MARK_OF_EVENT[event], ids=[n.pk])


def _settle_unrecorded(n: Notification, event: str, at: datetime | None, now: datetime) -> None:
    """Bring ``n`` (locked) onto the ladder, or raise NotReached (module docstring)."""
    if n.status in LADDER:
        return
    unrecorded = n.status == Status.SENDING or (n.status in (Status.SCHEDULED, Status.QUEUED)
                                                and n.reason in RESEND_PENDING_REASONS)
    if not unrecorded:
        raise NotReached(n.status, n.reason, n.channel)
    proof = Receipt(provider=n.provider or APP_PROVIDER, dedup_key=dedup_key(n.pk, event), kind="accepted",
                    raw=f"{KIND_PREFIX}{event}", notification_id=str(n.pk), occurred_at=at)
    settle_as_sent(n, proof, now)
    n.refresh_from_db()
    if n.status not in LADDER:  # cannot happen under our lock; refuse rather than write a wrong entry
        raise NotReached(n.status, n.reason, n.channel)


def _in_order(n: Notification, at: datetime, now: datetime) -> datetime:
    """``at`` clamped into [the latest timeline entry that is not an app receipt, now]."""
    latest = (log_of(TimelineEntry, [n]).exclude(kind__startswith=KIND_PREFIX)
              .aggregate(latest=Max("created_at"))["latest"])
    stored = min(at, now)
    return max(stored, latest) if latest is not None else stored


def _detail(event: str, at: datetime | None, stored: datetime, before: str, moved: bool) -> str:
    parts = [f"reported by the app: {event}"]
    if at is not None and at != stored:
        parts.append(f"at {at.isoformat()} (stored at {stored.isoformat()} to keep the timeline in order)")
    parts.append(f"{before} → {EVENT_STATUS[event]}" if moved else f"status stays {before}")
    return "; ".join(parts)[:500]


#: A mark of at most this many ids is mirrored in its request; a larger one on the ``receipts`` queue.
INBOX_MARK_INLINE = 20
#: The task applying a larger mark's receipts (``notifications.tasks``).
INBOX_MARK_TASK = "notifications.inbox_mark_receipts"


def mirror_inbox_mark(notification_ids: list, status: str) -> None:
    """:func:`from_inbox_mark` for what a mark by ids changed: in the request for a few ids (a tap,
    a page: about 10 ms each), else queued for the receipts worker (1,000 ids take ~12 s, which no
    request should hold a web thread for); applied here when the broker cannot take it. Queued and
    then lost with the broker (Redis flushed), the timeline misses them; the inbox's own state, which
    is the mark, is already committed."""
    if not notification_ids or status not in INBOX_MARK_EVENTS:
        return
    if len(notification_ids) <= INBOX_MARK_INLINE or settings.NOTIFY["RECEIPTS_INLINE"]:
        from_inbox_mark(notification_ids, status)
        return
    try:
        current_app.send_task(INBOX_MARK_TASK, args=[[str(i) for i in notification_ids], status],
                              queue=RECEIPTS_QUEUE, routing_key=RECEIPTS_QUEUE, exchange="")
    except Exception as exc:  # kombu/redis raise many types; all mean "not queued"
        log.warning("receipts queue unavailable (%s); mirroring %d inbox mark(s) in the request", exc,
                    len(notification_ids))
        from_inbox_mark(notification_ids, status)


#: The app receipt an inbox mark by ids stands for (``unread`` stands for none).
INBOX_MARK_EVENTS = {"seen": "displayed", "read": "opened", "archived": "dismissed"}
_MARK_OF_EVENT = {event: status for status, event in INBOX_MARK_EVENTS.items()}


def from_inbox_mark(notification_ids: list, status: str) -> int:
    """The inbox marks of a user's items by id (``POST /v1/users/{id}/inbox/mark`` with ``ids``), as
    app receipts of their ``in_app`` notifications: ``seen`` → ``displayed``, ``read`` → ``opened``,
    ``archived`` → ``dismissed``, applied by the same rules as ``POST /v1/notifications/{id}/receipts``
    (once, up the ladder only), so the timeline and campaign counts show what the inbox saw.
    ``notification_ids``: the items whose state the mark changed (at most ``MAX_IDS``); an
    ``all_before`` mark (up to ten thousand at once) is not mirrored. Returns how many receipts were
    stored. Never raises: the mark stands whatever happens here (logged)."""
    event = INBOX_MARK_EVENTS.get(status)
    stored = 0
    if event is None:
        return stored
    for nid in notification_ids:
        try:
            # The item is marked already: that is what is being mirrored.
            stored += not apply_app_receipt(Notification.objects.filter(pk=nid), event, mark_item=False,
                                            archived=NotificationHistory.objects.filter(pk=nid)).duplicate
        except (Notification.DoesNotExist, WrongChannel, NotReached):
            continue
        except Exception:
            log.exception("the inbox mark of %s as %s was not added to its timeline", nid, status)
    return stored
