"""Frequency caps in the admin (docs/POLICIES.md, "Frequency caps"): the rows that add to or
override the rules of ``settings.NOTIFY["FREQUENCY_CAPS"]`` by name, and above the list the
*effective* rules (settings and rows together, :func:`notifications.delivery.caps.rules`) with
where each comes from. A change applies to the next batch a worker decides (rules are read per
batch).

A rule that reaches what users must get (``include_high``, ``include_required``, or a category of
``QUIET_HOURS_BYPASS_CATEGORIES``: one-time codes, security alerts) is a security control, like an
abuse limit: only a superuser may save one (a product role could otherwise silence every OTP with
a limit-0 rule). :func:`must_reach_problem` says why."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from notifications.delivery.caps import rules
from notifications.models import FrequencyCap
from notifications.quiet_hours_policy import bypass_categories


def must_reach_problem(cleaned: dict) -> str:
    """Why a cap with these fields needs a superuser, or ``""``."""
    if cleaned.get("include_high") or cleaned.get("include_required"):
        return ("A cap that includes high-priority or required notifications (one-time codes, security alerts) can "
                "silence what users must get: only a superuser may save one.")
    if cleaned.get("category") in bypass_categories():
        return (f"Category '{cleaned['category']}' is sent even in quiet hours (one-time codes, security alerts): "
                "only a superuser may cap it.")
    return ""


class FrequencyCapForm(forms.ModelForm):
    class Meta:
        model = FrequencyCap
        fields = ("name", "category", "channel", "limit", "window_seconds", "active", "include_high",
                  "include_required")

    superuser = False  # set per request by FrequencyCapAdmin.get_form

    def clean(self):
        cleaned = super().clean()
        problem = must_reach_problem(cleaned)
        if problem and not self.superuser:
            raise forms.ValidationError(problem, code="needs_superuser")
        return cleaned


@admin.register(FrequencyCap)
class FrequencyCapAdmin(admin.ModelAdmin):
    list_display = ("name", "category", "channel", "limit", "window_seconds", "active", "include_high",
                    "include_required", "updated_at")
    list_filter = ("channel", "active")
    search_fields = ("name", "category")
    change_list_template = "admin/notifications/frequencycap/change_list.html"
    form = FrequencyCapForm

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        form.superuser = request.user.is_superuser
        return form

    def changelist_view(self, request, extra_context=None):
        return super().changelist_view(request, {**(extra_context or {}), "effective_rules": rules()})
