"""Status events into the webhook outbox, in the transaction of the status move that causes them
(docs/WEBHOOKS.md, "Where events come from"). :mod:`notifications.lifecycle`, the one writer of a
notification's status, calls :func:`emit_rows` / :func:`emit_ids` after each move; campaigns call
:func:`emit_campaign_completed`.

Only clients with an endpoint subscribed to the event pay anything: the subscriptions are held per
process (:func:`subscribers`, a short TTL, forgotten at once on a save in the process), and an
event nobody subscribes to returns before any query. Otherwise a batch of moved rows costs one
SELECT (when only ids are known) and one INSERT of all its deliveries.

An event's user whose notifications are all decided (a move ended the last one) is one
``event.reached`` or ``event.not_reached``, told once per endpoint.

A campaign's rows carry no client: they belong to the client that launched the campaign, which
the campaigns floor tells through :func:`register_campaign_owner` (the arrow points down). A
campaign launched in the admin has no client and sends no webhooks.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from core import clock
from core.postgres import array_literal
from notifications.events.models import Event
from notifications.models import user_outcome
from notifications.webhooks.models import OUTCOME_EVENTS, WebhookDelivery, WebhookEndpoint

#: event type → {client id: [endpoint ids]}, and when it is read again (:func:`_cache_clock`).
_subscriptions: dict[str, dict[str, list]] = {}
_deadline = 0.0
#: campaign id → its client id (None: launched in the admin); a campaign never changes owner.
_owners: dict[str, str | None] = {}
_MAX_OWNERS = 10_000
_owner_rule: Callable[[list[str]], dict[str, str | None]] | None = None


def _cache_clock() -> float:
    return time.monotonic() + clock.offset_seconds()


def register_campaign_owner(rule: Callable[[list[str]], dict[str, str | None]]) -> None:
    """The campaigns floor: ``rule(campaign ids)`` → ``{campaign id: client id or None}``."""
    global _owner_rule
    _owner_rule = rule


def subscribers(event_type: str) -> dict[str, list]:
    """``{client id: [endpoint ids]}`` of the active endpoints subscribed to ``event_type``."""
    global _subscriptions, _deadline
    if _cache_clock() >= _deadline:
        fresh: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for pk, client_id, events in WebhookEndpoint.objects.filter(active=True).values_list("id", "client_id",
                                                                                             "events"):
            for event in events or ():
                fresh[event][client_id].append(pk)
        _subscriptions = {event: dict(clients) for event, clients in fresh.items()}
        _deadline = _cache_clock() + settings.WEBHOOKS["CACHE_SECONDS"]
    return _subscriptions.get(event_type, {})


@receiver([post_save, post_delete], sender=WebhookEndpoint, dispatch_uid="webhook-subscriptions-forget")
def forget_subscriptions(**_kwargs) -> None:
    """An endpoint saved or deleted in this process: subscriptions are read again at the next event."""
    global _deadline
    _deadline = 0.0


def _owners_of(campaign_ids: set[str]) -> dict[str, str | None]:
    missing = [c for c in campaign_ids if c not in _owners]
    if missing and _owner_rule is not None:
        if len(_owners) > _MAX_OWNERS:
            _owners.clear()
        found = _owner_rule(missing)
        _owners.update({c: found.get(c) for c in missing})
    return {c: _owners.get(c) for c in campaign_ids}


def payload(event_type: str, at: datetime, row: dict) -> dict:
    """The body of a notification's event (docs/WEBHOOKS.md, "Payload"): ids, channel, status,
    reason, the instant, the client's idempotency key and the rest of what it sent (metadata)."""
    return {"type": event_type, "timestamp": at.isoformat().replace("+00:00", "Z"), "data": {
        "notification_id": str(row["id"]), "channel": row["channel"], "status": row["status"],
        "reason": row["reason"] or None, "at": at.isoformat().replace("+00:00", "Z"),
        "idempotency_key": row["idempotency_key"],
        "metadata": {"user_id": row["recipient_id"], "priority": row["priority"], "category": row["category"] or None,
                     "campaign_id": str(row["campaign_id"]) if row["campaign_id"] else None,
                     "event_id": str(row["event_id"]) if row["event_id"] else None}}}


_COLUMNS = ("id", "client_id", "campaign_id", "event_id", "recipient_id", "channel", "priority", "category",
            "status", "reason", "idempotency_key")


def _write(event_type: str, rows: Iterable[dict], subscribed: dict[str, list], at: datetime) -> int:
    rows = list(rows)
    owners = _owners_of({str(r["campaign_id"]) for r in rows if r["client_id"] is None and r["campaign_id"]})
    deliveries = []
    for row in rows:
        client = row["client_id"] if row["client_id"] is not None else owners.get(str(row["campaign_id"]))
        for endpoint in subscribed.get(client, ()) if client else ():
            deliveries.append(WebhookDelivery(endpoint_id=endpoint, event_type=event_type, notification_id=row["id"],
                                              payload=payload(event_type, at, row), next_attempt_at=at,
                                              created_at=at))
    if deliveries:
        WebhookDelivery.objects.bulk_create(deliveries)
    return len(deliveries)


def _interested(event_type: str) -> tuple[dict[str, list], set]:
    """The subscribers of ``event_type``, and every client that hears of the move (an event's
    outcome may follow from it)."""
    subscribed = subscribers(event_type)
    return subscribed, set(subscribed).union(*(subscribers(e) for e in OUTCOME_EVENTS))


def emit_rows(rows: Iterable, status: str, at: datetime) -> int:
    """``notification.<status>`` for the moved ``rows`` (Notification objects, updated in memory),
    and the outcomes they decide; returns the deliveries written."""
    event_type = f"notification.{status}"
    subscribed, clients = _interested(event_type)
    if not clients:
        return 0
    mine = [{c: getattr(r, c) for c in _COLUMNS} for r in rows
            if r.client_id in clients or (r.client_id is None and r.campaign_id and subscribed)]
    return _write(event_type, mine, subscribed, at) + _outcomes(mine, at)


def emit_ids(ids: Iterable, status: str, at: datetime, *, table: str = "notifications_notification",
             created_at: datetime | None = None) -> int:
    """``notification.<status>`` for the rows ``ids`` that moved (read here: one SELECT of the
    subscribed clients' rows and campaigns' rows among them); ``table``/``created_at``: a history
    row. Returns the deliveries written."""
    event_type = f"notification.{status}"
    subscribed, clients = _interested(event_type)
    if not clients:
        return 0
    ids = [str(i) for i in ids]
    if not ids:
        return 0
    since = " AND created_at = %s" if created_at is not None else ""
    campaigns = " OR (client_id IS NULL AND campaign_id IS NOT NULL)" if subscribed else ""
    with connection.cursor() as cur:
        cur.execute(f"SELECT {', '.join(_COLUMNS)} FROM {table} WHERE id = ANY(%s::uuid[]) "
                    f"AND (client_id = ANY(%s::text[]){campaigns}){since}",
                    [array_literal(ids), array_literal(clients), *([created_at] if created_at else [])])
        rows = [dict(zip(_COLUMNS, r, strict=True)) for r in cur.fetchall()]
    return _write(event_type, rows, subscribed, at) + _outcomes(rows, at)


_OUTCOME_SQL = f"""
SELECT n.event_id, n.recipient_id, n.id, n.channel, n.status, n.reason, e.idempotency_key
  FROM notifications_notification AS n JOIN {Event._meta.db_table} AS e ON e.id = n.event_id
 WHERE n.event_id = ANY(%s::uuid[]) AND n.recipient_id = ANY(%s::text[])
"""


def _outcomes(rows: list[dict], at: datetime) -> int:
    """``event.reached`` / ``event.not_reached`` for the users of an event whose outcome the moved
    ``rows`` decided (the rule: :func:`notifications.models.user_outcome`), told once per endpoint
    (``subject``: the first decision wins). One SELECT and one INSERT, for subscribed clients only."""
    outcome_subscribers = {e: subscribers(e) for e in OUTCOME_EVENTS}
    users = {(r["event_id"], r["recipient_id"]): r["client_id"] for r in rows
             if r["event_id"] and any(r["client_id"] in s for s in outcome_subscribers.values())}
    if not users:
        return 0
    with connection.cursor() as cur:
        cur.execute(_OUTCOME_SQL, [array_literal({str(e) for e, _u in users}), array_literal({u for _e, u in users})])
        found = cur.fetchall()
    per_user: dict[tuple, list] = defaultdict(list)
    for event_id, user_id, *rest in found:
        if (event_id, user_id) in users:
            per_user[(event_id, user_id)].append(rest)
    stamp = at.isoformat().replace("+00:00", "Z")
    deliveries = []
    for (event_id, user_id), notes in per_user.items():
        outcome = user_outcome(status for _i, _c, status, _r, _k in notes)
        endpoints = outcome_subscribers.get(f"event.{outcome}", {}).get(users[(event_id, user_id)], ())
        body = {"type": f"event.{outcome}", "timestamp": stamp, "data": {
            "event_id": str(event_id), "user_id": user_id, "outcome": outcome, "at": stamp,
            "idempotency_key": notes[0][4],
            "notifications": [{"notification_id": str(pk), "channel": channel, "status": status,
                               "reason": reason or None} for pk, channel, status, reason, _k in sorted(notes)]}}
        deliveries += [WebhookDelivery(endpoint_id=e, event_type=f"event.{outcome}", payload=body, next_attempt_at=at,
                                       created_at=at, subject=f"event:{event_id}:{user_id}") for e in endpoints]
    if deliveries:
        WebhookDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)
    return len(deliveries)


def emit_campaign_completed(campaign_id, client_id: str | None, at: datetime) -> int:
    """``campaign.completed`` for a campaign its client launched (admin campaigns: none)."""
    subscribed = subscribers("campaign.completed")
    endpoints = subscribed.get(client_id, ()) if client_id else ()
    body = {"type": "campaign.completed", "timestamp": at.isoformat().replace("+00:00", "Z"),
            "data": {"campaign_id": str(campaign_id), "at": at.isoformat().replace("+00:00", "Z")}}
    WebhookDelivery.objects.bulk_create([WebhookDelivery(endpoint_id=e, event_type="campaign.completed",
                                                         payload=body, next_attempt_at=at, created_at=at)
                                         for e in endpoints])
    return len(endpoints)
