"""Putting notifications on the broker. Only ids travel; the row in Postgres is the message.

Use :func:`enqueue_on_commit` from any code that runs inside a transaction: the task is published
only once the rows it names are committed (Zulip's ``queue_event_on_commit``, Saleor's rule). The
bare :func:`enqueue_rollback_unsafe` is for code that has already committed.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable

from celery import current_app
from django.conf import settings
from django.db import transaction

from core.queues import SEND_TASK, naive, queue_for
from notifications import metrics

log = logging.getLogger(__name__)

def chunk_size(priority: str, channel: str) -> int:
    """Notification ids per send task: one for the high tier (the high worker's threads work on
    different OTPs in parallel) and in naive mode; ``NOTIFY["BATCH_SIZE"][channel]`` for standard."""
    if priority == "high" or naive():
        return 1
    return max(1, int(settings.NOTIFY["BATCH_SIZE"][channel]))


def enqueue_rollback_unsafe(rows: Iterable[tuple], countdown: float | None = None) -> int:
    """Publish send tasks for ``rows`` of ``(id, priority, channel)``. Returns tasks published.
    Published by name (:data:`core.queues.SEND_TASK`), so this module does not import the tasks.

    Must only be called after the rows are committed as ``queued``.
    """
    by_queue: dict[tuple[str, int], list[str]] = defaultdict(list)
    for nid, priority, channel in rows:
        by_queue[(queue_for(priority, channel), chunk_size(priority, channel))].append(str(nid))
    published = 0
    for (queue, size), ids in by_queue.items():
        for start in range(0, len(ids), size):
            current_app.send_task(SEND_TASK, args=[ids[start:start + size]], queue=queue,
                                  routing_key=queue, exchange="", countdown=countdown)
            published += 1
            metrics.task_published(queue)
    return published


def enqueue_on_commit(rows: Iterable[tuple], countdown: float | None = None) -> None:
    """Publish send tasks for ``rows`` of ``(id, priority, channel)`` once the transaction commits."""
    rows = list(rows)
    if rows:
        transaction.on_commit(lambda: _enqueue_or_log(rows, countdown))


def _enqueue_or_log(rows: list[tuple], countdown: float | None) -> None:
    # The rows are committed as `queued`: if the broker is unreachable now, the reconciler
    # re-enqueues them after QUEUED_STALE_SECONDS. Nothing accepted is lost, so do not fail the
    # request (or the worker) that committed them.
    try:
        enqueue_rollback_unsafe(rows, countdown=countdown)
    except Exception as exc:  # kombu/redis raise many types; all mean "not published"
        metrics.publish_failed(len(rows))
        log.warning("broker publish failed for %d notification(s); the reconciler will re-drive "
                    "them: %s", len(rows), exc)
