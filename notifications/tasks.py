"""Celery tasks: thin, take ids, call a service (docs/ARCHITECTURE.md)."""

from __future__ import annotations

from celery import shared_task

from core import partitions
from core.queues import RECEIPTS_DRAIN_TASK, RECEIPTS_TASK, SEND_TASK, WEBHOOK_DELIVER_TASK
from notifications import app_receipts, receipts, scheduler
from notifications.delivery import pipeline
from notifications.inbox import prune, refresh
from notifications.provider_minutes import sampler as provider_minutes
from notifications.send_time import compute as send_time
from notifications.webhooks import delivery as webhook_delivery
from notifications.webhooks import retention as webhook_retention


def notification_task(name: str, **options):
    """The project's task decorator: explicit stable names, JSON arguments, no result storage.

    Delivery never relies on Celery retries or acks: a lost task is re-driven from Postgres by the
    reconciler, so tasks are acked on receipt (``acks_late`` off) and ignore their results.
    """
    return shared_task(name=name, ignore_result=True, acks_late=False, **options)


@notification_task(SEND_TASK)
def send_notifications(notification_ids: list[str]) -> None:
    """Deliver these notifications (the queue names the tier and channel)."""
    pipeline.send_notifications(notification_ids)


@notification_task("notifications.release_due")
def release_due() -> int:
    """Scheduler tick: release due scheduled rows."""
    return scheduler.release_due()


@notification_task("notifications.reconcile")
def reconcile() -> dict:
    """Reconciler tick: re-drive expired leases and stale queued rows, and buffered receipts no
    drain is pending for."""
    return {**scheduler.reconcile(), "receipts_drain_queued": receipts.requeue_stranded()}


@notification_task(RECEIPTS_TASK)
def apply_receipts(items: list[dict]) -> dict:
    """Apply provider receipts a webhook verified and queued (``receipts`` queue): messages queued
    before the receipts buffer, kept so none is left unread by an upgrade."""
    return receipts.apply_wire(items)


@notification_task(RECEIPTS_DRAIN_TASK)
def drain_receipts() -> dict:
    """Apply the receipts webhooks buffered, in batches, until none is left (``receipts`` queue)."""
    return receipts.drain_buffer()


@notification_task(app_receipts.INBOX_MARK_TASK)
def inbox_mark_receipts(notification_ids: list[str], status: str) -> int:
    """The app receipts of a large inbox mark by ids (``receipts`` queue): returns how many were stored."""
    return app_receipts.from_inbox_mark(notification_ids, status)


@notification_task(refresh.TRAILING_TASK)
def inbox_refresh_trailing(user_ids: list[str]) -> int:
    """The trailing silent refresh push of users whose refresh was throttled in a burst."""
    return refresh.trailing(user_ids)


@notification_task("notifications.archive")
def archive() -> int:
    """Archiver tick (``maintenance`` queue, every minute): finished rows past ``HOT_HOURS`` to the
    history, at most ``NOTIFY["ARCHIVE_MAX_ROWS_PER_RUN"]`` (docs/ARCHITECTURE.md, "Where a row lives")."""
    return scheduler.archive()


@notification_task("notifications.maintain_partitions")
def maintain_partitions() -> dict:
    """Partition tick (``maintenance`` queue, hourly): days ahead created, strays in DEFAULT moved,
    partitions past their retention dropped (core/partitions.py)."""
    run = partitions.maintain()
    return {"skipped": run.skipped, "created": [n for t in run.tables for n in t.created],
            "dropped": [n for t in run.tables for n in t.dropped]}


@notification_task("notifications.sample_provider_minutes")
def sample_provider_minutes() -> dict:
    """Beat (``maintenance``, every ``PROVIDER_HEALTH_SAMPLE_SECONDS``): the delivery log's new attempts
    and each provider's breaker into per-minute rows for the provider health page."""
    return provider_minutes.sample()


@notification_task("notifications.prune_inbox")
def prune_inbox() -> int:
    """Inbox tick (``maintenance`` queue, every ``NOTIFY["INBOX"]["PRUNE_EVERY_SECONDS"]``): delete items
    past their TTL or the retention period, ``PRUNE_BATCH`` at a time, counts moved with them."""
    return prune.prune()


@notification_task("notifications.compute_send_times")
def compute_send_times() -> dict:
    """Send-time tick (``maintenance`` queue, daily): every recipient's engagement hours recomputed in
    bulk (docs/SEND_TIME.md)."""
    run = send_time.recompute()
    return {"profiles": run.profiles, "dropped": run.dropped}


@notification_task("notifications.prune_webhooks")
def prune_webhooks() -> int:
    """Webhook retention tick (``maintenance`` queue, every ``WEBHOOKS_PRUNE_EVERY_SECONDS``): deliveries
    older than ``WEBHOOKS_KEEP_DAYS`` deleted with their attempts (docs/WEBHOOKS.md, "Retention")."""
    return webhook_retention.prune()


@notification_task("notifications.dispatch_webhooks")
def dispatch_webhooks() -> int:
    """Webhook tick (``webhooks`` queue, every ``WEBHOOKS_DISPATCH_SECONDS``): one delivery run per
    endpoint with due deliveries (docs/WEBHOOKS.md)."""
    return webhook_delivery.dispatch()


@notification_task(WEBHOOK_DELIVER_TASK)
def deliver_webhooks(endpoint_id: str) -> dict:
    """One endpoint's due webhook deliveries, within its batch budget (``webhooks`` queue)."""
    return webhook_delivery.deliver_endpoint(endpoint_id)
