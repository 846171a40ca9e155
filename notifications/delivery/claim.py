"""Claim stage of the delivery pipeline (docs/ARCHITECTURE.md, "The send path"): take ``queued``
rows for this worker with a lease, held by this process's lease keeper (:mod:`.leases`) until the
task releases them, and look up their sent markers.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings

from notifications import lifecycle
from notifications import sent_markers as markers
from notifications.delivery import leases


def claim(ids: Iterable[str], now: datetime) -> list:
    """Claim ``queued`` rows among ``ids`` for this worker: ``sending`` with a lease of
    ``NOTIFY["LEASE_SECONDS"]`` from ``now`` (UTC), held by this process's lease keeper (renewed
    for as long as the task works on them) until the task releases them.

    Returns the ids (UUIDs) actually claimed; rows that are cancelled, already claimed or finished
    are skipped. One conditional UPDATE: running the same task twice claims each row once.
    """
    lease = now + timedelta(seconds=settings.NOTIFY["LEASE_SECONDS"])
    rows = lifecycle.claim(ids, lease, now)
    leases.keeper().hold(rows, lease)
    return [row[0] for row in rows]


def release(ids: Iterable) -> None:
    """Stop renewing the leases of ``ids`` (the task is done with them, recorded or not)."""
    leases.keeper().release(ids)


def sent_markers(ids: Iterable) -> set[str]:
    """The claimed ids (as strings) whose sent marker exists: an earlier attempt was accepted.
    Empty when Redis is down (the claim already checked the row's status)."""
    return markers.find_sent(ids)


def call_deadline_seconds() -> float:
    """The longest one provider call may take (seconds): connect and read timeouts of the SDK's
    HTTP client, plus a margin. A row's lease is extended past it before every call."""
    return float(settings.PROVIDER_TIMEOUT_SECONDS) * 2 + 5


def still_ours(ids: Iterable, seconds: float) -> set[str]:
    """The ids (as strings) still ours after making their leases cover ``seconds`` more (before a
    provider call); the others changed hands and must never be sent from here."""
    return leases.keeper().ensure(ids, seconds)


def covers_call(pk: object) -> bool:
    """Does held row ``pk``'s lease still cover one provider call (``PROVIDER_TIMEOUT_SECONDS``)
    from now? Asked, in memory, right before each call of a sliding window (calls.py)."""
    return leases.keeper().covers(pk, float(settings.PROVIDER_TIMEOUT_SECONDS))
