"""Events in the admin, for support: what a semantic event (``POST /v1/events``) became, per user
and channel, and why a channel was not sent (opted out, fallback not needed, quiet hours, silent).

:class:`EventAdmin`: a read-only list and a page per event with each user's notifications, a page of
users at a time; a sensitive type's data is never shown. :class:`RecipientEventInline`: the
recipient page's newest events with the same per-channel outcome. Imported by
:mod:`notifications.admin` (Django's autodiscovery loads the package).
"""

from __future__ import annotations

import json
import uuid

from django.contrib import admin
from django.contrib.admin.utils import quote, unquote
from django.core.paginator import Paginator
from django.urls import reverse
from django.utils.html import format_html

from notifications import records
from notifications.admin.base import HIDDEN, EstimatedCountPaginator, ReadOnly, ReadOnlyFormSet
from notifications.admin.digests import event_digests
from notifications.admin.outcomes import outcome_list, outcomes
from notifications.admin.time import INSTANTS_JS, PlatformDateFilter, instant, instant_display
from notifications.events.models import Event
from notifications.models import Notification
from preferences.admin_guard import ContentLookupGuard

#: Users per page on an event's page (an event has up to 1,000).
USERS_PER_PAGE = 100
#: Events on the recipient page, newest first.
RECIPIENT_EVENTS_LIMIT = 20
_OUTCOME_FIELDS = ["id", "event", "recipient", "channel", "status", "reason", "reason_detail", "created_at",
                   "due_at", "sent_at", "delivered_at"]


@admin.register(Event)
class EventAdmin(ReadOnly, ContentLookupGuard, admin.ModelAdmin):
    """Read-only: events are made through the API and cancelled there."""

    list_display = ["id", "type", "client", "users", "created", "cancelled"]
    list_filter = ["type", ("created_at", PlatformDateFilter), ("cancelled_at", admin.EmptyFieldListFilter)]
    list_select_related = ["type", "client"]
    search_fields = ["=idempotency_key"]
    search_help_text = "Event id, or idempotency key (exact)."
    ordering = ["-created_at"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    change_form_template = "admin/notifications/event/change_form.html"
    fields = readonly_fields = ("id", "type_link", "client_name", "idempotency_key", "created", "scheduled",
                                "cancelled", "channels_shown", "routing", "ttl_seconds", "collapse_key", "data_shown",
                                "users", "digests_shown")
    created = instant_display("created_at", "Created")
    scheduled = instant_display("scheduled_at", "Scheduled")
    cancelled = instant_display("cancelled_at", "Cancelled")

    class Media:
        js = [INSTANTS_JS]

    def get_search_results(self, request, queryset, search_term):
        try:
            return queryset.filter(pk=uuid.UUID(search_term.strip())), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)

    @admin.display(description="Type", ordering="type")
    def type_link(self, obj):
        url = reverse("admin:notifications_notificationtype_change", args=[quote(obj.type_id)])
        return format_html('<a href="{}">{}</a>', url, obj.type_id)

    @admin.display(description="API client")
    def client_name(self, obj):
        return obj.client.name

    @admin.display(description="Channels (routing order)")
    def channels_shown(self, obj):
        return ", ".join(obj.channels)

    @admin.display(description="Data")
    def data_shown(self, obj):
        if obj.sensitive or obj.type.sensitive:
            return HIDDEN
        return format_html('<pre class="event-data">{}</pre>', json.dumps(obj.data, indent=2, ensure_ascii=False))

    @admin.display(description="Users")
    def users(self, obj):
        shown = ", ".join(obj.user_ids[:3])
        more = f" … (+{len(obj.user_ids) - 3})" if len(obj.user_ids) > 3 else ""
        return f"{len(obj.user_ids)}: {shown}{more}"

    @admin.display(description="Digests (a digest type's event: what it went into, per user)")
    def digests_shown(self, obj):

        return event_digests(obj, link=True)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        event = self.get_object(request, unquote(object_id))
        extra = {}
        if event is not None and self.has_view_permission(request, event):
            extra = self._outcome_page(request, event)
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    def _outcome_page(self, request, event: Event) -> dict:
        """``users_page`` (a page of :data:`USERS_PER_PAGE` users, ``?users_page=``) and ``user_outcomes``:
        ``[(user id, recipient page URL, outcome HTML)]`` in the event's user order."""
        page = Paginator(event.user_ids, USERS_PER_PAGE).get_page(request.GET.get("users_page"))
        users = list(page.object_list)
        rows = list(records.of_event(event, users).only(*_OUTCOME_FIELDS))
        found = outcomes(rows, {event.pk: event.channels})
        link = request.user.has_perm("notifications.view_notification")
        gone = records.history_expired(event.created_at)
        return {"users_page": page, "history_expired": gone, "history_days": records.history_days(),
                "user_outcomes": [(user, reverse("admin:preferences_recipient_change", args=[quote(user)]),
                                   outcome_list(found.get((event.pk, user), []), link, gone)) for user in users]}


# --- support: a recipient's events (an inline of the Recipient page) ---------------------------------

class NewestEvents(ReadOnlyFormSet):
    """One row per event among the recipient's newest :data:`RECIPIENT_EVENTS_LIMIT` events (its
    first notification stands for it), each carrying ``outcomes``: the recipient's notifications of
    that event. Served by the ``(recipient, -created_at)`` index, then the event index."""

    @classmethod
    def get_default_prefix(cls):
        return "recipient_events"

    def get_queryset(self):
        if not hasattr(self, "_newest"):
            mine = super().get_queryset().filter(event__isnull=False).order_by("-created_at")
            events: list = []
            for event_id in mine.values_list("event_id", flat=True)[:RECIPIENT_EVENTS_LIMIT * 3]:
                if event_id not in events:
                    events.append(event_id)
            events = events[:RECIPIENT_EVENTS_LIMIT]
            rows = list(mine.filter(event_id__in=events).select_related("event", "notification_type")
                        .only(*_OUTCOME_FIELDS, "event__channels", "event__created_at", "event__cancelled_at",
                              "notification_type__key", "notification_type__name"))
            first = {}
            for n in sorted(rows, key=lambda n: n.created_at):
                first.setdefault(n.event_id, n)
            grouped = outcomes(rows, {e: n.event.channels for e, n in first.items()})
            qs = mine.filter(pk__in=[n.pk for n in first.values()]).select_related("event", "notification_type")
            for n in qs:  # evaluated here: the formset's rows are these objects, outcomes attached
                n.outcomes = grouped.get((n.event_id, n.recipient_id), [])
            self._newest = qs
        return self._newest


class RecipientEventInline(ReadOnly, admin.TabularInline):
    """Read-only, on the Recipient page: the recipient's newest events (type, when, and each channel's
    outcome with its reason). Shown to users with ``notifications.view_event`` (support)."""

    model = Notification
    formset = NewestEvents

    def get_queryset(self, request):
        """Live and archived rows: the recipient's events wherever their notifications live."""
        return records.records()

    fields = readonly_fields = ("event_link", "type_shown", "created", "channel_outcomes")
    extra = 0
    can_delete = False
    show_change_link = False
    verbose_name = "event"
    verbose_name_plural = (f"Events (newest {RECIPIENT_EVENTS_LIMIT}; each channel's outcome for this user; "
                           "all of an event's users: its page)")
    created = instant_display("created_at", "Created")

    class Media:
        js = [INSTANTS_JS]
        css = {"all": ["notifications/admin/recipient_events.css"]}

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm("notifications.view_event")


    @admin.display(description="Event")
    def event_link(self, obj):
        url = reverse("admin:notifications_event_change", args=[obj.event_id])
        cancelled = format_html(" <small>(cancelled {})</small>", instant(obj.event.cancelled_at)) if (
            obj.event.cancelled_at) else ""
        return format_html('<a href="{}">{}</a>{}', url, obj.event_id, cancelled)

    @admin.display(description="Type")
    def type_shown(self, obj):
        kind = obj.notification_type
        return f"{kind.key} ({kind.name})" if kind else "—"

    @admin.display(description="Per channel")
    def channel_outcomes(self, obj):
        return outcome_list(getattr(obj, "outcomes", []), link=True)
