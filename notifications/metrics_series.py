"""The Prometheus event series of :mod:`notifications.metrics` (counters and histograms, one registry):
their names, help texts, labels and buckets, as docs/OPERATIONS.md lists them. Recorded through the
functions of :mod:`notifications.metrics`, never directly.

prometheus-client picks multiprocess mode from the environment when it is first imported, so this
module sets ``PROMETHEUS_MULTIPROC_DIR`` (from settings) before importing it."""

from __future__ import annotations

import os

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


def _ensure_multiprocess_env() -> None:
    """prometheus-client picks multiprocess mode from the environment when it is first imported."""
    try:
        path = getattr(settings, "PROMETHEUS_MULTIPROC_DIR", "")
    except ImproperlyConfigured:  # imported without Django settings (tooling): single-process mode
        return
    if path:
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", str(path))
        os.makedirs(os.environ["PROMETHEUS_MULTIPROC_DIR"], exist_ok=True)


_ensure_multiprocess_env()

from prometheus_client import CollectorRegistry, Counter, Histogram  # noqa: E402

#: accept → provider-accept: sub-second for OTPs, minutes to an hour for retried/deferred sends.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
#: One provider call (bounded by PROVIDER_TIMEOUT_SECONDS, 10 s by default).
CALL_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)



class Series:
    """Every event series, in their own registry (exposed through the multiprocess files)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.accept_to_provider = Histogram(
            "notify_accept_to_provider_seconds",
            "From acceptance (or the requested send time, if later) to the provider accepting the "
            "notification (its first accepted provider call, when it becomes sent).",
            ["tier", "channel"], buckets=LATENCY_BUCKETS, registry=r)
        self.provider_calls = Counter(
            "notify_provider_calls_total", "Provider calls (one per device for push) by outcome and error code.",
            ["provider", "outcome", "code"], registry=r)
        self.provider_call_seconds = Histogram(
            "notify_provider_call_duration_seconds", "Duration of one provider call.",
            ["provider"], buckets=CALL_BUCKETS, registry=r)
        self.outcomes = Counter(
            "notify_notification_outcomes_total",
            "Notifications moving to sent, delivered, failed, suppressed or expired, with the reason.",
            ["status", "reason", "channel", "tier"], registry=r)
        self.deferrals = Counter(
            "notify_notification_deferrals_total",
            "Notifications put back to wait: retry after a transient error or an unknown call outcome, "
            "a lost worker lease, a worker error, or the recipient's quiet hours.",
            ["reason", "channel", "tier"], registry=r)
        self.tokens_invalidated = Counter(
            "notify_push_tokens_invalidated_total",
            "Push tokens the provider called dead (FCM UNREGISTERED…); the device is deactivated.",
            ["provider", "code"], registry=r)
        self.email_bounces = Counter(
            "notify_email_bounces_total",
            "Email bounces from delivery receipts: hard (address marked invalid), soft (blocked), dropped_invalid.",
            ["provider", "type"], registry=r)
        self.receipts = Counter(
            "notify_receipts_total", "Delivery receipts received, by result: applied, duplicate, unknown.",
            ["provider", "result"], registry=r)
        self.released = Counter(
            "notify_scheduler_released_total", "Scheduled notifications released to the queues by the scheduler.",
            registry=r)
        self.redriven = Counter(
            "notify_reconciler_redriven_total",
            "Notifications re-driven by the reconciler: expired worker leases, stale queued rows.",
            ["kind"], registry=r)
        self.archived = Counter(
            "notify_archived_total", "Finished notifications the archiver moved from the live table to the history.",
            registry=r)
        self.events = Counter(
            "notify_events_accepted_total", "Events accepted (POST /v1/events), and the notifications they made.",
            ["kind"], registry=r)
        self.digests = Counter(
            "notify_digests_total", "Digests by what happened to them: opened (an event started one), closed "
            "(its window ended: its notifications were made), items (events added to one).", ["kind"], registry=r)
        self.inbox_refresh = Counter(
            "notify_inbox_refresh_total", "Silent inbox refresh pushes (docs/APP.md) by outcome: sent, failed, "
            "skipped_recent (one went to the user moments ago), skipped_budget, skipped_breaker, no_device.",
            ["outcome"], registry=r)
        self.acceptance_limited = Counter(
            "notify_acceptance_limited_total", "Requests refused (429) by an abuse limit at acceptance, by the "
            "limit's name (docs/POLICIES.md).", ["limit"], registry=r)
        self.fallbacks = Counter(
            "notify_fallback_total", "Fallback steps: the channel waiting behind one that ended, by what became of "
            "it: not_needed, released, cancelled, reopened (released after a bounce or undelivered receipt).",
            ["outcome"], registry=r)
        self.published = Counter(
            "notify_tasks_published_total", "Send tasks published to the broker, by queue.", ["queue"], registry=r)
        self.budget_waits = Counter(
            "notify_budget_wait_seconds_total",
            "Seconds senders waited for provider budget (token bucket), by provider and tier.",
            ["provider", "tier"], registry=r)
        self.breaker_fast_fails = Counter(
            "notify_breaker_fast_fails_total",
            "Calls not made because the provider's circuit breaker was open (high: failed over or retried; "
            "standard: deferred).", ["provider", "tier"], registry=r)
        self.breaker_opened = Counter(
            "notify_breaker_opened_total", "Times a provider's circuit breaker opened.", ["provider"], registry=r)
        self.bulkhead_full = Counter(
            "notify_bulkhead_full_total", "Times a sender found every concurrent-call slot of a provider taken.",
            ["provider", "tier"], registry=r)
        self.failovers = Counter(
            "notify_provider_failovers_total",
            "High-tier sends that went to a backup provider because the primary was unavailable.",
            ["channel", "provider"], registry=r)
        self.task_failures = Counter(
            "notify_task_failures_total",
            "Celery tasks that raised (periodic scheduler/reconciler ticks, fan-out pages, sends), by task name.",
            ["task"], registry=r)
        self.task_retries = Counter(
            "notify_task_retries_total", "Celery task retries requested, by task name.", ["task"], registry=r)
        self.publish_failures = Counter(
            "notify_publish_failures_total",
            "Notifications whose send task could not be published (broker down); the reconciler re-drives them.",
            registry=r)
        self.frequency_capped = Counter(
            "notify_frequency_capped_total",
            "Notifications suppressed at send time by a frequency cap (reason frequency_capped), by the "
            "rule's category and the channel.", ["category", "channel"], registry=r)
        self.invalid_zones = Counter(
            "notify_invalid_zone_fallbacks_total",
            "Stored time zone names that are not IANA zones (set before validation or by SQL), replaced by "
            "the fallback zone: fan-out (local-time campaigns) or quiet hours at send time.",
            ["where"], registry=r)
        self.app_receipts = Counter(
            "notify_app_receipts_total", "Receipts from the app (POST /v1/notifications/{id}/receipts) by event, "
            "channel and outcome: moved (the status went up), unchanged (stored, status kept), duplicate, "
            "refused (a channel without an app, or a notification never sent).",
            ["event", "channel", "outcome"], registry=r)
        self.unsubscribes = Counter(
            "notify_unsubscribes_total",
            "Opt-outs made through an email's unsubscribe link, by category (settings.PREFERENCE_CATEGORIES, "
            "else other) and source: one_click (the mail client's RFC 8058 POST) or page (the confirm button).",
            ["category", "source"], registry=r)
