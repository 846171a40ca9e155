"""The sender allow-list in the admin (:mod:`notifications.senders`, docs/TYPES.md "Senders"): which
From / Reply-To addresses, email domains and SMS numbers notification types may name, globally or
for one API client. Only superusers change it (no staff group has the add/change/delete
permissions, :mod:`campaigns.roles`): the product role defines types and may only read the list,
so no one who writes a type also widens its senders."""

from __future__ import annotations

from django.contrib import admin

from notifications.admin.clients import ClientByPrefix
from notifications.senders import AllowedSender
from preferences.admin_guard import ContentLookupGuard


class ForFilter(admin.SimpleListFilter):
    """Global entries or one client's, without a lookup on the client's id (it carries the key's hash)."""

    title = "for"
    parameter_name = "for"

    def lookups(self, request, model_admin):
        return [("global", "every client"), ("client", "one client")]

    def queryset(self, request, queryset):
        if self.value() in ("global", "client"):
            return queryset.filter(client__isnull=self.value() == "global")
        return queryset


@admin.register(AllowedSender)
class AllowedSenderAdmin(ContentLookupGuard, ClientByPrefix, admin.ModelAdmin):
    list_display = ("channel", "value", "client", "note", "created_at")
    list_filter = ("channel", ForFilter)
    search_fields = ("value", "client__name", "note")
    fields = ("channel", "value", "client", "note")
    list_select_related = ("client",)
