"""Digests in the admin, for support (docs/TYPES.md, "Digests"): a read-only list (user, type, key,
window, items, state, notifications) and a page per digest with its events in order and its
notifications' outcomes. Readable by whoever may read events (``notifications.view_event``: the
``support`` role), since a digest is part of what its events became.

Imported by :mod:`notifications.admin` (Django's autodiscovery loads the package); the outcome
helpers it shares with the events page are :mod:`notifications.admin.outcomes`.
"""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import Count
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from notifications import records
from notifications.admin.base import EstimatedCountPaginator, ReadOnly
from notifications.admin.outcomes import ChannelOutcome, outcome_list
from notifications.admin.time import INSTANTS_JS, instant_display
from notifications.events.models import Digest, DigestItem
from preferences.admin_guard import ContentLookupGuard

#: Items listed on a digest's page (its count is always the whole).
ITEMS_SHOWN = 100


def digest_outcomes(digest: Digest, link: bool):
    """The digest's notifications as support reads them (channel: status — reason), or a line saying
    it is still open."""
    if digest.closed_at is None:
        return format_html("open: its notifications are made when its window ends ({})",
                           digest.closes_at.isoformat())
    rows = {n.pk: n for n in records.records().filter(pk__in=digest.notification_ids())}
    return outcome_list([ChannelOutcome(rows[pk]) for pk in digest.notification_ids() if pk in rows], link)


class EventAccess:
    """Admin mixin: readable by whoever may read events."""

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("notifications.view_event")

    def has_module_permission(self, request):
        return request.user.has_perm("notifications.view_event")


@admin.register(Digest)
class DigestAdmin(ContentLookupGuard, EventAccess, ReadOnly, admin.ModelAdmin):
    """Read-only: digests are opened by events and closed by the scheduler."""

    list_display = ["id", "recipient", "type", "key_shown", "window_seconds", "items_count", "state_shown", "opened",
                    "notifications_shown"]
    list_filter = ["type", ("closed_at", admin.EmptyFieldListFilter)]
    search_fields = ["=recipient__user_id"]
    search_help_text = "User id (exact)."
    ordering = ["-opened_at"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = readonly_fields = ("id", "recipient", "type", "key_shown", "window_seconds", "channels", "routing",
                                "opened", "closes", "closed", "items_count", "items_shown", "notifications_shown")
    opened = instant_display("opened_at", "Opened")
    closes = instant_display("closes_at", "Window ends")
    closed = instant_display("closed_at", "Closed")

    class Media:
        js = [INSTANTS_JS]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("type").annotate(items_n=Count("items"))

    @admin.display(description="Key", ordering="key")
    def key_shown(self, obj):
        return obj.shown_key

    @admin.display(description="Items")
    def items_count(self, obj):
        return getattr(obj, "items_n", obj.item_count)

    @admin.display(description="State", ordering="closed_at")
    def state_shown(self, obj):
        return obj.state

    @admin.display(description="Notifications")
    def notifications_shown(self, obj):
        return digest_outcomes(obj, link=True)

    @admin.display(description=f"Events (in order; first {ITEMS_SHOWN})")
    def items_shown(self, obj):
        items = DigestItem.objects.filter(digest=obj).order_by("id").values_list("event_id", "created_at")
        return format_html_join("", '<div><a href="{}">{}</a> {}</div>', (
            (reverse("admin:notifications_event_change", args=[quote(str(e))]), e, at.isoformat())
            for e, at in items[:ITEMS_SHOWN])) or "—"


def event_digests(event, link: bool):
    """The digests an event went into (on its admin page): each linked, with its state, item count and
    its notifications' outcomes."""
    found = list(Digest.objects.filter(pk__in=DigestItem.objects.filter(event=event).values("digest"))
                 .select_related("type").annotate(items_n=Count("items"))
                 .order_by("recipient_id")[:ITEMS_SHOWN])
    if not found:
        return "—"
    return format_html_join("", "<div>{}: <a href=\"{}\">digest {}</a> [{}] {}, {} item(s): {}</div>", (
        (d.recipient_id, reverse("admin:notifications_digest_change", args=[d.pk]), d.pk, d.shown_key, d.state,
         d.items_n, digest_outcomes(d, link)) for d in found))
