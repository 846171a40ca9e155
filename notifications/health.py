"""Health and readiness: ``/healthz``, ``/readyz``, and the probes they share with ``/metrics``, the
provider-health admin page and ``manage.py doctor`` (docs/OPERATIONS.md, "Health checks").

``/healthz`` is always ``200`` and touches no dependency (a Postgres outage never restarts healthy
web processes). ``/readyz``: Postgres, Redis, the broker and the scheduler's heartbeat (older than
:data:`BEAT_MAX_AGE_SECONDS`: beat or the maintenance worker is broken); ``503`` names each failing
check, no addresses or errors (those go to the log). Every probe is bounded: 1 s Redis timeouts, a
2 s ``statement_timeout``, only index-backed ``LIMIT``-capped queries (:func:`pipeline_snapshot`).
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime

import redis
from django.conf import settings
from django.db import connection, transaction
from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from core import clock, partitions
from core.redis_client import client_for, get_redis
from notifications.metrics_labels import OUTCOMES
from providers.isolation import REFUSED_CODES

log = logging.getLogger(__name__)

#: The attempt outcomes that are provider calls (as ``notify_provider_calls_total`` counts them), and
#: those of them that count against the provider (contact_invalid is about the recipient): the
#: provider health page's error share, in its tables and its last hour.
CALL_OUTCOMES = OUTCOMES
ERROR_OUTCOMES = ("transient", "permanent", "configuration")
#: Error codes of an attempt that made no call (the breaker, bulkhead or budget refused it; the row
#: is written for the notification's log, latency 0): never a provider call, whatever its outcome.
#: Counted apart by ``notify_breaker_fast_fails_total`` and the health page's "not called" figure.
NOT_CALLED_CODES = REFUSED_CODES

#: Redis key (in ``settings.REDIS_URL``) holding the unix time of the last scheduler run.
HEARTBEAT_KEY = "ops:scheduler:heartbeat"
#: How long the heartbeat lives if nothing refreshes it (a day: a stale value still shows its age).
HEARTBEAT_TTL_SECONDS = 24 * 3600
#: Redis key (``settings.REDIS_URL``) of each kind of worker's heartbeat (``core.queues.WORKERS``) is this
#: prefix plus the kind: the unix time any worker consuming that kind's queues last beat.
WORKER_HEARTBEAT_PREFIX = "ops:worker:heartbeat:"
#: How often a worker writes its heartbeat (config/celery.py, ``WorkerHeartbeat``).
WORKER_HEARTBEAT_SECONDS = 10.0
#: /readyz fails the ``beat`` check when the last scheduler run is older than this (seconds).
BEAT_MAX_AGE_SECONDS = 30.0
#: Counts in the Postgres snapshot stop at this many rows (a value equal to it means "at least").
COUNT_CAP = 100_000
#: Statement timeout for the Postgres snapshot (milliseconds).
SNAPSHOT_TIMEOUT_MS = 2000

# kombu's Redis transport keeps one list per priority step: ``name`` and ``name\x06\x16<step>``.
_KOMBU_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")

# --- Redis ------------------------------------------------------------------------------------

def broker_redis_url() -> str | None:
    """The broker URL if the broker is Redis (queue depths are read from it), else ``None``."""
    url = settings.CELERY_BROKER_URL or ""
    return url if url.startswith(("redis://", "rediss://", "unix://")) else None


def write_beat_heartbeat() -> None:
    """Record that the scheduler just ran (called by ``scheduler.release_due``). Never raises."""
    try:
        get_redis().set(HEARTBEAT_KEY, f"{time.time():.3f}", ex=HEARTBEAT_TTL_SECONDS)
    except redis.RedisError as exc:
        log.warning("scheduler heartbeat not written, Redis unavailable: %s", exc)


def beat_heartbeat_age(client: redis.Redis | None = None) -> float | None:
    """Seconds since the scheduler last ran, ``None`` if it never did (or the key expired).

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    client = client or client_for(settings.REDIS_URL)
    raw = client.get(HEARTBEAT_KEY)
    if raw is None:
        return None
    try:
        return max(0.0, time.time() - float(raw))
    except ValueError:
        return None


def write_worker_heartbeat(queues) -> None:
    """A worker consuming ``queues`` is alive: refresh the heartbeat of each kind of worker they belong
    to (one key per kind, any worker of the kind refreshes it). Never raises."""
    from core.queues import WORKERS, worker_of

    kinds = sorted({worker_of(queue) for queue in queues} & set(WORKERS))
    try:
        pipe = get_redis().pipeline(transaction=False)
        for kind in kinds:
            pipe.set(WORKER_HEARTBEAT_PREFIX + kind, f"{time.time():.3f}", ex=HEARTBEAT_TTL_SECONDS)
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("worker heartbeat not written, Redis unavailable: %s", exc)


def worker_heartbeat_ages(client: redis.Redis | None = None) -> dict[str, float]:
    """Per kind of worker, seconds since one of them last beat; a kind never seen (or silent for
    :data:`HEARTBEAT_TTL_SECONDS`) is left out.

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    from core.queues import WORKERS

    client = client or client_for(settings.REDIS_URL)
    now, ages = time.time(), {}
    for kind, raw in zip(WORKERS, client.mget([WORKER_HEARTBEAT_PREFIX + k for k in WORKERS]), strict=True):
        if raw is None:
            continue
        try:
            ages[kind] = max(0.0, now - float(raw))
        except ValueError:
            continue
    return ages


def queue_snapshot() -> dict[str, dict]:
    """Per Celery queue: ``{"depth": int, "oldest_age": float | None}``.

    ``depth`` is the broker's list length (LLEN of every priority list of the queue). ``oldest_age``
    is known for the send queues only: the age (``now - queued_at``) of the notifications carried by
    the oldest message still waiting in that queue (``LINDEX -1``: kombu pushes left, pops right);
    ``0`` for an empty queue, ``None`` when not known (not a send queue, or the message could not be
    read). Costs one Redis pipeline and one primary-key query.

    Raises:
        redis.RedisError: the broker is unreachable. Returns ``{}`` if the broker is not Redis.
    """
    from core.queues import ALL_QUEUES, SEND_QUEUES

    url = broker_redis_url()
    if url is None:
        return {}
    client = client_for(url)
    pipe = client.pipeline(transaction=False)
    for queue in ALL_QUEUES:
        for suffix in _KOMBU_PRIORITY_SUFFIXES:
            pipe.llen(queue + suffix)
    for queue in SEND_QUEUES:
        for suffix in _KOMBU_PRIORITY_SUFFIXES:
            pipe.lindex(queue + suffix, -1)
    results = pipe.execute()
    n = len(_KOMBU_PRIORITY_SUFFIXES)
    depths = {q: sum(results[i * n:(i + 1) * n]) for i, q in enumerate(ALL_QUEUES)}
    heads = results[len(ALL_QUEUES) * n:]
    oldest_ids: dict[str, list[uuid.UUID]] = {}
    for i, queue in enumerate(SEND_QUEUES):
        ids: list[uuid.UUID] = []
        for raw in heads[i * n:(i + 1) * n]:
            if raw is not None:
                ids.extend(_notification_ids(raw))
        oldest_ids[queue] = ids
    try:
        queued_at = _queued_at([i for ids in oldest_ids.values() for i in ids])
    except Exception as exc:  # Postgres down: depths are still worth reporting
        log.warning("queue ages unavailable: %s", exc)
        queued_at = {}
    now = clock.now().timestamp()  # the clock that stamped queued_at
    snapshot = {}
    for queue in ALL_QUEUES:
        age: float | None = None
        if queue in oldest_ids:
            if depths[queue] == 0:
                age = 0.0
            else:
                instants = [queued_at[i] for i in oldest_ids[queue] if i in queued_at]
                if instants:
                    age = max(0.0, now - min(instants).timestamp())
        snapshot[queue] = {"depth": int(depths[queue]), "oldest_age": age}
    return snapshot


def _notification_ids(raw: bytes) -> list[uuid.UUID]:
    """Notification ids in one kombu/Celery message of the ``notifications.send`` task, or []."""
    try:
        payload = json.loads(raw)
        if (payload.get("headers") or {}).get("task") != "notifications.send":
            return []
        body = payload["body"]
        if (payload.get("properties") or {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return [uuid.UUID(str(i)) for i in args[0][:100]]
    except (ValueError, KeyError, IndexError, TypeError):
        return []


def _queued_at(ids: list[uuid.UUID]) -> dict[uuid.UUID, datetime]:
    if not ids:
        return {}
    with connection.cursor() as cur:
        cur.execute("SELECT id, queued_at FROM notifications_notification "
                    "WHERE id = ANY(%s::uuid[]) AND queued_at IS NOT NULL", [ids])
        return dict(cur.fetchall())


# --- Postgres ---------------------------------------------------------------------------------

_SNAPSHOT_SQL = f"""
SELECT
  (SELECT count(*) FROM (SELECT 1 FROM notifications_notification
                          WHERE status = 'scheduled' LIMIT {COUNT_CAP}) s) AS scheduled,
  (SELECT count(*) FROM (SELECT 1 FROM notifications_notification
                          WHERE status = 'queued' LIMIT {COUNT_CAP}) s) AS queued,
  (SELECT count(*) FROM (SELECT 1 FROM notifications_notification
                          WHERE status = 'sending' LIMIT {COUNT_CAP}) s) AS sending,
  (SELECT count(*) FROM (SELECT 1 FROM notifications_notification
                          WHERE status = 'scheduled' AND due_at <= %(now)s LIMIT {COUNT_CAP}) s) AS due,
  (SELECT min(due_at) FROM notifications_notification WHERE status = 'scheduled') AS oldest_due,
  (SELECT min(queued_at) FROM notifications_notification
    WHERE status = 'queued' AND priority = 'high') AS oldest_queued_high,
  (SELECT min(queued_at) FROM notifications_notification
    WHERE status = 'queued' AND priority = 'standard') AS oldest_queued_standard,
  (SELECT count(*) FROM (SELECT 1 FROM notifications_notification
                          WHERE status = 'sending' AND lease_until < %(now)s LIMIT {COUNT_CAP}) s) AS expired_leases,
  (SELECT count(*) FROM (SELECT 1 FROM notifications_notification
                          WHERE dead_lettered_at IS NOT NULL AND status = 'failed' LIMIT {COUNT_CAP}) s) AS dead,
  (SELECT min(dead_lettered_at) FROM notifications_notification
    WHERE dead_lettered_at IS NOT NULL AND status = 'failed') AS oldest_dead
"""


def partition_snapshot() -> dict:
    """The partitioned tables as /metrics and the provider-health page show them (core/partitions.py):
    ``{"tables": [{table, retention_days, partitions, oldest_day, oldest_age_days, default_rows}],
    "last_run": {at, outcome, success_at} or None when Redis is unreachable, "stale": no success within
    partitions.stale_after() (None when unreadable), "stale_after": that timedelta}``. Raises on
    Postgres errors."""
    today = clock.now().astimezone(UTC).date()
    tables = [{"table": s.table, "retention_days": s.retention_days, "partitions": s.partitions,
               "oldest_day": s.oldest_day, "default_rows": s.default_rows,
               "oldest_age_days": None if s.oldest_day is None else (today - s.oldest_day).days}
              for s in partitions.states()]
    try:
        last = partitions.last_run()
    except redis.RedisError as exc:
        log.warning("partition maintenance record unreadable: %s", exc)
        last = None
    stale = None if last is None else partitions.is_stale(last["success_at"])
    return {"tables": tables, "last_run": last, "stale": stale, "stale_after": partitions.stale_after()}


def pipeline_snapshot(now: datetime | None = None) -> dict:
    """Counts and ages of the delivery pipeline's non-terminal rows, from Postgres.

    Every subquery is served by a partial index (``status`` = scheduled/queued/sending; the oldest
    queued high-tier row by its own) or the ``dead_lettered_at`` index, counts stop at
    :data:`COUNT_CAP`, and the whole statement runs under a 2 s ``statement_timeout``. Returns::

        {"pending": {"scheduled": n, "queued": n, "sending": n},
         "due_unreleased": n, "scheduler_lag_seconds": s,
         "oldest_queued_age_seconds": {"high": s | None, "standard": s | None},
         "expired_leases": n, "dead_letters": n, "dead_letters_oldest_age_seconds": s | None}

    ``scheduler_lag_seconds`` is how long the oldest due ``scheduled`` row has been due (0 if none);
    ``oldest_queued_age_seconds``, per tier, how long its oldest ``queued`` row has waited (None: none).
    Raises the database's error when Postgres is unreachable or the timeout is hit.
    """
    from core import clock

    now = now or clock.now()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"SET LOCAL statement_timeout = {int(SNAPSHOT_TIMEOUT_MS)}")
        cur.execute(_SNAPSHOT_SQL, {"now": now})
        row = dict(zip([c.name for c in cur.description], cur.fetchone(), strict=True))

    def age(instant):
        return None if instant is None else max(0.0, (now - instant).total_seconds())

    return {
        "pending": {"scheduled": row["scheduled"], "queued": row["queued"], "sending": row["sending"]},
        "due_unreleased": row["due"],
        "scheduler_lag_seconds": age(row["oldest_due"]) or 0.0,
        "oldest_queued_age_seconds": {tier: age(row[f"oldest_queued_{tier}"]) for tier in ("high", "standard")},
        "expired_leases": row["expired_leases"],
        "dead_letters": row["dead"],
        "dead_letters_oldest_age_seconds": age(row["oldest_dead"]),
    }


# --- Provider configuration -------------------------------------------------------------------

#: Environment variables a real provider needs (the emulator needs none), for entries that do not
#: name them themselves (``ENV``, as ``config/provider_settings.py`` builds them).
PROVIDER_ENV = {
    "twilio": ("TWILIO_ACCOUNT_SID", "TWILIO_AUTH_TOKEN", "TWILIO_FROM_NUMBER"),
    "twilio_backup": ("TWILIO_BACKUP_ACCOUNT_SID", "TWILIO_BACKUP_AUTH_TOKEN", "TWILIO_BACKUP_FROM_NUMBER"),
    "sendgrid": ("SENDGRID_API_KEY", "EMAIL_FROM"),
    "smtp": ("SMTP_HOST", "SMTP_PORT", "EMAIL_FROM"),
    "fcm": ("FCM_CREDENTIALS", "FCM_PROJECT_ID"),
}


def provider_mode(entry: dict) -> str:
    """``"emulator"``, ``"real"`` or ``"custom"`` for one ``settings.PROVIDERS[channel]`` entry.

    Read from the entry's OPTIONS as settings built them: Twilio/SendGrid/FCM point at the emulator
    through ``BASE_URL``/``HOST``/``FCM_URL``; SMTP is the emulator's when it targets
    ``127.0.0.1:EMULATOR_SMTP_PORT``.
    """
    name = entry.get("NAME")
    options = entry.get("OPTIONS") or {}
    backend = str(entry.get("BACKEND", ""))
    if name == "twilio" or backend.endswith("TwilioSmsBackend"):
        return "emulator" if options.get("BASE_URL") else "real"
    if name == "sendgrid":
        return "emulator" if options.get("HOST") else "real"
    if name == "fcm":
        return "emulator" if options.get("FCM_URL") else "real"
    if name == "smtp":
        local = str(options.get("HOST", "")) in ("127.0.0.1", "localhost", "::1")
        return "emulator" if local and int(options.get("PORT") or 0) == settings.EMULATOR_SMTP_PORT else "real"
    return "custom"


def providers_overview(environ: Mapping[str, str] | None = None) -> dict[str, list[dict]]:
    """Per channel, the configured providers in order (primary first)::

        {"sms": [{"name": "twilio", "primary": True, "mode": "emulator",
                  "missing_env": ["TWILIO_ACCOUNT_SID", ...]}], ...}

    ``missing_env`` lists what a *real* provider of that name needs and is not set in ``environ``
    (default: the process environment, where settings read ``.run/env`` into): the variables the
    entry names in its ``ENV``, else those of :data:`PROVIDER_ENV` for its name.
    """
    import os

    env: Mapping[str, str] = os.environ if environ is None else environ
    overview: dict[str, list[dict]] = {}
    for channel, entries in (getattr(settings, "PROVIDERS", None) or {}).items():
        rows = []
        for index, entry in enumerate(entries or []):
            name = entry.get("NAME", "?")
            needed = list((entry.get("ENV") or {}).values()) or PROVIDER_ENV.get(name, ())
            rows.append({"name": name, "primary": index == 0, "mode": provider_mode(entry),
                         "missing_env": [v for v in needed if not env.get(v)]})
        overview[channel] = rows
    return overview


# --- Readiness checks -------------------------------------------------------------------------

def check_postgres() -> str | None:
    """``None`` when Postgres answers ``SELECT 1``, else a short reason."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
            cur.fetchone()
    except Exception as exc:
        log.warning("readiness: Postgres check failed: %s", exc)
        return f"Postgres unreachable ({type(exc).__name__})"
    return None


def _ping(url: str, what: str) -> str | None:
    try:
        client_for(url).ping()
    except redis.RedisError as exc:
        log.warning("readiness: %s check failed: %s", what, exc)
        return f"{what} unreachable ({type(exc).__name__})"
    return None


def check_redis() -> str | None:
    return _ping(settings.REDIS_URL, "Redis")


def check_broker() -> str | None:
    url = broker_redis_url()
    if url is not None:
        return _ping(url, "broker")
    from kombu import Connection

    try:
        with Connection(settings.CELERY_BROKER_URL, connect_timeout=1) as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, timeout=2)
    except Exception as exc:
        log.warning("readiness: broker check failed: %s", exc)
        return f"broker unreachable ({type(exc).__name__})"
    return None


def check_beat() -> str | None:
    limit = float(getattr(settings, "READYZ_BEAT_MAX_AGE_SECONDS", BEAT_MAX_AGE_SECONDS))
    try:
        age = beat_heartbeat_age()
    except redis.RedisError as exc:
        return f"heartbeat unreadable, Redis unreachable ({type(exc).__name__})"
    if age is None:
        return "no scheduler heartbeat: beat or the maintenance worker has not run release_due"
    if age > limit:
        return f"last scheduler heartbeat {age:.0f} s ago (limit {limit:.0f} s): beat or the maintenance worker is down"
    return None


READINESS_CHECKS = {"postgres": check_postgres, "redis": check_redis, "broker": check_broker, "beat": check_beat}


def readiness() -> tuple[bool, dict]:
    """Run every readiness check. Returns ``(ok, body)``; body names each failing check."""
    checks: dict[str, dict[str, object]] = {}
    for name, check in READINESS_CHECKS.items():
        started = time.monotonic()
        problem = check()
        checks[name] = {"ok": problem is None, "ms": round((time.monotonic() - started) * 1000, 1)}
        if problem:
            checks[name]["error"] = problem
    failing = [name for name, result in checks.items() if not result["ok"]]
    body: dict[str, object] = {"status": "ok" if not failing else "unavailable", "checks": checks}
    if failing:
        body["failing"] = failing
    return not failing, body


# --- Checks registered by apps above this one ------------------------------------------------

#: ``name -> callable() -> list of problem lines`` (empty = fine), registered by apps that sit above
#: notifications (campaigns) from their ``AppConfig.ready``, so this module never imports them.
#: ``manage.py doctor`` reports each line as a FAIL.
PROGRESS_CHECKS: dict = {}


def register_progress_check(name: str, check) -> None:
    """Register ``check`` (no arguments; returns problem lines) under ``name`` for ``manage.py doctor``."""
    PROGRESS_CHECKS[name] = check


# --- Views ------------------------------------------------------------------------------------

@never_cache
@require_GET
def healthz(request):
    """Liveness: the process is up. Touches no dependency."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_GET
def readyz(request):
    """Readiness: Postgres, Redis, the broker and a recent scheduler heartbeat; 503 naming failures."""
    ok, body = readiness()
    return JsonResponse(body, status=200 if ok else 503)
