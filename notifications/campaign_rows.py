"""The pipeline's side of campaign fan-out: inserting a page of a campaign's notifications
(:func:`insert_campaign_page`), and whether a campaign still has notifications to send.

Campaigns never write the notification table themselves: fan-out plans each member's row (status,
reason, due instant) and hands the page here; a campaign's cancel is
:func:`notifications.services.cancel_campaign_notifications`. One ``COPY`` per page in a savepoint,
falling back to ``INSERT ... ON CONFLICT DO NOTHING`` when rows already exist: exactly the new rows
are created and returned (docs/ARCHITECTURE.md §7); the members created final are told to the
campaign's client's webhooks (:func:`notifications.webhooks.outbox.emit_created`, same transaction).
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import NamedTuple

import psycopg
from django.db import IntegrityError, connection, transaction
from psycopg.types.json import Jsonb

from core.postgres import copy_rows
from notifications.delivery.checks import suppression_detail
from notifications.models import Notification, Reason, Status
from notifications.webhooks import outbox
from preferences.models import Recipient

_TABLE = "notifications_notification"

# Every NOT NULL column without a database default, plus the campaign's own; the nullable rest
# (client, idempotency key, data, lease, attempt times…) stays NULL as for any new campaign row.
_COLUMNS = ("id", "campaign_id", "recipient_id", "channel", "priority", "category", "status", "reason",
            "accepted_status", "scheduled_at", "due_at", "queued_at", "expires_at", "title", "body", "html",
            "sensitive", "request_fingerprint", "reason_detail", "attempts", "provider", "provider_message_id",
            "created_at", "updated_at", "notification_type_id", "metadata")

_INSERT_SQL = f"""
INSERT INTO {_TABLE} ({", ".join(_COLUMNS)})
SELECT u.id, %(campaign)s, u.recipient_id, %(channel)s, %(priority)s, %(category)s, u.status, u.reason, u.status,
       u.due_at, CASE WHEN u.status = 'scheduled' THEN u.due_at END,
       CASE WHEN u.status = 'queued' THEN %(now)s::timestamptz END, u.expires_at,
       '', '', '', %(sensitive)s, '', u.detail, 0, '', '', %(now)s, %(now)s, %(type)s, %(metadata)s::jsonb
  FROM unnest(%(ids)s::uuid[], %(recipients)s::text[], %(statuses)s::text[], %(reasons)s::text[],
              %(dues)s::timestamptz[], %(expires)s::timestamptz[], %(details)s::text[])
       AS u(id, recipient_id, status, reason, due_at, expires_at, detail)
ON CONFLICT (id) DO NOTHING
RETURNING id, status
"""


class CampaignRow(NamedTuple):
    """One member's planned notification: ``id`` (a UUID, or its canonical 36-character text),
    ``recipient_id``, ``status`` (``scheduled``, ``queued`` or ``suppressed``), ``reason`` (``""``
    unless suppressed), ``due`` (aware UTC datetime: when it is to be sent, or for a suppressed row
    when it was meant for), ``expires`` (aware UTC datetime or ``None``)."""

    id: uuid.UUID | str
    recipient_id: str
    status: str
    reason: str
    due: datetime
    expires: datetime | None


def insert_campaign_page(*, campaign_id, channel: str, priority: str, category: str, now: datetime,
                         rows: list[CampaignRow], notification_type: str | None = None,
                         sensitive: bool = False, metadata: dict | None = None) -> list[tuple[str, str]]:
    """Insert one fan-out page of campaign ``campaign_id``'s notifications, in the caller's
    transaction (the shard cursor's). A ``scheduled`` row gets ``due_at = due``; a ``queued`` one
    ``queued_at = now``; a ``suppressed`` one neither (it is final). Content is rendered at send time.
    A typed campaign's rows carry their ``notification_type`` (the send path then applies the type's
    opt-outs and quiet-hours policy, as for any row of the type) and the type's ``sensitive``; every
    row carries the campaign's ``metadata`` (the client's object).

    Returns ``[(id as text, status)]`` of the rows created; a row whose id already exists is left as
    it is and not returned (so re-running a page creates nothing twice). Raises what the database
    raises for anything else (e.g. an unknown recipient: ``IntegrityError`` at commit).
    """
    if not rows:
        return []
    shared = {"campaign": campaign_id, "channel": channel, "priority": priority, "category": category, "now": now,
              "type": notification_type, "sensitive": sensitive,
              "metadata": None if metadata is None else Jsonb(metadata)}
    try:
        with transaction.atomic():
            _copy(shared, rows)
        created = [(str(r.id), r.status) for r in rows]
    except (IntegrityError, psycopg.errors.UniqueViolation):
        created = _insert_skipping_existing(shared, rows)
    outbox.emit_created(created, now)  # the members created final (suppressed at fan-out)
    return created


def _details(shared: dict) -> dict[str, str]:
    """A suppressed row's reason detail per reason, as a send of one would say it (support reads the
    same words on every road): the send path's :func:`suppression_detail` for the campaign's fields."""
    like = Notification(channel=shared["channel"], category=shared["category"],
                        notification_type_id=shared["type"], recipient=Recipient(user_id=""))
    per_row = {Reason.OPTED_OUT_CATEGORY, Reason.OPTED_OUT_TYPE}  # the rest need the recipient: the label
    return {r.value: suppression_detail(like, r.value) if r in per_row else str(r.label) for r in Reason}


def _detail(details: dict[str, str], row: CampaignRow) -> str:
    return details.get(row.reason, row.reason) if row.status == Status.SUPPRESSED and row.reason else ""


def _copy(shared: dict, rows: list[CampaignRow]) -> None:
    campaign, now = str(shared["campaign"]), shared["now"]
    channel, priority, category = shared["channel"], shared["priority"], shared["category"]
    scheduled, queued = Status.SCHEDULED, Status.QUEUED
    details = _details(shared)
    meta = shared["metadata"]
    copy_rows(_TABLE, _COLUMNS, [
        (r.id, campaign, r.recipient_id, channel, priority, category, r.status, r.reason, r.status,
         r.due, r.due if r.status == scheduled else None, now if r.status == queued else None, r.expires,
         "", "", "", shared["sensitive"], "", _detail(details, r), 0, "", "", now, now, shared["type"], meta)
        for r in rows])


def _insert_skipping_existing(shared: dict, rows: list[CampaignRow]):
    details = _details(shared)
    with connection.cursor() as cur:
        cur.execute(_INSERT_SQL, {
            **shared,
            "ids": [str(r.id) for r in rows], "recipients": [r.recipient_id for r in rows],
            "statuses": [r.status for r in rows], "reasons": [r.reason for r in rows],
            "dues": [r.due for r in rows], "expires": [r.expires for r in rows],
            "details": [_detail(details, r) for r in rows],
        })
        return [(str(nid), status) for nid, status in cur.fetchall()]


def campaign_has_open_notifications(campaign_id) -> bool:
    """Whether any of the campaign's notifications is still ``scheduled``, ``queued`` or ``sending``
    (one probe of the partial index ``notification_campaign_open_idx``)."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM {_TABLE} WHERE campaign_id = %s "
                    "AND status IN ('scheduled', 'queued', 'sending'))", [campaign_id])
        return cur.fetchone()[0]


def campaign_has_backlog(campaign_id, now: datetime) -> bool:
    """Whether any of the campaign's notifications is due and not yet sent: ``queued`` or ``sending``,
    or ``scheduled`` with ``due_at`` passed. Rows scheduled for later (a recipient's local time still
    ahead, a spread, a quiet-hours deferral, a retry's backoff) are not a backlog. A recurring
    campaign's next run waits on this (docs/RECURRING.md, "A run still active")."""
    with connection.cursor() as cur:
        cur.execute(f"SELECT EXISTS (SELECT 1 FROM {_TABLE} WHERE campaign_id = %s "
                    "AND (status IN ('queued', 'sending') OR (status = 'scheduled' AND due_at <= %s)))",
                    [campaign_id, now])
        return cur.fetchone()[0]
