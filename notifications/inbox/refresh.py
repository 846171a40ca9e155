"""The silent refresh push (docs/APP.md, "The silent refresh push"): when an inbox item is written for
a user with active push devices, a data-only push tells an open app to fetch its inbox now, so an
inbox is instant without a socket server.

The message: no notification block, ``content-available`` (:func:`providers.fcm.backend.build_message`,
``silent``), ``data`` with the unseen count and the newest id, collapse key ``inbox_refresh``, TTL
60 s. Best effort, never at other traffic's expense: at most one per user per
``REFRESH_PUSH_SECONDS`` (Redis ``SET NX EX``) plus one trailing refresh at the window's end; the
standard push budget without waiting, only while the breaker is closed; no retry, no row.
Counted in ``notify_inbox_refresh_total{outcome}`` (docs/OPERATIONS.md).
"""

from __future__ import annotations

import logging
from collections import defaultdict

from celery import current_app
from django.conf import settings

from core.queues import queue_for
from core.redis_client import get_redis
from notifications import metrics
from notifications.inbox.models import InboxCounts, InboxItem
from preferences.models import Device
from providers import isolation
from providers.base import OutboundMessage
from providers.registry import get_backend, provider_names, unavailable_channel_problem

log = logging.getLogger(__name__)

#: The push's ``data["type"]`` and its collapse key.
REFRESH_TYPE = "inbox_refresh"
#: How long the provider may hold the refresh for an offline device (seconds).
REFRESH_TTL_SECONDS = 60


def request(newest: dict[str, str]) -> int:
    """Send the refresh push to the users of ``newest`` (user id → the id of their newest item just
    written) that have active devices and had none in the last ``REFRESH_PUSH_SECONDS``. Returns
    the number of pushes accepted. Never raises (logged and counted instead)."""
    options = settings.NOTIFY["INBOX"]
    if not newest or not options["REFRESH_PUSH"] or unavailable_channel_problem("push"):
        return 0
    try:
        return _send(newest, int(options["REFRESH_PUSH_SECONDS"]))
    except Exception:
        log.exception("inbox refresh push for %d user(s) failed; their apps see the items when next opened",
                      len(newest))
        metrics.inbox_refresh("failed", len(newest))
        return 0


def _send(newest: dict[str, str], every_seconds: int) -> int:
    devices: dict[str, list] = defaultdict(list)
    for d in Device.objects.filter(recipient_id__in=list(newest), active=True).only(
            "recipient_id", "push_token", "platform"):
        devices[d.recipient_id].append(d)
    metrics.inbox_refresh("no_device", len(newest) - len(devices))
    users = sorted(devices)
    if not users:
        return 0
    pipe = get_redis().pipeline(transaction=False)
    for user in users:
        pipe.set(f"inbox-refresh:{user}", "1", nx=True, ex=max(1, every_seconds))
    due = [user for user, fresh in zip(users, pipe.execute(), strict=True) if fresh]
    metrics.inbox_refresh("skipped_recent", len(users) - len(due))
    _trail([user for user in users if user not in set(due)], every_seconds)
    if not due:
        return 0
    unseen = dict(InboxCounts.objects.filter(recipient_id__in=due).values_list("recipient_id", "unseen"))
    messages = [OutboundMessage(notification_id=newest[user], channel="push", to=d.push_token, body="",
                                data={"type": REFRESH_TYPE, "unseen": str(unseen.get(user, 0))}, platform=d.platform,
                                ttl_seconds=REFRESH_TTL_SECONDS, priority="standard", collapse_key=REFRESH_TYPE,
                                silent=True)
                for user in due for d in devices[user]]
    name = provider_names("push")[0]
    if not isolation.breaker_allows(name, may_probe=False).allowed:
        metrics.inbox_refresh("skipped_breaker", len(messages))
        return 0
    granted, _wait = isolation.take_tokens(name, "standard", len(messages))
    if granted < len(messages):
        metrics.inbox_refresh("skipped_budget", len(messages) - granted)
    if not granted:
        return 0
    # The high tier's instance: its TIMEOUT is PROVIDER_TIMEOUT_SECONDS_HIGH at most, so a slow
    # provider holds the in_app worker that long per batch, and its breaker then skips the rest.
    backend = get_backend("push", name, "high")
    results = backend.send_batch(messages[:granted], max(1, int(settings.NOTIFY["SEND_CONCURRENCY"]["push"])))
    failed = sum(1 for r in results if isinstance(r, Exception))
    # Only provider trouble (timeouts, 5xx) counts against the breaker, not a stale token.
    isolation.record_calls(name, ok=len(results) - failed,
                           failed=sum(1 for r in results if isinstance(r, Exception) and isolation.is_failure(r)))
    metrics.inbox_refresh("sent", len(results) - failed)
    metrics.inbox_refresh("failed", failed)
    return len(results) - failed


#: The task that sends a trailing refresh (``notifications.tasks``), and its queue.
TRAILING_TASK = "notifications.inbox_refresh_trailing"


def _trail(users: list[str], every_seconds: int) -> None:
    """Users whose refresh was throttled: one trailing refresh each at the window's end (a second
    ``SET NX`` key per user keeps it to one per window)."""
    if not users:
        return
    pipe = get_redis().pipeline(transaction=False)
    for user in users:
        pipe.set(f"inbox-refresh-trailing:{user}", "1", nx=True, ex=max(1, every_seconds))
    later = [user for user, fresh in zip(users, pipe.execute(), strict=True) if fresh]
    if later:
        queue = queue_for("standard", "in_app")
        try:
            current_app.send_task(TRAILING_TASK, args=[later], queue=queue, routing_key=queue, exchange="",
                                  countdown=every_seconds + 0.5)
        except Exception as exc:  # kombu/redis raise many types; the app sees the items when next opened
            log.warning("trailing inbox refresh for %d user(s) not queued: %s", len(later), exc)


def trailing(users: list[str]) -> int:
    """The trailing refresh (the task's body): each user's newest item now, one refresh push each
    (:func:`request`; the window's key has run out). Returns the pushes accepted."""
    get_redis().delete(*[f"inbox-refresh-trailing:{user}" for user in users])
    newest = dict(InboxItem.objects.filter(recipient_id__in=users).order_by("recipient_id", "-created_at",
                                                                             "-notification_id")
                  .distinct("recipient_id").values_list("recipient_id", "notification_id"))
    return request({user: str(nid) for user, nid in newest.items()})

