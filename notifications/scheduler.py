"""The scheduler and the reconciler: together they make the broker disposable (docs/ARCHITECTURE.md §6).

* :func:`release_due` (beat, every second) closes the digests whose window has ended, then moves
  due ``scheduled`` rows to ``queued`` (``FOR UPDATE SKIP LOCKED``) and enqueues them after commit.
* :func:`reconcile` (beat, every few seconds) re-drives rows whose worker died (``sending`` with an
  expired lease: reason ``lease_expired``, dead-lettered as ``worker_lost`` on the last attempt)
  and rows whose broker message was lost (``queued`` too long while their queue is empty).
* :func:`archive` (beat, every minute) moves finished rows past ``HOT_HOURS`` to the history
  (:mod:`notifications.lifecycle.archive`).

Long delays live in Postgres, never in Celery ETAs, which a Redis broker may fire several times.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction

from core import clock
from core.queues import SEND_QUEUES, queue_for
from core.redis_client import client_for
from notifications import housekeeping, lifecycle, metrics
from notifications.enqueue import enqueue_on_commit
from notifications.events import digests, fallback
from notifications.models import DeliveryEvent

log = logging.getLogger(__name__)

_STALE_QUEUED_SQL = """
WITH stale AS (
    SELECT id FROM notifications_notification
     WHERE status = 'queued'
       AND queued_at < CASE WHEN priority = 'high' THEN %(high_before)s ELSE %(standard_before)s END
       AND (priority || '.' || channel) = ANY(%(drained)s)
     LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
)
UPDATE notifications_notification n
   SET queued_at = %(now)s, updated_at = %(now)s
  FROM stale
 WHERE n.id = stale.id AND n.status = 'queued'
RETURNING n.id, n.priority, n.channel
"""


def _move(sql: str, params: dict, event_kind: str, status: str, detail: str) -> int:
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(sql, params)
            rows = cur.fetchall()
        if rows:
            DeliveryEvent.objects.bulk_create(
                [DeliveryEvent(notification_id=r[0], kind=event_kind, status=status, detail=detail) for r in rows])
            enqueue_on_commit(rows)
    return len(rows)


def release_due(max_batches: int = 20) -> int:
    """Close the digests whose window has ended (:func:`notifications.events.digests.close_due`: their
    rows are inserted due now), then release due scheduled rows, up to ``max_batches`` ×
    ``RELEASE_BATCH_SIZE``. Returns the count released."""
    limit = settings.NOTIFY["RELEASE_BATCH_SIZE"]
    digests.close_due()
    total = 0
    for _ in range(max_batches):
        with transaction.atomic():
            rows = lifecycle.release_due(clock.now(), limit)
            enqueue_on_commit(rows)
        n = len(rows)
        total += n
        if n < limit:
            break
    metrics.scheduler_ran(total)  # also the heartbeat /readyz checks
    return total


def drained_queues() -> list[str]:
    """Send queues with no message waiting in the broker.

    Only their stale ``queued`` rows are re-enqueued: when a queue still holds messages, an old
    ``queued`` row is most likely waiting its turn behind a backlog (a big campaign), and enqueueing
    it again would only pile duplicates onto that backlog. A lost message (Redis flushed or
    restarted) empties the queue, so it is re-driven as soon as the queue has drained. If the broker
    cannot be read, every queue counts as drained (re-driving is always safe: the claim de-duplicates).
    """
    from notifications import health

    url = health.broker_redis_url()
    if url is None:
        return list(SEND_QUEUES)
    try:
        pipe = client_for(url).pipeline(transaction=False)
        for queue in SEND_QUEUES:
            pipe.llen(queue_for(*queue.split(".")))
        lengths = pipe.execute()
    except Exception as exc:
        log.warning("broker queue lengths unavailable (%s); re-driving stale rows of every queue", exc)
        return list(SEND_QUEUES)
    return [q for q, n in zip(SEND_QUEUES, lengths, strict=True) if n == 0]


def _expired_leases(now, limit: int) -> int:
    """Take over ``sending`` rows whose lease ran out (see the module docstring). Returns the count."""
    notify = settings.NOTIFY
    params = {"now": now, "limit": limit, "max_high": notify["MAX_ATTEMPTS"]["high"],
              "max_standard": notify["MAX_ATTEMPTS"]["standard"],
              "standard_due": now + timedelta(seconds=float(notify["OUTCOME_UNKNOWN_WAIT_SECONDS"]["standard"]))}
    with transaction.atomic():
        rows = lifecycle.expire_leases(params)
        if not rows:
            return 0
        enqueue_on_commit([(pk, priority, channel) for pk, priority, channel, status, *_ in rows
                           if status == "queued"])
        # A dead-lettered event row releases the channel waiting behind it in a fallback order.
        fallback.settle([(pk, status, reason, channel) for pk, _priority, channel, status, reason, _d in rows
                         if status == "failed"])
    lost = [row for row in rows if row[3] == "failed"]
    if lost:
        log.error("%d notification(s) dead-lettered: their worker died or stalled on their last allowed attempt",
                  len(lost))
    for _pk, priority, channel, status, reason, _detail in rows:
        if status == "failed":
            metrics.record_outcome(status=status, reason=reason, channel=channel, tier=priority)
    return len(rows)


def reconcile(limit: int = 1000) -> dict[str, int]:
    """Re-drive expired leases and stale queued rows, and settle fallback rows still waiting behind
    one that ended (:func:`notifications.events.fallback.sweep`). Returns ``{"leases": n,
    "stale_queued": m, "fallbacks": k}``."""
    now = clock.now()
    leases = _expired_leases(now, limit)
    with transaction.atomic():
        fallbacks = fallback.sweep(limit)
    stale_after = settings.NOTIFY["QUEUED_STALE_SECONDS"]
    drained = drained_queues()
    stale = 0 if not drained else _move(_STALE_QUEUED_SQL, {"now": now, "limit": limit, "drained": drained,
                                      "high_before": now - timedelta(seconds=stale_after["high"]),
                                      "standard_before": now - timedelta(seconds=stale_after["standard"])},
                  "requeued", "queued", "broker message not consumed in time; enqueued again")
    if leases or stale:
        log.info("reconciler re-drove %d expired lease(s) and %d stale queued row(s)", leases, stale)
    metrics.reconciled(leases, stale)
    return {"leases": leases, "stale_queued": stale, "fallbacks": fallbacks}


def archive() -> int:
    """Archiver tick: at most ``NOTIFY["ARCHIVE_MAX_ROWS_PER_RUN"]`` finished rows to the history
    (:func:`notifications.lifecycle.archive.archive`); counted in ``notify_archived_total``, its
    success recorded for the alert on a stopped archiver (:mod:`notifications.housekeeping`)."""
    moved = lifecycle.archive.archive(clock.now(), int(settings.NOTIFY["ARCHIVE_MAX_ROWS_PER_RUN"]))
    if moved:
        log.info("archiver moved %d finished notification(s) to the history", moved)
    metrics.archived(moved)
    housekeeping.succeeded("notifications.archive")
    return moved
