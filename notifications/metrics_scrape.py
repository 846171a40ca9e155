"""``/metrics``: the scrape. Sums the event series every process wrote (prometheus-client's
multiprocess mode, notifications/metrics.py) and adds the state gauges computed now from Redis and
Postgres (:class:`OpsCollector`, bounded queries of ``notifications.health``); who may scrape
(docs/OPERATIONS.md, "Metrics").
"""

from __future__ import annotations

import hmac
import logging
import math
import os
import time

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

# notifications.metrics first: it sets PROMETHEUS_MULTIPROC_DIR before prometheus_client is imported.
from notifications.metrics import MULTIPROCESS, _m  # isort: skip
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import GaugeMetricFamily

from core.queues import WORKERS
from notifications import housekeeping, receipts_buffer
from notifications.metrics_labels import provider_label

log = logging.getLogger(__name__)

# --- scrape-time gauges -----------------------------------------------------------------------

def _breaker_gauge(dj_settings) -> GaugeMetricFamily:
    """``notify_provider_breaker_state{provider}``: 0 closed, 1 half-open or probe due (the open period
    is over: the next call decides), 2 open (calls fail fast), as ``isolation.breaker_state`` says."""
    from providers.isolation import breaker_state

    gauge = GaugeMetricFamily("notify_provider_breaker_state",
                              "Circuit breaker of each configured provider: 0 closed, "
                              "1 half-open (probing or probe due), 2 open (failing fast).",
                              labels=["provider"])
    names = [e["NAME"] for entries in (getattr(dj_settings, "PROVIDERS", None) or {}).values() for e in entries]
    for name in dict.fromkeys(names):
        state = breaker_state(name)["state"]
        if state != "unknown":
            value = {"closed": 0, "half_open": 1, "probe_due": 1, "open": 2}.get(state, 0)
            gauge.add_metric([provider_label(name)], value)
    return gauge


def _partition_gauges(snap: dict):
    """``notify_partitions{table}``, ``notify_partition_oldest_age_days{table}`` and
    ``notify_partition_maintenance_last_success_timestamp`` (core/partitions.py)."""
    count = GaugeMetricFamily("notify_partitions", "Day partitions of a partitioned table (DEFAULT not counted).",
                              labels=["table"])
    oldest = GaugeMetricFamily("notify_partition_oldest_age_days",
                               "Days from the oldest day partition to today (UTC); its retention bounds it.",
                               labels=["table"])
    for t in snap["tables"]:
        count.add_metric([t["table"]], t["partitions"])
        if t["oldest_age_days"] is not None:
            oldest.add_metric([t["table"]], t["oldest_age_days"])
    yield count
    yield oldest
    if snap["last_run"] is not None:  # None: Redis unreachable
        success = snap["last_run"]["alert_success_at"]
        yield GaugeMetricFamily("notify_partition_maintenance_last_success_timestamp",
                                "Unix time of the last partition maintenance run that succeeded; none recorded "
                                "(a new or flushed Redis): when that was first seen.", value=success.timestamp())


def _housekeeping_gauges(last: dict):
    """``notify_housekeeping_last_success_timestamp{task}`` (none recorded: when that was first seen)
    and ``notify_housekeeping_interval_seconds{task}`` (notifications/housekeeping.py)."""
    success = GaugeMetricFamily("notify_housekeeping_last_success_timestamp",
                                "Unix time a housekeeping task (archive, inbox and webhook pruning) last succeeded; "
                                "none recorded (a new or flushed Redis): when that was first seen.", labels=["task"])
    interval = GaugeMetricFamily("notify_housekeeping_interval_seconds",
                                 "How often beat runs the housekeeping task (its schedule in settings).",
                                 labels=["task"])
    for task, at in last.items():
        success.add_metric([task], at)
        seconds = housekeeping.interval_seconds(task)
        if seconds is not None:
            interval.add_metric([task], seconds)
    yield success
    yield interval


def _receipts_gauges(backlog: dict):
    """``notify_receipts_buffered`` and ``notify_receipts_buffered_oldest_age_seconds``
    (notifications/receipts_buffer.py)."""
    yield GaugeMetricFamily("notify_receipts_buffered",
                            "Webhook requests whose delivery receipts wait in the receipts buffer for the "
                            "receipts worker.", value=backlog["requests"])
    if backlog["oldest_age"] is not None:
        yield GaugeMetricFamily("notify_receipts_buffered_oldest_age_seconds",
                                "Seconds since the oldest buffered webhook request was received (0 if none).",
                                value=backlog["oldest_age"])


class OpsCollector:
    """Gauges computed at scrape time from Redis (queues, heartbeats, receipts buffer) and Postgres (pipeline state)."""

    def describe(self):
        return []  # do not collect at registration

    def collect(self):
        from core.redis_client import get_redis
        from notifications import health
        from notifications.lifecycle import archive

        started = time.monotonic()
        up = GaugeMetricFamily("notify_scrape_source_up",
                               "1 if the source answered this scrape, 0 if not (its gauges are then missing).",
                               labels=["source"])

        # Broker: queue depths and the age of the oldest waiting message per send queue.
        try:
            queues = health.queue_snapshot()
            depth = GaugeMetricFamily("notify_queue_depth", "Messages waiting in the Celery queue (broker LLEN).",
                                      labels=["queue"])
            oldest = GaugeMetricFamily(
                "notify_queue_oldest_age_seconds",
                "Age (now - queued_at) of the notifications in the oldest message waiting in a send queue; "
                "0 when the queue is empty.", labels=["queue"])
            for queue, info in queues.items():
                depth.add_metric([queue], info["depth"])
                if info["oldest_age"] is not None:
                    oldest.add_metric([queue], info["oldest_age"])
            yield depth
            yield oldest
            up.add_metric(["broker"], 1)
        except Exception as exc:
            log.warning("metrics: broker gauges unavailable: %s", exc)
            up.add_metric(["broker"], 0)

        # Redis: the scheduler's and the workers' heartbeats, the breakers, the receipts buffer, the
        # housekeeping tasks' last successes. A heartbeat never seen (or expired) is +Inf, not left
        # out: its alert needs no absent(), which would also fire whenever the scrape itself fails.
        try:
            age = health.beat_heartbeat_age(get_redis())
            yield GaugeMetricFamily("notify_scheduler_heartbeat_age_seconds",
                                    "Seconds since the scheduler (release_due, run by beat) last ran; +Inf: no "
                                    "heartbeat recorded.", value=math.inf if age is None else age)
            workers = GaugeMetricFamily(
                "notify_worker_heartbeat_age_seconds",
                f"Seconds since a worker of this kind last beat (every {health.WORKER_HEARTBEAT_SECONDS:.0f} s "
                "while it runs); +Inf for a kind not seen for a day or ever.", labels=["worker"])
            ages = health.worker_heartbeat_ages(get_redis())
            for kind in WORKERS:
                workers.add_metric([kind], ages.get(kind, math.inf))
            yield workers
            yield from _housekeeping_gauges(housekeeping.last_successes_for_alerts(get_redis()))
            yield _breaker_gauge(settings)
            yield from _receipts_gauges(receipts_buffer.backlog())
            up.add_metric(["redis"], 1)
        except Exception as exc:
            log.warning("metrics: heartbeat gauge unavailable: %s", exc)
            up.add_metric(["redis"], 0)

        # Postgres: pending rows, scheduler lag, expired leases, dead letters.
        try:
            snap = health.pipeline_snapshot()
            pending = GaugeMetricFamily(
                "notify_notifications_pending",
                f"Notifications waiting in a non-terminal status (counted up to {health.COUNT_CAP}).",
                labels=["status"])
            for status, count in snap["pending"].items():
                pending.add_metric([status], count)
            yield pending
            yield GaugeMetricFamily("notify_scheduler_due_unreleased",
                                    "Scheduled notifications already due but not yet released.",
                                    value=snap["due_unreleased"])
            yield GaugeMetricFamily("notify_scheduler_lag_seconds",
                                    "How long the oldest due scheduled notification has been due (0 if none).",
                                    value=snap["scheduler_lag_seconds"])
            queued = GaugeMetricFamily("notify_queued_oldest_age_seconds",
                                       "Age of the oldest queued notification of the tier in Postgres (whatever "
                                       "the broker holds); 0 when none is queued.", labels=["tier"])
            for tier, age in snap["oldest_queued_age_seconds"].items():
                queued.add_metric([tier], age or 0.0)
            yield queued
            yield GaugeMetricFamily("notify_expired_leases",
                                    "Notifications in sending whose worker lease ran out (the reconciler "
                                    "re-drives them).",
                                    value=snap["expired_leases"])
            yield GaugeMetricFamily("notify_dead_letters", "Dead letters waiting for a person (admin › Dead letters).",
                                    value=snap["dead_letters"])
            yield GaugeMetricFamily("notify_dead_letters_oldest_age_seconds",
                                    "Age of the oldest dead letter (0 if none).",
                                    value=snap["dead_letters_oldest_age_seconds"] or 0.0)
            yield GaugeMetricFamily("notify_live_notifications_estimate",
                                    "Rows in the live notifications table, as Postgres last estimated them "
                                    "(the archiver keeps it to about HOT_HOURS of traffic).",
                                    value=archive.live_rows_estimate())
            up.add_metric(["postgres"], 1)
        except Exception as exc:
            log.warning("metrics: Postgres gauges unavailable: %s", exc)
            up.add_metric(["postgres"], 0)
        # Postgres (and the last run's record in Redis): the partitioned tables.
        try:
            yield from _partition_gauges(health.partition_snapshot())
        except Exception as exc:
            log.warning("metrics: partition gauges unavailable: %s", exc)
        yield up
        yield GaugeMetricFamily("notify_scrape_duration_seconds", "Time this scrape spent computing the gauges.",
                                value=time.monotonic() - started)


class _LocalCollector:
    """Single-process fallback (PROMETHEUS_MULTIPROC_DIR unset when prometheus-client was imported)."""

    def describe(self):
        return []

    def collect(self):
        yield from _m().registry.collect()


def registry_for_scrape() -> CollectorRegistry:
    """A fresh registry: every process's event series (summed) plus the scrape-time gauges."""
    registry = CollectorRegistry()
    if MULTIPROCESS:
        multiprocess.MultiProcessCollector(registry, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
    else:
        registry.register(_LocalCollector())
    registry.register(OpsCollector())
    return registry


# --- /metrics -----------------------------------------------------------------------------------

_LOOPBACK = frozenset({"127.0.0.1", "::1", "::ffff:127.0.0.1"})
_PROXY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def _refusal(request):
    """``None`` if the request may read /metrics, else the response refusing it.

    With ``METRICS_TOKEN`` set: ``Authorization: Bearer <METRICS_TOKEN>`` is required from anywhere
    (401 otherwise). Unset outside local development (``settings.LOCAL_DEVELOPMENT``): every request
    is refused (403), whatever its peer address or forwarding headers say, since which headers a
    proxy sets or strips is not ours to know. Unset in local development: only loopback clients that
    did not come through a proxy (no X-Forwarded-For/Forwarded/X-Real-IP header) are answered (403
    otherwise).
    """
    token = getattr(settings, "METRICS_TOKEN", "") or ""
    if not token and not getattr(settings, "LOCAL_DEVELOPMENT", False):
        return JsonResponse({"error": {"status": 403, "code": "forbidden",
                                       "message": "METRICS_TOKEN is not set: outside local development /metrics "
                                                  "answers only Authorization: Bearer <METRICS_TOKEN>"}},
                            status=403)
    if token:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode()):
            return None
        response = JsonResponse({"error": {"status": 401, "code": "unauthorized",
                                           "message": "send Authorization: Bearer <METRICS_TOKEN>"}}, status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    local = request.META.get("REMOTE_ADDR") in _LOOPBACK
    if local and not any(request.META.get(h) for h in _PROXY_HEADERS):
        return None
    return JsonResponse({"error": {"status": 403, "code": "forbidden",
                                   "message": "METRICS_TOKEN is not set: /metrics answers local requests only"}},
                        status=403)


@never_cache
@require_GET
def metrics_view(request):
    """Prometheus text exposition of every series (docs/OPERATIONS.md)."""
    refused = _refusal(request)
    if refused is not None:
        return refused
    return HttpResponse(generate_latest(registry_for_scrape()), content_type=CONTENT_TYPE_LATEST)

