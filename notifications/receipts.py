"""Delivery receipts: normalised provider events applied to notifications (DESIGN.md §5).

Provider webhooks (``providers/twilio/webhooks.py``, ``providers/sendgrid/webhooks.py``) verify the
signature, map the provider's vocabulary to a :class:`Receipt`, and call :func:`apply_receipts`.

Rules:

* **Stored once.** Each receipt is a :class:`~notifications.models.DeliveryEvent` with a unique
  ``dedup_key`` (constraint ``event_dedup_key_uniq``), built by the provider's webhook from what
  identifies the event itself. Twilio sends no event id: ``"twilio:<MessageSid>:<status>:<ErrorCode>"``.
  SendGrid: ``"sendgrid:<sg_message_id>:<event>:<timestamp>"``, not its ``sg_event_id``, because
  SendGrid re-posts an event under a fresh event id (``providers/sendgrid/webhooks.py``,
  ``dedup_key``). A duplicate is dropped before it can change anything.
* **Monotonic.** ``delivered`` moves ``sent`` (or a still-``sending`` row whose worker has not
  recorded it yet) to ``delivered``; a failure (``undelivered``, ``failed``, ``bounce``, ``dropped``)
  moves it to ``failed`` with the provider's code. Terminal states never change again, so a late or
  reordered ``queued``/``sent``/``processed`` never regresses ``delivered``.
* **Contact hygiene** (``shared/reference/providers.md`` §1(c), §2(c)): hard bounce, ``dropped``
  for a bounced/invalid address, Twilio 30005/30006 → the address/number is marked invalid;
  ``spamreport`` → email channel opt-out; ``unsubscribe``/``group_unsubscribe``/``dropped`` for an
  unsubscribed address → opt-out of the notification's category on email (the whole channel when it
  has no category); Twilio 30004 (blocked) → SMS STOP for that sender. Later sends are
  ``suppressed`` with that reason.
* **Unknown** message/notification ids are acknowledged (so the provider stops retrying) and counted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import IntegrityError, transaction

from notifications import clock, markers, metrics
from notifications.models import DeliveryEvent, Notification, Reason, Status
from preferences.models import Preferences, Recipient, SmsStop

log = logging.getLogger(__name__)

# Normalised receipt kinds.
ACCEPTED = "accepted"  # queued/accepted/sent/processed: the provider has it; no state change
DELIVERED = "delivered"
DEFERRED = "deferred"  # the provider retries; no state change
FAILED = "failed"  # undelivered/failed/bounce/dropped
COMPLAINT = "complaint"  # spamreport
UNSUBSCRIBE = "unsubscribe"
ENGAGEMENT = "engagement"  # open/click/read: recorded only

UNKNOWN_COUNTER_KEY = "receipts:unknown"

# Twilio status-callback error codes with a contact consequence (providers.md §1(c)).
TWILIO_DEAD_NUMBER = {"30005": "unknown_handset", "30006": "landline"}
TWILIO_BLOCKED = "30004"


@dataclass(frozen=True)
class Receipt:
    """One provider event about one message.

    Attributes:
        provider: ``"twilio"`` / ``"sendgrid"``.
        dedup_key: unique per provider event, at most 200 characters (see the module docstring).
        kind: one of the normalised kinds above.
        raw: the provider's own word (``"undelivered"``, ``"bounce"``, ``"delivered"``…).
        notification_id: our id if the provider echoed it (Twilio ``?nid=``, SendGrid custom arg).
        provider_message_id: Twilio ``MessageSid`` / SendGrid ``sg_message_id`` prefix.
        error_code: Twilio ``ErrorCode``, SendGrid bounce ``status`` (e.g. ``5.1.1``) or ``""``.
        detail: human-readable detail (bounce reason…), never message content.
        hard_bounce / invalid_address: email contact is dead (mark invalid).
        sender: Twilio ``From`` (for per-sender STOP).
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


def _find(receipt: Receipt) -> Notification | None:
    qs = Notification.objects.select_related("recipient")
    if receipt.notification_id:
        try:
            found = qs.filter(pk=receipt.notification_id).first()
        except Exception:  # not a UUID: treat as unknown
            found = None
        if found is not None:
            return found
    if receipt.provider_message_id:
        return qs.filter(provider_message_id=receipt.provider_message_id).first()
    return None


def apply_receipts(receipts: list[Receipt]) -> dict[str, int]:
    """Apply receipts in order. Returns ``{"applied", "duplicate", "unknown"}`` counts. Never raises
    for bad data: a webhook must answer 2xx for anything it verified."""
    counts = {"applied": 0, "duplicate": 0, "unknown": 0}
    for receipt in receipts:
        counts[_apply_one(receipt)] += 1
    if receipts:
        metrics.receipts_counted(receipts[0].provider, counts)
    if counts["unknown"]:
        log.info("%d receipt(s) for unknown messages from %s", counts["unknown"], receipts[0].provider)
        try:
            markers.get_redis().incrby(UNKNOWN_COUNTER_KEY, counts["unknown"])
        except Exception as exc:  # redis down: the log line above still counts
            log.warning("unknown-receipt counter not updated: %s", exc)
    return counts


def _apply_one(receipt: Receipt) -> str:
    n = _find(receipt)
    if n is None:
        return "unknown"
    with transaction.atomic():
        try:
            with transaction.atomic():
                event = DeliveryEvent.objects.create(
                    notification=n, kind=f"receipt:{receipt.raw}"[:32], dedup_key=receipt.dedup_key[:200],
                    detail=_detail(receipt))
        except IntegrityError:
            return "duplicate"
        now = clock.now()
        if receipt.kind == DELIVERED:
            moved = Notification.objects.filter(pk=n.pk, status__in=[Status.SENT, Status.SENDING]).update(
                status=Status.DELIVERED, delivered_at=now, lease_until=None, updated_at=now)
            if moved:
                DeliveryEvent.objects.filter(pk=event.pk).update(status=Status.DELIVERED)
                metrics.receipt_transitioned(n, Status.DELIVERED)
        elif receipt.kind == FAILED:
            reason = Reason.PROVIDER_BOUNCED if n.channel == "email" else Reason.PROVIDER_UNDELIVERED
            moved = Notification.objects.filter(pk=n.pk, status__in=[Status.SENT, Status.SENDING]).update(
                status=Status.FAILED, reason=reason, reason_detail=_detail(receipt), lease_until=None,
                updated_at=now)
            if moved:
                DeliveryEvent.objects.filter(pk=event.pk).update(status=Status.FAILED, reason=reason)
                metrics.receipt_transitioned(n, Status.FAILED, reason)
        _contact_hygiene(n, receipt, now)
        metrics.receipt_applied(n, receipt)
    return "applied"


def _detail(receipt: Receipt) -> str:
    parts = [receipt.provider, receipt.raw]
    if receipt.error_code:
        parts.append(f"code {receipt.error_code}")
    if receipt.detail:
        parts.append(receipt.detail)
    return " ".join(parts)[:500]


def _contact_hygiene(n: Notification, receipt: Receipt, now) -> None:
    recipient: Recipient = n.recipient
    if n.channel == "email":
        if receipt.invalid_address:
            Recipient.objects.filter(pk=recipient.pk, email=recipient.email).update(
                email_invalid_reason=f"{receipt.provider} {receipt.raw}"[:64], email_invalid_at=now)
        elif receipt.kind == COMPLAINT:
            _opt_out(recipient, channel="email", category=None)
        elif receipt.kind == UNSUBSCRIBE:
            _opt_out(recipient, channel="email", category=n.category or None)
    elif n.channel == "sms":
        if receipt.error_code in TWILIO_DEAD_NUMBER:
            Recipient.objects.filter(pk=recipient.pk, phone=recipient.phone).update(
                phone_invalid_reason=TWILIO_DEAD_NUMBER[receipt.error_code], phone_invalid_at=now)
        elif receipt.error_code == TWILIO_BLOCKED and receipt.sender and recipient.phone:
            SmsStop.objects.get_or_create(phone=recipient.phone, sender=receipt.sender,
                                          defaults={"source": f"{receipt.provider} {receipt.error_code}"})


def _opt_out(recipient: Recipient, *, channel: str, category: str | None) -> None:
    prefs, _ = Preferences.objects.select_for_update().get_or_create(recipient=recipient)
    if category:
        current = set(prefs.category_opt_outs.get(category, []))
        current.add(channel)
        prefs.category_opt_outs = {**prefs.category_opt_outs, category: sorted(current)}
    else:
        prefs.opt_outs = sorted(set(prefs.opt_outs) | {channel})
    prefs.save()
