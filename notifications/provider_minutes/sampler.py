"""Beat's provider-minute sampler (``notifications.sample_provider_minutes``, ``maintenance`` queue, every
``PROVIDER_HEALTH_SAMPLE_SECONDS``): rolls the delivery log up into one
:class:`~notifications.provider_minutes.models.ProviderMinute` per provider and minute, and samples
each configured provider's breaker (docs/OPERATIONS.md, "Provider health page").

Bounded however large the log: it reads only attempts past its high-water mark, by primary key (each
day partition's ``(id, created_at)`` index; the table has no ``created_at`` index), at most
:data:`BATCH` a read and :data:`MAX_BATCHES` a sample, aggregated by Postgres, so Python sees one row
per provider and minute. Only provider calls count: an attempt the breaker, bulkhead or budget
refused (``health.NOT_CALLED_CODES``, 0 ms) is in no minute's requests, errors or p95. A minute split
across two samples is merged: counts add up, the p95 is the larger of the parts' (:func:`merge`).
Rows older than ``PROVIDER_HEALTH_KEEP_DAYS`` are deleted.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from core import clock
from notifications.health import CALL_OUTCOMES, ERROR_OUTCOMES, NOT_CALLED_CODES, providers_overview
from notifications.models import DeliveryAttempt
from notifications.provider_minutes.models import ProviderMinute, RollupMark
from providers.isolation import breaker_state

log = logging.getLogger(__name__)

MARK = "provider_minutes"
#: Attempts read per statement, and statements per sample (then the rest waits for the next sample).
BATCH = 50_000
MAX_BATCHES = 20
#: Breaker states of an open spell not yet closed (``isolation.STATES``).
OPEN_STATES = ("open", "probe_due", "half_open")

_BATCH_SQL = f"""
WITH batch AS (
    SELECT id, provider, outcome, error_code, latency_ms, created_at FROM {DeliveryAttempt._meta.db_table}
     WHERE id > %(after)s ORDER BY id LIMIT %(limit)s
)
SELECT provider, date_trunc('minute', created_at),
       count(*) FILTER (WHERE outcome = ANY(%(calls)s) AND error_code <> ALL(%(not_called)s)),
       count(*) FILTER (WHERE outcome = ANY(%(errors)s) AND error_code <> ALL(%(not_called)s)),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms)
           FILTER (WHERE outcome = ANY(%(calls)s) AND error_code <> ALL(%(not_called)s)),
       NULL::bigint, NULL::bigint
  FROM batch GROUP BY 1, 2
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, count(*), max(id) FROM batch
"""


def sample_seconds() -> float:
    return float(settings.NOTIFY["PROVIDER_HEALTH_SAMPLE_SECONDS"])


def keep_days() -> int:
    return int(settings.NOTIFY["PROVIDER_HEALTH_KEEP_DAYS"])


def minute_of(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def merge(row: ProviderMinute, requests: int, errors: int, p95: int | None) -> None:
    """Add a later part of ``row``'s minute: counts add up; the p95 becomes the larger of the two, an
    upper bound of the whole minute's (at most 5 % of either part lies above its own p95, so at most
    5 % of the whole lies above the larger) that the raw latencies would be needed to better."""
    row.requests += requests
    row.errors += errors
    if p95 is not None:
        row.latency_p95_ms = p95 if row.latency_p95_ms is None else max(row.latency_p95_ms, p95)


def _read_batch(after: int) -> tuple[dict[tuple[str, datetime], tuple[int, int, int | None]], int, int]:
    """``({(provider, minute): (requests, errors, p95)}, attempts read, highest id read)``."""
    parts: dict[tuple[str, datetime], tuple[int, int, int | None]] = {}
    read, last = 0, after
    with connection.cursor() as cur:
        cur.execute(_BATCH_SQL, {"after": after, "limit": BATCH, "calls": list(CALL_OUTCOMES),
                                 "errors": list(ERROR_OUTCOMES), "not_called": list(NOT_CALLED_CODES)})
        for provider, minute, requests, errors, p95, count, top in cur.fetchall():
            if provider is None and minute is None:
                read, last = count, top if top is not None else after
            else:
                parts[(provider, minute)] = (requests, errors, None if p95 is None else round(p95))
    return parts, read, last


def _store(parts: dict[tuple[str, datetime], tuple[int, int, int | None]]) -> None:
    if not parts:
        return
    providers = {p for p, _ in parts}
    minutes = {m for _, m in parts}
    existing = {(r.provider, r.minute): r for r in
                ProviderMinute.objects.filter(provider__in=providers, minute__in=minutes)}
    new, changed = [], []
    for key, (requests, errors, p95) in parts.items():
        row = existing.get(key)
        if row is None:
            new.append(ProviderMinute(provider=key[0], minute=key[1], requests=requests, errors=errors,
                                      latency_p95_ms=p95))
        else:
            merge(row, requests, errors, p95)
            changed.append(row)
    ProviderMinute.objects.bulk_create(new)
    ProviderMinute.objects.bulk_update(changed, ["requests", "errors", "latency_p95_ms"])


def _instant(ms: int) -> datetime | None:
    """A breaker instant (Redis ``TIME``, epoch ms) on the platform clock (``core.clock``'s offset)."""
    return datetime.fromtimestamp(ms / 1000 + clock.offset_seconds(), UTC) if ms else None


def configured_providers() -> list[str]:
    """Every configured provider name once, in the page's order (channel, primary first)."""
    names = [p["name"] for providers in providers_overview().values() for p in providers]
    return list(dict.fromkeys(names))


def sample_breaker(name: str, now: datetime) -> ProviderMinute:
    """Record ``name``'s breaker into the row of ``now``'s minute: its state, the openings since the
    previous sample (the breaker's counter), and the open spell it is in or that closed since then."""
    state = breaker_state(name)
    previous = (ProviderMinute.objects.filter(provider=name, sampled_at__isnull=False, minute__lte=minute_of(now))
                .order_by("-minute").values_list("breaker_opened_total", "sampled_at").first())
    total, (last_total, last_at) = state["opened"], previous or (None, None)
    if state["state"] == "unknown":  # Redis unreachable: no counter read, keep the last one
        total = last_total or 0
    opened = 0 if last_total is None else total - last_total if total >= last_total else total
    began, ended = _instant(state["since_ms"]), _instant(state["closed_ms"])
    if state["state"] in OPEN_STATES:
        ended = None
    elif not (began and ended and ended >= began and (last_at is None or ended > last_at)):
        began = ended = None
    row, created = ProviderMinute.objects.get_or_create(provider=name, minute=minute_of(now))
    row.breaker_opened = (0 if created else row.breaker_opened) + opened
    row.breaker_state, row.breaker_opened_total, row.sampled_at = state["state"], total, now
    if began is not None or row.spell_began is None:
        row.spell_began, row.spell_ended = began, ended
    row.save()
    return row


def sample(now: datetime | None = None) -> dict:
    """One sample: the attempts past the mark into their minutes, each configured provider's breaker
    into ``now``'s minute, rows past the keep deleted; all in one transaction holding the mark's lock.
    Returns ``{"attempts": read, "behind": bool, "deleted": rows}``."""
    now = now or clock.now()
    with transaction.atomic():
        if not RollupMark.objects.filter(name=MARK).exists():
            # The first sample starts at the newest attempt: the history before it is not rolled up.
            with connection.cursor() as cur:
                cur.execute(f"SELECT max(id) FROM {DeliveryAttempt._meta.db_table}")
                start = cur.fetchone()[0] or 0
            RollupMark.objects.get_or_create(name=MARK, defaults={"last_id": start, "at": now})
        mark = RollupMark.objects.select_for_update().get(name=MARK)
        read = 0
        for _ in range(MAX_BATCHES):
            parts, count, mark.last_id = _read_batch(mark.last_id)
            _store(parts)
            read += count
            if count < BATCH:
                break
        behind = count >= BATCH
        if behind:
            log.warning("provider minutes: %s attempts read, more wait for the next sample", read)
        for name in configured_providers():
            sample_breaker(name, now)
        mark.at = now
        mark.save()
        deleted, _ = ProviderMinute.objects.filter(minute__lt=now - timedelta(days=keep_days())).delete()
    return {"attempts": read, "behind": behind, "deleted": deleted}
