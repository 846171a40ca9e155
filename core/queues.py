"""The queue topology: every Celery queue, which queue a piece of work goes to, and the names of the
tasks that other floors publish by name (docs/ARCHITECTURE.md, "Queues and workers").

Queues: ``{tier}.{channel}`` for sends (``high.sms``… consumed only by the high-tier worker;
``standard.*`` by the standard worker), ``fanout`` (campaign pages), ``maintenance`` (scheduler,
reconciler), ``receipts`` (provider delivery receipts) and ``webhooks`` (status webhooks to the
calling services). The benchmark's naive baseline is the
benchmark's own; production code has no naive mode.

Publishing by task name (``current_app.send_task(SEND_TASK, …)``) lets a module queue work without
importing the module that defines the task, so no import runs back up from a service to its tasks.
"""

from __future__ import annotations

from core.vocabulary import CHANNELS, TIERS

SEND_QUEUES = tuple(f"{tier}.{channel}" for tier in TIERS for channel in CHANNELS)
FANOUT_QUEUE = "fanout"
MAINTENANCE_QUEUE = "maintenance"
RECEIPTS_QUEUE = "receipts"
#: Status webhooks to the calling services (docs/WEBHOOKS.md): their own worker, never the send path's.
WEBHOOKS_QUEUE = "webhooks"
ALL_QUEUES = (*SEND_QUEUES, FANOUT_QUEUE, MAINTENANCE_QUEUE, RECEIPTS_QUEUE, WEBHOOKS_QUEUE)


def worker_of(queue: str) -> str:
    """The kind of worker that consumes ``queue`` (the Procfile's ``worker_<kind>``, node ``<kind>@host``):
    a send queue's tier (``high.sms`` → ``high``), else the queue's own name (``fanout``)."""
    return queue.split(".", 1)[0]


#: Every kind of worker: ``high``, ``standard``, ``fanout``, ``maintenance``, ``receipts``, ``webhooks``.
WORKERS = tuple(dict.fromkeys(worker_of(queue) for queue in ALL_QUEUES))

#: Task names (stable: they are in queued messages). Defined in notifications/tasks.py.
SEND_TASK = "notifications.send"
RECEIPTS_TASK = "notifications.apply_receipts"  # one request's receipts (queued before the buffer)
RECEIPTS_DRAIN_TASK = "notifications.drain_receipts"  # the receipts buffer (notifications/receipts_buffer.py)
#: Defined in campaigns/tasks.py; published by campaigns/fanout.py, which campaigns/tasks.py imports.
FAN_OUT_PAGE_TASK = "campaigns.fan_out_page"
#: Defined in notifications/tasks.py: one endpoint's due webhook deliveries (notifications/webhooks/delivery.py).
WEBHOOK_DELIVER_TASK = "notifications.deliver_webhooks"


def queue_for(priority: str, channel: str) -> str:
    """``{tier}.{channel}`` (``high.sms``)."""
    return f"{priority}.{channel}"


def fanout_queue() -> str:
    """``fanout``: the queue of campaign fan-out pages."""
    return FANOUT_QUEUE
