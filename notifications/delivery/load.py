"""Load stage of the delivery pipeline (docs/ARCHITECTURE.md, "The send path"): the claimed rows
with their recipients and preferences in one query (only the columns the send path reads), and per
channel batch the SMS STOP list and the active push devices in one query each; content of campaign
rows through the content hook (content.py); for a row whose last call may have been accepted
unseen, the provider lookup (Twilio) before anything is sent again.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models.expressions import RawSQL

from core import clock
from core.compiled import Compiled
from core.postgres import array_literal
from notifications import sent_markers as markers
from notifications.delivery.content import Content, ContentError
from notifications.delivery.outcomes import AttemptRow
from notifications.delivery.record import finish
from notifications.delivery.routing import sms_sender
from notifications.delivery.types import Row
from notifications.models import DeliveryAttempt, Notification, Status, log_of
from notifications.unsubscribe import unsubscribe_url
from preferences.models import Device, SmsStop
from providers.base import OutboundMessage
from providers.registry import get_backend, provider_names

Outcome = DeliveryAttempt.Outcome

#: Columns the send path never reads (loaded lazily if a rare path does): parsing them is a good
#: share of the per-row cost of a 500-row batch.
_NOT_NEEDED_TO_SEND = ("updated_at", "queued_at", "lease_until", "due_at", "sent_at", "dead_lettered_at",
                       "delivered_at", "receipt_at", "receipt_rank", "accepted_status", "reason_detail",
                       "recipient__created_at", "recipient__updated_at", "recipient__preferences__updated_at")


#: The two SELECTs of every batch (a high-tier batch is one row), compiled once per thread: Django's
#: compile was ~28 % of an OTP's task (docs/PERFORMANCE.md, "What an OTP costs").
_ROWS = Compiled(lambda ids: Notification.objects.filter(id__in=RawSQL("SELECT unnest(%s::uuid[])", [ids]))
                 .select_related("recipient", "recipient__preferences").defer(*_NOT_NEEDED_TO_SEND), ("ids",))
_STOPPED = Compiled(lambda sender, phones: SmsStop.objects.filter(
    sender=sender, phone__in=RawSQL("SELECT unnest(%s::text[])", [phones])).values_list("phone"),
    ("sender", "phones"))


def rows(claimed: list) -> list[Notification]:
    """The claimed rows with recipient and preferences (one query)."""
    return _ROWS.models(array_literal(claimed))


def stopped_phones(batch: list[Notification]) -> set[str]:
    """The phones of ``batch`` that replied STOP to our SMS sender (one query)."""
    phones = {n.recipient.phone for n in batch if n.recipient.phone}
    if not phones:
        return set()
    return {phone for (phone,) in _STOPPED.tuples(sms_sender(), array_literal(phones))}


def devices(batch: list[Notification]) -> dict[str, list[Device]]:
    """``{recipient_id: [active devices by id]}`` for the recipients of ``batch`` (one query)."""
    found: dict[str, list[Device]] = defaultdict(list)
    recipients = {n.recipient_id for n in batch}
    for device in Device.objects.filter(recipient_id__in=recipients, active=True).order_by("recipient_id", "id"):
        found[device.recipient_id].append(device)
    return found


def message_for(row: Row, to: str, platform: str | None = None) -> OutboundMessage:
    """The OutboundMessage of ``row`` for one destination (phone, address or push token); its TTL is
    the seconds left until ``expires_at`` (at least 1); an email that carries one gets its one-click
    unsubscribe link (:mod:`notifications.unsubscribe`)."""
    n, options = row.n, row.options  # options: typed rows' (notifications.events.content.SendOptions)
    data = {str(k): str(v) for k, v in (n.data or {}).items()} or None
    ttl = None
    if n.expires_at:
        ttl = max(1, int((n.expires_at - clock.now()).total_seconds()))
    collapse = (options.collapse_key if options is not None else None) or str(n.pk)
    return OutboundMessage(
        notification_id=str(n.pk), channel=n.channel, to=to, body=n.body, title=n.title or None,
        html=n.html or None, data=data, platform=platform, ttl_seconds=ttl, priority=n.priority,
        collapse_key=collapse if n.channel == "push" else None, silent=row.silent,
        sender=options.sender if options is not None else None,
        reply_to=options.reply_to if options is not None else None,
        unsubscribe_url=(unsubscribe_url(n, required=options is not None and options.required)
                         if n.channel == "email" else None),
    )


def found_at_provider(n: Notification, content: Content) -> bool:
    """Before re-sending a row whose previous call may have been accepted unseen, ask the providers
    that offer a lookup (Twilio) whether they have it. Found → ``sent`` with the provider's id (an
    attempt ``found_by_lookup``), and True: nothing is sent again.

    Only a message created since the call in doubt started counts (:func:`call_in_doubt_since`),
    and never one recorded for another notification (the same text to the same number sent for
    another reason: an earlier OTP, a campaign run twice).

    ``in_app``: the inbox is its own exact lookup: an item for the row means the write was made.
    """
    if n.channel == "in_app":
        return _found_in_inbox(n)
    if n.channel != "sms" or not n.recipient.phone:
        return False
    since = call_in_doubt_since(n)
    options = None

    def is_taken(message_id: str) -> bool:
        return Notification.objects.filter(provider_message_id=message_id).exclude(pk=n.pk).exists()

    for name in provider_names(n.channel):
        backend = get_backend(n.channel, name)
        if not backend.supports_lookup:
            continue
        if content.needs_render(n) and not n.body:
            try:
                options = content.apply(n)
            except ContentError:
                return False
        found = backend.find_accepted(message_for(Row(n, options=options), n.recipient.phone), since,
                                      is_taken=is_taken)
        if found is None:
            continue
        now = clock.now()
        finish(n, Status.SENT, kind="sent", detail=f"found at {found.provider} ({found.provider_message_id}): "
               "the earlier call whose answer was lost had been accepted; not sent again",
               extra={"sent_at": now, "provider": found.provider, "provider_message_id": found.provider_message_id},
               attempts=[AttemptRow(n.pk, n.attempts, found.provider[:32], None, Outcome.FOUND_BY_LOOKUP.value,
                                    "", "", None, None, found.provider_message_id[:255], now)])
        markers.mark_sent([n.pk])
        return True
    return False


def _found_in_inbox(n: Notification) -> bool:
    """An ``in_app`` row re-driven after its worker died: its item written means it was sent (the
    write and the record are two steps). Found → ``sent``, an attempt ``found_by_lookup``, True."""
    from notifications.inbox.models import InboxItem

    written = InboxItem.objects.filter(pk=n.pk).values_list("created_at", flat=True).first()
    if written is None:
        return False
    finish(n, Status.SENT, kind="sent", detail="found in the user's inbox: the earlier write had been made; not "
           "written again", extra={"sent_at": written, "provider": "inbox"},
           attempts=[AttemptRow(n.pk, n.attempts, "inbox", None, Outcome.FOUND_BY_LOOKUP.value, "", "", None, None,
                                "", clock.now())])
    markers.mark_sent([n.pk])
    return True


#: Allowance for the provider's clock and its whole-second timestamps (seconds).
LOOKUP_CLOCK_SKEW_SECONDS = 2


def call_in_doubt_since(n: Notification) -> datetime:
    """When the call whose outcome is unknown may have started (UTC, minus the clock allowance):
    the start of the last ``unknown`` attempt (its end minus its latency); for a row whose worker
    lost its lease, which records no attempt, the start of the earliest attempt not accounted for
    (the first attempt, or the end of the last recorded one)."""
    last = (log_of(DeliveryAttempt, [n]).order_by("-created_at", "-id")
            .values("outcome", "created_at", "latency_ms").first())
    if last is not None and last["outcome"] == Outcome.UNKNOWN:
        started = last["created_at"] - timedelta(milliseconds=last["latency_ms"] or 0)
    elif last is not None:
        started = last["created_at"]
    else:
        started = n.first_attempt_at or n.created_at
    return started - timedelta(seconds=LOOKUP_CLOCK_SKEW_SECONDS)
