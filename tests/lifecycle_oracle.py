"""The transition table the stateful test of concurrent writers holds the code to
(tests/test_lifecycle_stateful.py), written from docs/ARCHITECTURE.md §5 and the module docstrings
of the writers, not from the code's table; and :func:`race`, two writers released together."""

from __future__ import annotations

import threading

from django.db import connection

from notifications.lifecycle.table import TRANSITIONS
from notifications.models import Reason, Status
from notifications.services import NotCancellable

S = Status

# --- the transition table the invariants hold the code to ----------------------------------------

#: Reached by a provider or the app (``REACHED_STATUSES`` without ``sent``, which may still fail).
REACHED_FINAL = frozenset({S.DELIVERED, S.DISPLAYED, S.DISMISSED, S.OPENED})
#: The terminal kinds: a row shows one of them at most, bar the documented exits.
TERMINAL = {S.DELIVERED: "reached", S.DISPLAYED: "reached", S.DISMISSED: "reached", S.OPENED: "reached",
            S.FAILED: "failed", S.SUPPRESSED: "suppressed", S.EXPIRED: "expired", S.CANCELLED: "cancelled"}
APP = (S.DISPLAYED, S.DISMISSED, S.OPENED)
WAITING_RESEND = frozenset({Reason.OUTCOME_UNKNOWN, Reason.LEASE_EXPIRED})


def _always(_before) -> bool:
    return True


def _waiting_resend(before) -> bool:
    """A ``scheduled``/``queued`` row waiting for a re-send after a call whose outcome nobody knows:
    a receipt (provider's or app's) or its worker's late record proves the call (receipts.py)."""
    return before.reason in WAITING_RESEND


def _failed_by_a_receipt(before) -> bool:
    """A newer ``delivered`` receipt ends a row an older failure receipt had failed."""
    return before.reason in (Reason.PROVIDER_UNDELIVERED, Reason.PROVIDER_BOUNCED)


def _dead_letter(before) -> bool:
    return before.dead_lettered


def _fallback_waiting(before) -> bool:
    """A fallback channel waiting for the one before it, made not needed when that one reached the user."""
    return before.reason == Reason.FALLBACK_WAITING


def _not_needed(before) -> bool:
    """A fallback channel made not needed by a send that then failed (fallback.reopen)."""
    return before.reason == Reason.FALLBACK_NOT_NEEDED


#: ``(from, to) → guard on the row before the step``: every move docs/ARCHITECTURE.md §5 and the
#: module docstrings of receipts.py, app_receipts.py, events/fallback.py and scheduler.py allow.
EDGES = {
    # scheduler: due release; fallback: release / not needed / cancelled with the one before; cancels
    (S.SCHEDULED, S.QUEUED): _always, (S.SCHEDULED, S.CANCELLED): _always,
    (S.SCHEDULED, S.SUPPRESSED): _fallback_waiting, (S.QUEUED, S.CANCELLED): _always,
    # claim; the worker's record (sent, retry, wait, high-tier retry, dead letter, suppressed…)
    (S.QUEUED, S.SENDING): _always,
    **{(S.SENDING, to): _always for to in (S.SENT, S.SCHEDULED, S.QUEUED, S.FAILED, S.SUPPRESSED, S.EXPIRED,
                                            S.CANCELLED)},
    # a receipt proves the call of a row whose worker has not recorded it (provider's or app's)
    **{(S.SENDING, to): _always for to in (S.DELIVERED, *APP)},
    **{(s, to): _waiting_resend for s in (S.SCHEDULED, S.QUEUED) for to in (S.SENT, S.DELIVERED, S.FAILED, *APP)},
    # provider receipts after the send, in the provider's order: its last word is the end ("Receipt order")
    (S.SENT, S.DELIVERED): _always, (S.SENT, S.FAILED): _always,
    (S.DELIVERED, S.FAILED): _always, (S.FAILED, S.DELIVERED): _failed_by_a_receipt,
    **{(s, to): _always for s in (S.SENT, S.DELIVERED) for to in APP},
    (S.DISPLAYED, S.DISMISSED): _always, (S.DISPLAYED, S.OPENED): _always, (S.DISMISSED, S.OPENED): _always,
    # the documented exits from a terminal state (and the receipts' delivered ↔ failed above)
    (S.FAILED, S.QUEUED): _dead_letter,  # a dead letter replayed
    (S.SUPPRESSED, S.QUEUED): _not_needed, (S.SUPPRESSED, S.SCHEDULED): _not_needed,  # fallback reopened
    (S.SUPPRESSED, S.CANCELLED): _not_needed,  # its event cancelled: a later bounce must not reopen it
}


def in_the_codes_table(before: str, after: str, moves: int) -> bool:
    """Can the code's own table (``notifications.lifecycle.table``) take ``before`` to ``after`` in at
    most ``moves`` moves, whatever the causes? (The runtime half of tests/test_status_writers.py: no
    write outside the lifecycle module, whose every UPDATE takes its from-states from the table.)"""
    reach = {before}
    for _ in range(moves):
        reach |= {to for t in TRANSITIONS for s in t.sources if s in reach for to in t.targets}
    return after in reach


def moves_legally(before, after: str, moves: int) -> bool:
    """Can ``before`` (a :class:`Seen`) become ``after`` in at most ``moves`` moves of :data:`EDGES`?
    (A guard is checked on the row as it was; the moves after the first, within one raced step, on the
    reason the first move may have given it: any.)"""
    if before.status == after:
        return True
    frontier = {s for (a, s), guard in EDGES.items() if a == before.status and guard(before)}
    for _ in range(moves - 1):
        if after in frontier:
            return True
        frontier |= {s for (a, s) in EDGES if a in frontier}
    return after in frontier


def race(*actions) -> list:
    """Run ``actions`` at once, each in its own thread and database connection, released together;
    returns what each returned (or raised)."""
    start = threading.Barrier(len(actions))
    results: list = [None] * len(actions)

    def run(index, action):
        try:
            start.wait(timeout=10)
            results[index] = action()
        except Exception as exc:  # re-raised below unless it is a refusal
            results[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i, a)) for i, a in enumerate(actions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a racing writer hung (a lock never released)"
    for result in results:
        if isinstance(result, Exception) and not isinstance(result, NotCancellable):
            raise result
    return results
