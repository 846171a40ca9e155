"""What ``GET /v1/events/{id}`` and ``GET /v1/events/{id}/recipients`` answer: an event as a bounded
summary (counts per outcome and per channel and status) with the first page of its recipients, and
the keyset-paginated listing of its recipients, each with their notifications and timelines.

An event holds up to 1,000 users with a notification per channel each: read whole, one answer was
2.5 MB and took seconds (docs/PERFORMANCE.md, "API reads and writes at their bounds"). A page is
:data:`FIRST_PAGE` users in the detail, and ``limit`` (core.api.pagination) in the listing, in
``user_id`` order; the detail's ``recipients_next_cursor`` is the listing's ``cursor``.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from django.db.models import Count
from rest_framework import serializers

from core.api.pagination import Ordering, page
from notifications import records
from notifications.api.serializers import EventSerializer as TimelineSerializer
from notifications.events.digests import digests_of
from notifications.events.models import DigestItem, Event
from notifications.models import TimelineEntry, log_of, user_outcome
from preferences.models import Recipient

#: How many recipients the event's detail shows (the rest: ``GET /v1/events/{id}/recipients``).
FIRST_PAGE = 10
#: The recipients' order: by user id (the primary key; unique, so the order is total).
BY_USER = Ordering(("pk",))

#: How every answer writes an instant (DRF's: UTC with "Z"; None stays None).
ISO = serializers.DateTimeField().to_representation


class EventNotificationDetailSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    channel = serializers.CharField()
    status = serializers.CharField()
    reason = serializers.CharField()
    reason_detail = serializers.CharField()
    sent_at = serializers.DateTimeField(allow_null=True)
    delivered_at = serializers.DateTimeField(allow_null=True)
    timeline = TimelineSerializer(many=True)


class EventDigestDetailSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    key = serializers.CharField()
    state = serializers.ChoiceField(choices=["open", "closed"])
    opened_at = serializers.DateTimeField()
    closes_at = serializers.DateTimeField()
    closed_at = serializers.DateTimeField(allow_null=True)
    items = serializers.IntegerField(help_text="How many events it holds (so far, while open).")


OUTCOMES = ("reached", "pending", "not_reached", "unknown")


class EventRecipientSerializer(serializers.Serializer):
    user_id = serializers.CharField()
    digest = EventDigestDetailSerializer(allow_null=True, help_text="A digest type's event: the digest it went "
                                                                    "into; `notifications` are the digest's (made "
                                                                    "when it closes; none while it is open).")
    outcome = serializers.ChoiceField(choices=OUTCOMES,
                                      help_text="`reached`: a channel sent it; `pending`: not decided yet; "
                                                "`not_reached`: every channel ended without sending (see reasons); "
                                                "`unknown`: none sent among the notifications left, and the "
                                                "history may have dropped the others (`history_expired`).")
    notifications = EventNotificationDetailSerializer(many=True)


class EventOutcomeCountsSerializer(serializers.Serializer):
    reached = serializers.IntegerField()
    pending = serializers.IntegerField()
    not_reached = serializers.IntegerField()
    unknown = serializers.IntegerField()


class EventSummarySerializer(serializers.Serializer):
    users = serializers.IntegerField(help_text="How many users the event was sent to.")
    outcomes = EventOutcomeCountsSerializer(help_text="Users per outcome (as each recipient's `outcome`).")
    channels = serializers.DictField(child=serializers.DictField(child=serializers.IntegerField()),
                                     help_text="Notifications per channel and status: `{\"push\": {\"sent\": 998, "
                                               "\"failed\": 2}}` (a digest type's: its digests' notifications).")


class EventDetailSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    type = serializers.CharField()
    created_at = serializers.DateTimeField()
    scheduled_at = serializers.DateTimeField(allow_null=True)
    ttl_seconds = serializers.IntegerField(allow_null=True)
    collapse_key = serializers.CharField()
    cancelled_at = serializers.DateTimeField(allow_null=True)
    data = serializers.DictField(allow_null=True, help_text="The event's data; null for a sensitive type.")
    history_expired = serializers.BooleanField(
        help_text="True once the notification history's retention may have dropped some of the event's "
                  "notifications (created more than RETENTION_NOTIFICATIONS_DAYS + HOT_HOURS ago): a user "
                  "whose notifications left show no send reads `unknown`, not `not_reached`.")
    summary = EventSummarySerializer()
    recipients = EventRecipientSerializer(many=True, help_text=f"The first {FIRST_PAGE} users by `user_id`; "
                                                               "the rest: `GET /v1/events/{id}/recipients`.")
    recipients_next_cursor = serializers.CharField(
        allow_null=True, help_text="Pass as `cursor` to `GET /v1/events/{id}/recipients` for the users after "
                                   "`recipients`; null when they are all.")


#: A user's outcome over their notifications (EventRecipientSerializer.outcome): the one rule.
outcome_of = user_outcome


def expired(event: Event) -> bool:
    """Whether the history may have dropped some of ``event``'s notifications (the one rule:
    :func:`notifications.records.history_expired`)."""
    return records.history_expired(event.created_at)


def _rows(event: Event, into: dict, users: list[str] | None = None):
    """The notifications of ``event`` (only ``users``' when given) and of the digests ``into``, live or
    archived (:func:`notifications.records.of_event`)."""
    return records.of_event(event, users, [pk for d in into.values() for pk in d.notification_ids()])


def summary(event: Event) -> dict:
    """Counts per outcome and per channel and status, over the event's users (at most 1,000, with a
    notification per channel each: one query of three short columns)."""
    into = digests_of(event)
    statuses: dict[str, list[str]] = defaultdict(list)
    channels: dict[str, Counter] = defaultdict(Counter)
    for user, channel, status in _rows(event, into).values_list("recipient_id", "channel", "status"):
        statuses[user].append(status)
        channels[channel][status] += 1
    gone = expired(event)
    outcomes = Counter("pending" if user in into and not into[user].closed_at else outcome_of(statuses[user], gone)
                       for user in dict.fromkeys(event.user_ids))
    order = {c: i for i, c in enumerate(event.channels)}
    return {"users": len(set(event.user_ids)), "outcomes": {o: outcomes[o] for o in OUTCOMES},
            "channels": {c: dict(sorted(channels[c].items()))
                         for c in sorted(channels, key=lambda c: (order.get(c, len(order)), c))}}


def recipients_query(event: Event):
    """The event's users as a queryset in :data:`BY_USER` order's terms (for :func:`page`)."""
    return Recipient.objects.filter(pk__in=event.user_ids).only("pk")


def recipients_listing(event: Event) -> tuple[str, str]:
    """What a cursor of the event's users is bound to (:mod:`core.cursors`): the detail's
    ``recipients_next_cursor`` reads on in ``GET /v1/events/{id}/recipients`` of this event only."""
    return ("event_recipients", str(event.pk))


def recipients_body(event: Event, users: list[str]) -> list[dict]:
    """Each of ``users`` (a page of the event's) with their outcome, digest and notifications in the
    event's channel order, each with its timeline: a fixed number of queries whatever the page."""
    if not users:
        return []
    into = digests_of(event, users)
    rows = list(_rows(event, into, users).only("id", "recipient_id", "channel", "status", "reason", "reason_detail",
                                               "sent_at", "delivered_at", "created_at"))
    entries: dict = defaultdict(list)
    found = list(log_of(TimelineEntry, rows))
    for entry, shown in zip(found, TimelineSerializer(found, many=True).data, strict=True):
        entries[entry.notification_id].append(shown)
    by_user: dict[str, list] = {u: [] for u in users}
    for n in rows:
        by_user.setdefault(n.recipient_id, []).append(n)
    order = {c: i for i, c in enumerate(event.channels)}
    counts = dict(DigestItem.objects.filter(digest__in=list(into.values())).values("digest")
                  .annotate(n=Count("id")).values_list("digest", "n")) if into else {}
    iso = ISO
    gone = expired(event)
    recipients = []
    for user, notes in by_user.items():
        notes.sort(key=lambda n: order.get(n.channel, 9))
        digest = into.get(user)
        recipients.append({"user_id": user, "outcome": "pending" if digest and not digest.closed_at else
                           outcome_of((n.status for n in notes), gone), "digest": None if digest is None else {
            "id": str(digest.pk), "key": digest.key, "state": digest.state, "opened_at": iso(digest.opened_at),
            "closes_at": iso(digest.closes_at), "closed_at": iso(digest.closed_at),
            "items": counts.get(digest.pk, 0)}, "notifications": [
            {"id": str(n.pk), "channel": n.channel, "status": n.status, "reason": n.reason,
             "reason_detail": n.reason_detail, "sent_at": iso(n.sent_at), "delivered_at": iso(n.delivered_at),
             "timeline": entries[n.pk]} for n in notes]})
    return recipients


def event_body(event: Event) -> dict:
    """The event's detail (:class:`EventDetailSerializer`): bounded whatever its number of users."""
    first, next_cursor = page(recipients_query(event), BY_USER, limit=FIRST_PAGE, cursor=None,
                              listing=recipients_listing(event))
    iso = ISO
    return {"id": str(event.pk), "type": event.type_id, "created_at": iso(event.created_at),
            "scheduled_at": iso(event.scheduled_at), "ttl_seconds": event.ttl_seconds,
            "collapse_key": event.collapse_key, "cancelled_at": iso(event.cancelled_at),
            "data": None if event.sensitive or event.type.sensitive else event.data,
            "history_expired": expired(event), "summary": summary(event),
            "recipients": recipients_body(event, [r.pk for r in first]), "recipients_next_cursor": next_cursor}
