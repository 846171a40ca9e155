"""An event's outcome per channel as support reads it (the event page, the recipient's events, a
digest's page)."""

from __future__ import annotations

from dataclasses import dataclass

from django.urls import reverse
from django.utils.html import format_html, format_html_join

from notifications.models import DeliveryEvent, NotificationRecord, log_of


@dataclass(frozen=True)
class ChannelOutcome:
    """One notification of an event as support reads it: its channel, status, reason (code and
    words) and reason detail, and the ``silent`` timeline event's detail when it went as a silent push."""

    notification: NotificationRecord
    silent: str = ""

    @property
    def channel(self) -> str:
        return self.notification.channel

    def html(self, link: bool):
        """``push: sent (silent push: …)`` / ``email: scheduled — quiet_hours: Deferred…: until …``."""
        n = self.notification
        head = (format_html('<a href="{}">{}</a>', reverse("admin:notifications_notification_change", args=[n.pk]),
                            n.channel) if link else n.channel)
        reason = ""
        if n.reason:
            reason = format_html(" — <code>{}</code>: {}", n.reason, n.get_reason_display())
            if n.reason_detail:
                reason = format_html("{} ({})", reason, n.reason_detail)
        silent = format_html(" — silent push: {}", self.silent) if self.silent else ""
        return format_html('<span class="outcome outcome-{}">{}: <b>{}</b>{}{}</span>', n.channel, head, n.status,
                           reason, silent)


def outcomes(rows: list[NotificationRecord], orders: dict) -> dict[tuple, list[ChannelOutcome]]:
    """``{(event id, user id): [ChannelOutcome]}`` for ``rows``, each event's channels in its order
    (``orders``: ``{event id: [channel]}``), with the ``silent`` timeline events of those rows (one query)."""
    silent = dict(log_of(DeliveryEvent, rows).filter(kind="silent")
                  .values_list("notification_id", "detail"))
    grouped: dict[tuple, list[ChannelOutcome]] = {}
    for n in rows:
        grouped.setdefault((n.event_id, n.recipient_id), []).append(ChannelOutcome(n, silent.get(n.pk, "")))
    for (event_id, _user), found in grouped.items():
        rank = {channel: i for i, channel in enumerate(orders.get(event_id, []))}
        found.sort(key=lambda o: rank.get(o.channel, len(rank)))
    return grouped


#: What a user without notifications shows once the history may have dropped them.
EXPIRED = "history expired: no notification kept"


def outcome_list(found: list[ChannelOutcome], link: bool, history_expired: bool = False):
    """A user's channels one a line; none: "—", or :data:`EXPIRED` once the history may have dropped
    them (:func:`notifications.records.history_expired`), never read as "not reached"."""
    if not found:
        return EXPIRED if history_expired else "—"
    return format_html_join("", "<div>{}</div>", ((o.html(link),) for o in found))
