"""Fallback routing (docs/TYPES.md): a type with ``routing: fallback`` lists its channels in order;
an event makes one notification per channel, the first due at once and each next one waiting
(``scheduled``, reason ``fallback_waiting``, ``fallback_after`` = the one before it) until the one
before it ends:

* **sent** or delivered (or itself not needed) → the waiting ones are not needed: ``suppressed``,
  reason ``fallback_not_needed``;
* **cancelled** → the waiting ones are cancelled with it;
* any other end (suppressed: opted out, no contact, no active device, contact invalid, STOP;
  failed: permanent error, attempts exhausted; expired) → the next one is released (``queued``) and
  goes through the pipeline like any notification, where its own checks apply.

:func:`settle` is called by the record stage in the transaction that ends a row, so the next channel
is decided with it; :func:`sweep` (the reconciler, every run) settles what a crash between the two
left waiting behind a row that has ended.
"""

from __future__ import annotations

from django.db import connection

from core import clock
from core.postgres import array_literal
from notifications import metrics
from notifications.enqueue import enqueue_on_commit
from notifications.models import DeliveryEvent, Notification, Reason, Status

FINAL = (Status.SENT, Status.DELIVERED, Status.FAILED, Status.SUPPRESSED, Status.EXPIRED, Status.CANCELLED)

_MOVE_SQL = """
UPDATE notifications_notification
   SET status = %s, reason = %s, reason_detail = %s, updated_at = %s, queued_at = %s, due_at = NULL
 WHERE fallback_after = ANY(%s::uuid[]) AND status = 'scheduled' AND reason = 'fallback_waiting'
RETURNING id, priority, channel
"""


def outcome(status: str, reason: str) -> str | None:
    """What a row's end means for the one waiting behind it: ``"not_needed"``, ``"cancelled"``,
    ``"release"``, or ``None`` when it has not ended."""
    if status in (Status.SENT, Status.DELIVERED) or reason == Reason.FALLBACK_NOT_NEEDED:
        return "not_needed"
    if status == Status.CANCELLED:
        return "cancelled"
    if status in FINAL:
        return "release"
    return None


def settle(ended: list[tuple]) -> int:
    """Decide the notifications waiting behind ``ended`` rows: ``[(id, status, reason, channel)]``
    (rows that just ended; others are ignored). Runs inside the caller's transaction; released rows
    are enqueued after it commits. Returns how many waiting rows moved (recursively: a row not needed
    or cancelled settles the one behind it too)."""
    groups: dict[str, list] = {"not_needed": [], "cancelled": [], "release": []}
    for pk, status, reason, channel in ended:
        what = outcome(status, reason)
        if what:
            groups[what].append((str(pk), channel, reason or status))
    moved = 0
    now = clock.now()
    for what, rows in groups.items():
        if not rows:
            continue
        if what == "not_needed":
            changed = _move(rows, Status.SUPPRESSED, Reason.FALLBACK_NOT_NEEDED, now,
                            "an earlier channel in the fallback order ({}) reached the recipient")
            metrics.fallback_settled("not_needed", len(changed))
            moved += len(changed) + settle([(pk, Status.SUPPRESSED, Reason.FALLBACK_NOT_NEEDED, ch)
                                            for pk, _p, ch in changed])
        elif what == "cancelled":
            changed = _move(rows, Status.CANCELLED, Reason.CANCELLED_BY_CLIENT, now,
                            "the channel before it in the fallback order ({}) was cancelled")
            metrics.fallback_settled("cancelled", len(changed))
            moved += len(changed) + settle([(pk, Status.CANCELLED, Reason.CANCELLED_BY_CLIENT, ch)
                                            for pk, _p, ch in changed])
        else:
            changed = _move(rows, Status.QUEUED, "", now,
                            "released: the channel before it in the fallback order ({}) could not reach the "
                            "recipient")
            enqueue_on_commit([(pk, priority, channel) for pk, priority, channel in changed])
            metrics.fallback_settled("released", len(changed))
            moved += len(changed)
    return moved


def _move(rows: list[tuple], status: str, reason: str, now, detail: str) -> list[tuple]:
    """Move the rows waiting behind ``rows`` (``(id, channel, why)``) to ``status``; one timeline
    event each naming the channel before it and how it ended (one UPDATE per distinct channel and
    ending). Returns ``[(id, priority, channel)]``."""
    by_ending: dict[tuple, list] = {}
    for pk, channel, why in rows:
        by_ending.setdefault((channel, why), []).append(pk)
    moved, events = [], []
    with connection.cursor() as cur:
        for (channel, why), pks in by_ending.items():
            text = detail.format(f"{channel}: {why}")[:500]
            cur.execute(_MOVE_SQL, [status, reason, "" if status == Status.QUEUED else text, now,
                                    now if status == Status.QUEUED else None, array_literal(pks)])
            for pk, priority, ch in cur.fetchall():
                moved.append((str(pk), priority, ch))
                events.append(DeliveryEvent(notification_id=pk, kind="released" if status == Status.QUEUED
                                            else str(status), status=status, reason=reason, detail=text,
                                            created_at=now))
    DeliveryEvent.objects.bulk_create(events)
    return moved


def sweep(limit: int = 1000) -> int:
    """Settle rows still waiting behind a row that has ended (a crash between the two writes, or an
    end written by a path that does not call :func:`settle`: the reconciler's dead letters, an
    erasure). Returns how many moved."""
    waiting = (Notification.objects.filter(status=Status.SCHEDULED, reason=Reason.FALLBACK_WAITING)
               .values_list("fallback_after", flat=True)[:limit])
    ended = list(Notification.objects.filter(pk__in=list(waiting), status__in=FINAL)
                 .values_list("pk", "status", "reason", "channel"))
    return settle(ended) if ended else 0
