"""Recording the outcome of a send (docs/ARCHITECTURE.md §6 steps 8–9): attempt rows, the row's next state,
retries and dead letters, contact hygiene. Shared by the single-row path (notifications/sending.py)
and the batch path (notifications/batch.py), so both record alike.

Every state change goes through :func:`transition`, a conditional UPDATE on the claimed row
(``status = 'sending'`` and our attempt number): a row that changed hands is never overwritten.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from core import clock
from core.redaction import SENSITIVE
from notifications import metrics, sent_markers
from notifications.enqueue import enqueue_on_commit
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification, Reason, Status
from notifications.routing import sms_sender
from preferences.models import Device, SmsStop
from providers.base import ContactInvalidError, ProviderConfigurationError, TransientProviderError

log = logging.getLogger(__name__)
Outcome = DeliveryAttempt.Outcome


def outcome_unknown(exc: Exception) -> bool:
    """True when a failed call may nevertheless have been accepted: the provider did not answer in
    time (``code="timeout"``) or the connection broke after the request may have reached it
    (``"connection_lost"``; providers.base.transport_code). Refusals, error answers (5xx, 429) and
    refused connections were not accepted."""
    return isinstance(exc, TransientProviderError) and exc.code in ("timeout", "connection_lost")


def backoff_seconds(attempt: int, priority: str, retry_after: float | None = None) -> float:
    """Exponential backoff with full jitter (AWS Architecture Blog, "Exponential Backoff And
    Jitter"): uniform(0, min(cap, base · 2^(attempt-1))) seconds, never less than the provider's
    ``retry_after`` (seconds) when it gave one."""
    base = settings.NOTIFY["BACKOFF_BASE_SECONDS"][priority]
    cap = settings.NOTIFY["BACKOFF_CAP_SECONDS"][priority]
    delay = random.uniform(0, min(cap, base * 2 ** max(attempt - 1, 0)))
    if retry_after:
        delay = max(delay, float(retry_after))
    return delay


@dataclass
class Call:
    """Outcome of the provider call(s) for one notification."""

    accepted: list = field(default_factory=list)  # SendResult
    errors: list = field(default_factory=list)  # ProviderError / ProviderConfigurationError
    lost: bool = False  # the row changed hands (lease lost) before a call: nothing more is sent


#: A word of a sensitive message that may be its secret (an OTP code, a token): 4+ characters with a digit.
_SECRET_WORD = re.compile(r"\w*\d\w*")


def shown(rows, text: str) -> str:
    """``text`` as it may be stored and shown (reason details, attempt errors, timeline events) for
    ``rows`` (one notification or several sharing the text): a provider's error message may quote
    the message it refused ("bad content: Your code is 626262"), so for sensitive rows their
    content, each of its lines and each of its words that holds a digit (4+ characters: a code)
    become ``[sensitive]``. Text about non-sensitive rows is unchanged."""
    rows = [rows] if isinstance(rows, Notification) else list(rows)
    secrets: set[str] = set()
    for n in rows:
        if not n.sensitive:
            continue
        for part in (n.title, n.body, n.html):
            if not part:
                continue
            secrets.add(part)
            secrets.update(line.strip() for line in part.splitlines() if len(line.strip()) >= 4)
            secrets.update(w for w in _SECRET_WORD.findall(part) if len(w) >= 4)
    for secret in sorted(secrets, key=len, reverse=True):  # the whole text before its lines and words
        text = text.replace(secret, SENSITIVE)
    return text


def attempt_for(n: Notification, outcome, *, device: Device | None = None, latency_ms: int | None = None
                ) -> DeliveryAttempt:
    """The (unsaved) DeliveryAttempt of one provider call of ``n``: ``outcome`` is the SendResult or
    the ProviderError / ProviderConfigurationError it ended with."""
    attempt = DeliveryAttempt(notification=n, number=n.attempts, device=device, latency_ms=latency_ms,
                              provider=outcome.provider[:32])
    if isinstance(outcome, Exception):
        attempt.outcome = outcome_of(outcome)
        attempt.error_code = outcome.code[:64]
        attempt.error_message = shown(n, outcome.message or str(outcome))[:500]
        attempt.http_status = getattr(outcome, "http_status", None)
    else:
        attempt.outcome = Outcome.ACCEPTED
        attempt.provider_message_id = outcome.provider_message_id[:255]
    return attempt


def outcome_of(exc: Exception) -> str:
    if isinstance(exc, ProviderConfigurationError):
        return Outcome.CONFIGURATION
    if isinstance(exc, ContactInvalidError):
        return Outcome.CONTACT_INVALID
    if outcome_unknown(exc):
        return Outcome.UNKNOWN
    if isinstance(exc, TransientProviderError):
        return Outcome.TRANSIENT
    return Outcome.PERMANENT


def record_call(n: Notification, call: Call, attempts: list[DeliveryAttempt], devices: list[Device]) -> None:
    """Turn the call's outcome into the row's next state (docs/ARCHITECTURE.md §6 steps 8–9)."""
    now = clock.now()
    deactivate_dead_contacts(n, call)
    if call.accepted:
        first = call.accepted[0]
        detail = ""
        if n.channel == "push":
            detail = f"accepted for {len(call.accepted)} of {len(devices)} device(s)"
        provider_fields = {"sent_at": now, "provider": first.provider,
                           "provider_message_id": first.provider_message_id[:255]}
        if not finish(n, Status.SENT, kind="sent", detail=detail, attempts=attempts,
                       extra={**provider_fields, "due_at": None}):
            # The provider's receipt arrived (and settled the row) before we recorded the call:
            # keep what only we know, and our attempt rows replace the receipt's stand-in.
            Notification.objects.filter(pk=n.pk, provider_message_id="").update(**provider_fields)
            DeliveryAttempt.objects.filter(notification_id=n.pk, number=n.attempts,
                                           outcome=Outcome.LEARNED_FROM_RECEIPT).delete()
        sent_markers.mark_sent([n.pk])  # after the row says `sent` (committed in finish)
        log.info("sent %s %s %s via %s (attempt %d, %s)", n.priority, n.channel, n.pk, first.provider, n.attempts,
                 first.provider_message_id)
        return
    errors = [e for e, _ in call.errors]
    transient = [e for e in errors if isinstance(e, TransientProviderError)]
    config = [e for e in errors if isinstance(e, ProviderConfigurationError)]
    provider = errors[0].provider if errors else ""
    if transient:
        retry_or_dead_letter(n, transient[0], attempts, now)
    elif config:
        log.error("provider configuration error for %s: %s", provider, config[0].message)
        finish(n, Status.FAILED, Reason.CONFIGURATION_ERROR, kind="dead_lettered", attempts=attempts,
                detail=error_detail(config[0]), extra={"provider": provider, "dead_lettered_at": now})
    elif errors and all(isinstance(e, ContactInvalidError) for e in errors):
        finish(n, Status.FAILED, Reason.CONTACT_INVALID, kind="failed", attempts=attempts,
                detail=error_detail(errors[0]), extra={"provider": provider})
    else:
        # A permanent refusal that is not about the contact is ours (bad payload): dead letter.
        finish(n, Status.FAILED, Reason.PERMANENT_ERROR, kind="dead_lettered", attempts=attempts,
                detail=error_detail(errors[0]), extra={"provider": provider, "dead_lettered_at": now})


def error_detail(exc) -> str:
    reason = getattr(exc, "reason", "")
    return (f"{exc.provider} {exc.code}" + (f" ({reason})" if reason else "") + f": {exc.message}")[:500]


def retry_or_dead_letter(n: Notification, exc: TransientProviderError, attempts, now: datetime) -> None:
    max_attempts = settings.NOTIFY["MAX_ATTEMPTS"][n.priority]
    window = timedelta(seconds=settings.NOTIFY["MIN_RETRY_WINDOW_SECONDS"][n.priority])
    # Dead letter only once the attempt budget is spent AND the retry window has passed: full jitter
    # can make a few attempts very close together, and a provider outage of a few minutes must not
    # dead-letter what was accepted.
    if n.attempts >= max_attempts and now - (n.first_attempt_at or now) >= window:
        finish(n, Status.FAILED, Reason.ATTEMPTS_EXHAUSTED, kind="dead_lettered", attempts=attempts,
                detail=f"{n.attempts} attempts; last: {error_detail(exc)}"[:500],
                extra={"provider": exc.provider, "dead_lettered_at": now})
        return
    delay, reason = retry_delay(n, exc)
    until = now + timedelta(seconds=delay)
    detail = f"attempt {n.attempts} failed ({error_detail(exc)}); retry in {delay:.1f}s"
    if reason == Reason.OUTCOME_UNKNOWN:
        detail += " (it may have been accepted: looked up or waited for first)"
    if delay <= settings.NOTIFY["MAX_COUNTDOWN_SECONDS"]:
        with transaction.atomic():
            moved = transition(n, Status.QUEUED, reason, kind="retry", detail=detail,
                                attempts=attempts, extra={"queued_at": now + timedelta(seconds=delay)})
            if moved:
                enqueue_on_commit([(n.pk, n.priority, n.channel)], countdown=delay)
    else:
        defer(n, until, reason, kind="retry", detail=detail, attempts=attempts)


def retry_delay(n: Notification, exc: TransientProviderError) -> tuple[float, str]:
    """``(seconds, reason)`` before the next attempt after the transient failure ``exc``: the
    backoff (honouring the provider's ``retry_after``), and when the call's outcome is unknown at
    least ``OUTCOME_UNKNOWN_WAIT_SECONDS`` of the tier (reason ``outcome_unknown``)."""
    delay = backoff_seconds(n.attempts, n.priority, exc.retry_after)
    if outcome_unknown(exc):
        return max(delay, float(settings.NOTIFY["OUTCOME_UNKNOWN_WAIT_SECONDS"][n.priority])), Reason.OUTCOME_UNKNOWN
    return delay, Reason.RETRY_SCHEDULED


def deactivate_dead_contacts(n: Notification, call: Call) -> None:
    now = clock.now()
    for exc, device in call.errors:
        if not isinstance(exc, ContactInvalidError):
            continue
        if device is not None:
            Device.objects.filter(pk=device.pk, active=True).update(
                active=False, deactivated_reason=exc.reason[:64], deactivated_at=now, updated_at=now)
        elif n.channel == "sms" and exc.reason == "opted_out":
            # Twilio 21610: the recipient replied STOP to this sender; scoped to it (carrier rule).
            SmsStop.objects.get_or_create(phone=n.recipient.phone, sender=sms_sender(),
                                          defaults={"source": f"{exc.provider} {exc.code}"})
        elif n.channel == "sms":
            type(n.recipient).objects.filter(pk=n.recipient_id).update(
                phone_invalid_reason=exc.reason[:64], phone_invalid_at=now)
        elif n.channel == "email":
            type(n.recipient).objects.filter(pk=n.recipient_id).update(
                email_invalid_reason=exc.reason[:64], email_invalid_at=now)


def transition(n: Notification, status: str, reason: str = "", *, kind: str, detail: str = "",
                attempts: list[DeliveryAttempt] | None = None, extra: dict | None = None) -> bool:
    """Move a claimed (``sending``) row to ``status`` and log it. Returns False if the row was no
    longer ours (another worker re-claimed it, or it was settled meanwhile).

    ``sent`` is also recorded on a row the reconciler took back after its lease ran out
    (``lease_expired``) as long as nobody has claimed it again: the call we made was accepted, so
    the pending re-send must not happen (a worker that was slow, not dead)."""
    detail = shown(n, detail)
    fields = {"status": status, "reason": reason, "reason_detail": detail[:500], "lease_until": None,
              "updated_at": clock.now(), **(extra or {})}
    ours = Q(status=Status.SENDING)
    if status == Status.SENT:
        ours |= Q(status__in=[Status.SCHEDULED, Status.QUEUED], reason=Reason.LEASE_EXPIRED)
        fields.setdefault("due_at", None)
    moved = Notification.objects.filter(ours, pk=n.pk, attempts=n.attempts).update(**fields)
    if attempts:
        DeliveryAttempt.objects.bulk_create(attempts)
    if moved:
        DeliveryEvent.objects.create(notification=n, kind=kind, status=status, reason=reason, detail=detail[:500])
        for key, value in fields.items():
            setattr(n, key, value)
        metrics.notification_transitioned(n)
    else:
        log.warning("notification %s changed hands before it could be recorded as %s", n.pk, status)
    return bool(moved)


def finish(n: Notification, status: str, reason: str = "", **kw) -> bool:
    attempt = kw.pop("attempt", None)
    if attempt is not None:
        attempt.notification = n
        kw["attempts"] = [attempt]
    with transaction.atomic():
        return transition(n, status, reason, **kw)


def defer(n: Notification, until: datetime, reason: str, **kw) -> bool:
    """Back to ``scheduled`` (the row waits in Postgres) until ``until``; the scheduler releases it."""
    extra = kw.pop("extra", {})
    extra["due_at"] = until
    with transaction.atomic():
        return transition(n, Status.SCHEDULED, reason, extra=extra, **kw)
