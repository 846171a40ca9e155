"""The send path (DESIGN.md §6 steps 3–9): claim → check → de-dup → call → classify → record.

:func:`send_notifications` is what a worker runs for a list of notification ids taken from a
``{tier}.{channel}`` queue. It is safe to run twice for the same ids, concurrently or not: the
claim (a conditional UPDATE ``queued → sending`` with a lease) lets exactly one worker proceed,
and the sent marker guards the window after a provider accepted.

De-dup order, which keeps delivery at-least-once: look for the sent marker → call the provider →
record ``sent`` → write the marker. There is no "claimed" marker before the call: a crash after
such a marker would turn at-least-once into at-most-once.

Beside it: :mod:`notifications.leases` (leases renewed while rows are in flight),
:mod:`notifications.routing` (which provider a single send goes to), :mod:`notifications.recording`
(attempt rows, next state, retries and dead letters) and :mod:`notifications.batch` (the standard
tier's bulk path).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models.expressions import RawSQL

from core import clock
from core.postgres import array_literal
from core.redaction import sensitive_content, without_sensitive
from notifications import leases, metrics
from notifications import sent_markers as markers
from notifications.models import DeliveryAttempt, Notification, Reason, Status
from notifications.quiet_hours_policy import bypasses_quiet_hours
from notifications.recording import (
    Call,
    attempt_for,
    backoff_seconds,
    defer,
    finish,
    record_call,
)
from notifications.routing import Route, route_for, sms_sender
from preferences import suppression
from preferences.models import Device, Preferences, SmsStop
from preferences.quiet_hours import quiet_zone, window_end
from providers import isolation
from providers.base import (
    OutboundMessage,
    ProviderConfigurationError,
    ProviderError,
)
from providers.registry import get_backend, provider_names

log = logging.getLogger(__name__)
Outcome = DeliveryAttempt.Outcome

_CLAIM_SQL = """
UPDATE notifications_notification
   SET status = 'sending', lease_until = %s, attempts = attempts + 1, updated_at = %s,
       first_attempt_at = COALESCE(first_attempt_at, %s)
 WHERE id = ANY(%s::uuid[]) AND status = 'queued'
RETURNING id, attempts
"""

#: Reasons a row carries when its previous call may have been accepted although no answer was
#: recorded (a timeout, or a worker that lost its lease mid-call): the next attempt first looks the
#: message up at the provider where it can (:func:`_found_at_provider`).
RESEND_AFTER_UNKNOWN = frozenset({Reason.OUTCOME_UNKNOWN, Reason.LEASE_EXPIRED})


def claim(ids: Iterable[str], now: datetime) -> list:
    """Claim ``queued`` rows among ``ids`` for this worker: ``sending`` with a lease, held by this
    process's lease keeper (renewed for as long as the task works on them, notifications/leases.py)
    until :func:`send_notifications` releases them.

    Returns the ids actually claimed; rows that are cancelled, already claimed or finished are
    skipped (DESIGN.md §6 step 3).
    """
    lease = now + timedelta(seconds=settings.NOTIFY["LEASE_SECONDS"])
    with connection.cursor() as cur:
        cur.execute(_CLAIM_SQL, [lease, now, now, array_literal(ids)])
        rows = cur.fetchall()
    leases.keeper().hold(rows, lease)
    return [row[0] for row in rows]


def call_deadline_seconds() -> float:
    """The longest one provider call may take (seconds): connect and read timeouts of the SDK's
    HTTP client, plus a margin. A row's lease is extended past it before every call."""
    return float(settings.PROVIDER_TIMEOUT_SECONDS) * 2 + 5


#: Columns the send path never reads (loaded lazily if a rare path does): parsing them is a good
#: share of the per-row cost of a 500-row batch.
_NOT_NEEDED_TO_SEND = ("updated_at", "queued_at", "lease_until", "due_at", "sent_at", "dead_lettered_at",
                       "delivered_at", "accepted_status", "reason_detail", "recipient__created_at",
                       "recipient__updated_at", "recipient__preferences__updated_at")


def send_notifications(ids: Iterable[str]) -> None:
    """Deliver the given notifications (one worker task's worth). Never raises for provider errors;
    every outcome is recorded on the rows.

    High-tier rows go one by one through the provider router (failover while the primary's breaker
    is open); standard rows go through the batch path (:func:`deliver_batch`) unless
    ``NOTIFY["PIPELINE"]`` is ``"naive"`` (the benchmark's baseline: one by one, no reserve).
    """
    now = clock.now()
    claimed = claim(ids, now)
    if not claimed:
        return
    try:
        _send_claimed(claimed)
    finally:
        leases.keeper().release(claimed)


def _send_claimed(claimed: list) -> None:
    already_sent = markers.find_sent(claimed)
    rows = list(Notification.objects.filter(id__in=RawSQL("SELECT unnest(%s::uuid[])", [array_literal(claimed)]))
                .select_related("recipient", "recipient__preferences").defer(*_NOT_NEEDED_TO_SEND))
    # Whatever is logged while these rows are handled (tracebacks included) never shows the
    # content of the sensitive ones (config/redaction.py).
    with sensitive_content(n for n in rows if n.sensitive):
        _send_rows(rows, already_sent)


def _send_rows(rows: list[Notification], already_sent: set[str]) -> None:
    content = _CampaignContent()
    naive = settings.NOTIFY["PIPELINE"] == "naive"
    batch = [n for n in rows if n.priority == "standard" and not naive]
    for n in rows:
        if n.priority == "standard" and not naive:
            continue
        try:
            _deliver(n, already_sent, content)
        except Exception:
            # A bug or an unreachable database must not lose the row: it stays `sending` and the
            # reconciler re-drives it when the lease runs out.
            log.exception("delivery of %s crashed; the lease will expire and it will be retried", n.pk)
    if batch:
        from notifications.batch import deliver_batch

        try:
            deliver_batch(batch, already_sent, content)
        except Exception:
            log.exception("batch delivery of %d notification(s) crashed; their leases will expire and "
                          "they will be retried", len(batch))


class _CampaignContent:
    """Lazily built campaigns.selectors.ContentCache (single sends never import campaigns)."""

    def __init__(self) -> None:
        self._cache = None

    def apply(self, n: Notification) -> None:
        """Render a campaign notification's content into ``n`` (in memory). Raises RenderError."""
        if self._cache is None:
            from campaigns.selectors import ContentCache

            self._cache = ContentCache()
        rendered = self._cache.render(n)
        n.title, n.body, n.html = rendered.title, rendered.body, rendered.html
        n.data = self._cache.data(n)

    def cancelled(self, n: Notification) -> bool:
        """Whether ``n``'s campaign was cancelled (its unclaimed rows may not all be cancelled yet)."""
        if self._cache is None:
            from campaigns.selectors import ContentCache

            self._cache = ContentCache()
        return self._cache.cancelled(n)


def _deliver(n: Notification, already_sent: set[str], content: _CampaignContent) -> None:
    try:
        devices = prepare(n, already_sent, content)
    except Exception as exc:
        worker_error(n, exc)
        return
    if devices is None:
        return
    call, attempts = _call_provider(n, devices)
    if call.lost and not attempts:
        return  # not ours any more, and nothing was called
    record_call(n, call, attempts, devices)


def worker_error(n: Notification, exc: Exception) -> None:
    """The checks before the call crashed on ``n`` (a bug, bad stored data): nothing was sent.
    Retried with backoff like a transient error, then dead-lettered with the error once the attempt
    budget is spent (the poison-message rule), so one bad row never loops or blocks a batch."""
    log.error("checks of %s %s %s crashed (attempt %d): %s", n.priority, n.channel, n.pk, n.attempts, exc,
              exc_info=exc)
    detail = without_sensitive(f"{type(exc).__name__}: {exc}")[:400]
    now = clock.now()
    try:
        if n.attempts >= settings.NOTIFY["MAX_ATTEMPTS"][n.priority]:
            finish(n, Status.FAILED, Reason.WORKER_ERROR, kind="dead_lettered",
                    detail=f"{n.attempts} attempts crashed the worker; last: {detail}", extra={"dead_lettered_at": now})
            return
        delay = backoff_seconds(n.attempts, n.priority)
        defer(n, now + timedelta(seconds=delay), Reason.WORKER_ERROR, kind="retry",
               detail=f"attempt {n.attempts} crashed the worker ({detail}); retry in {delay:.1f}s")
    except Exception:
        log.exception("recording the crash of %s failed too; its lease will expire and it will be retried", n.pk)


def prepare(n: Notification, already_sent: set[str], content: _CampaignContent,
            stopped_phones: set[str] | None = None, devices: list[Device] | None = None) -> list[Device] | None:
    """The checks before a provider call (DESIGN.md §6 steps 4–5) for the claimed row ``n``.

    Returns ``None`` when the row was settled here (sent marker found, expired, suppressed, deferred
    for quiet hours, template error); otherwise the active push devices to send to (``[]`` for SMS
    and email). ``stopped_phones`` / ``devices`` are preloaded by the batch path (one query per
    batch instead of one per row); ``None`` = look them up.
    """
    now = clock.now()
    if str(n.pk) in already_sent:
        finish(n, Status.SENT, kind="sent", detail="sent marker found: an earlier attempt was accepted",
                extra={"sent_at": now}, attempt=DeliveryAttempt(
                    number=n.attempts, provider=n.provider or "-", outcome=Outcome.DUPLICATE_SKIPPED))
        return None
    if n.reason in RESEND_AFTER_UNKNOWN and _found_at_provider(n, content):
        return None
    if n.campaign_id and content.cancelled(n):
        finish(n, Status.CANCELLED, Reason.CAMPAIGN_CANCELLED, kind="cancelled",
                detail="its campaign was cancelled before this was sent")
        return None
    if n.expires_at and now >= n.expires_at:
        finish(n, Status.EXPIRED, Reason.TTL_EXPIRED, kind="expired",
                detail=f"expired at {n.expires_at.isoformat()}")
        return None
    reason = suppression_reason(n, stopped_phones)
    if reason:
        finish(n, Status.SUPPRESSED, reason, kind="suppressed", detail=_suppression_detail(n, reason))
        return None
    if not bypasses_quiet_hours(n.priority, n.category):
        until = quiet_hours_end(n, now)
        if until:
            # A deferral is not a delivery attempt: give back the attempt the claim counted.
            defer(n, until, Reason.QUIET_HOURS, kind="deferred",
                   detail=f"quiet hours until {until.isoformat()}", extra={"attempts": n.attempts - 1})
            return None
    if n.campaign_id:
        from campaigns.rendering import RenderError

        try:
            content.apply(n)
        except RenderError as exc:
            finish(n, Status.FAILED, Reason.TEMPLATE_ERROR, kind="dead_lettered", detail=str(exc)[:500],
                    extra={"dead_lettered_at": now})
            return None
    if n.channel != "push":
        return []
    if devices is None:
        devices = list(Device.objects.filter(recipient_id=n.recipient_id, active=True).order_by("id"))
    if not devices:
        finish(n, Status.SUPPRESSED, Reason.NO_ACTIVE_DEVICE, kind="suppressed",
                detail=Reason.NO_ACTIVE_DEVICE.label)
        return None
    return devices


def _found_at_provider(n: Notification, content: _CampaignContent) -> bool:
    """Before re-sending a row whose previous call may have been accepted unseen, ask the providers
    that offer a lookup (Twilio) whether they have it. Found → ``sent`` with the provider's id (an
    attempt ``found_by_lookup``), and True: nothing is sent again.

    Only a message created since the call in doubt started counts (:func:`_call_in_doubt_since`),
    and never one recorded for another notification (the same text to the same number sent for
    another reason: an earlier OTP, a campaign run twice)."""
    if n.channel != "sms" or not n.recipient.phone:
        return False
    since = _call_in_doubt_since(n)

    def is_taken(message_id: str) -> bool:
        return Notification.objects.filter(provider_message_id=message_id).exclude(pk=n.pk).exists()

    for name in provider_names(n.channel):
        backend = get_backend(n.channel, name)
        if not backend.supports_lookup:
            continue
        if n.campaign_id and not n.body:
            from campaigns.rendering import RenderError

            try:
                content.apply(n)
            except RenderError:
                return False
        found = backend.find_accepted(message_for(n, n.recipient.phone), since, is_taken=is_taken)
        if found is None:
            continue
        now = clock.now()
        finish(n, Status.SENT, kind="sent", detail=f"found at {found.provider} ({found.provider_message_id}): "
               "the earlier call whose answer was lost had been accepted; not sent again",
               extra={"sent_at": now, "provider": found.provider, "provider_message_id": found.provider_message_id},
               attempt=DeliveryAttempt(number=n.attempts, provider=found.provider, outcome=Outcome.FOUND_BY_LOOKUP,
                                       provider_message_id=found.provider_message_id[:255]))
        markers.mark_sent([n.pk])
        return True
    return False


#: Allowance for the provider's clock and its whole-second timestamps (seconds).
LOOKUP_CLOCK_SKEW_SECONDS = 2


def _call_in_doubt_since(n: Notification) -> datetime:
    """When the call whose outcome is unknown may have started (UTC, minus the clock allowance):
    the start of the last ``unknown`` attempt (its end minus its latency); for a row whose worker
    lost its lease, which records no attempt, the start of the earliest attempt not accounted for
    (the first attempt, or the end of the last recorded one)."""
    last = n.attempts_log.order_by("-created_at", "-id").values("outcome", "created_at", "latency_ms").first()
    if last is not None and last["outcome"] == Outcome.UNKNOWN:
        started = last["created_at"] - timedelta(milliseconds=last["latency_ms"] or 0)
    elif last is not None:
        started = last["created_at"]
    else:
        started = n.first_attempt_at or n.created_at
    return started - timedelta(seconds=LOOKUP_CLOCK_SKEW_SECONDS)


def suppression_reason(n: Notification, stopped_phones: set[str] | None = None) -> str:
    """Why this notification must not be sent at all (opt-outs, missing or dead contact), or ''.

    Checked at send time, never only at acceptance (DESIGN.md §6 step 4). ``stopped_phones``: the
    numbers that replied STOP to our sender, preloaded for a batch (``None`` = query).
    """
    recipient = n.recipient
    stopped = None
    if n.channel == "sms" and recipient.phone:
        stopped = (recipient.phone in stopped_phones if stopped_phones is not None
                   else SmsStop.objects.filter(phone=recipient.phone, sender=sms_sender()).exists())
    return suppression.suppression_reason(suppression.facts_of(recipient, sms_stopped=stopped), n.channel,
                                          n.category)


def _suppression_detail(n: Notification, reason: str) -> str:
    """What a support agent needs beside the reason code."""
    r = n.recipient
    if reason == Reason.PHONE_INVALID:
        return f"{Reason(reason).label}: {r.phone_invalid_reason} since {r.phone_invalid_at:%Y-%m-%d %H:%M} UTC"
    if reason == Reason.EMAIL_INVALID:
        return f"{Reason(reason).label}: {r.email_invalid_reason} since {r.email_invalid_at:%Y-%m-%d %H:%M} UTC"
    if reason == Reason.OPTED_OUT_CATEGORY:
        return f"{Reason(reason).label} ({n.category} on {n.channel})"
    if reason == Reason.SMS_STOPPED:
        return f"{Reason(reason).label} ({sms_sender()})"
    return Reason(reason).label


def quiet_hours_end(n: Notification, now: datetime) -> datetime | None:
    """End of the recipient's quiet window (UTC) if ``now`` falls inside it, else None."""
    try:
        prefs = n.recipient.preferences
    except Preferences.DoesNotExist:
        return None
    if prefs.quiet_start is None or prefs.quiet_end is None:
        return None
    tz, invalid = quiet_zone(prefs.quiet_timezone, n.recipient.timezone)
    if invalid:
        log.warning("notification %s: stored zone(s) %s of %s are not IANA zones; quiet hours in %s",
                    n.pk, invalid, n.recipient_id, tz.key)
        metrics.invalid_zone_fell_back("quiet_hours", len(invalid))
    return window_end(now, prefs.quiet_start, prefs.quiet_end, tz)


def message_for(n: Notification, to: str, platform: str | None = None) -> OutboundMessage:
    """The OutboundMessage of ``n`` for one destination (phone, address or push token)."""
    data = {str(k): str(v) for k, v in (n.data or {}).items()} or None
    ttl = None
    if n.expires_at:
        ttl = max(1, int((n.expires_at - clock.now()).total_seconds()))
    return OutboundMessage(
        notification_id=str(n.pk), channel=n.channel, to=to, body=n.body, title=n.title or None,
        html=n.html or None, data=data, platform=platform, ttl_seconds=ttl, priority=n.priority,
        collapse_key=str(n.pk) if n.channel == "push" else None,
    )


def _call_provider(n: Notification, devices: list[Device]) -> tuple[Call, list[DeliveryAttempt]]:
    """Call the provider the router picks (:func:`route_for`): once, or once per active device for push."""
    if n.channel == "sms":
        targets = [(n.recipient.phone, None)]
    elif n.channel == "email":
        targets = [(n.recipient.email, None)]
    else:
        targets = [(d.push_token, d) for d in devices]
    call = Call()
    attempts: list[DeliveryAttempt] = []
    tried: list[str] = []
    while True:
        try:
            route = route_for(n, len(targets), exclude=tried)
        except (ProviderError, ProviderConfigurationError) as exc:
            if attempts:
                return call, attempts  # the failed call(s) above are the outcome
            # No provider may be called now (breaker open, budget or bulkhead exhausted, misconfigured):
            # an attempt that made no call, retried like any transient error.
            attempt = attempt_for(n, exc, latency_ms=0)
            call.errors.append((exc, None))
            attempts.append(attempt)
            metrics.provider_call(n, attempt)
            return call, attempts
        tried.append(route.name)
        provider_failed = _call_route(n, route, targets, call, attempts)
        # High tier: a provider that just timed out or failed (not a bad number) is not retried
        # after a backoff; the next provider gets the same attempt at once (a rare duplicate if the
        # timed-out call was in fact accepted: acceptable for an OTP, a late one is not).
        if not (provider_failed and not call.accepted and n.priority == "high" and route.guarded):
            return call, attempts


def _call_route(n: Notification, route: Route, targets: list, call: Call, attempts: list) -> bool:
    """Send to every target through ``route``; True if a call failed in a way that counts against
    the provider's health (timeout, connection error, 5xx)."""
    provider_failed = False
    try:
        for to, device in targets:
            if not leases.keeper().ensure([n.pk], call_deadline_seconds()):
                call.lost = True  # the reconciler took it over: never call for a row that is not ours
                break
            started = time.monotonic()
            outcome = route.backend.send_or_error(message_for(n, to, device.platform if device else None))
            if isinstance(outcome, Exception):
                call.errors.append((outcome, device))
            else:
                call.accepted.append(outcome)
            failed = isinstance(outcome, Exception) and isolation.is_failure(outcome)
            provider_failed = provider_failed or failed
            attempt = attempt_for(n, outcome, device=device, latency_ms=int((time.monotonic() - started) * 1000))
            attempts.append(attempt)
            metrics.provider_call(n, attempt)
            if route.guarded and isolation.record_calls(
                    route.name, ok=0 if failed else 1, failed=1 if failed else 0, probe=route.probe) == "open":
                metrics.isolation_event("breaker_opened", route.name)
            route = route.after_probe()
    finally:
        isolation.release_slots(route.name, n.priority, route.slots)
    return provider_failed


