"""The in-app inbox in the admin, for support (docs/APP.md): what a user has in their inbox and what
they did with it (seen, read, archived), next to their notifications.

:class:`InboxItemAdmin`: a read-only list (``?recipient=<user id>``) and a page per item with its
content as support sees a notification's (never a sensitive one; content never filtered or
searched: ``InboxItem.content_fields``). On the recipient page (appended by
:mod:`notifications.admin`): the badge counts and the newest :data:`RECIPIENT_INBOX_LIMIT` items'
state, no content. Both need ``notifications.view_inboxitem`` (the ``support`` role).
"""

from __future__ import annotations

import uuid
from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import OuterRef, Subquery
from django.urls import reverse
from django.utils.html import format_html

from notifications import records
from notifications.admin.base import HIDDEN, EstimatedCountPaginator, ReadOnly, ReadOnlyFormSet
from notifications.admin.time import INSTANTS_JS, instant_display
from notifications.inbox.models import InboxCounts, InboxItem
from preferences.admin_guard import ContentLookupGuard

RECIPIENT_INBOX_LIMIT = 50
VIEW = "notifications.view_inboxitem"


def _state(obj) -> str:
    parts = [name for name, at in (("archived", obj.archived_at), ("read", obj.read_at), ("seen", obj.seen_at)) if at]
    return ", ".join(parts) or "new"


@admin.register(InboxItem)
class InboxItemAdmin(ReadOnly, ContentLookupGuard, admin.ModelAdmin):
    list_display = ["item", "recipient_id", "type_key", "category", "state", "created", "expires"]
    search_fields = ["=recipient__user_id"]
    search_help_text = "Exact user id, or the notification id."
    ordering = ["-created_at"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    readonly_fields = ["notification_link", "recipient_link", "type_key", "category", "state", "shown_title",
                       "shown_body", "shown_data", "created", "seen", "read", "archived", "expires"]
    fieldsets = [
        ("Item", {"fields": ["notification_link", "recipient_link", "type_key", "category", "state"]}),
        ("Content (as the app shows it)", {"fields": ["shown_title", "shown_body", "shown_data"]}),
        ("Times (UTC, and your browser's zone)", {"fields": ["created", "seen", "read", "archived", "expires"]}),
    ]
    created = instant_display("created_at", "Created")
    seen = instant_display("seen_at", "Seen")
    read = instant_display("read_at", "Read")
    archived = instant_display("archived_at", "Archived")
    expires = instant_display("expires_at", "Expires")

    class Media:
        js = [INSTANTS_JS]

    def get_queryset(self, request):
        # Its notification's sensitive flag wherever it lives (archived: the history; an INNER JOIN on
        # the live table would drop the item).
        sensitive = records.records().filter(pk=OuterRef("pk")).values("sensitive")[:1]
        return super().get_queryset(request).annotate(notification_sensitive=Subquery(sensitive))

    def get_search_results(self, request, queryset, search_term):
        try:
            return queryset.filter(pk=uuid.UUID(search_term.strip())), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)

    @admin.display(description="Item", ordering="notification_id")
    def item(self, obj):
        return str(obj.pk)

    @admin.display(description="State")
    def state(self, obj):
        return _state(obj)

    @admin.display(description="Notification")
    def notification_link(self, obj):
        url = reverse("admin:notifications_notification_change", args=[obj.pk])
        return format_html('<a href="{}">{}</a>', url, obj.pk)

    @admin.display(description="Recipient")
    def recipient_link(self, obj):
        url = reverse("admin:preferences_recipient_change", args=[quote(obj.recipient_id)])
        return format_html('<a href="{}">{}</a>', url, obj.recipient_id)

    def _content(self, obj, field):
        # Unknown (its notification past retention): hidden, as a sensitive one's.
        return getattr(obj, field) if obj.notification_sensitive is False else HIDDEN

    @admin.display(description="Title")
    def shown_title(self, obj):
        return self._content(obj, "title")

    @admin.display(description="Body")
    def shown_body(self, obj):
        return self._content(obj, "body")

    @admin.display(description="Data")
    def shown_data(self, obj):
        return self._content(obj, "data")


class InboxCountsFormSet(ReadOnlyFormSet):
    """Never bound to the recipient page's POST (that saves the preferences), never saving."""

    @classmethod
    def get_default_prefix(cls):
        return "inbox_counts"


class NewestInboxItems(ReadOnlyFormSet):
    """The recipient's newest RECIPIENT_INBOX_LIMIT items, archived ones included (inlines cannot
    slice their queryset: filtered to those ids); never bound to the page's POST, never saving."""

    @classmethod
    def get_default_prefix(cls):
        return "inbox_items"

    def get_queryset(self):
        if not hasattr(self, "_newest"):
            qs = super().get_queryset().order_by("-created_at", "-notification_id")
            ids = list(qs.values_list("pk", flat=True)[:RECIPIENT_INBOX_LIMIT])
            self._newest = qs.filter(pk__in=ids)
        return self._newest


class RecipientInboxCountsInline(ReadOnly, admin.TabularInline):
    """The badge numbers on the recipient page, with a link to every item of the user."""

    model = InboxCounts
    formset = InboxCountsFormSet
    fields = readonly_fields = ("unseen", "unread", "total", "all_items")
    extra = 0
    can_delete = False
    verbose_name = "inbox counts"
    verbose_name_plural = "Inbox counts (the app's badge: items not archived)"

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(VIEW)

    @admin.display(description="Items")
    def all_items(self, obj):
        url = reverse("admin:notifications_inboxitem_changelist") + "?" + urlencode({"recipient": obj.pk})
        return format_html('<a href="{}" class="recipient-inbox-link">Every inbox item of {}</a>', url, obj.pk)


class RecipientInboxInline(ReadOnly, admin.TabularInline):
    """Read-only, on the recipient page: the newest inbox items with their state; no content (each
    links to its item page, which shows it)."""

    model = InboxItem
    formset = NewestInboxItems
    fields = readonly_fields = ("created", "type_key", "category", "state", "seen", "read", "archived", "expires")
    extra = 0
    can_delete = False
    show_change_link = True
    verbose_name = "inbox item"
    verbose_name_plural = f"Inbox (newest {RECIPIENT_INBOX_LIMIT}, archived included)"
    created = instant_display("created_at", "Created")
    seen = instant_display("seen_at", "Seen")
    read = instant_display("read_at", "Read")
    archived = instant_display("archived_at", "Archived")
    expires = instant_display("expires_at", "Expires")

    class Media:
        js = [INSTANTS_JS]

    def has_view_permission(self, request, obj=None):
        return request.user.has_perm(VIEW)

    @admin.display(description="State")
    def state(self, obj):
        return _state(obj)
