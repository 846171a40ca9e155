"""How long webhook deliveries are kept (docs/WEBHOOKS.md, "Retention"), and removing an
endpoint's: both in set-based SQL, a batch at a time.

A delivery, with its attempts, is deleted ``WEBHOOKS["KEEP_DAYS"]`` after it was written, whatever its
state: by then it was delivered, failed after ``RETRY_FOR_SECONDS`` (a check keeps the two apart), or
belongs to a disabled endpoint that will never send it. Each batch is one statement per endpoint,
by the ``(endpoint, created_at)`` index. Django's own cascade would read every delivery's id into the
process first (millions for a busy endpoint), so deleting an endpoint goes through here too.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from core import clock
from notifications import housekeeping
from notifications.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

_DELIVERIES, _ATTEMPTS = WebhookDelivery._meta.db_table, WebhookAttempt._meta.db_table


def _delete_batch(endpoint_id, before: datetime | None, limit: int) -> int:
    """Up to ``limit`` of the endpoint's deliveries (written before ``before``: all when None), oldest
    first, with their attempts, in one statement."""
    since = "AND created_at < %(before)s" if before is not None else ""
    with connection.cursor() as cur:
        cur.execute(f"WITH gone AS (SELECT id FROM {_DELIVERIES} WHERE endpoint_id = %(endpoint)s {since} "
                    f"ORDER BY created_at LIMIT %(limit)s), "
                    f"attempts AS (DELETE FROM {_ATTEMPTS} WHERE delivery_id IN (SELECT id FROM gone)) "
                    f"DELETE FROM {_DELIVERIES} WHERE id IN (SELECT id FROM gone)",
                    {"endpoint": endpoint_id, "before": before, "limit": limit})
        return cur.rowcount


def prune(*, now: datetime | None = None, batch: int | None = None, budget_seconds: float | None = None) -> int:
    """The beat task's work: every endpoint's deliveries older than ``KEEP_DAYS``, ``PRUNE_BATCH`` per
    statement (each its own transaction), until none is left or ``PRUNE_BUDGET_SECONDS`` is spent (the
    next tick goes on). Returns the deliveries deleted. A run that ends, done or out of budget, is a
    success, recorded for the alert on a stopped prune (:mod:`notifications.housekeeping`)."""
    config = settings.WEBHOOKS
    before = (now or clock.now()) - timedelta(days=config["KEEP_DAYS"])
    stop = time.monotonic() + (config["PRUNE_BUDGET_SECONDS"] if budget_seconds is None else budget_seconds)
    deleted = _prune(before, batch or config["PRUNE_BATCH"], stop)
    housekeeping.succeeded("notifications.prune_webhooks")
    return deleted


def _prune(before: datetime, batch: int, stop: float) -> int:
    deleted = 0
    for endpoint_id in WebhookEndpoint.objects.order_by("pk").values_list("pk", flat=True):
        while True:
            with transaction.atomic():
                n = _delete_batch(endpoint_id, before, batch)
            deleted += n
            if n < batch:
                break
            if time.monotonic() >= stop:
                return deleted
    return deleted


def delete_endpoint(endpoint: WebhookEndpoint) -> None:
    """The endpoint, its deliveries and their attempts, in one transaction (pending ones are never sent).
    The endpoint row is taken ``FOR UPDATE`` first: a status move that wrote to it (holding it ``FOR KEY
    SHARE``, :mod:`notifications.webhooks.outbox`) commits before its deliveries are deleted, a later
    one skips it, and a delivery run records after the delete or not at all."""
    with transaction.atomic():
        if not list(WebhookEndpoint.objects.select_for_update().filter(pk=endpoint.pk).values_list("pk")):
            return  # deleted already
        while _delete_batch(endpoint.pk, None, 50_000):
            pass
        WebhookEndpoint.objects.filter(pk=endpoint.pk).delete()


def setting_problems() -> list[str]:
    """``WEBHOOKS["KEEP_DAYS"|"PRUNE_BATCH"]`` out of range, each naming the setting and the rule."""
    config, problems = settings.WEBHOOKS, []
    keep = config.get("KEEP_DAYS")
    if not isinstance(keep, int) or keep < 1 or keep * 86400 <= config["RETRY_FOR_SECONDS"]:
        problems.append(f"WEBHOOKS_KEEP_DAYS must be whole days >= 1 and longer than WEBHOOKS_RETRY_FOR_SECONDS "
                        f"({config['RETRY_FOR_SECONDS']:g} s: a delivery still retried would be deleted), got {keep!r}")
    if not isinstance(config.get("PRUNE_BATCH"), int) or config["PRUNE_BATCH"] < 1:
        problems.append(f"WEBHOOKS_PRUNE_BATCH must be >= 1, got {config.get('PRUNE_BATCH')!r}")
    return problems
