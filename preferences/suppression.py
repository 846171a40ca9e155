"""The suppression rule: may a message on ``channel`` in ``category`` go to this recipient at all?

One pure function, :func:`suppression_reason`, over what is known about the recipient
(:class:`RecipientFacts`), used by every place that decides it: the send path's checks, campaign
fan-out's pre-filter and a campaign's pre-launch reach. The first check that applies is the reason:
channel, category, then type opt-out (none for a ``required`` type), then the channel's contact
(docs/TYPES.md, "What happens at send time"). The codes are ``notifications.models.Reason``'s
values (this floor cannot import it; a test keeps them in step). Quiet hours never suppress: they
defer (:mod:`preferences.quiet_hours`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from preferences.models import Preferences

OPTED_OUT_CHANNEL = "opted_out_channel"
OPTED_OUT_CATEGORY = "opted_out_category"
NO_PHONE = "no_phone"
PHONE_INVALID = "phone_invalid"
SMS_STOPPED = "sms_stopped"
NO_EMAIL = "no_email"
EMAIL_INVALID = "email_invalid"
NO_ACTIVE_DEVICE = "no_active_device"
OPTED_OUT_TYPE = "opted_out_type"

#: Every reason :func:`suppression_reason` can return.
REASONS = (OPTED_OUT_CHANNEL, OPTED_OUT_CATEGORY, OPTED_OUT_TYPE, NO_PHONE, PHONE_INVALID, SMS_STOPPED, NO_EMAIL,
           EMAIL_INVALID, NO_ACTIVE_DEVICE)


@dataclass(frozen=True)
class RecipientFacts:
    """What the rule needs to know about one recipient.

    ``has_active_device`` / ``sms_stopped``: ``None`` means "not known here" and the check is skipped
    (the send path looks devices up after quiet hours, and STOPs with a query of its own).
    ``opt_outs``: channels opted out of entirely. ``category_opt_outs``: ``{category: channels}``;
    ``type_opt_outs``: ``{notification type key: channels}``. Build the preference fields with
    :func:`channels` / :func:`category_channels` from stored JSON.
    """

    has_phone: bool = False
    phone_invalid: bool = False
    has_email: bool = False
    email_invalid: bool = False
    has_active_device: bool | None = None
    sms_stopped: bool | None = None
    opt_outs: frozenset[str] = frozenset()
    category_opt_outs: Mapping[str, frozenset[str]] = field(default_factory=dict)
    type_opt_outs: Mapping[str, frozenset[str]] = field(default_factory=dict)


def opt_out_reason(facts: RecipientFacts, channel: str, category: str = "", type_key: str = "") -> str:
    """The opt-out that stops a ``channel`` message in ``category`` of notification type ``type_key``
    (``""``: none): ``opted_out_channel``, ``opted_out_category``, ``opted_out_type`` or ``""``."""
    if channel in facts.opt_outs:
        return OPTED_OUT_CHANNEL
    if category and channel in facts.category_opt_outs.get(category, ()):
        return OPTED_OUT_CATEGORY
    if type_key and channel in facts.type_opt_outs.get(type_key, ()):
        return OPTED_OUT_TYPE
    return ""


def suppression_reason(facts: RecipientFacts, channel: str, category: str = "", type_key: str = "",
                       required: bool = False) -> str:
    """The reason code why a ``channel`` message in ``category`` (``""``: none) of notification type
    ``type_key`` (``""``: none) must not be sent to the recipient described by ``facts``, or ``""``
    if it may be. ``required``: the type's category cannot be opted out of (opt-outs are skipped;
    contacts still count). Pure: no I/O, never raises."""
    if not required:
        reason = opt_out_reason(facts, channel, category, type_key)
        if reason:
            return reason
    if channel == "sms":
        if not facts.has_phone:
            return NO_PHONE
        if facts.phone_invalid:
            return PHONE_INVALID
        if facts.sms_stopped:
            return SMS_STOPPED
    elif channel == "email":
        if not facts.has_email:
            return NO_EMAIL
        if facts.email_invalid:
            return EMAIL_INVALID
    elif channel == "push" and facts.has_active_device is False:
        return NO_ACTIVE_DEVICE
    return ""


def channels(value) -> frozenset[str]:
    """Channel names from a stored (parsed) opt-out value: a list of strings, or ``None``.

    Names are matched whole (``"sms"`` is not in ``["smsx"]``); a bare string is one channel;
    anything else (a number, an object, ``None``) names no channel. Raw SQL reads ``jsonb`` as
    text (psycopg 3 with Django's loader): parse it with :func:`json.loads` first.
    """
    if isinstance(value, str):
        return frozenset([value])
    if isinstance(value, list | tuple | set | frozenset):
        return frozenset(v for v in value if isinstance(v, str))
    return frozenset()


def category_channels(value) -> dict[str, frozenset[str]]:
    """``{category: channels}`` from a stored (parsed) ``category_opt_outs`` (or ``type_opt_outs``)
    object or ``None``;
    each value is read with :func:`channels`."""
    if not isinstance(value, dict):
        return {}
    return {str(k): channels(v) for k, v in value.items()}


def facts_of(recipient, *, sms_stopped: bool | None = None, has_active_device: bool | None = None
             ) -> RecipientFacts:
    """:class:`RecipientFacts` of a ``preferences.models.Recipient`` loaded through the ORM (its
    ``preferences`` row, if any, read through the relation: ``select_related`` it for many rows)."""
    try:
        prefs = recipient.preferences
    except Preferences.DoesNotExist:
        prefs = None
    return RecipientFacts(
        has_phone=bool(recipient.phone), phone_invalid=bool(recipient.phone_invalid_reason),
        has_email=bool(recipient.email), email_invalid=bool(recipient.email_invalid_reason),
        has_active_device=has_active_device, sms_stopped=sms_stopped,
        opt_outs=channels(prefs.opt_outs) if prefs is not None else frozenset(),
        category_opt_outs=category_channels(prefs.category_opt_outs) if prefs is not None else {},
        type_opt_outs=category_channels(prefs.type_opt_outs) if prefs is not None else {})


def opted_out_q(channel: str, category: str = "", type_key: str = ""):
    """:func:`opt_out_reason` in SQL, for rule segments (``{"subscribed": true}``): a ``Q`` over
    ``Recipient`` true when its preferences opt out of ``channel``, of ``channel`` in ``category`` or
    of ``channel`` for type ``type_key``. ``jsonb @> '"sms"'`` holds for a list holding ``"sms"`` and
    for the bare string, exactly the stored shapes :func:`channels` reads as naming it
    (``tests/test_segment_rules.py`` keeps the two in step)."""
    from django.db.models import Exists, JSONField, OuterRef, Q, Value
    from django.db.models.fields.json import DataContains, KeyTransform

    named = Value(channel, output_field=JSONField())
    chosen = Q(opt_outs__contains=channel)
    if category:
        chosen |= Q(DataContains(KeyTransform(category, "category_opt_outs"), named))
    if type_key:
        chosen |= Q(DataContains(KeyTransform(type_key, "type_opt_outs"), named))
    return Q(Exists(Preferences.objects.filter(chosen, recipient_id=OuterRef("user_id"))))
