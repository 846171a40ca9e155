"""Outcomes stage of the delivery pipeline: ONE rule set turning the provider calls of a claimed row
into what happens next, the same for both tiers and for a batch of 1 or N rows. Pure: the record
stage (record.py) applies the :class:`Decision`.

In order: no call and the batch must wait → back to ``scheduled``, attempt given back; accepted →
*sent*; transient → *retry* with backoff (``outcome_unknown`` when the call may have been accepted),
or *dead letter* once attempts and time are spent; configuration → dead letter; contact invalid →
*failed*; any other refusal → dead letter. Details: docs/ARCHITECTURE.md §6, step 8 and "Leases,
retries and unknown outcomes".
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings

from core import clock
from core.redaction import SENSITIVE
from notifications.models import DeliveryAttempt, Notification, Reason, Status
from preferences.models import Device
from providers.base import (
    ContactInvalidError,
    ProviderConfigurationError,
    ProviderError,
    SendResult,
    TransientProviderError,
)

#: What a failed call ends with, inside the provider contract.
CallError = ProviderError | ProviderConfigurationError
Outcome = DeliveryAttempt.Outcome

#: Reasons a row carries when its previous call may have been accepted although no answer was
#: recorded (a timeout, or a worker that lost its lease mid-call): the next attempt first looks the
#: message up at the provider where it can (load.py).
RESEND_AFTER_UNKNOWN = frozenset({Reason.OUTCOME_UNKNOWN, Reason.LEASE_EXPIRED})


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


def retry_delay(n: Notification, exc: TransientProviderError) -> tuple[float, str]:
    """``(seconds, reason)`` before the next attempt after the transient failure ``exc``: the
    backoff (honouring the provider's ``retry_after``), and when the call's outcome is unknown at
    least ``OUTCOME_UNKNOWN_WAIT_SECONDS`` of the tier (reason ``outcome_unknown``)."""
    delay = backoff_seconds(n.attempts, n.priority, exc.retry_after)
    if outcome_unknown(exc):
        return max(delay, float(settings.NOTIFY["OUTCOME_UNKNOWN_WAIT_SECONDS"][n.priority])), Reason.OUTCOME_UNKNOWN
    return delay, Reason.RETRY_SCHEDULED


def attempts_spent(n: Notification, now: datetime) -> bool:
    """Whether a transient failure now dead-letters ``n``: ``MAX_ATTEMPTS`` of its tier made AND
    ``MIN_RETRY_WINDOW_SECONDS`` passed since its first attempt (full jitter can put a few attempts
    very close together; an outage of a few minutes must not dead-letter what was accepted)."""
    window = timedelta(seconds=settings.NOTIFY["MIN_RETRY_WINDOW_SECONDS"][n.priority])
    return n.attempts >= settings.NOTIFY["MAX_ATTEMPTS"][n.priority] and now - (n.first_attempt_at or now) >= window


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


def error_detail(exc) -> str:
    """``"{provider} {code} ({reason}): {message}"``, at most 500 characters."""
    reason = getattr(exc, "reason", "")
    return (f"{exc.provider} {exc.code}" + (f" ({reason})" if reason else "") + f": {exc.message}")[:500]


def outcome_of(exc: Exception) -> str:
    """The DeliveryAttempt outcome of a failed call."""
    if isinstance(exc, ProviderConfigurationError):
        return Outcome.CONFIGURATION
    if isinstance(exc, ContactInvalidError):
        return Outcome.CONTACT_INVALID
    if outcome_unknown(exc):
        return Outcome.UNKNOWN
    if isinstance(exc, TransientProviderError):
        return Outcome.TRANSIENT
    return Outcome.PERMANENT


class AttemptRow(NamedTuple):
    """One DeliveryAttempt row as the record stage COPYs it (the columns of ``ATTEMPT_COLUMNS``)."""

    notification_id: object
    number: int
    provider: str
    device_id: int | None
    outcome: str
    error_code: str
    error_message: str
    http_status: int | None
    latency_ms: int | None
    provider_message_id: str
    created_at: datetime


ATTEMPT_COLUMNS = AttemptRow._fields


def attempt_row(n: Notification, outcome: SendResult | CallError, device: Device | None = None,
                latency_ms: int | None = None, now: datetime | None = None) -> AttemptRow:
    """The attempt row of one provider call of ``n``: ``outcome`` is the SendResult or the
    ProviderError / ProviderConfigurationError it ended with (its message scrubbed by :func:`shown`)."""
    device_id = device.pk if device is not None else None
    now = now or clock.now()
    if isinstance(outcome, Exception):
        return AttemptRow(n.pk, n.attempts, outcome.provider[:32], device_id, outcome_of(outcome),
                          outcome.code[:64], shown(n, outcome.message or str(outcome))[:500],
                          getattr(outcome, "http_status", None), latency_ms, "", now)
    return AttemptRow(n.pk, n.attempts, outcome.provider[:32], device_id, Outcome.ACCEPTED.value, "", "", None,
                      latency_ms, outcome.provider_message_id[:255], now)


@dataclass
class Decision:
    """What the record stage does with one row after its calls: ``action`` is ``sent``, ``wait``,
    ``retry``, ``dead_letter`` or ``failed``; ``status``/``reason``/``kind``/``detail`` as recorded;
    ``error``: the error it is about (retry: the one whose backoff and Retry-After apply);
    ``until`` (UTC) for a wait."""

    action: str
    status: str
    kind: str
    reason: str = ""
    detail: str = ""
    error: CallError | None = None
    until: datetime | None = None
    accepted: tuple = ()  # SendResults (sent)


class Unexpected(Exception):
    """A call ended with an exception outside the provider contract: the row is left to its lease."""


def decide(n: Notification, outcomes: list, *, planned: int, devices: int,
           waiting: tuple[datetime, str] | None, now: datetime) -> Decision | None:
    """The rule set (module docstring) for row ``n``: ``outcomes`` are the SendResults and errors of
    its calls (all providers tried), ``planned`` the calls it needed per provider (push: one per
    device), ``devices`` its active devices, ``waiting`` the batch's ``(until, detail)`` when it
    stopped before sending everything. ``None``: no call was made and nothing to wait for.

    Raises :class:`Unexpected` when a call ended with an exception outside the provider contract.
    """
    if not outcomes:
        if waiting is None:
            return None
        until, detail = waiting
        return Decision("wait", Status.SCHEDULED, "deferred", Reason.RETRY_SCHEDULED, detail, until=until)
    for outcome in outcomes:
        if isinstance(outcome, Exception) and not isinstance(outcome, (ProviderError, ProviderConfigurationError)):
            raise Unexpected(outcome)
    accepted = tuple(o for o in outcomes if not isinstance(o, Exception))
    if accepted:
        detail = ""
        if n.channel == "push":
            detail = f"accepted for {len(accepted)} of {devices} device(s)"
            missed = [o for o in outcomes if isinstance(o, Exception)]
            if missed:
                # A push counts as sent once one device accepted it; the others are not retried
                # (one status per notification). Say which errors those devices met.
                detail += "; not reached: " + shown(n, ", ".join(sorted({error_detail(o)[:120] for o in missed})))
                detail += " (not retried: the notification is sent)"
        return Decision("sent", Status.SENT, "sent", detail=detail[:500], accepted=accepted)
    errors = list(outcomes)
    if len(errors) < planned:
        errors.append(TransientProviderError(errors[0].provider, "circuit_open",
                                             "circuit breaker opened during the batch"))
    transient = [e for e in errors if isinstance(e, TransientProviderError)]
    config = [e for e in errors if isinstance(e, ProviderConfigurationError)]
    if transient:
        exc = transient[0]
        if attempts_spent(n, now):
            return Decision("dead_letter", Status.FAILED, "dead_lettered", Reason.ATTEMPTS_EXHAUSTED,
                            f"{n.attempts} attempts; last: {error_detail(exc)}"[:500], error=exc)
        return Decision("retry", Status.SCHEDULED, "retry", error=exc)
    if config:
        return Decision("dead_letter", Status.FAILED, "dead_lettered", Reason.CONFIGURATION_ERROR,
                        error_detail(config[0]), error=config[0])
    if all(isinstance(e, ContactInvalidError) for e in errors):
        return Decision("failed", Status.FAILED, "failed", Reason.CONTACT_INVALID, error_detail(errors[0]),
                        error=errors[0])
    return Decision("dead_letter", Status.FAILED, "dead_lettered", Reason.PERMANENT_ERROR, error_detail(errors[0]),
                    error=errors[0])
