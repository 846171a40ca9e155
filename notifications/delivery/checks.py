"""Checks stage of the delivery pipeline: whether a claimed row may go to a provider now. A
*verdict*, computed from what the load stage loaded; no writes (the record stage applies it).

Order (the first rule that applies wins; the sent marker and the lookup of a call in doubt come
before, in ``pipeline.prepare``): recipient erased after the row was created (in flight at the
erasure) → campaign cancelled → expired → suppressed (opt-outs, contact, STOP) → quiet hours (a
type's policy ``defer``/``bypass``/``silent``; an untyped row by
:mod:`notifications.quiet_hours_policy`; ``in_app`` only with ``in_app_quiet_hours``) → abuse
limits of a contact changed since acceptance (:func:`limit_verdict`) → push without an active
device. docs/ARCHITECTURE.md §6, step 4; docs/TYPES.md, "What happens at send time".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from notifications import metrics
from notifications.admission import SendLimits
from notifications.events.models import NotificationType, QuietHoursPolicy
from notifications.models import Notification, Reason, Status
from notifications.quiet_hours_policy import bypasses_quiet_hours
from preferences import suppression
from preferences.models import Preferences, SmsStop
from preferences.quiet_hours import quiet_zone, window_end

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Verdict:
    """What happens to a row instead of a provider call: ``status`` (``sent`` for a marker found,
    ``scheduled`` for a deferral, else the terminal status), ``reason``, the timeline event's
    ``kind`` and ``detail``; ``until`` (UTC) for a deferral."""

    status: str
    kind: str
    reason: str = ""
    detail: str = ""
    until: datetime | None = None


@dataclass
class Facts:
    """What the load stage knows about one claimed row beside the row itself."""

    campaign_cancelled: bool = False
    stopped_phones: set | None = None  # the batch's phones that replied STOP to our sender (None: query)
    devices: list = field(default_factory=list)  # active push devices
    kind: NotificationType | None = None  # a typed row's type


MARKER_FOUND = Verdict(Status.SENT, "sent", detail="sent marker found: an earlier attempt was accepted")
#: The kind of the verdict that sends a push now, silently (quiet hours, type policy ``silent``).
SILENT = "silent"


def verdict(n: Notification, facts: Facts, now: datetime) -> Verdict | None:
    """The verdict on claimed row ``n`` at ``now`` (UTC), or ``None`` when it goes to the provider.
    A verdict of kind :data:`SILENT` goes to the provider too, as a silent push."""
    if n.recipient.erased_after(n.created_at):  # in flight at the erasure: never to the id's next holder
        return Verdict(Status.CANCELLED, "cancelled", Reason.RECIPIENT_ERASED,
                       f"the recipient's personal data was erased at {n.recipient.erased_at:%Y-%m-%d %H:%M:%S} UTC, "
                       "after this was created")
    if facts.campaign_cancelled:
        return Verdict(Status.CANCELLED, "cancelled", Reason.CAMPAIGN_CANCELLED,
                       "its campaign was cancelled before this was sent")
    if n.expires_at and now >= n.expires_at:
        return Verdict(Status.EXPIRED, "expired", Reason.TTL_EXPIRED, f"expired at {n.expires_at.isoformat()}")
    reason = suppression_reason(n, facts.stopped_phones, facts.kind)
    if reason:
        return Verdict(Status.SUPPRESSED, "suppressed", reason, suppression_detail(n, reason, facts.kind))
    if n.channel == "in_app" and not (facts.kind is not None and facts.kind.in_app_quiet_hours):
        return None  # an inbox item makes no sound: quiet hours keep it only when its type says so
    policy = facts.kind.quiet_hours if facts.kind is not None else None
    if policy == QuietHoursPolicy.BYPASS and n.campaign_id is not None:
        policy = None  # a bulk send never overrides users' choices, even of a type changed after launch
    if policy == QuietHoursPolicy.BYPASS or (policy is None and bypasses_quiet_hours(n.priority, n.category)):
        return None
    until = quiet_hours_end(n, now)
    if until is None:
        return None
    if policy == QuietHoursPolicy.SILENT and n.channel == "push":
        return Verdict(Status.SENDING, SILENT, detail=f"quiet hours until {until.isoformat()}: sent now as a silent "
                                                      "(data-only) push, no alert or sound (type policy silent)")
    return Verdict(Status.SCHEDULED, "deferred", Reason.QUIET_HOURS, f"quiet hours until {until.isoformat()}",
                   until=until)


def limit_verdict(n: Notification, limits: SendLimits, now: datetime) -> Verdict | None:
    """A row that is going now, over an abuse limit of its current contact (counted again when it is
    not the one counted at acceptance, :class:`notifications.admission.SendLimits`): suppressed."""
    detail = limits.refusal(n, now)
    if detail:
        return Verdict(Status.SUPPRESSED, "suppressed", Reason.ACCEPTANCE_LIMITED, detail[:500])
    return None


def device_verdict(n: Notification, facts: Facts) -> Verdict | None:
    """After rendering: a push row without an active device is suppressed."""
    if n.channel == "push" and not facts.devices:
        return Verdict(Status.SUPPRESSED, "suppressed", Reason.NO_ACTIVE_DEVICE, Reason.NO_ACTIVE_DEVICE.label)
    return None


def suppression_reason(n: Notification, stopped_phones: set[str] | None = None,
                       kind: NotificationType | None = None) -> str:
    """Why this notification must not be sent at all (opt-outs, missing or dead contact), or ''.
    ``stopped_phones``: the numbers that replied STOP to our sender, preloaded for a batch
    (``None`` = query). ``kind``: a typed row's type (its key for type opt-outs, ``required``, and
    its own SMS sender, whose STOP list is asked instead)."""
    from notifications.delivery.routing import sms_sender

    recipient = n.recipient
    stopped = None
    if n.channel == "sms" and recipient.phone:
        own = kind.sms_from if kind is not None else ""
        if stopped_phones is not None and not own:  # the batch's preload is for the provider's sender
            stopped = recipient.phone in stopped_phones
        else:
            stopped = SmsStop.objects.filter(phone=recipient.phone, sender=own or sms_sender()).exists()
    return suppression.suppression_reason(suppression.facts_of(recipient, sms_stopped=stopped), n.channel,
                                          n.category, type_key=kind.key if kind is not None else "",
                                          required=bool(kind is not None and kind.required and n.campaign_id is None))


def suppression_detail(n: Notification, reason: str, kind: NotificationType | None = None) -> str:
    """What a support agent needs beside the reason code."""
    from notifications.delivery.routing import sms_sender

    r = n.recipient
    if reason == Reason.PHONE_INVALID:
        return f"{Reason(reason).label}: {r.phone_invalid_reason}{_since(r.phone_invalid_at)}"
    if reason == Reason.EMAIL_INVALID:
        return f"{Reason(reason).label}: {r.email_invalid_reason}{_since(r.email_invalid_at)}"
    if reason == Reason.OPTED_OUT_CATEGORY:
        return f"{Reason(reason).label} ({n.category} on {n.channel})"
    if reason == Reason.OPTED_OUT_TYPE:
        return f"{Reason(reason).label} ({n.notification_type_id} on {n.channel})"
    if reason == Reason.SMS_STOPPED:
        return f"{Reason(reason).label} ({(kind.sms_from if kind is not None else '') or sms_sender()})"
    return Reason(reason).label


def _since(at: datetime | None) -> str:
    """`` since 2026-12-02 07:00 UTC``, or ``""`` when the mark has no instant (set by hand, or older
    data): a missing instant never crashes the checks of the row."""
    return f" since {at:%Y-%m-%d %H:%M} UTC" if at is not None else ""


def quiet_hours_end(n: Notification, now: datetime) -> datetime | None:
    """End of the recipient's quiet window (UTC) if ``now`` falls inside it, else None."""
    try:
        prefs = n.recipient.preferences
    except Preferences.DoesNotExist:
        return None
    if prefs.quiet_start is None or prefs.quiet_end is None:
        return None
    tz, invalid = quiet_zone(prefs.quiet_timezone, n.recipient.timezone)
    if invalid:
        log.warning("notification %s: stored zone(s) %s of %s are not IANA zones; quiet hours in %s",
                    n.pk, invalid, n.recipient_id, tz.key)
        metrics.invalid_zone_fell_back("quiet_hours", len(invalid))
    return window_end(now, prefs.quiet_start, prefs.quiet_end, tz)
