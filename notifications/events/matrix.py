"""The effective preference matrix of one recipient (``GET /v1/users/{user_id}/preferences``, field
``effective``): every notification type on each of its channels, allowed or not and why.

Registered with :func:`preferences.api.effective.register_matrix` in ``NotificationsConfig.ready``
(the preferences floor cannot list types). Every entry is decided by the one suppression rule,
:func:`preferences.suppression.suppression_reason`, over the recipient's real facts: stored
preferences, contacts and their invalid marks, whether any push device is active, and SMS STOPs to
the sender the type's SMS go out from (its ``sms_from``, else the primary SMS provider's
``FROM_NUMBER``, as ``notifications.delivery.checks`` reads it). Quiet hours only defer a send,
so they never appear here.
"""

from __future__ import annotations

import dataclasses

from core.vocabulary import CHANNELS
from notifications.delivery.routing import sms_sender
from notifications.events.models import NotificationType
from preferences import suppression
from preferences.api.effective import REQUIRED
from preferences.models import Device, Recipient, SmsStop
from providers.base import ProviderConfigurationError


def type_channels(notification_type: NotificationType) -> list[str]:
    """The type's channels in its order, each once; a stored value that is not a channel is skipped."""
    stored = notification_type.channels if isinstance(notification_type.channels, list) else []
    return [c for c in dict.fromkeys(v for v in stored if isinstance(v, str)) if c in CHANNELS]


def _primary_sms_sender() -> str:
    """The primary SMS provider's sender, or ``""`` when no SMS provider is configured (then no STOP
    applies here; the send itself fails with the configuration error)."""
    try:
        return sms_sender()
    except ProviderConfigurationError:
        return ""


def effective_matrix(recipient: Recipient) -> list[dict]:
    """``[{"type", "category", "channel", "allowed", "reason", "required"}…]`` for ``recipient``,
    sorted by type key, then the type's channel order (the entry shape and reasons:
    :mod:`preferences.api.effective`). Reads the recipient and its preferences afresh (one query),
    its active devices (one), its phone's SMS STOPs (one, when it has a phone and a type uses SMS)
    and the types (one). Never raises for stored values the API would refuse (they read as the
    suppression rule reads them)."""
    recipient = Recipient.objects.select_related("preferences").get(pk=recipient.pk)
    types = [(t, type_channels(t)) for t in NotificationType.objects.order_by("key").only(
        "key", "category", "channels", "required", "sms_from")]
    has_device = Device.objects.filter(recipient=recipient, active=True).exists()
    stopped_senders: set[str] = set()
    if recipient.phone and any("sms" in channels for _, channels in types):
        stopped_senders = set(SmsStop.objects.filter(phone=recipient.phone).values_list("sender", flat=True))
    base = suppression.facts_of(recipient, has_active_device=has_device, sms_stopped=False)
    primary: list[str] = []  # looked up once, only when a STOP exists and a type sends from the primary
    entries: list[dict] = []
    for t, channels in types:
        facts = base
        if "sms" in channels and stopped_senders:
            if not t.sms_from and not primary:
                primary.append(_primary_sms_sender())
            sender = t.sms_from or primary[0]
            facts = dataclasses.replace(base, sms_stopped=bool(sender) and sender in stopped_senders)
        for channel in channels:
            reason = suppression.suppression_reason(facts, channel, t.category, t.key, t.required)
            if not reason and t.required and suppression.opt_out_reason(facts, channel, t.category, t.key):
                reason = REQUIRED
            entries.append({"type": t.key, "category": t.category, "channel": channel,
                            "allowed": reason in ("", REQUIRED), "reason": reason, "required": t.required})
    return entries
