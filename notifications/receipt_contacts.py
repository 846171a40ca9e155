"""What a delivery receipt says about a contact, and how its detail may be stored.

Split from :mod:`notifications.receipts` (which applies receipts to rows): the consequences for the
recipient's address or number (bounces, complaints, unsubscribes, dead and blocked numbers), only
for the contact the receipt names and never for a user erased since; and the receipt's detail as a
row's reason may keep it (docs/PROVIDERS.md, "Delivery receipts").
"""

from __future__ import annotations

from core.redaction import erase_contacts
from notifications.delivery.outcomes import shown
from notifications.models import Notification
from preferences.models import Recipient, SmsStop
from preferences.services import opt_out
from providers.receipts import COMPLAINT, UNSUBSCRIBE, Receipt

# Twilio status-callback error codes with a contact consequence (docs/PROVIDERS.md §1(c)).
TWILIO_DEAD_NUMBER = {"30005": "unknown_handset", "30006": "landline"}
TWILIO_BLOCKED = "30004"


def detail(receipt: Receipt) -> str:
    parts = [receipt.provider, receipt.raw]
    if receipt.error_code:
        parts.append(f"code {receipt.error_code}")
    if receipt.detail:
        parts.append(receipt.detail)
    return " ".join(parts)[:500]


def stored_detail(n: Notification, receipt: Receipt) -> str:
    """The receipt's detail as ``n``'s reason and timeline may keep it: sensitive content removed
    (:func:`shown`); for a recipient erased since ``n`` was created, no address or number either
    (``[erased]``, :func:`core.redaction.erase_contacts`: the erasure scrubbed the rest already)."""
    return stored_details([(receipt, n)])[0]


def stored_details(pairs: list[tuple[Receipt, Notification]]) -> list[str]:
    """:func:`stored_detail` of each ``(receipt, notification)``. Only the details of rows whose
    recipient was erased since are scrubbed (read from the loaded recipients): scrubbing compiles a
    pattern per contact, which cost ~200 µs per receipt when done for every one (bench --receipts)."""
    erased = erased_rows([n for _r, n in pairs])
    return [erase_contacts(d, [r.contact, r.address or ""]) if n.pk in erased else d
            for d, (r, n) in zip((shown(n, detail(r)) for r, n in pairs), pairs, strict=True)]


def _is_current(receipt: Receipt, contact: str) -> bool:
    """Whether the receipt is about the recipient's current ``contact`` (or does not say which):
    a receipt of an address or number the user has changed since must not mark the new one."""
    said = receipt.contact.strip().casefold()
    return not said or said == (contact or "").strip().casefold()


def _erased_since(n: Notification) -> bool:
    """Whether ``n``'s recipient was erased after ``n`` was created."""
    return n.pk in erased_rows([n])


def erased_rows(rows: list[Notification]) -> set:
    """The ids of ``rows`` whose recipient was erased after the row was created (the one rule,
    :meth:`preferences.models.Recipient.erased_after`, on the recipients the receipts loaded)."""
    return {n.pk for n in rows if n.recipient.erased_after(n.created_at)}


def contact_hygiene(n: Notification, receipt: Receipt, now) -> None:
    """What a receipt tells about the recipient's contact (invalid, complained, unsubscribed, blocked):
    only about the contact it names if that is still the user's, and never about a user erased since
    the message (a user re-created under the id is someone it never reached; the links' rule too)."""
    recipient: Recipient = n.recipient
    if n.channel == "email":
        if not (receipt.invalid_address or receipt.kind in (COMPLAINT, UNSUBSCRIBE)):
            return
        if not _is_current(receipt, recipient.email) or _erased_since(n):
            return
        if receipt.invalid_address:
            Recipient.objects.filter(pk=recipient.pk, email=recipient.email).update(
                email_invalid_reason=f"{receipt.provider} {receipt.raw}"[:64], email_invalid_at=now)
        elif receipt.kind == COMPLAINT:
            _opt_out(recipient, channel="email", category=None)
        else:
            _opt_out(recipient, channel="email", category=n.category or None)
    elif n.channel == "sms":
        if not (receipt.error_code in TWILIO_DEAD_NUMBER or receipt.error_code == TWILIO_BLOCKED):
            return
        if not _is_current(receipt, recipient.phone):
            return
        if receipt.error_code in TWILIO_DEAD_NUMBER and not _erased_since(n):
            Recipient.objects.filter(pk=recipient.pk, phone=recipient.phone).update(
                phone_invalid_reason=TWILIO_DEAD_NUMBER[receipt.error_code], phone_invalid_at=now)
        elif receipt.error_code == TWILIO_BLOCKED and receipt.sender and recipient.phone:  # the number's, kept
            SmsStop.objects.get_or_create(phone=recipient.phone, sender=receipt.sender,
                                          defaults={"source": f"{receipt.provider} {receipt.error_code}"})


def _opt_out(recipient: Recipient, *, channel: str, category: str | None) -> None:
    opt_out(recipient, channel=channel, category=category)
