"""Digests (docs/TYPES.md, "Digests"): the events of a type with ``digest: {window_seconds, key}``
for one user and one rendered key inside one window become ONE notification per channel when the
window closes, rendered at send time with the events' data as ``items``.

:func:`append` (in the accepting event's transaction) takes the open digest of (type, user, key)
under its row lock and adds the event as an item, closing a digest found past its window first;
:func:`close_due` (the scheduler, every beat) closes each digest whose window has ended and inserts
its rows in one transaction, with derived ids, so a re-run inserts nothing twice. Why so: the
"Acceptance" and "Closing" paragraphs there.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils.crypto import salted_hmac

from core import clock
from core.postgres import array_literal
from notifications import metrics
from notifications.admission import Admission, Road, admit
from notifications.events.models import (
    Digest,
    DigestItem,
    Event,
    NotificationType,
    Routing,
)
from notifications.ids import digest_notification_id
from notifications.models import DeliveryEvent, Notification, Reason, Status
from notifications.rendering import render_parts
from notifications.webhooks import outbox

#: A digest window, in seconds: at least a minute (shorter batches too little to be worth the
#: delay: the first event waits the whole window) and at most a day (a digest older than that is
#: news nobody wants, and TTLs of days are for single sends).
MIN_WINDOW_SECONDS = 60
MAX_WINDOW_SECONDS = 86_400
#: A rendered key is stored up to this many characters; a longer one as a hash of itself.
MAX_KEY_LENGTH = 255

_OPEN_SQL = """
INSERT INTO notifications_digest (id, type_id, recipient_id, key, client_id, window_seconds, channels, routing,
                                  opened_at, closes_at, item_count)
VALUES (%(id)s, %(type)s, %(user)s, %(key)s, %(client)s, %(window)s, %(channels)s::jsonb, %(routing)s, %(now)s,
        %(closes)s, 0)
ON CONFLICT (type_id, recipient_id, key, client_id) WHERE closed_at IS NULL DO NOTHING
"""


#: The salt of :func:`keyed_hash` (``salted_hmac``: HMAC-SHA256 with a key derived from SECRET_KEY).
KEY_HMAC_SALT = "notifications.digests.key"


def _plain_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:40]


def keyed_hash(plain_hash: str) -> str:
    """A sensitive type's stored key: ``"dk-"`` + HMAC-SHA256 (key derived from ``SECRET_KEY``) of
    the plain SHA-256 prefix. A plain hash of a 6-digit code is reversed by trying the million codes
    (a second); this one cannot be computed without the server's secret. Taken over the plain hash
    so migration ``0027_digest_keyed_hash`` turns a stored plain one into it (open digests keep
    collecting across the deploy)."""
    return "dk-" + salted_hmac(KEY_HMAC_SALT, plain_hash, algorithm="sha256").hexdigest()[:40]


def rendered_key(kind: NotificationType, data: dict) -> str:
    """The digest key of an event of ``kind`` with ``data``: the type's ``digest.key`` template
    rendered with ``{{ data.* }}`` (no recipient: one key per event); ``""`` when it has none; of a
    ``sensitive`` type, :func:`keyed_hash` of it (it may be made of a code); over
    :data:`MAX_KEY_LENGTH` characters, ``"dk-"`` + a SHA-256 prefix of it. Raises RenderError."""
    source = (kind.digest or {}).get("key") or ""
    if not source:
        return ""
    key = render_parts({"key": source}, {"data": data})["key"]
    if kind.sensitive and key:
        return keyed_hash(_plain_hash(key))
    if len(key) > MAX_KEY_LENGTH:
        return "dk-" + _plain_hash(key)
    return key


def append(event: Event, kind: NotificationType, recipients: list, key: str, now: datetime) -> list[Digest]:
    """Add ``event`` to the open digest of (``kind``, each recipient, ``key``), opening one where
    none is open (window from ``now``). Must run inside the event's transaction. Recipients are taken
    in user-id order, so two events for the same users lock their digests in the same order (no
    deadlock). Returns the digests, in ``recipients`` order."""
    assert kind.digest is not None, kind  # only a digest type's events are appended
    window = int(kind.digest["window_seconds"])
    found = {}
    for recipient in sorted(recipients, key=lambda r: r.user_id):
        digest = _take_open(kind, recipient.user_id, key, event.client_id, window, now)
        DigestItem.objects.create(digest=digest, event=event, created_at=now)
        found[recipient.user_id] = digest
    transaction.on_commit(lambda: metrics.digest_counted("items", len(found)))
    return [found[r.user_id] for r in recipients]


def _take_open(kind: NotificationType, user_id: str, key: str, client_id, window: int, now: datetime) -> Digest:
    """The open digest of (kind, user, key, API client), locked until the transaction ends; a new
    one when none is open or the open one's window has ended (that one is closed here first). Two
    clients' events never share a digest: its notification is one client's, and shows every item."""
    while True:
        with connection.cursor() as cur:
            cur.execute(_OPEN_SQL, {"id": uuid.uuid4(), "type": kind.pk, "user": user_id, "key": key,
                                    "client": client_id, "window": window, "channels": json.dumps(kind.channels),
                                    "routing": kind.routing, "now": now, "closes": now + timedelta(seconds=window)})
            if cur.rowcount:
                transaction.on_commit(lambda: metrics.digest_counted("opened"))
        digest = (Digest.objects.select_for_update().filter(type=kind, recipient_id=user_id, key=key,
                                                            client_id=client_id, closed_at__isnull=True).first())
        if digest is None:  # closed between our insert and our lock: open the next one
            continue
        if digest.closes_at <= now:
            close(digest, now)
            continue
        return digest


def close(digest: Digest, now: datetime) -> list[Notification]:
    """Close ``digest`` (locked by the caller, inside its transaction): mark it closed and insert its
    notifications (one per channel of the digest; ``routing`` fallback: the first due now, each next
    one waiting behind the one before), ``scheduled`` and due now for the scheduler to release. TTL:
    the type's, from ``now``. Returns the rows inserted (none when a row of it exists already)."""
    kind = NotificationType.objects.get(pk=digest.type_id)
    items = list(DigestItem.objects.filter(digest=digest).select_related("event").order_by("id"))
    Digest.objects.filter(pk=digest.pk).update(closed_at=now, item_count=len(items))
    digest.closed_at, digest.item_count = now, len(items)
    transaction.on_commit(lambda: metrics.digest_counted("closed"))
    if not items:
        return []
    first = items[0].event
    sensitive = kind.sensitive or any(i.event.sensitive for i in items)
    ttl = kind.ttl_seconds
    rows, before = [], None
    for index, channel in enumerate(digest.channels):
        waiting = digest.routing == Routing.FALLBACK and index > 0
        nid = digest_notification_id(digest.pk, channel)
        rows.append(Notification(
            id=nid, client_id=digest.client_id or first.client_id, recipient_id=digest.recipient_id, channel=channel,
            priority=kind.priority, category=kind.category, body="", sensitive=sensitive, digest=digest,
            notification_type=kind, fallback_after=before if waiting else None, status=Status.SCHEDULED,
            reason=Reason.FALLBACK_WAITING if waiting else "", accepted_status=Status.SCHEDULED,
            due_at=None if waiting else now, expires_at=now + timedelta(seconds=ttl) if ttl else None,
            created_at=now, updated_at=now))
        before = nid
    # The road "digest" of the gate: each event was admitted when it was accepted (high gate, limits);
    # what is left is idempotency (a re-run: its rows were inserted by the run that closed it).
    if admit(Admission(road=Road.DIGEST, now=now, request=(Notification, rows[0].pk))).replayed:
        return []
    Notification.objects.bulk_create(rows)
    shown = Digest.HIDDEN_KEY if kind.sensitive else digest.key
    detail = f"digest of {len(items)} event(s) of type {kind.key}" + (f", key {shown}" if digest.key else "")
    DeliveryEvent.objects.bulk_create([
        DeliveryEvent(notification_id=n.pk, kind="accepted", status=n.status, reason=n.reason, created_at=now,
                      detail=detail + ("; waits for the channel before it" if n.fallback_after else
                                       "; released by the scheduler")) for n in rows])
    outbox.emit_created(rows, now)  # a row created final is told as its move would be
    return rows


def close_due(limit: int = 500) -> int:
    """Close up to ``limit`` open digests whose window has ended (``closes_at`` ≤ now), each in its
    own transaction (``FOR UPDATE SKIP LOCKED``: one an event is appending to is left for the next
    beat, or closed by that event). Returns how many were closed."""
    closed = 0
    for _ in range(limit):
        with transaction.atomic():
            now = clock.now()
            digest = (Digest.objects.select_for_update(skip_locked=True)
                      .filter(closed_at__isnull=True, closes_at__lte=now).order_by("closes_at").first())
            if digest is None:
                break
            close(digest, now)
            closed += 1
    return closed


def withdraw(event: Event) -> int:
    """Take ``event`` out of the digests it went into that are still open (inside the caller's
    transaction; the digests are locked in user-id order, as :func:`append` takes them, so a cancel
    and an append never deadlock). Returns how many items were removed; a closed digest keeps its
    items (its notifications are shared with the other events). Its users there are not reached by
    it, and told so (the outbox's ``event.not_reached``), as no notification's move will."""
    open_ids = list(Digest.objects.select_for_update().filter(items__event=event, closed_at__isnull=True)
                    .order_by("recipient_id").values_list("pk", flat=True))
    if not open_ids:
        return 0
    outbox.emit_digests_emptied(open_ids, clock.now(), event_id=event.pk)  # before the items go
    removed, _ = DigestItem.objects.filter(event=event, digest_id__in=open_ids).delete()
    return removed


def erase_digests(recipient_id: str) -> int:
    """A recipient's erasure, for its digests (inside the erasure's transaction): each open one is
    emptied and closed unsent (nothing of it may reach a user re-created inside the window), its
    events' outcome for the user told (``event.not_reached``: the outbox's), the data of the events
    that were for this user alone is cleared, and every digest's key (rendered from event data) is
    cleared. Returns how many open digests were closed."""
    now = clock.now()
    mine = Digest.objects.filter(recipient_id=recipient_id)
    Event.objects.filter(digest_items__digest__recipient_id=recipient_id, user_ids=[recipient_id]).exclude(
        data={}).update(data={})
    open_ids = list(mine.select_for_update().filter(closed_at__isnull=True).values_list("pk", flat=True))
    outbox.emit_digests_emptied(open_ids, now)  # before the items go: it reads them
    DigestItem.objects.filter(digest_id__in=open_ids).delete()
    closed = Digest.objects.filter(pk__in=open_ids).update(closed_at=now, item_count=0, key="")
    mine.exclude(key="").update(key="")
    return closed


def digests_of(event: Event, users: list[str] | None = None) -> dict[str, Digest]:
    """``{user_id: Digest}`` for the digests ``event`` went into (one query); only ``users``' when given
    (a page of the event's recipients)."""
    items = DigestItem.objects.filter(event=event).select_related("digest")
    if users is not None:
        items = items.filter(digest__recipient_id__in=users)
    return {i.digest.recipient_id: i.digest for i in items}


#: How many of a digest's items its templates see in ``items`` (``count`` is always the total and
#: ``last`` the real last one): a digest of 10,000 likes renders "Ana and 9,999 others" without loading
#: 10,000 events' data (up to 16 KB each) into one render.
MAX_RENDERED_ITEMS = 100

_ITEMS_SQL = """
SELECT digest_id, data, rn, total FROM (
    SELECT i.digest_id, e.data, row_number() OVER w AS rn, count(*) OVER (PARTITION BY i.digest_id) AS total,
           row_number() OVER (PARTITION BY i.digest_id ORDER BY i.id DESC) AS back
      FROM notifications_digestitem i JOIN notifications_event e ON e.id = i.event_id
     WHERE i.digest_id = ANY(%s::uuid[])
    WINDOW w AS (PARTITION BY i.digest_id ORDER BY i.id)) t
 WHERE rn <= %s OR back = 1
 ORDER BY digest_id, rn
"""


@dataclass
class Items:
    """What a digest's templates see of its items: ``first`` (at most :data:`MAX_RENDERED_ITEMS`
    events' data, in order of acceptance), ``last`` (the last one's) and ``total`` (how many)."""

    first: list = field(default_factory=list)
    last: dict = field(default_factory=dict)
    total: int = 0


def items_data(digest_ids) -> dict[object, Items]:
    """``{digest_id: Items}`` (one query; a digest with no items has an empty one)."""
    out: dict = {d: Items() for d in digest_ids}
    with connection.cursor() as cur:
        cur.execute(_ITEMS_SQL, [array_literal(str(d) for d in digest_ids), MAX_RENDERED_ITEMS])
        for digest_id, data, rn, total in cur.fetchall():
            items = out.setdefault(digest_id, Items())
            if isinstance(data, str):
                data = json.loads(data)
            items.total, items.last = total, data or {}
            if rn <= MAX_RENDERED_ITEMS:
                items.first.append(data or {})
    return out
