"""Calls stage of the delivery pipeline (docs/ARCHITECTURE.md, "The send path"): the provider calls
of one channel's batch, one ``backend.send_batch(messages, concurrency)`` call per grant of budget
and bulkhead slots (SendGrid: up to 1,000 recipients per request; Twilio and FCM: several messages
in flight, ``NOTIFY["SEND_CONCURRENCY"]``).

Two routing policies (routing.py), one stage:

* **standard** (:func:`call_standard`): the primary provider only. While its circuit breaker is
  open, or when budget or slots did not come within ``BATCH_MAX_WAIT_SECONDS``, the rest of the
  batch waits (the outcomes stage sends it back to ``scheduled``); tokens come from the standard
  budget, never the high tier's reserve;
* **high** (:func:`call_high`): a batch of one row with the failover policy: the first usable
  provider; one that times out or fails (not a bad number) is followed at once by the next for the
  same attempt (a rare duplicate if the timed-out call was in fact accepted: acceptable for an
  OTP, a late one is not).

No call outlives the lease of a row it sends: before each ``send_batch`` the rows it carries get a
lease covering the call's deadline (claim.py); a row that changed hands meanwhile is dropped,
never sent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings

from core import clock
from notifications import metrics
from notifications.delivery.claim import call_deadline_seconds, still_ours
from notifications.delivery.routing import route_for
from notifications.models import Notification
from providers import isolation
from providers.base import OutboundMessage, ProviderConfigurationError, ProviderError, TransientProviderError
from providers.registry import get_backend

#: SendGrid v3 mail/send: recipients per request (one send_batch call is one request).
MAX_PER_REQUEST = 1000


@dataclass
class Item:
    """One provider call to make: the row, its push device (or None) and the message."""

    row: Notification
    device: object
    message: OutboundMessage


@dataclass
class Calls:
    """What the calls stage did for a batch: ``outcomes[i]`` the ``(SendResult or error, latency
    ms, end of the call (UTC))`` of every call of item ``i`` (the high tier may call several
    providers); ``lost``: ids of rows that changed hands before a call; ``waiting``: ``(until,
    detail)`` when the rest of the batch must wait; ``no_call``: row id → the error that prevented
    any call (high tier)."""

    outcomes: dict[int, list] = field(default_factory=dict)
    lost: set = field(default_factory=set)
    waiting: tuple[datetime, str] | None = None
    no_call: dict = field(default_factory=dict)


def call_standard(channel: str, name: str, items: list[Item]) -> Calls:
    """Send every item through the primary ``name`` as budget, breaker and bulkhead allow."""
    done = Calls()
    backend = get_backend(channel, name)
    batch_api = getattr(backend, "batch_api", False)
    concurrency = max(1, int(settings.NOTIFY["SEND_CONCURRENCY"][channel]))
    call_lease = call_deadline_seconds()
    deadline = time.monotonic() + float(settings.NOTIFY["BATCH_MAX_WAIT_SECONDS"])
    pending = list(range(len(items)))
    budget_waited = 0.0
    while pending:
        verdict = isolation.breaker_allows(name)
        if not verdict.allowed:
            metrics.isolation_event("breaker_fast_fail", name, "standard")
            until = clock.now() + timedelta(seconds=max(1.0, verdict.retry_in))
            done.waiting = until, f"{name} unavailable (circuit breaker open); waiting until {until.isoformat()}"
            break
        if time.monotonic() > deadline:
            until = clock.now() + timedelta(seconds=5)
            done.waiting = until, (f"no {name} budget or call slot for {settings.NOTIFY['BATCH_MAX_WAIT_SECONDS']} s; "
                                   f"waiting until {until.isoformat()}")
            break
        slots = isolation.acquire_slots(name, "standard", 1 if batch_api else concurrency, call_lease)
        if not slots:
            metrics.isolation_event("bulkhead_full", name, "standard")
            time.sleep(0.05)
            continue
        if verdict.probe:
            want = 1
        elif batch_api:
            want = min(len(pending), MAX_PER_REQUEST)
        else:
            want = min(len(pending), len(slots))
        granted, wait = isolation.take_tokens(name, "standard", want)
        if not granted:
            isolation.release_slots(name, "standard", slots)
            pause = min(max(wait, 0.01), 1.0, max(0.0, deadline - time.monotonic()) + 0.01)
            time.sleep(pause)
            budget_waited += pause
            continue
        chunk, pending = pending[:granted], pending[granted:]
        # Budget and slots can take a while on a loaded machine: the chunk's leases must cover the
        # call from here (no call outlives its row's lease).
        chunk = _owned(items, chunk, call_lease, done)
        if not chunk:
            isolation.release_slots(name, "standard", slots)
            continue
        try:
            _send(backend, items, chunk, min(len(slots), len(chunk)), done)
        finally:
            isolation.release_slots(name, "standard", slots)
        latest = [done.outcomes[i][-1][0] for i in chunk]
        _count_calls(name, latest, batch_api, verdict.probe)
        limited = [o for o in latest if rate_limited(o)]
        if limited and pending:
            # The provider says we are over its limit: the rest of the batch waits for the time it
            # asked (Retry-After), without spending an attempt, instead of meeting the same 429.
            pause = max([1.0] + [float(o.retry_after or 0) for o in limited])
            until = clock.now() + timedelta(seconds=pause)
            done.waiting = until, f"{name} rate limit (429); waiting until {until.isoformat()}"
            break
    if budget_waited:
        metrics.isolation_event("budget_wait", name, "standard", seconds=budget_waited)
    return done


def call_high(n: Notification, items: list[Item]) -> Calls:
    """Send the items of the high-tier row ``n`` through the provider the failover policy picks,
    then through the next while a provider fails and nothing was accepted."""
    done = Calls()
    tried: list[str] = []
    indexes = list(range(len(items)))
    while True:
        try:
            route = route_for(n, len(items), exclude=tried)
        except (ProviderError, ProviderConfigurationError) as exc:
            if not done.outcomes:
                # No provider may be called now (breaker open, budget or bulkhead exhausted,
                # misconfigured): an attempt that made no call, retried like any transient error.
                done.no_call[n.pk] = exc
            return done
        tried.append(route.name)
        try:
            owned = _owned(items, indexes, call_deadline_seconds() * len(items), done)
            if not owned:
                return done  # the reconciler took it over: never call for a row that is not ours
            _send(route.backend, items, owned, len(route.slots), done)
        finally:
            isolation.release_slots(route.name, "high", route.slots)
        latest = [done.outcomes[i][-1][0] for i in owned]
        failed = _count_calls(route.name, latest, getattr(route.backend, "batch_api", False), route.probe)
        accepted = any(not isinstance(o, Exception) for o in latest)
        # A transient answer (5xx, timeout, and also a 429: this account's limit, not the backup's)
        # sends the OTP to the next provider at once; a bad number or a misconfiguration does not.
        if accepted or not (failed or any(isinstance(o, TransientProviderError) for o in latest)):
            return done


def _owned(items: list[Item], chunk: list[int], seconds: float, done: Calls) -> list[int]:
    """``chunk`` without the items of rows that are no longer ours, after making the leases of the
    rest cover ``seconds`` more."""
    rows = {str(items[i].row.pk) for i in chunk}
    owned = still_ours(rows, seconds)
    done.lost.update(items[i].row.pk for i in chunk if str(items[i].row.pk) not in owned)
    return [i for i in chunk if str(items[i].row.pk) in owned]


def _send(backend, items: list[Item], chunk: list[int], concurrency: int, done: Calls) -> None:
    started = time.monotonic()
    outcomes = backend.send_batch([items[i].message for i in chunk], concurrency=max(1, concurrency))
    latency_ms = int((time.monotonic() - started) * 1000)
    ended = clock.now()  # each call's own end (UTC): its attempt row's instant, which the lookup of
    # a call in doubt counts back from (end - latency); the batch's end would hide earlier waves
    for index, outcome in zip(chunk, outcomes, strict=True):
        done.outcomes.setdefault(index, []).append((outcome, latency_ms, ended))


def rate_limited(outcome) -> bool:
    """Is ``outcome`` the provider's "too many requests" (HTTP 429, Twilio 20429, FCM
    QUOTA_EXCEEDED)? Such an answer is about the account's rate, not about the message."""
    return isinstance(outcome, TransientProviderError) and (
        getattr(outcome, "http_status", None) == 429 or outcome.code in ("429", "20429", "QUOTA_EXCEEDED"))


def _count_calls(name: str, outcomes: list, batch_api: bool, probe: bool) -> int:
    """Feed the breaker of ``name``: requests, not recipients, for a batch API. Returns the calls
    that failed in a way that counts against the provider's health."""
    failed = sum(1 for o in outcomes if isinstance(o, Exception) and isolation.is_failure(o))
    ok, bad = ((0, 1) if failed else (1, 0)) if batch_api else (len(outcomes) - failed, failed)
    if isolation.record_calls(name, ok=ok, failed=bad, probe=probe) == "open":
        metrics.isolation_event("breaker_opened", name)
    return failed
