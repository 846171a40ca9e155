"""A notification's status and reason change here and nowhere else (docs/ARCHITECTURE.md §5).

Creating a row (acceptance, campaign fan-out, digests) is not a transition; every later change of
``status``/``reason`` is one conditional UPDATE whose allowed from-states come from the one table
(:mod:`.table`), written with its timeline event in the same transaction. ``tests/test_lifecycle.py``
fails when production code writes a status or reason anywhere else. :mod:`.archive` moves finished
rows to the history (docs/ARCHITECTURE.md §13), the one other move of a notification.
"""

from notifications.lifecycle import archive
from notifications.lifecycle.manual import MAYBE_SENT, cancel, fallback, reopen, replay
from notifications.lifecycle.receipts import (
    KIND_RANK,
    OUT_OF_ORDER,
    OVERRULED,
    REFAILED,
    app_move,
    deliver,
    mark_events,
    mark_out_of_order,
    settle_unrecorded,
)
from notifications.lifecycle.receipts import settle as settle_receipt
from notifications.lifecycle.send import claim, expire_leases, record_one, release_due, reschedule, sent, suppress
from notifications.lifecycle.table import FINISHED, TRANSITIONS, Cause, allowed, sources

__all__ = ["FINISHED", "KIND_RANK", "MAYBE_SENT", "OUT_OF_ORDER", "OVERRULED", "REFAILED", "TRANSITIONS", "Cause",
           "allowed", "app_move", "archive", "cancel", "claim", "deliver", "expire_leases", "fallback", "mark_events",
           "mark_out_of_order", "record_one", "release_due", "reopen", "replay", "reschedule", "sent", "settle_receipt",
           "settle_unrecorded", "sources", "suppress"]
