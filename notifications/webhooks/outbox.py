"""Status events into the webhook outbox, in the transaction of the status move that causes them
(docs/WEBHOOKS.md, "Delivery"). :mod:`notifications.lifecycle`, the one writer of a notification's
status, calls :func:`emit_rows` / :func:`emit_ids` after each move; every road that creates rows
calls :func:`emit_created` (a row created final); campaigns call :func:`emit_campaign_completed`.

Only clients with an endpoint subscribed to the event pay anything: the subscriptions are held per
process (:func:`subscribers`, a short TTL, forgotten at once on a save in the process), and an
event nobody subscribes to returns before any query. Otherwise a batch of moved rows costs one
SELECT (of the subscribed clients' rows only), one SELECT of its endpoints (:func:`_live`) and one
COPY of all its deliveries.

Another process may have deleted an endpoint this one still holds: deliveries go only to the
endpoints :func:`_live` finds and locks ``FOR KEY SHARE`` until the move commits (the delete,
:func:`notifications.webhooks.retention.delete_endpoint`, takes the row ``FOR UPDATE`` first), so a
deleted endpoint never fails a move on the foreign key.

An event's user whose notifications are all decided (a move ended the last one) is one
``event.reached`` or ``event.not_reached``, told once per endpoint, with the key the client sent
(the event's; a typed single send's is on its one notification).

A campaign's rows carry no client: they belong to the client that launched the campaign, which
the campaigns floor tells as SQL through :func:`register_campaign_owner` (the arrow points down). A
campaign launched in the admin has no client and sends no webhooks.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.db import connection
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from core import clock
from core.postgres import array_literal, copy_rows
from notifications.events.models import Digest, DigestItem, Event
from notifications.models import user_outcome
from notifications.webhooks.models import OUTCOME_EVENTS, WebhookDelivery, WebhookEndpoint

#: event type → {client id: [endpoint ids]}, when it was read and when it is read again
#: (:func:`_cache_clock`; a clock moved back before the read also reads it again).
_subscriptions: dict[str, dict[str, list]] = {}
_read_at = 0.0
_deadline = 0.0
#: SQL over a notification ``n``: the id of the client that launched its campaign (NULL: none); and
#: the ids of the campaigns launched by the clients ``%(clients)s``.
_campaign_owner = "NULL"
_campaigns_of = "SELECT NULL::uuid"


def _cache_clock() -> float:
    return time.monotonic() + clock.offset_seconds()


def register_campaign_owner(owner: str, campaigns_of: str) -> None:
    """The campaigns floor: ``owner``, an SQL expression over the notification ``n`` giving the client
    id that launched ``n.campaign_id`` (NULL for an admin campaign); ``campaigns_of``, a SELECT of the
    ids of the campaigns launched by the clients ``%(clients)s`` (a text array)."""
    global _campaign_owner, _campaigns_of
    _campaign_owner, _campaigns_of = owner, campaigns_of


def subscribers(event_type: str) -> dict[str, list]:
    """``{client id: [endpoint ids]}`` of the active endpoints subscribed to ``event_type``."""
    global _subscriptions, _read_at, _deadline
    if not _read_at <= _cache_clock() < _deadline:
        fresh: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for pk, client_id, events in WebhookEndpoint.objects.filter(active=True).values_list("id", "client_id",
                                                                                             "events"):
            for event in events or ():
                fresh[event][client_id].append(pk)
        _subscriptions = {event: dict(clients) for event, clients in fresh.items()}
        _read_at = _cache_clock()
        _deadline = _read_at + settings.WEBHOOKS["CACHE_SECONDS"]
    return _subscriptions.get(event_type, {})


@receiver([post_save, post_delete], sender=WebhookEndpoint, dispatch_uid="webhook-subscriptions-forget")
def forget_subscriptions(**_kwargs) -> None:
    """An endpoint saved or deleted in this process: subscriptions are read again at the next event."""
    global _deadline
    _deadline = 0.0


def payload(event_type: str, at: datetime, row: dict) -> dict:
    """The body of a notification's event (docs/WEBHOOKS.md, "Payload"): ids, channel, status,
    reason, the instant, the client's idempotency key and what it sent that identifies it, its own
    ``metadata`` object in ``metadata.client`` (null: none)."""
    return {"type": event_type, "timestamp": at.isoformat().replace("+00:00", "Z"), "data": {
        "notification_id": str(row["id"]), "channel": row["channel"], "status": row["status"],
        "reason": row["reason"] or None, "at": at.isoformat().replace("+00:00", "Z"),
        "idempotency_key": row["idempotency_key"],
        "metadata": {"user_id": row["recipient_id"], "priority": row["priority"], "category": row["category"] or None,
                     "campaign_id": str(row["campaign_id"]) if row["campaign_id"] else None,
                     "event_id": str(row["event_id"]) if row["event_id"] else None,
                     "client": json.loads(row["metadata"]) if isinstance(row["metadata"], str) else row["metadata"]}}}


_COLUMNS = ("id", "client_id", "campaign_id", "event_id", "digest_id", "recipient_id", "channel", "priority",
            "category", "status", "reason", "idempotency_key", "metadata")
_TABLE = WebhookDelivery._meta.db_table
_COPY_COLUMNS = ("id", "endpoint_id", "event_type", "notification_id", "subject", "payload", "state", "attempts",
                 "next_attempt_at", "last_error", "created_at")


_ENDPOINTS = WebhookEndpoint._meta.db_table


def _live(endpoints: set) -> set:
    """The ``endpoints`` that still exist, locked ``FOR KEY SHARE`` until the transaction ends: a
    delete waits for this move to commit and then deletes what it wrote. One being deleted now (held
    ``FOR UPDATE``) is skipped, not waited for: a send batch is never held by a delete, and what it
    would write there is deleted. Nothing to write: no query."""
    if not endpoints:
        return set()
    with connection.cursor() as cur:
        cur.execute(f"SELECT id FROM {_ENDPOINTS} WHERE id = ANY(%s::uuid[]) FOR KEY SHARE SKIP LOCKED",
                    [array_literal(str(e) for e in endpoints)])
        return {row[0] for row in cur.fetchall()}


def _targets(rows: list[dict], subscribed: dict[str, list]) -> set:
    """Every endpoint the moved ``rows`` may write to: their owners' subscribers of the move's event,
    and of the outcome events for the rows of an event or a digest."""
    outcome = [subscribers(e) for e in OUTCOME_EVENTS]
    found: set = set()
    for row in rows:
        found.update(subscribed.get(row["owner"], ()))
        if row["event_id"] or row.get("digest_id"):
            for clients in outcome:
                found.update(clients.get(row["owner"], ()))
    return found


def _write(event_type: str, rows: list[dict], subscribed: dict[str, list], at: datetime, live: set) -> int:
    """One COPY of the deliveries of ``rows`` (each with its ``owner``) to the subscribed endpoints
    among ``live`` (:func:`_live`)."""
    copied = [(uuid.uuid4(), endpoint, event_type, row["id"], "", json.dumps(payload(event_type, at, row)),
               WebhookDelivery.State.PENDING.value, 0, at, "", at)
              for row in rows for endpoint in subscribed.get(row["owner"], ()) if endpoint in live]
    copy_rows(_TABLE, _COPY_COLUMNS, copied)
    return len(copied)


def _interested(event_type: str) -> tuple[dict[str, list], set]:
    """The subscribers of ``event_type``, and every client that hears of the move (an event's
    outcome may follow from it)."""
    subscribed = subscribers(event_type)
    return subscribed, set(subscribed).union(*(subscribers(e) for e in OUTCOME_EVENTS))


def emit_rows(rows: Iterable, status: str, at: datetime) -> int:
    """``notification.<status>`` for the moved ``rows`` (Notification objects, updated in memory),
    and the outcomes they decide; returns the deliveries written. A campaign's rows are read by id
    (their owner is the campaign's)."""
    event_type = f"notification.{status}"
    subscribed, clients = _interested(event_type)
    if not clients:
        return 0
    rows = list(rows)
    mine = [{**{c: getattr(r, c) for c in _COLUMNS}, "owner": r.client_id} for r in rows if r.client_id in clients]
    live = _live(_targets(mine, subscribed))
    written = _write(event_type, mine, subscribed, at, live) + _outcomes(mine, at, live)
    campaign_rows = [r.pk for r in rows if r.client_id is None and r.campaign_id]
    if campaign_rows:
        written += emit_ids(campaign_rows, status, at)
    return written


def emit_ids(ids: Iterable, status: str, at: datetime, *, table: str = "notifications_notification",
             created_at: datetime | None = None) -> int:
    """``notification.<status>`` for the rows ``ids`` that moved, read here: one SELECT of the rows
    among them of the interested clients (their own, and their campaigns'); ``table``/``created_at``:
    a history row. Returns the deliveries written."""
    event_type = f"notification.{status}"
    subscribed, clients = _interested(event_type)
    if not clients:
        return 0
    ids = [str(i) for i in ids]
    if not ids:
        return 0
    since = " AND n.created_at = %(created_at)s" if created_at is not None else ""
    with connection.cursor() as cur:
        cur.execute(f"SELECT {', '.join('n.' + c for c in _COLUMNS)}, COALESCE(n.client_id, {_campaign_owner}) "
                    f"FROM {table} AS n WHERE n.id = ANY(%(ids)s::uuid[]) AND (n.client_id = ANY(%(clients)s::text[]) "
                    f"OR (n.client_id IS NULL AND n.campaign_id IN ({_campaigns_of}))){since}",
                    {"ids": array_literal(ids), "clients": array_literal(clients), "created_at": created_at})
        rows = [dict(zip((*_COLUMNS, "owner"), r, strict=True)) for r in cur.fetchall()]
    live = _live(_targets(rows, subscribed))
    return _write(event_type, rows, subscribed, at, live) + _outcomes(rows, at, live)


#: Statuses a row is created in that are not an end: no event (the moves out of them are).
_OPEN = frozenset({"scheduled", "queued", "sending"})


def emit_created(rows: Iterable, at: datetime) -> int:
    """``notification.<status>`` for rows created already final (a campaign member suppressed at
    fan-out, ``local_time_passed``…): no lifecycle move ends them, so every road that creates rows
    calls this after its insert, in its transaction. ``rows``: Notification objects, or ``(id,
    status)`` pairs read here (a campaign page: one SELECT and one COPY per final status). Rows
    created open cost nothing; returns the deliveries written."""
    objects: dict[str, list] = defaultdict(list)
    pairs: dict[str, list] = defaultdict(list)
    for row in rows:
        if isinstance(row, tuple):
            if str(row[1]) not in _OPEN:
                pairs[str(row[1])].append(row[0])
        elif str(row.status) not in _OPEN:
            objects[str(row.status)].append(row)
    return (sum(emit_rows(found, status, at) for status, found in objects.items())
            + sum(emit_ids(ids, status, at) for status, ids in pairs.items()))


_OUTCOME_SQL = f"""
SELECT n.event_id, n.recipient_id, n.id, n.channel, n.status, n.reason,
       COALESCE(e.idempotency_key, n.idempotency_key)
  FROM notifications_notification AS n JOIN {Event._meta.db_table} AS e ON e.id = n.event_id
 WHERE n.event_id = ANY(%s::uuid[]) AND n.recipient_id = ANY(%s::text[])
"""


_DIGEST_OUTCOME_SQL = f"""
SELECT i.event_id, n.recipient_id, n.id, n.channel, n.status, n.reason, e.idempotency_key, n.digest_id
  FROM notifications_notification AS n JOIN {DigestItem._meta.db_table} AS i ON i.digest_id = n.digest_id
  JOIN {Event._meta.db_table} AS e ON e.id = i.event_id
 WHERE n.digest_id = ANY(%s::uuid[])
"""


def _outcomes(rows: list[dict], at: datetime, live: set) -> int:
    """``event.reached`` / ``event.not_reached`` for the users of an event whose outcome the moved
    ``rows`` decided (the rule: :func:`notifications.models.user_outcome`), told once per endpoint
    (``subject``: the first decision wins). A digest's row decides the user of every event in the
    digest, by the digest's notifications. One SELECT (per kind) and one INSERT, subscribed clients only,
    to the endpoints among ``live``."""
    outcome_subscribers = {e: subscribers(e) for e in OUTCOME_EVENTS}
    heard = [r for r in rows if any(r["owner"] in s for s in outcome_subscribers.values())]
    users = {(r["event_id"], r["recipient_id"]): r["owner"] for r in heard if r["event_id"]}
    digests = {r["digest_id"]: r["owner"] for r in heard if r.get("digest_id")}
    if not users and not digests:
        return 0
    found: list = []
    with connection.cursor() as cur:
        if users:
            cur.execute(_OUTCOME_SQL, [array_literal({str(e) for e, _u in users}),
                                       array_literal({u for _e, u in users})])
            found = cur.fetchall()
        if digests:
            cur.execute(_DIGEST_OUTCOME_SQL, [array_literal({str(d) for d in digests})])
            for event_id, user_id, *rest, digest_id in cur.fetchall():
                users[(event_id, user_id)] = digests[digest_id]
                found.append((event_id, user_id, *rest))
    if not users:
        return 0
    per_user: dict[tuple, list] = defaultdict(list)
    for event_id, user_id, *rest in found:
        if (event_id, user_id) in users:
            per_user[(event_id, user_id)].append(rest)
    decided = {user: (users[user], notes[0][4], [n[:4] for n in notes]) for user, notes in per_user.items()}
    return _tell_outcomes(decided, at, live, outcome_subscribers)


def _tell_outcomes(decided: dict[tuple, tuple], at: datetime, live: set, outcome_subscribers: dict) -> int:
    """One INSERT of ``event.<outcome>`` for each ``(event id, user id)`` of ``decided``, whose value is
    ``(owner, idempotency key, [(notification id, channel, status, reason)])``: the outcome by the one
    rule over those statuses, to the owner's subscribed endpoints among ``live``, once per endpoint
    (``subject``: the first decision wins)."""
    stamp = at.isoformat().replace("+00:00", "Z")
    deliveries = []
    for (event_id, user_id), (owner, key, notes) in decided.items():
        outcome = user_outcome(status for _i, _c, status, _r in notes)
        endpoints = [e for e in outcome_subscribers.get(f"event.{outcome}", {}).get(owner, ()) if e in live]
        body = {"type": f"event.{outcome}", "timestamp": stamp, "data": {
            "event_id": str(event_id), "user_id": user_id, "outcome": outcome, "at": stamp, "idempotency_key": key,
            "notifications": [{"notification_id": str(pk), "channel": channel, "status": status,
                               "reason": reason or None} for pk, channel, status, reason in sorted(notes)]}}
        deliveries += [WebhookDelivery(endpoint_id=e, event_type=f"event.{outcome}", payload=body, next_attempt_at=at,
                                       created_at=at, subject=f"event:{event_id}:{user_id}") for e in endpoints]
    if deliveries:
        WebhookDelivery.objects.bulk_create(deliveries, ignore_conflicts=True)
    return len(deliveries)


_EMPTIED_SQL = f"""
SELECT i.event_id, d.recipient_id, e.idempotency_key, d.client_id
  FROM {DigestItem._meta.db_table} AS i JOIN {Digest._meta.db_table} AS d ON d.id = i.digest_id
  JOIN {Event._meta.db_table} AS e ON e.id = i.event_id
 WHERE i.digest_id = ANY(%s::uuid[]) AND d.client_id = ANY(%s::text[]) AND (%s::uuid IS NULL OR i.event_id = %s)
"""


def emit_digests_emptied(digest_ids: Iterable, at: datetime, event_id=None) -> int:
    """``event.not_reached`` for the user of every event in the open digests ``digest_ids`` that an
    erasure empties and closes unsent, or of ``event_id`` alone when its cancel takes it out of them
    (call before the items are deleted, in the same transaction): they get no notification, so no
    move of one tells it. The same rule (no notification: not reached), body and once-per-endpoint
    as an outcome a move decides. Nobody subscribed: no query. Returns the deliveries written."""
    outcome_subscribers = {e: subscribers(e) for e in OUTCOME_EVENTS}
    clients = set().union(*outcome_subscribers.values())
    ids = [str(d) for d in digest_ids]
    if not clients or not ids:
        return 0
    with connection.cursor() as cur:
        only = str(event_id) if event_id is not None else None
        cur.execute(_EMPTIED_SQL, [array_literal(ids), array_literal(clients), only, only])
        found = cur.fetchall()
    decided: dict[tuple, tuple] = {(event, user): (owner, key, []) for event, user, key, owner in found}
    live = _live({e for owner, _k, _n in decided.values() for s in outcome_subscribers.values()
                  for e in s.get(owner, ())})
    return _tell_outcomes(decided, at, live, outcome_subscribers)


def forget_client_metadata(recipient_id: str) -> int:
    """Erasure: the payloads of the deliveries of ``recipient_id``'s notifications (sent, pending,
    and the erasure's own ``notification.cancelled``, written earlier in its transaction) lose
    ``metadata.client``, what the client sent about the user; a pending one is sent without it, a
    replay too. ``event.*`` and ``campaign.completed`` payloads carry no client metadata. Returns
    the deliveries changed."""
    from notifications.models import NotificationRecord

    with connection.cursor() as cur:
        cur.execute(f"UPDATE {_TABLE} SET payload = jsonb_set(payload, '{{data,metadata,client}}', 'null') "
                    f"WHERE notification_id IN (SELECT id FROM {NotificationRecord._meta.db_table} "
                    f"WHERE recipient_id = %s) AND payload #> '{{data,metadata,client}}' <> 'null'::jsonb",
                    [recipient_id])
        return cur.rowcount


def emit_campaign_completed(campaign_id, client_id: str | None, at: datetime, *, series_id=None,
                            series: bool = False) -> int:
    """``campaign.completed`` for a campaign its client launched (admin campaigns: none): a one-off, a
    recurring series' run (``series_id``: its series) or the series itself (``series``: its rule has
    no occurrence left and its last run finished, docs/RECURRING.md)."""
    subscribed = subscribers("campaign.completed").get(client_id, []) if client_id else []
    live = _live(set(subscribed))
    endpoints = [e for e in subscribed if e in live]
    stamp = at.isoformat().replace("+00:00", "Z")
    body = {"type": "campaign.completed", "timestamp": stamp,
            "data": {"campaign_id": str(campaign_id), "at": stamp, "series": series,
                     "series_id": str(series_id) if series_id else None}}
    WebhookDelivery.objects.bulk_create([WebhookDelivery(endpoint_id=e, event_type="campaign.completed",
                                                         payload=body, next_attempt_at=at, created_at=at)
                                         for e in endpoints])
    return len(endpoints)
