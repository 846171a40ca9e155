"""Frequency caps in the admin (docs/POLICIES.md, "Frequency caps"): the rows that add to or
override the rules of ``settings.NOTIFY["FREQUENCY_CAPS"]`` by name, and above the list the
*effective* rules (settings and rows together, :func:`notifications.delivery.caps.rules`) with
where each comes from. A change applies to the next batch a worker decides (rules are read per
batch)."""

from __future__ import annotations

from django.contrib import admin

from notifications.delivery.caps import rules
from notifications.models import FrequencyCap


@admin.register(FrequencyCap)
class FrequencyCapAdmin(admin.ModelAdmin):
    list_display = ("name", "category", "channel", "limit", "window_seconds", "active", "include_high",
                    "include_required", "updated_at")
    list_filter = ("channel", "active")
    search_fields = ("name", "category")
    change_list_template = "admin/notifications/frequencycap/change_list.html"

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {**(extra_context or {}), "effective_rules": rules()})
