"""Fallback routing (docs/TYPES.md, "Fallback routing"): each channel after the first waits
(``scheduled``, ``fallback_waiting``, ``fallback_after`` = the one before) until the one before ends:
sent → not needed (``suppressed``, ``fallback_not_needed``); cancelled → cancelled; any other end →
released (``queued``, with its own checks).

:func:`settle` decides in the record stage's transaction that ends a row; :func:`sweep` (the
reconciler) settles what a crash between the two left waiting; :func:`reopen` (in a bounce or
undelivered receipt's transaction) releases the channel a send had made not needed.
"""

from __future__ import annotations

from django.db import connection

from core import clock
from notifications import lifecycle, metrics
from notifications.admission import Admission, Road, admit
from notifications.enqueue import enqueue_on_commit
from notifications.models import REACHED_STATUSES, Reason, Status

FINAL = lifecycle.FINISHED

def outcome(status: str, reason: str) -> str | None:
    """What a row's end means for the one waiting behind it: ``"not_needed"``, ``"cancelled"``,
    ``"release"``, or ``None`` when it has not ended."""
    if status in REACHED_STATUSES or reason == Reason.FALLBACK_NOT_NEEDED:
        return "not_needed"
    if status == Status.CANCELLED:
        return "cancelled"
    if status in FINAL:
        return "release"
    return None


def settle(ended: list[tuple], origin: str = "") -> int:
    """Decide the notifications waiting behind ``ended`` rows: ``[(id, status, reason, channel)]``
    (rows that just ended; others are ignored). Runs inside the caller's transaction; released rows
    are enqueued after it commits. Returns how many waiting rows moved (recursively: a row not needed
    or cancelled settles the one behind it too; ``origin`` then names the channel that decided it)."""
    groups: dict[str, list] = {"not_needed": [], "cancelled": [], "release": []}
    for pk, status, reason, channel in ended:
        what = outcome(status, reason)
        if what:
            groups[what].append((str(pk), channel, origin or f"{channel}: {reason or status}"))
    moved = 0
    now = clock.now()
    for what, rows in groups.items():
        if not rows:
            continue
        if what == "not_needed":
            changed = _move(rows, Status.SUPPRESSED, Reason.FALLBACK_NOT_NEEDED, now,
                            "an earlier channel in the fallback order ({}) reached the recipient")
            metrics.fallback_settled("not_needed", len(changed))
            moved += len(changed) + _onwards(changed, Status.SUPPRESSED, Reason.FALLBACK_NOT_NEEDED)
        elif what == "cancelled":
            changed = _move(rows, Status.CANCELLED, Reason.CANCELLED_BY_CLIENT, now,
                            "the channel before it in the fallback order ({}) was cancelled")
            metrics.fallback_settled("cancelled", len(changed))
            moved += len(changed) + _onwards(changed, Status.CANCELLED, Reason.CANCELLED_BY_CLIENT)
        else:
            admit(Admission(road=Road.FALLBACK, now=now))  # the gate: no rule is re-applied at release
            changed = _move(rows, Status.QUEUED, "", now,
                            "released: the channel before it in the fallback order ({}) could not reach the "
                            "recipient")
            enqueue_on_commit([(pk, priority, channel) for pk, priority, channel, _why in changed])
            metrics.fallback_settled("released", len(changed))
            moved += len(changed)
    return moved


def _onwards(changed: list[tuple], status: str, reason: str) -> int:
    """Settle what waits behind rows just made not needed or cancelled, keeping the channel that
    decided it in their detail (one :func:`settle` per distinct deciding channel)."""
    by_why: dict[str, list] = {}
    for pk, _priority, channel, why in changed:
        by_why.setdefault(why, []).append((pk, status, reason, channel))
    return sum(settle(rows, why) for why, rows in by_why.items())


def _move(rows: list[tuple], status: str, reason: str, now, detail: str) -> list[tuple]:
    """Move the rows waiting behind ``rows`` (``(id, channel, why)``: ``why`` names the channel that
    decided and how it ended) to ``status``; one timeline event each saying so (one UPDATE per
    distinct ``why``). Returns ``[(id, priority, channel, why)]``."""
    by_ending: dict[str, list] = {}
    for pk, _channel, why in rows:
        by_ending.setdefault(why, []).append(pk)
    moved = []
    for why, pks in by_ending.items():
        for pk, priority, ch in lifecycle.fallback(pks, status, reason, detail.format(why)[:500], now):
            moved.append((str(pk), priority, ch, why))
    return moved


_ENDED_AHEAD_SQL = f"""
SELECT p.id, p.status, p.reason, p.channel
  FROM notifications_notification w
  JOIN notifications_notification p ON p.id = w.fallback_after
 WHERE w.status = 'scheduled' AND w.reason = 'fallback_waiting'
   AND p.status IN ({", ".join(f"'{s}'" for s in FINAL)})
 LIMIT %s
"""


def sweep(limit: int = 1000) -> int:
    """Settle rows still waiting behind a row that has ended (a crash between the two writes, or an
    end written by a path that does not settle: an erasure, a row changed by hand). Reads the
    waiting rows through their partial index and each one's predecessor by primary key, so it costs
    a scan of the waiting rows (few: only fallback events still deciding). Returns how many moved."""
    with connection.cursor() as cur:
        cur.execute(_ENDED_AHEAD_SQL, [limit])
        ended = cur.fetchall()
    return settle(ended) if ended else 0


def reopen(failed: list[tuple], why: str) -> int:
    """A receipt says rows recorded ``sent`` did not reach the recipient after all (``failed``:
    ``[(id, channel)]``): release the channel after each in its fallback order if the send made it
    ``fallback_not_needed`` (and it has not expired), and make the ones behind that wait again
    (``scheduled``, ``fallback_waiting``), so the order goes on from there. ``why`` names the
    receipt (``"email: provider_bounced"``). Runs inside the receipt's transaction; released rows are
    enqueued after it commits. Returns how many rows moved."""
    if not failed:
        return 0
    now = clock.now()
    detail = f"released: the channel before it in the fallback order ({why}) was sent but did not reach the recipient"
    released = lifecycle.reopen([pk for pk, _c in failed], Status.QUEUED, detail[:500], now)
    enqueue_on_commit([(str(pk), priority, channel) for pk, priority, channel in released])
    metrics.fallback_settled("reopened", len(released))
    moved = len(released)
    behind = [pk for pk, _p, _c in released]
    while behind:  # the channels after the released one wait for it again
        rows = lifecycle.reopen(behind, Status.SCHEDULED, detail, now)
        moved += len(rows)
        behind = [pk for pk, _p, _c in rows]
    return moved
