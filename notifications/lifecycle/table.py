"""The one table of a notification's legal status changes (docs/ARCHITECTURE.md §5).

Each row: the cause that may make the move, the statuses it may start from, the statuses it may
end in, and the extra guard the move's UPDATE adds. Every UPDATE in :mod:`notifications.lifecycle`
takes its ``status IN (…)`` from here (:func:`in_sql`, :func:`sources`), so a writer can only move
a row out of a state this table lets its cause leave, and two writers racing on a row never move
it backwards or give it two ends: the second one's conditional UPDATE finds it gone.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache
from typing import NamedTuple

from notifications.models import FINISHED_STATUSES, Status

S = Status

#: The statuses a row ends in (the archiver's "finished"): no cause of the send path (claim, record,
#: lease expiry, scheduler) leaves them; a receipt, a replay of a dead letter or a fallback's reopen
#: may (tests/test_archive.py checks this against :data:`TRANSITIONS`).
FINISHED: tuple[str, ...] = tuple(str(s) for s in FINISHED_STATUSES)


class Cause(StrEnum):
    """Who moves a notification's status."""

    CLAIM = "claim"
    RECORD = "record"
    LEASE_EXPIRY = "lease_expiry"
    SCHEDULER = "scheduler"
    PROVIDER_RECEIPT = "provider_receipt"
    APP_RECEIPT = "app_receipt"
    CLIENT_CANCEL = "client_cancel"
    EVENT_CANCEL = "event_cancel"
    CAMPAIGN_CANCEL = "campaign_cancel"
    ERASURE = "erasure"
    FALLBACK = "fallback"
    REPLAY = "replay"


class Transition(NamedTuple):
    cause: Cause
    sources: tuple[str, ...]
    targets: tuple[str, ...]
    guard: str


_UNRECORDED = (S.SENDING, S.SCHEDULED, S.QUEUED)
_RESEND_GUARD = "scheduled/queued only with reason outcome_unknown or lease_expired"
_NOT_SENT = "not written to the inbox; not waiting after an unknown outcome (lease_expired, outcome_unknown)"
_NEWER = "the receipt is newer than the last applied (receipt order)"

#: The legal transitions. docs/ARCHITECTURE.md §5 prints this table (tests/test_lifecycle.py keeps them equal).
TRANSITIONS: tuple[Transition, ...] = (
    Transition(Cause.CLAIM, (S.QUEUED,), (S.SENDING,), "attempts + 1, claims + 1; a lease"),
    Transition(Cause.RECORD, (S.SENDING,),
               (S.SENT, S.SCHEDULED, S.QUEUED, S.SUPPRESSED, S.FAILED, S.EXPIRED, S.CANCELLED),
               "our claim number (cancelled: its campaign was cancelled after the claim)"),
    Transition(Cause.RECORD, (S.SCHEDULED, S.QUEUED), (S.SENT,),
               "reason lease_expired and our claim number (a late record of an accepted call)"),
    Transition(Cause.LEASE_EXPIRY, (S.SENDING,), (S.QUEUED, S.SCHEDULED, S.FAILED), "lease_until passed"),
    Transition(Cause.SCHEDULER, (S.SCHEDULED,), (S.QUEUED,), "due_at passed"),
    Transition(Cause.PROVIDER_RECEIPT, (S.SENT,), (S.DELIVERED, S.FAILED), _NEWER),
    Transition(Cause.PROVIDER_RECEIPT, _UNRECORDED, (S.SENT, S.DELIVERED, S.FAILED), _RESEND_GUARD),
    Transition(Cause.PROVIDER_RECEIPT, (S.DELIVERED,), (S.FAILED,), _NEWER),
    Transition(Cause.PROVIDER_RECEIPT, (S.FAILED,), (S.DELIVERED, S.FAILED), f"failed by a receipt; {_NEWER}"),
    Transition(Cause.APP_RECEIPT, _UNRECORDED, (S.SENT,), _RESEND_GUARD),
    Transition(Cause.APP_RECEIPT, (S.SENT, S.DELIVERED), (S.DISPLAYED,), "up the app's ladder only"),
    Transition(Cause.APP_RECEIPT, (S.SENT, S.DELIVERED, S.DISPLAYED), (S.DISMISSED,), "up the app's ladder only"),
    Transition(Cause.APP_RECEIPT, (S.SENT, S.DELIVERED, S.DISPLAYED, S.DISMISSED), (S.OPENED,),
               "up the app's ladder only"),
    Transition(Cause.CLIENT_CANCEL, (S.SCHEDULED, S.QUEUED), (S.CANCELLED,), _NOT_SENT),
    Transition(Cause.EVENT_CANCEL, (S.SCHEDULED, S.QUEUED, S.SUPPRESSED), (S.CANCELLED,),
               f"{_NOT_SENT}; suppressed only with reason fallback_not_needed"),
    Transition(Cause.CAMPAIGN_CANCEL, (S.SCHEDULED, S.QUEUED), (S.CANCELLED,), _NOT_SENT),
    Transition(Cause.ERASURE, (S.SCHEDULED, S.QUEUED, S.SUPPRESSED), (S.CANCELLED,),
               "suppressed only with reason fallback_not_needed (a bounce would reopen it)"),
    Transition(Cause.FALLBACK, (S.SCHEDULED,), (S.SUPPRESSED, S.CANCELLED, S.QUEUED), "reason fallback_waiting"),
    Transition(Cause.FALLBACK, (S.SUPPRESSED,), (S.QUEUED, S.SCHEDULED),
               "reopened: reason fallback_not_needed, not expired"),
    Transition(Cause.REPLAY, (S.FAILED,), (S.QUEUED,), "dead-lettered"),
)


@cache
def sources(cause: Cause, target: str) -> tuple[str, ...]:
    """The statuses ``cause`` may move a row from to ``target`` (in the table's order). Raises
    ValueError when the table has no such move: a writer asking for one is a bug."""
    found: list[str] = []
    for t in TRANSITIONS:
        if t.cause == cause and target in t.targets:
            found += [s for s in t.sources if s not in found]
    if not found:
        raise ValueError(f"no transition to {str(target)!r} by {cause}")
    return tuple(str(s) for s in found)


def allowed(cause: Cause, source: str, target: str) -> bool:
    """Whether the table lets ``cause`` move a row from ``source`` to ``target``."""
    return any(t.cause == cause and source in t.sources and target in t.targets for t in TRANSITIONS)


def in_sql(cause: Cause, target: str, column: str = "status") -> str:
    """``column IN ('a', 'b')`` for :func:`sources` (built once, when a module's SQL is defined)."""
    return f"{column} IN ({', '.join(repr(str(s)) for s in sources(cause, target))})"


def markdown() -> str:
    """The table as docs/ARCHITECTURE.md §5 shows it."""
    lines = ["| cause | from | to | guard |", "|---|---|---|---|"]
    for t in TRANSITIONS:
        lines.append(f"| {t.cause} | {', '.join(t.sources)} | {', '.join(t.targets)} | {t.guard} |")
    return "\n".join(lines)
