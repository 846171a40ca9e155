"""Prometheus metrics: the series and the small recording functions the pipeline calls.

Label values: notifications/metrics_labels.py; the scrape's state gauges: notifications/metrics_scrape.py;
the series: :class:`notifications.metrics_series.Series` (docs/OPERATIONS.md lists every one, and
how multiprocess collection works). Recording functions never raise: a metrics bug must not fail a
delivery. Events inside a transaction are recorded ``on_commit``, so a rolled-back (and re-driven)
transition is counted once. Label values are bounded: fixed sets, provider names from
``settings.PROVIDERS`` (else ``other``), provider codes from an allow-list (else ``4xx``/``5xx``,
else ``other``).
"""

from __future__ import annotations

import functools
import logging
import os
import threading

from django.conf import settings

# First: it sets PROMETHEUS_MULTIPROC_DIR before prometheus-client is imported anywhere.
from notifications.metrics_series import Series as _Metrics  # isort: skip

from django.db import transaction
from prometheus_client import multiprocess, values

from core.vocabulary import CHANNELS, TIERS
from notifications.metrics_labels import OUTCOMES, code_label, one_of, provider_label, reason_label, task_label

log = logging.getLogger(__name__)

#: True when this process writes its metrics to PROMETHEUS_MULTIPROC_DIR files.
MULTIPROCESS = bool(getattr(values.ValueClass, "_multiprocess", False))

#: Statuses counted by notify_notification_outcomes_total (the end of the send path, or a receipt's).
#: Cancellations happen in the API/campaign services, which are not instrumented (yet).
OUTCOME_STATUSES = ("sent", "delivered", "failed", "suppressed", "expired")
DEFERRAL_REASONS = ("retry_scheduled", "quiet_hours", "outcome_unknown", "lease_expired", "worker_error")

_metrics: _Metrics | None = None
_metrics_lock = threading.Lock()


def _m() -> _Metrics:
    """The metrics, created on first use: a process that records nothing (``manage.py`` commands, the
    scrape itself) writes no file into the multiprocess directory."""
    global _metrics
    if _metrics is None:
        with _metrics_lock:
            if _metrics is None:
                _metrics = _Metrics()
    return _metrics


def use_multiprocess_dir(path: str | None) -> None:
    """Re-point this process's metric files at ``path`` and start its values from that directory.

    For tests and tools (a fresh, private directory); the platform itself only ever uses the
    directory from settings. Closes this process's open metric files first.
    """
    global _metrics
    with _metrics_lock:
        if MULTIPROCESS:
            values.ValueClass.close_all_files()  # this process's open files; later values open anew
            if path:
                os.makedirs(path, exist_ok=True)
                os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
        _metrics = None


def _safe(func):
    """Recording must never break the caller."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except Exception:
            log.warning("metrics: %s failed", func.__name__, exc_info=True)
            return None

    return wrapper


def _on_commit(func) -> None:
    """Run ``func`` once the current transaction commits (at once outside a transaction)."""
    transaction.on_commit(_safe(func), robust=True)


# --- recording: primitives --------------------------------------------------------------------

@_safe
def record_provider_call(*, provider: str, channel: str, outcome: str, code: str = "",
                         http_status: int | None = None, seconds: float | None = None) -> None:
    """One provider call and its outcome (accepted, transient, permanent, contact_invalid, configuration)."""
    if outcome not in OUTCOMES:
        return
    provider = provider_label(provider)
    code = code_label(code, http_status) if outcome != "accepted" else ""
    _m().provider_calls.labels(provider, outcome, code).inc()
    if seconds is not None:
        _m().provider_call_seconds.labels(provider).observe(max(0.0, seconds))
    if channel == "push" and outcome == "contact_invalid":
        _m().tokens_invalidated.labels(provider, code).inc()


@_safe
def record_outcome(*, status: str, reason: str, channel: str, tier: str, count: int = 1) -> None:
    """``count`` notifications moved to ``status`` (sent, delivered, failed, suppressed, expired)."""
    if status not in OUTCOME_STATUSES:
        return
    _m().outcomes.labels(status, reason_label(reason), one_of(channel, CHANNELS), one_of(tier, TIERS)).inc(count)


@_safe
def record_accept_to_provider(*, tier: str, channel: str, seconds: float) -> None:
    _m().accept_to_provider.labels(one_of(tier, TIERS), one_of(channel, CHANNELS)).observe(max(0.0, seconds))


@_safe
def isolation_event(kind: str, provider: str, tier: str = "", seconds: float = 0.0, channel: str = "") -> None:
    """Isolation mechanisms (providers/isolation.py): ``kind`` is ``budget_wait`` (with ``seconds``),
    ``breaker_fast_fail``, ``breaker_opened``, ``bulkhead_full`` or ``failover`` (to ``provider``)."""
    p, t = provider_label(provider), one_of(tier, TIERS)
    if kind == "budget_wait":
        _m().budget_waits.labels(p, t).inc(max(0.0, seconds))
    elif kind == "breaker_fast_fail":
        _m().breaker_fast_fails.labels(p, t).inc()
    elif kind == "breaker_opened":
        _m().breaker_opened.labels(p).inc()
    elif kind == "bulkhead_full":
        _m().bulkhead_full.labels(p, t).inc()
    elif kind == "failover":
        _m().failovers.labels(one_of(channel, CHANNELS), p).inc()


@_safe
def batch_recorded(*, channel: str, tier: str, provider: str, sent: int, calls: int, call_seconds: float,
                   accept_latencies: list[float]) -> None:
    """The standard batch path recorded ``sent`` notifications as sent after ``calls`` accepted
    provider calls that took ``call_seconds`` in all (one histogram observation per batch: the mean
    call time); ``accept_latencies`` are the accept → provider seconds of each."""
    p = provider_label(provider)
    if calls:
        _m().provider_calls.labels(p, "accepted", "").inc(calls)
        _m().provider_call_seconds.labels(p).observe(max(0.0, call_seconds / calls))
    if sent:
        _m().outcomes.labels("sent", "", one_of(channel, CHANNELS), one_of(tier, TIERS)).inc(sent)
    histogram = _m().accept_to_provider.labels(one_of(tier, TIERS), one_of(channel, CHANNELS))
    for seconds in accept_latencies:
        histogram.observe(max(0.0, seconds))


# --- recording: call sites --------------------------------------------------------------------

def accept_started_at(n):
    """Where accept → provider latency starts: the later of ``created_at`` and ``scheduled_at``."""
    start = n.created_at
    if n.scheduled_at and (start is None or n.scheduled_at > start):
        start = n.scheduled_at
    return start


@_safe
def provider_calls(n, attempts) -> None:
    """The delivery pipeline (notifications/delivery/): these DeliveryAttempts of ``n`` were made
    (the calls happened; an attempt the isolation refused, ``health.NOT_CALLED_CODES``, is skipped),
    all it records for ``n`` at once.

    The first accepted call among them also observes accept → provider-accept latency: from
    ``max(created_at, scheduled_at)`` (acceptance, or the requested send time if later) to now,
    the instant the provider accepted it and the worker records ``sent``.
    """
    from notifications.health import NOT_CALLED_CODES

    observed = False
    for attempt in attempts:
        if attempt.error_code in NOT_CALLED_CODES:
            continue  # refused before the call (breaker open…): counted as such where it was refused
        record_provider_call(
            provider=attempt.provider, channel=n.channel, outcome=attempt.outcome, code=attempt.error_code,
            http_status=attempt.http_status,
            seconds=attempt.latency_ms / 1000 if attempt.latency_ms is not None else None)
        if attempt.outcome == "accepted" and not observed:
            from core import clock

            observed = True
            start = accept_started_at(n)
            if start is not None:
                record_accept_to_provider(tier=n.priority, channel=n.channel,
                                          seconds=(clock.now() - start).total_seconds())


@_safe
def notification_transitioned(n) -> None:
    """``recording.transition``: the claimed row ``n`` (fields already updated) moved to ``n.status``;
    counts the outcome (sent, failed, suppressed, expired) or the deferral (retry, quiet hours)."""
    status, reason, channel, tier = n.status, n.reason, n.channel, n.priority

    def record():
        if status in OUTCOME_STATUSES:
            record_outcome(status=status, reason=reason, channel=channel, tier=tier)
        elif reason in DEFERRAL_REASONS:
            _m().deferrals.labels(reason, one_of(channel, CHANNELS), one_of(tier, TIERS)).inc()

    _on_commit(record)


@_safe
def receipt_transitioned(n, status: str, reason: str = "") -> None:
    """``receipts._apply_one``: a receipt moved ``n`` to ``delivered`` or ``failed``."""
    channel, tier = n.channel, n.priority
    _on_commit(lambda: record_outcome(status=status, reason=reason, channel=channel, tier=tier))


@_safe
def receipt_applied(n, receipt) -> None:
    """``receipts._apply_one``: a (non-duplicate) receipt was stored; counts email bounces."""
    if n.channel != "email" or receipt.raw not in ("bounce", "dropped"):
        return
    if receipt.raw == "bounce":
        kind = "hard" if receipt.invalid_address else "soft"
    elif receipt.invalid_address:
        kind = "dropped_invalid"
    else:
        return
    provider = provider_label(receipt.provider)
    _on_commit(lambda: _m().email_bounces.labels(provider, kind).inc())


@_safe
def receipts_counted(provider: str, counts: dict[str, int]) -> None:
    """``receipts.apply_receipts``: ``{"applied": n, "duplicate": n, "unknown": n}`` for one request."""
    provider = provider_label(provider)
    for result in ("applied", "duplicate", "unknown"):
        if counts.get(result):
            _m().receipts.labels(provider, result).inc(counts[result])


APP_RECEIPT_LABELS = (("displayed", "opened", "dismissed"), CHANNELS,
                      ("moved", "unchanged", "duplicate", "refused"))


@_safe
def app_receipt(event: str, channel: str, outcome: str) -> None:
    """``notifications.app_receipts.apply_app_receipt``: one receipt from the app and its outcome
    (recorded after its transaction; a refusal's once its rollback is over)."""
    labels = tuple(one_of(value, allowed) for value, allowed in zip((event, channel, outcome), APP_RECEIPT_LABELS,
                                                                     strict=True))
    _on_commit(lambda: _m().app_receipts.labels(*labels).inc())


@_safe
def scheduler_ran(released: int) -> None:
    """``scheduler.release_due``: one scheduler run; writes the heartbeat /readyz checks."""
    from notifications.health import write_beat_heartbeat

    write_beat_heartbeat()
    # Also brings the label-less counters into existence (at 0) as soon as the scheduler runs, so
    # increase() sees their first events.
    _m().released.inc(released)


@_safe
def reconciled(leases: int, stale_queued: int) -> None:
    """``scheduler.reconcile``: rows re-driven."""
    if leases:
        _m().redriven.labels("expired_lease").inc(leases)
    if stale_queued:
        _m().redriven.labels("stale_queued").inc(stale_queued)


@_safe
def archived(moved: int) -> None:
    """``scheduler.archive``: finished rows moved from the live table to the history."""
    _m().archived.inc(moved)


@_safe
def events_accepted(events: int, notifications: int) -> None:
    """``notifications.events.services.accept_event``: new (not replayed) events and their rows."""
    _m().events.labels("events").inc(events)
    _m().events.labels("notifications").inc(notifications)


@_safe
def digest_counted(kind: str, count: int = 1) -> None:
    """``notifications.events.digests``: ``count`` digests opened or closed, or items added."""
    if count:
        _m().digests.labels(one_of(kind, ("opened", "closed", "items"))).inc(count)


#: ``notify_inbox_refresh_total``'s outcomes (notifications/inbox/refresh.py).
INBOX_REFRESH_OUTCOMES = ("sent", "failed", "skipped_recent", "skipped_budget", "skipped_breaker", "no_device")


@_safe
def inbox_refresh(outcome: str, count: int = 1) -> None:
    """``notifications.inbox.refresh``: ``count`` refresh pushes (or users) with this outcome."""
    if count:
        _m().inbox_refresh.labels(one_of(outcome, INBOX_REFRESH_OUTCOMES)).inc(count)


@_safe
def acceptance_limited(limit: str) -> None:
    """``notifications.acceptance.rules.reserve``: one request refused by the abuse limit ``limit``."""
    _m().acceptance_limited.labels(limit).inc()


@_safe
def fallback_settled(outcome: str, count: int) -> None:
    """``notifications.events.fallback.settle`` / ``reopen``: ``count`` waiting rows became ``outcome``."""
    if count:
        _m().fallbacks.labels(one_of(outcome, ("not_needed", "released", "cancelled", "reopened"))).inc(count)


@_safe
def unsubscribed(category: str, source: str) -> None:
    """``notifications.unsubscribe_views``: one opt-out made through a link (after its commit)."""
    categories = tuple(getattr(settings, "PREFERENCE_CATEGORIES", ["marketing"]))
    labels = (one_of(category, categories), one_of(source, ("one_click", "page")))
    _on_commit(lambda: _m().unsubscribes.labels(*labels).inc())


@_safe
def task_published(queue: str) -> None:
    """``enqueue.enqueue_rollback_unsafe``: one send task published."""
    from core.queues import ALL_QUEUES

    _m().published.labels(one_of(queue, ALL_QUEUES)).inc()


@_safe
def publish_failed(rows: int) -> None:
    """``enqueue._enqueue_or_log``: publishing ``rows`` notifications failed (broker unreachable)."""
    _m().publish_failures.inc(rows)


@_safe
def fanout_page_inserted(*, channel: str, tier: str, inserted, reasons: dict) -> None:
    """``campaigns.fanout._insert_page``: rows created by one page; counts the pre-filtered
    ``suppressed`` ones by reason (rows that already existed are not returned, so never twice)."""
    by_reason: dict[str, int] = {}
    for nid, status in inserted:
        if status == "suppressed":
            reason = reasons.get(nid, "")
            by_reason[reason] = by_reason.get(reason, 0) + 1
    if by_reason:
        def record():
            for reason, count in by_reason.items():
                record_outcome(status="suppressed", reason=reason, channel=channel, tier=tier, count=count)

        _on_commit(record)


@_safe
def task_failed(sender=None, **_kwargs) -> None:
    """Celery ``task_failure``: one task run raised (counted whatever the task; its name bounded)."""
    _m().task_failures.labels(task_label(getattr(sender, "name", None))).inc()


@_safe
def task_retried(sender=None, **_kwargs) -> None:
    """Celery ``task_retry``."""
    _m().task_retries.labels(task_label(getattr(sender, "name", None))).inc()


@_safe
def invalid_zone_fell_back(where: str, count: int = 1) -> None:
    """A stored zone name was not an IANA zone and the fallback zone was used instead; ``where``:
    ``fanout`` or ``quiet_hours``."""
    if count:
        _m().invalid_zones.labels(one_of(where, ("fanout", "quiet_hours"))).inc(count)


@_safe
def frequency_capped(category: str, channel: str, categories) -> None:
    """``notifications.delivery.caps.admit``: one row suppressed by a frequency cap (after its
    transaction). ``categories``: the active rules' categories (the label's bounded values)."""
    labels = (one_of(category, categories), one_of(channel, CHANNELS))
    _on_commit(lambda: _m().frequency_capped.labels(*labels).inc())


# --- process lifecycle ------------------------------------------------------------------------

def _mark_process_dead(pid=None, **_kwargs) -> None:
    """Celery ``worker_process_shutdown``: drop this pool process's live-gauge files.

    Counter and histogram files of dead processes are kept on purpose: they hold counts already
    reported, and removing them would make the summed counters go backwards. The whole directory
    is wiped only before the whole stack starts (docs/OPERATIONS.md).
    """
    if MULTIPROCESS and os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        try:
            multiprocess.mark_process_dead(pid or os.getpid())
        except OSError:
            log.debug("mark_process_dead failed", exc_info=True)


try:
    from celery.signals import task_failure, task_retry, worker_process_shutdown

    worker_process_shutdown.connect(_mark_process_dead, weak=False)
    task_failure.connect(task_failed, weak=False)
    task_retry.connect(task_retried, weak=False)
except ImportError:  # pragma: no cover - celery is a dependency
    pass
