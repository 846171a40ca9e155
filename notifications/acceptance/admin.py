"""The admin's *Acceptance limits*: rows that add abuse limits or replace the settings' by name, and
the list of every limit in force (docs/POLICIES.md, "Abuse limits")."""

from __future__ import annotations

from django.contrib import admin

from core import clock
from notifications.acceptance.models import AcceptanceLimit
from notifications.acceptance.rules import effective_rules


@admin.register(AcceptanceLimit)
class AcceptanceLimitAdmin(admin.ModelAdmin):
    list_display = ["name", "type_key", "category", "per", "limit", "window_seconds", "enabled", "updated_at"]
    list_filter = ["per", "enabled"]
    readonly_fields = ["updated_at"]
    change_list_template = "admin/notifications/acceptancelimit/change_list.html"

    def get_readonly_fields(self, request, obj=None):
        return ["name", "updated_at"] if obj is not None else ["updated_at"]

    def save_model(self, request, obj, form, change):
        obj.updated_at = clock.now()
        super().save_model(request, obj, form, change)

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {**(extra_context or {}), "effective_rules": effective_rules()})
