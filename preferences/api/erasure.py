"""``DELETE /v1/users/{user_id}``: erase a recipient's personal data (GDPR art. 17), recorded.

One transaction over every layer's part, with the recipient row locked (a concurrent PUT or a second
DELETE waits): :func:`preferences.services.erase_personal_data` (contacts, zone, locale, attributes,
devices, preferences), :func:`campaigns.services.remove_from_every_segment`, and
:func:`notifications.services.erase_notification_content` (pending sends cancelled, content removed,
contacts scrubbed from delivery logs). An :class:`~preferences.models.Erasure` records who asked,
when, and the counts.

Idempotent: a repeat that finds nothing left to erase records nothing new and answers the last
erasure (``replayed: true``). A user re-created afterwards (new contacts via PUT) can be erased again.
"""

from __future__ import annotations

from django.db import transaction

from campaigns.services import remove_from_every_segment
from notifications.services import erase_notification_content
from preferences.models import Erasure, Recipient
from preferences.services import erase_personal_data


def erase_user(recipient: Recipient, *, requested_by: str) -> tuple[Erasure, bool]:
    """Erase ``recipient``'s personal data. Returns ``(erasure, replayed)``."""
    with transaction.atomic():
        recipient = Recipient.objects.select_for_update().get(pk=recipient.pk)
        held = erase_personal_data(recipient)
        memberships = remove_from_every_segment(recipient.pk)
        notes = erase_notification_content(recipient.pk, held["contacts"], by=requested_by)
        counts = {"contacts_erased": held["contacts_erased"], "devices_deleted": held["devices_deleted"],
                  "preferences_deleted": held["preferences_deleted"], "segment_memberships_removed": memberships,
                  **notes}
        if not any(counts.values()):
            last = recipient.erasures.order_by("-erased_at", "-id").first()
            if last is not None:
                return last, True
        return Erasure.objects.create(recipient=recipient, requested_by=requested_by[:200], **counts), False
