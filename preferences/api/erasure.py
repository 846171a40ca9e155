"""``DELETE /v1/users/{user_id}``: erase a recipient's personal data (GDPR art. 17), recorded.

One transaction with the recipient row locked: :func:`preferences.services.erase_personal_data`,
then each eraser the floors above registered with :func:`register_eraser` at startup (this floor
imports neither); an :class:`~preferences.models.Erasure` records who asked, when, and the counts.
Every model holding a user's data says what erasure does to it (:func:`personal_data`;
tests/test_erasure_registry.py fails for one declared nowhere). Idempotent: a repeat with nothing
left answers the last erasure (``replayed: true``). What is erased and kept: docs/API.md "Erasure",
docs/SECURITY.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from django.db import transaction

from core import clock
from preferences.models import Erasure, Recipient
from preferences.services import erase_personal_data

#: An eraser: ``(recipient_id, contacts, requested_by) -> {count name: int}``, run inside the
#: erasure's transaction; the count names are :class:`~preferences.models.Erasure` fields.
Eraser = Callable[[str, list[str], str], dict[str, int]]
_erasers: list[Eraser] = []

#: ``{"app_label.Model": what erasure does to its rows}`` for every model holding a user's data.
_personal_data: dict[str, str] = {
    "preferences.Recipient": "kept, bare: contacts, zone, locale, attributes and invalid marks cleared",
    "preferences.Device": "deleted",
    "preferences.Preferences": "deleted",
    "preferences.Unsubscribe": "deleted (a re-created user starts with no opt-outs; old links are dead)",
    "preferences.Erasure": "kept: the record of the erasure (who asked, when, counts; no erased data)",
    "preferences.SmsStop": "kept: the STOP list keyed by phone, so the number is never texted again",
}


def register_eraser(eraser: Eraser, covers: Mapping[str, str] | None = None) -> None:
    """Add a floor's part of every erasure (once, however often it is registered); called from the
    ``AppConfig.ready`` of an app that holds personal data of recipients. ``covers`` says, per model
    of that app holding a user's data, what ``eraser`` does to it."""
    if eraser not in _erasers:
        _erasers.append(eraser)
    _personal_data.update(covers or {})


def personal_data() -> dict[str, str]:
    """Every model declared to hold a user's data, and what erasure does to it."""
    return dict(_personal_data)


def erase_user(recipient: Recipient, *, requested_by: str) -> tuple[Erasure, bool]:
    """Erase ``recipient``'s personal data. Returns ``(erasure, replayed)``."""
    with transaction.atomic():
        # FOR NO KEY UPDATE: an inbox write's foreign-key check (FOR KEY SHARE) on this row does not
        # wait for it, so erasure and a concurrent write holding the user's inbox counts never deadlock.
        recipient = Recipient.objects.select_for_update(no_key=True).get(pk=recipient.pk)
        held = erase_personal_data(recipient)
        counts = {"contacts_erased": held["contacts_erased"], "devices_deleted": held["devices_deleted"],
                  "preferences_deleted": held["preferences_deleted"]}
        for eraser in _erasers:
            counts.update(eraser(recipient.pk, held["contacts"], requested_by))
        if not any(counts.values()):
            last = recipient.erasures.order_by("-erased_at", "-id").first()
            if last is not None:
                return last, True
        # What was created before this instant and is still in flight is never sent, written or replayed;
        # the record says the same instant.
        now = clock.now()
        Recipient.objects.filter(pk=recipient.pk).update(erased_at=now)
        return Erasure.objects.create(recipient=recipient, requested_by=requested_by[:200], erased_at=now,
                                      **counts), False
