"""Provider-neutral delivery receipts, and the subscriber that applies them.

A provider's webhook (``providers/twilio/webhooks.py``, ``providers/sendgrid/webhooks.py``) verifies
the signature and turns the request into :class:`Receipt` events (as django-anymail normalises
tracking events into ``AnymailTrackingEvent``), then calls :func:`publish`. Providers know nothing
of what a receipt changes: the delivery pipeline registers its handler with :func:`subscribe` when
Django starts (``notifications.apps.NotificationsConfig.ready`` subscribes
``notifications.receipts.accept_receipts``). How each provider's statuses map to these kinds is in
docs/PROVIDERS.md ("Delivery receipts").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

# Normalised receipt kinds.
ACCEPTED = "accepted"  # queued/accepted/sent/processed: the provider has it; no state change
DELIVERED = "delivered"
DEFERRED = "deferred"  # the provider retries; no state change
FAILED = "failed"  # undelivered/failed/bounce/dropped
COMPLAINT = "complaint"  # spamreport
UNSUBSCRIBE = "unsubscribe"
ENGAGEMENT = "engagement"  # open/click/read: recorded only
#: Every kind a :class:`Receipt` may have (``"unknown"`` for a status a provider added since).
KINDS = (ACCEPTED, DELIVERED, DEFERRED, FAILED, COMPLAINT, UNSUBSCRIBE, ENGAGEMENT, "unknown")


@dataclass(frozen=True)
class Receipt:
    """One provider event about one message.

    Attributes:
        provider: ``"twilio"`` / ``"sendgrid"``.
        dedup_key: unique per provider event, at most 200 characters (how each webhook builds it:
            docs/PROVIDERS.md, "Delivery receipts").
        kind: one of the normalised kinds above (:data:`KINDS`).
        raw: the provider's own word (``"undelivered"``, ``"bounce"``, ``"delivered"``…).
        notification_id: our id if the provider echoed it (Twilio ``?nid=``, SendGrid custom arg).
        provider_message_id: Twilio ``MessageSid`` / SendGrid ``sg_message_id`` prefix.
        address: the recipient's address when ``provider_message_id`` names a request that may carry
            several recipients (SendGrid: the ``X-Message-Id`` of up to 1,000); without our
            ``notification_id`` the receipt then belongs only to that request's row sent to this
            address (``""``: to none). ``None``: the message id names one message (Twilio).
        error_code: Twilio ``ErrorCode``, SendGrid bounce ``status`` (e.g. ``5.1.1``) or ``""``.
        detail: human-readable detail (bounce reason…), never message content.
        invalid_address: email contact is dead (mark invalid).
        sender: Twilio ``From`` (for per-sender STOP).
        occurred_at: when the provider says the event happened (aware UTC; SendGrid ``timestamp``),
            ``None`` if it did not say (Twilio). Only a candidate for ``sent_at``, checked first.
        received_at: when the platform received it (aware UTC), stamped by the subscriber when it
            is accepted; with ``occurred_at`` it orders a message's receipts (the provider's time
            first, else this one: Twilio says none).
        contact: the address or number the event is about (SendGrid ``email``, Twilio ``To``; ``""``:
            not said). A dead-contact mark or a STOP applies to the recipient's contact only while it
            is still this one (a late bounce of an old address never marks the new one).
    """

    provider: str
    dedup_key: str
    kind: str
    raw: str
    notification_id: str | None = None
    provider_message_id: str = ""
    error_code: str = ""
    detail: str = ""
    invalid_address: bool = False
    sender: str = ""
    occurred_at: datetime | None = None
    address: str | None = None
    contact: str = ""
    received_at: datetime | None = None


Subscriber = Callable[[list[Receipt]], None]
_subscribers: list[Subscriber] = []


def subscribe(handler: Subscriber) -> None:
    """Register ``handler`` to receive every published batch of receipts (once, however often it is
    subscribed). Called at start-up by the app that applies receipts."""
    if handler not in _subscribers:
        _subscribers.append(handler)


def publish(receipts: Sequence[Receipt]) -> None:
    """Hand ``receipts`` (one webhook request's events, in the provider's order) to every subscriber.

    Raises:
        RuntimeError: nobody subscribed (the app that applies receipts is not installed): the webhook
            then answers 500 and the provider retries, rather than dropping receipts silently.
    """
    if not receipts:
        return
    if not _subscribers:
        raise RuntimeError("no receipt subscriber registered (is the notifications app installed?)")
    for handler in _subscribers:
        handler(list(receipts))
