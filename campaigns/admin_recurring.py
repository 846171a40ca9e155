"""CampaignAdmin's part for recurring campaigns (docs/RECURRING.md): the schedule's fields, its next
occurrences (DST-correct), its runs with their outcomes, a run's series, and the Pause / Resume
actions (Cancel is the campaigns' own action)."""

from __future__ import annotations

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from campaigns import admin_views, recurrence, runs, selectors
from campaigns.models import Campaign
from core import clock

SCHEDULE_DEFINITION = ["schedule_rule", "schedule_start", "schedule_timezone"]
SERIES_FIELDS = ["next_occurrences", "runs_list"]
RUN_OF_SERIES_FIELDS = ["series_link", "occurrence_at", "skip_reason"]
#: Occurrences and runs a series' page lists.
SHOWN_OCCURRENCES, SHOWN_RUNS = 10, 20
RECURRING_DESCRIPTION = (
    'Leave empty for a one-off campaign. An RFC 5545 RRULE ("FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0", COUNT or a '
    'local UNTIL without Z ends it), the first occurrence\'s wall time (2030-03-04T09:00:00) and an IANA zone, or '
    '"recipient" for each recipient\'s own zone. Each occurrence sends a run; at least one hour between occurrences. '
    "docs/RECURRING.md.")


class RecurringAdminMixin:
    """Displays and actions of recurring campaigns, mixed into CampaignAdmin."""

    def recurring_fieldsets(self, obj: Campaign | None) -> list:
        """The "Recurring" section: the definition (a new campaign or a series), the next occurrences
        and runs (a launched series), or the series a run belongs to."""
        if obj is not None and obj.series_id is not None:
            return [("Run of a recurring campaign", {"fields": RUN_OF_SERIES_FIELDS})]
        if obj is not None and not obj.is_recurring and obj.status != "draft":
            return []
        fields = list(SCHEDULE_DEFINITION) + (SERIES_FIELDS if obj is not None and obj.is_recurring else [])
        return [("Recurring", {"fields": fields, "description": RECURRING_DESCRIPTION})]

    @admin.display(description="Next occurrences")
    def next_occurrences(self, obj: Campaign):
        if not obj.is_recurring:
            return "—"
        occurrences = recurrence.upcoming(obj, SHOWN_OCCURRENCES, clock.now())
        if not occurrences:
            return "—"
        return format_html_join(mark_safe("<br>"), "{} local ({})", (
            (f"{o.wall:%Y-%m-%d %H:%M}", admin_views.utc(o.at)) for o in occurrences))

    @admin.display(description="Runs (latest first)")
    def runs_list(self, obj: Campaign):
        latest = list(obj.runs.order_by("-occurrence_at")[:SHOWN_RUNS])
        if not latest:
            return "—"
        counts = selectors.counts_for(latest)
        return format_html_join(mark_safe("<br>"), '<a href="{}">{}</a>: {}{} · {}', (
            (reverse("admin:campaigns_campaign_change", args=[r.pk]), admin_views.utc(r.occurrence_at),
             r.get_status_display(), f" ({r.skip_reason})" if r.skip_reason else "",
             admin_views.outcome_summary(counts[r.pk]["outcome"])) for r in latest))

    @admin.display(description="Series")
    def series_link(self, obj: Campaign):
        return format_html('<a href="{}">{}</a>', reverse("admin:campaigns_campaign_change", args=[obj.series_id]),
                           obj.series)

    def _series_action(self, request, queryset, action, verb: str) -> None:
        for campaign in queryset:
            if not self._may_send(request, campaign):
                messages.error(request, f"{campaign}: not {verb}: a high-priority campaign needs the permission "
                                        "campaigns.send_high_priority.")
                continue
            try:
                action(campaign.pk)
            except (runs.NotRecurring, runs.WrongStatus) as exc:
                messages.warning(request, f"{campaign}: not {verb}: {exc}.")
                continue
            self.log_change(request, campaign, verb.capitalize() + ".")
            messages.success(request, f"{campaign}: {verb}.")

    @admin.action(description="Pause selected recurring campaigns", permissions=["change"])
    def pause_selected(self, request, queryset):
        self._series_action(request, queryset, runs.pause, "paused")

    @admin.action(description="Resume selected recurring campaigns (missed occurrences are skipped)",
                  permissions=["change"])
    def resume_selected(self, request, queryset):
        self._series_action(request, queryset, runs.resume, "resumed")
