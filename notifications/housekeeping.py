"""The last success of each housekeeping task (beat's archive and retention ticks), for ``/metrics`` and
the ``HousekeepingTaskNotRunning`` alert (docs/OPERATIONS.md, "Dashboards and alerts").

A failing task is counted (``notify_task_failures_total``), but one that never runs (beat or the
maintenance worker down, its schedule entry gone, every run expiring in a backed-up queue) raises
nothing unless its last success is watched. Each task's owner calls :func:`succeeded` when a run ends
well. The instants live in one Redis hash, not in a process's metric files: a restart or a wiped
``PROMETHEUS_MULTIPROC_DIR`` loses nothing, and every host's scrape shows the same value. Partition
maintenance keeps its own record, with its outcome (core/partitions.py), under the same rule:

A missing record reads as the instant a reader first found it missing
(``core.redis_client.first_found_missing``), not 0: after a Redis restart or flush the next run may
be an interval (an hour for partitions) away, and 0 paged at once for nothing wrong (hadv34). A task
that never succeeds after that still pages, once its threshold has passed since. Not in Postgres: it
would cost a table and a write per run for one case, and a flush only delays a real page by one
threshold at most.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta

import redis
from django.conf import settings

from core.redis_client import first_found_missing, get_redis

log = logging.getLogger(__name__)

#: The housekeeping tasks, each with its beat schedule entry (``settings.CELERY_BEAT_SCHEDULE``).
TASKS = {
    "notifications.archive": "archive-notifications",
    "notifications.prune_inbox": "prune-inbox",
    "notifications.prune_webhooks": "prune-webhooks",
}
#: Redis hash (``settings.REDIS_URL``): task name → unix time of its last successful run.
KEY = "ops:housekeeping:last_success"


def succeeded(task: str) -> None:
    """A run of ``task`` (one of :data:`TASKS`) just ended well. Never raises: the run is done."""
    try:
        get_redis().hset(KEY, task, f"{time.time():.3f}")
    except redis.RedisError as exc:
        log.warning("%s: last success not recorded, Redis unavailable: %s", task, exc)


def last_successes(client: redis.Redis | None = None) -> dict[str, float | None]:
    """Per task of :data:`TASKS`, the unix time of its last success; ``None``: none recorded.

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    raw = (client or get_redis()).hmget(KEY, list(TASKS))
    found: dict[str, float | None] = {}
    for task, value in zip(TASKS, raw, strict=True):
        try:
            found[task] = None if value is None else float(value)
        except ValueError:
            found[task] = None
    return found


def last_successes_for_alerts(client: redis.Redis) -> dict[str, float]:
    """:func:`last_successes`, a missing one read as when it was first found missing (module docstring).

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    now = time.time()
    return {task: at if at is not None else first_found_missing(client, KEY, task, now)
            for task, at in last_successes(client).items()}


def interval_seconds(task: str) -> float | None:
    """How often beat runs ``task``, from its schedule entry in settings; ``None`` when the entry is
    missing or not a plain interval (a crontab)."""
    entry = settings.CELERY_BEAT_SCHEDULE.get(TASKS[task]) or {}
    schedule = entry.get("schedule")
    if isinstance(schedule, timedelta):
        return schedule.total_seconds()
    if isinstance(schedule, int | float) and schedule > 0:
        return float(schedule)
    return None
