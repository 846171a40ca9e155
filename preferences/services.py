"""Writes for recipients, preferences and devices."""

from __future__ import annotations

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from core import clock
from preferences.models import Device, Preferences, Recipient, Unsubscribe


def _race_safe(write, attempts: int = 3):
    """Run ``write`` (which does its own atomic block) again when a concurrent request inserted the
    same key first: the retry then finds and updates that row instead of failing with a 500."""
    for attempt in range(attempts):
        try:
            return write()
        except IntegrityError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def upsert_recipient(user_id: str, **fields) -> tuple[Recipient, bool]:
    """Create or replace a recipient's contact fields. A changed phone/email clears its
    "invalid" mark (it is a new contact). Stamps ``written_at``: written after its erasure, the
    recipient is a re-created user (campaigns.membership.matching). Safe under concurrent calls for
    the same id.
    Returns ``(recipient, created)``."""

    def write():
        with transaction.atomic():
            recipient = Recipient.objects.select_for_update().filter(pk=user_id).first()
            created = recipient is None
            if created:
                recipient = Recipient(user_id=user_id)
            if "phone" in fields and fields["phone"] != recipient.phone:
                recipient.phone_invalid_reason, recipient.phone_invalid_at = "", None
            if "email" in fields and fields["email"] != recipient.email:
                recipient.email_invalid_reason, recipient.email_invalid_at = "", None
            for key, value in fields.items():
                setattr(recipient, key, value)
            recipient.written_at = clock.now()  # after an erasure: the user is re-created (erased_at)
            recipient.save(force_insert=created)
        return recipient, created

    return _race_safe(write)


def set_preferences(recipient: Recipient, *, opt_outs: list[str], category_opt_outs: dict[str, list[str]],
                    quiet_hours: dict | None, type_opt_outs: dict[str, list[str]] | None = None) -> Preferences:
    """Replace a recipient's preferences (every field: ``type_opt_outs=None`` stores none).
    ``category_opt_outs`` / ``type_opt_outs``: ``{category or type key: [channel…]}``, stored with
    each channel list sorted and de-duplicated. ``quiet_hours`` is ``{start, end, timezone}`` (times
    as ``datetime.time``) or ``None`` to clear."""
    return _race_safe(lambda: _set_preferences(recipient, opt_outs, category_opt_outs, type_opt_outs or {},
                                               quiet_hours))


def _set_preferences(recipient, opt_outs, category_opt_outs, type_opt_outs, quiet_hours) -> Preferences:
    with transaction.atomic():
        prefs, _ = Preferences.objects.select_for_update().get_or_create(recipient=recipient)
        _apply_preferences(prefs, opt_outs, category_opt_outs, type_opt_outs, quiet_hours)
    return prefs


def _apply_preferences(prefs: Preferences, opt_outs, category_opt_outs, type_opt_outs, quiet_hours) -> None:
    prefs.opt_outs = sorted(set(opt_outs))
    prefs.category_opt_outs = {k: sorted(set(v)) for k, v in category_opt_outs.items()}
    prefs.type_opt_outs = {k: sorted(set(v)) for k, v in type_opt_outs.items()}
    if quiet_hours:
        prefs.quiet_start = quiet_hours["start"]
        prefs.quiet_end = quiet_hours["end"]
        prefs.quiet_timezone = quiet_hours.get("timezone") or ""
    else:
        prefs.quiet_start = prefs.quiet_end = None
        prefs.quiet_timezone = ""
    prefs.save()


def opt_out(recipient: Recipient, *, channel: str, category: str | None = None) -> bool:
    """Add one opt-out to ``recipient``'s preferences (made if missing), under a lock of the row:
    of ``channel`` in ``category`` (``category_opt_outs``), or of the whole channel when ``category``
    is ``None`` or ``""`` (``opt_outs``). True when it was added, False when it was already there
    (nothing written). The opt-outs of receipts (unsubscribe, complaint) and of email links
    (preferences.unsubscribe) both come here."""
    with transaction.atomic():
        prefs, _ = Preferences.objects.select_for_update().get_or_create(recipient=recipient)
        if category:
            current = set(prefs.category_opt_outs.get(category) or [])
            if channel in current:
                return False
            prefs.category_opt_outs = {**prefs.category_opt_outs, category: sorted(current | {channel})}
        else:
            if channel in prefs.opt_outs:
                return False
            prefs.opt_outs = sorted(set(prefs.opt_outs) | {channel})
        prefs.save()
    return True


def register_device(recipient: Recipient, *, platform: str, push_token: str) -> tuple[Device, bool]:
    """Register (or re-activate) a push token for ``recipient``. A token registered to another
    recipient moves to this one (a token belongs to one recipient at a time). Returns
    ``(device, created)``. Safe under concurrent calls for the same token."""

    def write():
        with transaction.atomic():
            device = Device.objects.select_for_update().filter(push_token=push_token).first()
            if device is None:
                return Device.objects.create(recipient=recipient, platform=platform, push_token=push_token), True
            device.recipient = recipient
            device.platform = platform
            device.active = True
            device.deactivated_reason = ""
            device.deactivated_at = None
            device.updated_at = timezone.now()
            device.save()
            return device, False

    return _race_safe(write)


def remove_device(recipient: Recipient, push_token: str) -> bool:
    """Delete the recipient's device with this token. Returns False if it had no such device."""
    deleted, _ = Device.objects.filter(recipient=recipient, push_token=push_token).delete()
    return bool(deleted)


def erase_personal_data(recipient: Recipient) -> dict:
    """Remove what this layer holds about ``recipient`` (call inside the erasure's transaction, with the
    recipient row locked): contacts and their invalid marks, zone, locale, attributes, devices,
    preferences and the record of its unsubscribes. The row stays, bare. SMS STOPs (keyed by phone)
    are kept: they are the suppression list that keeps the number from being texted again.

    Returns ``{"contacts_erased": bool, "devices_deleted": n, "preferences_deleted": bool,
    "contacts": [the email/phone it held]}`` (the contacts, to scrub them from delivery logs).
    """
    contacts = [c for c in (recipient.email, recipient.phone) if c]
    held = bool(contacts or recipient.timezone or recipient.locale or recipient.attributes
                or recipient.email_invalid_reason or recipient.phone_invalid_reason)
    recipient.email = recipient.phone = recipient.timezone = recipient.locale = ""
    recipient.email_invalid_reason = recipient.phone_invalid_reason = ""
    recipient.email_invalid_at = recipient.phone_invalid_at = None
    recipient.attributes = {}
    recipient.save()
    devices, _ = Device.objects.filter(recipient=recipient).delete()
    prefs, _ = Preferences.objects.filter(recipient=recipient).delete()
    Unsubscribe.objects.filter(recipient=recipient).delete()
    return {"contacts_erased": held, "devices_deleted": devices, "preferences_deleted": bool(prefs),
            "contacts": contacts}


def create_bare_recipients(user_ids: list[str]) -> int:
    """Create a bare recipient (no contacts yet) for each of ``user_ids`` that has none, in one
    ``INSERT … SELECT FROM unnest(…) ON CONFLICT DO NOTHING`` (in the caller's transaction): a
    10,000-id segment upload costs one statement, not 10,000 model instances. Every column but the
    id takes the model's default for a new row, read from the model so the two never differ.
    Returns how many were created (an id created meanwhile by another request is not counted).
    The ids must follow :func:`core.identifiers.user_id_problem` (the callers check it first)."""
    if not user_ids:
        return 0
    prototype = Recipient(user_id="")
    fields = [f for f in Recipient._meta.concrete_fields if not f.primary_key]
    values = [f.get_db_prep_save(f.pre_save(prototype, add=True), connection) for f in fields]
    pk = Recipient._meta.pk
    columns = ", ".join(connection.ops.quote_name(f.column) for f in [pk, *fields])
    casts = ", ".join(f"%s::{f.cast_db_type(connection)}" for f in fields)
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {connection.ops.quote_name(Recipient._meta.db_table)} ({columns}) "
                    f"SELECT u, {casts} FROM unnest(%s::text[]) AS u ON CONFLICT DO NOTHING",
                    [*values, sorted(set(user_ids))])
        return cur.rowcount

