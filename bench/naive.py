"""The naive baseline: the textbook one-Celery-task-per-notification design, at its best.

A fan-out task inserts one rendered row per member (``bulk_create`` per :data:`PAGE`) and enqueues
one ``send_one`` task per row, which loads the row and recipient, calls the primary provider's
``send`` and marks it ``sent``; at least once (``acks_late``), no tiers, batches, leases, breakers or
budgets. Its own Celery app (``celery -A bench.naive worker``, queue :data:`QUEUE`), never the
production pipeline, on the platform's tables so statuses are read the same way. "At its best":
many prefork processes, or a threaded worker per core (docs/PERFORMANCE.md).
"""

from __future__ import annotations

import os
import uuid

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

#: The naive design's one queue (never one of the platform's).
QUEUE = "bench.naive"
#: Members per fan-out page: one ``bulk_create`` and then one task per row.
PAGE = 1000
#: Provider errors are retried this many times, 1 s apart, before the row is marked ``failed``.
MAX_RETRIES = 5

app = Celery("bench_naive", set_as_current=False)  # never the current app of a process that imports it
app.conf.update(
    broker_url=os.environ.get("CELERY_BROKER_URL") or os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/3",
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
    task_ignore_result=True,
    task_acks_late=True,
    task_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
)


@app.task(name="bench.naive.fan_out")
def fan_out(segment_id: str, channel: str, campaign_id: str, title: str, body: str) -> int:
    """Insert one ``queued`` row per member of ``segment_id`` (ids ``uuid5(campaign_id, user_id)``,
    ``body`` rendered as a Django template with the recipient's attributes) and enqueue one
    :func:`send_one` per row. Returns the number of rows inserted."""
    from django.template import engines
    from django.utils import timezone

    from campaigns.models import SegmentMember
    from notifications.models import Notification

    template = engines["django"].from_string(body)
    namespace = uuid.UUID(campaign_id)
    members = SegmentMember.objects.filter(segment_id=segment_id).order_by("recipient_id")
    after, total = "", 0
    while True:
        page = list(members.filter(recipient_id__gt=after).values_list("recipient_id", "recipient__attributes")[:PAGE])
        if not page:
            return total
        now = timezone.now()
        rows = [Notification(id=uuid.uuid5(namespace, user_id), campaign_id=namespace, recipient_id=user_id,
                             channel=channel, priority="standard", title=title,
                             body=template.render(attributes or {}), status="queued",
                             queued_at=now, created_at=now, updated_at=now)
                for user_id, attributes in page]
        Notification.objects.bulk_create(rows, ignore_conflicts=True)
        for row in rows:
            send_one.delay(str(row.id))
        total += len(rows)
        after = page[-1][0]


@app.task(name="bench.naive.send_one", bind=True, max_retries=MAX_RETRIES)
def send_one(self, notification_id: str) -> None:
    """Load the row and its recipient, call the primary provider once, mark the row ``sent``
    (``failed`` after :data:`MAX_RETRIES` provider errors)."""
    from django.db.models import F
    from django.utils import timezone

    from notifications.models import Notification
    from preferences.models import Device
    from providers.base import OutboundMessage
    from providers.registry import get_backend

    n = Notification.objects.select_related("recipient").get(pk=notification_id)
    if n.status != "queued":
        return
    platform = None
    if n.channel == "push":
        device = Device.objects.filter(recipient_id=n.recipient_id, active=True).order_by("pk").first()
        to, platform = (device.push_token, device.platform) if device else ("", None)
    else:
        to = n.recipient.email if n.channel == "email" else n.recipient.phone
    nid = str(n.id)
    message = OutboundMessage(notification_id=nid, channel=n.channel, to=to, body=n.body, title=n.title or None,
                              data={"notification_id": nid} if n.channel != "sms" else None, platform=platform,
                              collapse_key=nid if n.channel == "push" else None)
    try:
        result = get_backend(n.channel).send(message)
    except Exception as exc:
        if self.request.retries >= MAX_RETRIES:
            Notification.objects.filter(pk=n.pk).update(status="failed", reason_detail=repr(exc)[:500],
                                                        updated_at=timezone.now())
            return
        raise self.retry(exc=exc, countdown=1) from None
    now = timezone.now()
    Notification.objects.filter(pk=n.pk).update(status="sent", provider=result.provider,
                                                provider_message_id=result.provider_message_id, sent_at=now,
                                                attempts=F("attempts") + 1, updated_at=now)
