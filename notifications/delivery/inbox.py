"""The calls stage for ``in_app`` (docs/APP.md): "sending" is writing the batch's items to the users'
inboxes (:func:`notifications.inbox.store.write`), one statement for the batch, no provider.

Every row counts as accepted by the ``inbox`` "provider" (one attempt row each; one whose recipient
was erased since it was loaded is refused, a transient error), so the outcomes and record stages
treat it as any sent row; a re-driven row finds its item and is not written twice. The
silent refresh push (:mod:`notifications.inbox.refresh`) goes after the batch is recorded
(:func:`refresh_after`), so a slow push provider never holds an in_app row in ``sending``.
"""

from __future__ import annotations

import time

from core import clock
from notifications.delivery.calls import Calls, Item
from notifications.inbox import refresh, store
from providers.base import SendResult, TransientProviderError

#: The name the inbox writes under in attempt rows, the timeline and metrics.
INBOX = "inbox"


def call_inbox(items: list[Item]) -> tuple[Calls, dict[str, str]]:
    """Write ``items`` (one per row: an in_app row has a single target) to the inboxes; every row
    is accepted but one the write refused (its recipient erased since it was loaded): a transient
    error, so the retry's checks cancel it. Returns the calls and the users given a new item (user
    id → its id). Raises what the database raises (the batch's leases then run out and it is
    re-driven: nothing is lost, nothing is written twice)."""
    started = time.monotonic()
    now = clock.now()
    written = store.write([
        store.NewItem(notification_id=item.row.pk, recipient_id=item.row.recipient_id,
                      type_key=item.row.notification_type_id or "", category=item.row.category,
                      title=item.row.title, body=item.row.body, data=item.row.data, created_at=None,
                      expires_at=item.row.expires_at)
        for item in items])
    latency_ms = int((time.monotonic() - started) * 1000)
    # Refused: the recipient was erased after this row was loaded. Retried, its checks cancel it
    # (recipient_erased); never recorded as sent without an item.
    refused = store.without_item([item.row.pk for item in items if item.row.pk not in written])
    done = Calls()
    for index, item in enumerate(items):
        done.outcomes[index] = [(TransientProviderError(INBOX, "recipient_erased", "not written: the recipient's "
                                                        "personal data was erased meanwhile")
                                 if item.row.pk in refused else SendResult(INBOX, ""), latency_ms, now)]
    return done, {item.row.recipient_id: str(item.row.pk) for item in items if item.row.pk in written}


def refresh_after(written: dict[str, str]) -> None:
    """The silent refresh push for the users :func:`call_inbox` wrote new items for (user id → the
    newest item's id), once their rows are recorded."""
    if written:
        refresh.request(written)
