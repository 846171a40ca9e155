"""Routing stage of the delivery pipeline (docs/ARCHITECTURE.md, "The send path"): which provider a
batch goes to, with its circuit breaker consulted, bulkhead slots and budget tokens taken once.

* High tier (:func:`route_for`): the failover policy. The channel's providers in order, the first
  usable one taken; a provider that fails is followed at once by the next (calls.py).
* Standard tier (:func:`primary`): the primary only; standard traffic waits for it (while its
  breaker is open the rows go back to ``scheduled``, calls.py), never failing over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from django.conf import settings

from notifications import metrics
from notifications.models import Notification
from providers import isolation
from providers.base import ProviderConfigurationError, TransientProviderError
from providers.registry import get_backend, provider_names, unavailable_channel_problem

log = logging.getLogger(__name__)


def sms_sender() -> str:
    """The sender (From number) SMS currently go out from: the primary SMS provider's FROM_NUMBER."""
    return str(get_backend("sms").options.get("FROM_NUMBER", ""))


@dataclass
class Route:
    """The provider a high-tier batch goes to: its backend, the bulkhead slots held, and whether
    the call is the breaker's half-open probe."""

    name: str
    backend: object
    slots: list = field(default_factory=list)
    probe: bool = False


def route_for(n: Notification, needed: int, exclude: Collection[str] = ()) -> Route:
    """Pick the provider for a high-tier batch of one row needing ``needed`` calls (the failover
    policy, docs/ARCHITECTURE.md).

    The channel's providers in order; one is skipped while its circuit breaker is open, its
    high-tier bulkhead is full, or its budget (reserved high share, then the standard share) has
    no token within ``HIGH_BUDGET_WAIT_SECONDS``; the first usable one is taken (a backup =
    failover). A half-open primary is probed by high traffic only when no other provider is
    usable. ``exclude``: providers already tried in this attempt.

    Raises:
        TransientProviderError: no provider can be called now (``code`` ``circuit_open``,
            ``bulkhead_full`` or ``budget_exhausted`` of the last one tried).
        ProviderConfigurationError: the channel has no provider configured.
    """
    tier = "high"
    names = provider_names(n.channel)
    lease = float(settings.PROVIDER_TIMEOUT_SECONDS) * 2 * max(1, needed)
    last: Exception | None = None
    candidates = [(i, name, False) for i, name in enumerate(names) if name not in exclude]
    candidates += [(i, name, True) for i, name, _ in candidates]  # second pass: may probe
    for index, name, may_probe in candidates:
        # The breaker, the bulkhead and a first try at the budget in one round trip (isolation.py).
        admission = isolation.admit_call(name, tier, 1, needed, lease, may_probe=may_probe)
        verdict = admission.verdict
        if not verdict.allowed:
            metrics.isolation_event("breaker_fast_fail", name, tier)
            last = TransientProviderError(name, "circuit_open",
                                          f"circuit breaker open; next probe in {verdict.retry_in:.1f} s")
            continue
        slots = admission.slots
        if not slots:
            metrics.isolation_event("bulkhead_full", name, tier)
            last = TransientProviderError(name, "bulkhead_full", "every concurrent-call slot is taken")
            continue
        if admission.tokens < needed and not wait_for_tokens(name, tier, needed, max_wait=HIGH_BUDGET_WAIT_SECONDS,
                                                             first_wait=admission.wait):
            isolation.release_slots(name, tier, slots)
            last = TransientProviderError(name, "budget_exhausted", "no provider budget left this second")
            continue
        if index:
            metrics.isolation_event("failover", name, tier, channel=n.channel)
            log.warning("%s %s %s fails over to %s: %s", tier, n.channel, n.pk, name,
                        last or "the previous provider's call failed")
        return Route(name, get_backend(n.channel, name, tier), slots, verdict.probe)
    raise last or ProviderConfigurationError(n.channel, "no provider configured", code="not_configured")


#: How long a high-tier send waits for a budget token before trying the next provider (seconds).
HIGH_BUDGET_WAIT_SECONDS = 1.0


def wait_for_tokens(provider: str, tier: str, needed: int, max_wait: float, first_wait: float | None = None) -> bool:
    """Take ``needed`` tokens (all or none), waiting up to ``max_wait`` seconds. True if taken.
    ``first_wait``: a first try was already refused (by :func:`isolation.admit_call`) and said to
    wait this long."""
    deadline = time.monotonic() + max_wait
    waited = 0.0
    while True:
        if first_wait is not None:
            granted, wait, first_wait = 0, first_wait, None
        else:
            granted, wait = isolation.take_tokens(provider, tier, needed, partial=False)
        if granted:
            if waited:
                metrics.isolation_event("budget_wait", provider, tier, seconds=waited)
            return True
        pause = min(wait, deadline - time.monotonic())
        if pause <= 0:
            return False
        time.sleep(pause)
        waited += pause


def primary(channel: str) -> str | None:
    """The standard tier's provider for ``channel``: its primary, or ``None`` when the channel has no
    provider (an empty ``*_PROVIDERS`` list; its rows become dead letters)."""
    return None if unavailable_channel_problem(channel) else provider_names(channel)[0]
