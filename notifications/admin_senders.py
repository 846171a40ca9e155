"""The sender allow-list in the admin (:mod:`notifications.senders`, docs/TYPES.md "Senders"): which
From / Reply-To addresses, email domains and SMS numbers notification types may name, globally or
for one API client. Only superusers change it (no staff group has the add/change/delete
permissions, :mod:`campaigns.roles`): the product role defines types and may only read the list,
so no one who writes a type also widens its senders."""

from __future__ import annotations

from django.contrib import admin

from notifications.senders import AllowedSender


@admin.register(AllowedSender)
class AllowedSenderAdmin(admin.ModelAdmin):
    list_display = ("channel", "value", "client", "note", "created_at")
    list_filter = ("channel", ("client", admin.EmptyFieldListFilter))
    search_fields = ("value", "client__name", "note")
    fields = ("channel", "value", "client", "note")
    list_select_related = ("client",)
