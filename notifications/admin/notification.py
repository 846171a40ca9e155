"""Support view of notifications: find one, see its status, reason and whole timeline.

Content marked ``sensitive`` (OTP codes) is never rendered here. Notifications are read-only: the
admin is for looking, the API and the pipeline for changing. The list, a notification's page and the
recipient's notifications read live and archived rows alike (:mod:`notifications.records`); an
archived row says so. The dead letters are the live table's (an archived one expired: not replayable).
"""

from __future__ import annotations

import uuid

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.utils import quote, unquote
from django.forms.models import BaseInlineFormSet
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from notifications import records, services
from notifications.admin.base import HIDDEN, EstimatedCountPaginator, ReadOnly
from notifications.admin.time import INSTANTS_JS, PlatformDateFilter, instant_display
from notifications.models import (
    DEAD_LETTERS,
    DeadLetter,
    DeliveryAttempt,
    Notification,
    NotificationRecord,
    Status,
    TimelineEntry,
    log_of,
)
from preferences.admin_guard import ContentLookupGuard
from preferences.validation import phone_search_term

RECIPIENT_HISTORY_LIMIT = 50


class ReadOnlyInline(ReadOnly, admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False


class _LogFormSet(BaseInlineFormSet):
    """A notification's log rows (timeline, provider calls) under its page, which shows a
    :class:`NotificationRecord` (live or archived): found by its id wherever it lives, read from its
    ``created_at`` on (the day partitions before it hold none of its rows: ``models.log_of``)."""

    def __init__(self, data=None, files=None, instance=None, save_as_new=False, prefix=None, queryset=None,
                 **kwargs) -> None:
        model = self.model
        if model is not None and instance is not None and instance.pk is not None:
            queryset = log_of(model, [instance]).order_by(*model._meta.ordering)
        if isinstance(instance, NotificationRecord):
            instance = Notification(pk=instance.pk)  # the key the log rows point at; never saved
        super().__init__(data, files, instance, save_as_new, prefix, queryset, **kwargs)


class _TimelineFormSet(_LogFormSet):
    @classmethod
    def get_default_prefix(cls):
        return "events"  # the page's element ids stay what they were when it listed DeliveryEvent rows


class EventInline(ReadOnlyInline):
    """The timeline: events and the `sent` line of each accepted attempt (models.TimelineEntry)."""

    model = TimelineEntry
    formset = _TimelineFormSet
    fields = readonly_fields = ("at", "kind", "status", "reason", "detail")
    verbose_name_plural = "Timeline (state changes, receipts)"
    at = instant_display("created_at", "At")

    def has_view_permission(self, request, obj=None):
        # A view over events and attempts: readable by whoever may read the events.
        return request.user.has_perm("notifications.view_deliveryevent")


class AttemptInline(ReadOnlyInline):
    model = DeliveryAttempt
    formset = _LogFormSet
    fields = readonly_fields = ("at", "number", "provider", "device", "outcome", "error_code", "error_message",
                                "http_status", "latency_ms", "provider_message_id")
    verbose_name_plural = "Provider calls"
    at = instant_display("created_at", "At")

# The notification page's instants (UTC, and the viewer's zone in the browser), to the millisecond.
TIMES = ["created_at", "scheduled_at", "due_at", "queued_at", "lease_until", "expires_at", "sent_at",
         "delivered_at", "dead_lettered_at", "updated_at"]


@admin.register(Notification)
class NotificationAdmin(ReadOnly, ContentLookupGuard, admin.ModelAdmin):
    list_display = ["id", "recipient_id", "channel", "priority", "category", "colored_status", "reason",
                    "created_at", "sent_at", "archived"]
    list_filter = ["status", "channel", "priority", "reason", ("created_at", PlatformDateFilter)]
    search_fields = ["recipient__user_id", "recipient__email", "recipient__phone", "idempotency_key",
                     "provider_message_id"]
    search_help_text = ("User id, email, phone (international format, e.g. +49 151 1234 5678), idempotency key, "
                        "provider message id or notification id.")
    date_hierarchy = None
    ordering = ["-created_at"]
    list_select_related = ["recipient"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    inlines = [EventInline, AttemptInline]
    readonly_fields = ["id", "archived", "client_shown", "idempotency_key", "recipient_link", "channel", "priority",
                       "category", "status", "reason", "reason_detail", "shown_title", "shown_body", "shown_html",
                       "shown_data", "sensitive", "attempts_shown", "provider", "provider_message_id",
                       "campaign_id", *(f"{f}_instant" for f in TIMES)]
    fieldsets = [
        ("Status", {"fields": ["id", "archived", "status", "reason", "reason_detail", "attempts_shown", "provider",
                               "provider_message_id"]}),
        ("Recipient and request", {"fields": ["recipient_link", "channel", "priority", "category", "client_shown",
                                              "idempotency_key", "campaign_id"]}),
        ("Content", {"fields": ["sensitive", "shown_title", "shown_body", "shown_html", "shown_data"]}),
        ("Times (UTC, and your browser's zone)", {"fields": [f"{f}_instant" for f in TIMES]}),
    ]
    created_at_instant = instant_display("created_at", "Created")
    scheduled_at_instant = instant_display("scheduled_at", "Scheduled (requested send time)")
    due_at_instant = instant_display("due_at", "Due")
    queued_at_instant = instant_display("queued_at", "Queued")
    lease_until_instant = instant_display("lease_until", "Lease until")
    expires_at_instant = instant_display("expires_at", "Expires")
    sent_at_instant = instant_display("sent_at", "Sent")
    delivered_at_instant = instant_display("delivered_at", "Delivered")
    dead_lettered_at_instant = instant_display("dead_lettered_at", "Dead-lettered")
    updated_at_instant = instant_display("updated_at", "Updated")

    class Media:
        js = [INSTANTS_JS]

    def get_queryset(self, request):
        """Live and archived rows (:class:`NotificationRecord`), in the admin's order."""
        qs = records.records()
        ordering = self.get_ordering(request)
        return qs.order_by(*ordering) if ordering else qs

    @admin.display(description="Archived", boolean=True)
    def archived(self, obj):
        """Moved to the history (finished ``HOT_HOURS`` ago, docs/ARCHITECTURE.md, "Where a row lives"):
        shown as it was, changed by nothing but a late receipt or an erasure."""
        return not getattr(obj, "live", True)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            pass
        if term.startswith("+") or "@" in term:
            # Exact contact lookups use the indexes instead of a LIKE scan. A phone number may be
            # typed with spaces or dashes: it is normalised to E.164 (as stored) first.
            if term.startswith("+"):
                return queryset.filter(recipient__phone=phone_search_term(term) or term), False
            return queryset.filter(recipient__email__iexact=term), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="Status", ordering="status")
    def colored_status(self, obj):
        colors = {"delivered": "#1a7f37", "sent": "#1a7f37", "displayed": "#1a7f37", "dismissed": "#1a7f37",
                  "opened": "#1a7f37", "failed": "#cf222e", "suppressed": "#9a6700",
                  "expired": "#9a6700", "cancelled": "#6e7781"}
        return format_html('<b style="color:{}">{}</b>', colors.get(obj.status, "#0969da"), obj.status)

    @admin.display(description="Attempts")
    def attempts_shown(self, obj):
        """The attempt count with the provider calls made; "No provider call" when none was made (a
        notification suppressed, expired or cancelled before sending is claimed once but never sent)."""
        calls = log_of(DeliveryAttempt, [obj]).count()
        if calls:
            return f"{obj.attempts} ({calls} provider call{'s' if calls != 1 else ''})"
        if obj.status in (Status.SUPPRESSED, Status.EXPIRED, Status.CANCELLED):
            why = obj.get_reason_display() if obj.reason else obj.get_status_display()
            return f"No provider call ({obj.get_status_display().lower()} before sending: {why})"
        return "No provider call"

    @admin.display(description="Client")
    def client_shown(self, obj):
        """``name (prefix)``: never Django's link to the client, whose URL would carry its id (the
        key's hash; notifications/admin/clients.py)."""
        return f"{obj.client.name} ({obj.client.prefix})" if obj.client_id else "—"

    @admin.display(description="Recipient")
    def recipient_link(self, obj):
        url = reverse("admin:preferences_recipient_change", args=[quote(obj.recipient_id)])
        return format_html('<a href="{}">{}</a>', url, obj.recipient_id)

    def _content(self, obj, field):
        return HIDDEN if obj.sensitive else getattr(obj, field)

    @admin.display(description="Title / subject")
    def shown_title(self, obj):
        return self._content(obj, "title")

    @admin.display(description="Body")
    def shown_body(self, obj):
        return self._content(obj, "body")

    @admin.display(description="HTML")
    def shown_html(self, obj):
        return self._content(obj, "html")

    @admin.display(description="Data")
    def shown_data(self, obj):
        return self._content(obj, "data")


@admin.register(DeadLetter)
class DeadLetterAdmin(NotificationAdmin):
    """Dead letters: failed for a reason that needs a person. Select and replay."""

    list_display = ["id", "recipient_id", "channel", "priority", "reason", "last_error", "attempts",
                    "dead_lettered_at"]
    list_filter = ["reason", "channel", "priority", "provider"]
    ordering = ["-dead_lettered_at"]
    actions = ["replay"]

    def get_queryset(self, request):
        # The live table's: a dead letter stays live until replayed or DEAD_LETTER_DAYS old.
        qs = DeadLetter.objects.filter(DEAD_LETTERS)
        return qs.order_by(*self.get_ordering(request))

    def changelist_view(self, request, extra_context=None):
        depth = self.get_queryset(request).count()
        oldest = self.get_queryset(request).order_by("dead_lettered_at").values_list("dead_lettered_at",
                                                                                      flat=True).first()
        extra_context = {**(extra_context or {}),
                         "title": f"Dead letters: {depth}" + (f" (oldest {oldest:%Y-%m-%d %H:%M} UTC)" if oldest
                                                               else "")}
        return super().changelist_view(request, extra_context)

    @admin.display(description="Last error")
    def last_error(self, obj):
        return obj.reason_detail[:120]

    def _get_obj_does_not_exist_redirect(self, request, opts, object_id):
        """A link to a dead letter archived since (or replayed, so no longer one) goes to its
        notification page saying so, as the replay action does, instead of "Perhaps it was deleted?"."""
        try:
            pk = uuid.UUID(unquote(object_id))
        except ValueError:
            return super()._get_obj_does_not_exist_redirect(request, opts, object_id)
        live = NotificationRecord.objects.filter(pk=pk).values_list("live", flat=True).first()
        if live is None:
            return super()._get_obj_does_not_exist_redirect(request, opts, object_id)
        self.message_user(request, f"Dead letter {pk} was archived (an expired dead letter, kept as history): "
                                   "not replayable. Its notification page follows." if not live else
                          f"{pk} is no longer a dead letter (replayed or changed since). Its notification page "
                          "follows.", messages.WARNING)
        return HttpResponseRedirect(reverse("admin:notifications_notification_change", args=[quote(str(pk))],
                                            current_app=self.admin_site.name))

    @admin.action(description="Replay selected dead letters (same id; attempt budget reset)", permissions=["replay"])
    def replay(self, request, queryset):
        archived = NotificationRecord.objects.filter(
            pk__in=request.POST.getlist(helpers.ACTION_CHECKBOX_NAME), live=False).count()
        if archived:
            self.message_user(request, f"{archived} selected were archived (expired dead letters, kept as history): "
                                       "not replayed.", messages.WARNING)
        ids = list(queryset.values_list("pk", flat=True))
        refused = {}  # id → why, filled by the replay
        count = services.replay_dead_letters(ids, by=request.user.get_username(), refused=refused)
        for obj in queryset.model.objects.filter(pk__in=ids, status="queued"):
            self.log_change(request, obj, "Replayed dead letter")
        if count:
            self.message_user(request, f"Replayed {count} dead letter(s); they are queued again.")
        if refused:
            whys = "; ".join(sorted(set(refused.values())))
            self.message_user(request, f"Refused {len(refused)} dead letter(s), still dead-lettered "
                                       f"(their timeline says why): {whys}"[:1000], messages.WARNING)
        if len(ids) > count + len(refused):
            self.message_user(request, f"{len(ids) - count - len(refused)} selected were no longer replayable "
                                       "(replayed or changed meanwhile, or their fallback channel has reached the "
                                       "user).", messages.WARNING)

    def has_replay_permission(self, request):
        # Declared by the migration campaigns/0002_staff_groups (the support group has it). The
        # pages stay read-only: no change permission is needed or given.
        return request.user.has_perm("notifications.replay_deadletter")


# --- support: a recipient's notifications (an inline of the Recipient page) ---------------------------

class NewestNotifications(BaseInlineFormSet):
    """The recipient's newest RECIPIENT_HISTORY_LIMIT notifications (inlines cannot slice their
    queryset, so it is filtered to those ids; the index on ``(recipient, -created_at)`` serves it)."""

    def get_queryset(self):
        if not hasattr(self, "_newest"):
            qs = super().get_queryset().order_by("-created_at")
            ids = list(qs.values_list("pk", flat=True)[:RECIPIENT_HISTORY_LIMIT])
            self._newest = qs.filter(pk__in=ids)
        return self._newest


class RecipientNotificationInline(ReadOnly, admin.TabularInline):
    """Read-only, on the Recipient page: every notification of this person (API sends and campaign
    sends), newest first, with status and reason, each linked to its page. No content is shown.
    Shown to users with ``notifications.view_notification`` only (support, not marketing)."""

    model = Notification
    formset = NewestNotifications
    readonly_fields = ["created", "channel", "priority", "category", "status", "reason_shown", "campaign_link",
                       "campaign_id", "archived"]
    extra = 0
    can_delete = False
    show_change_link = True
    verbose_name = "notification"
    verbose_name_plural = f"Notifications (newest {RECIPIENT_HISTORY_LIMIT}; all: “All notifications” above)"

    def get_fields(self, request, obj=None):
        # The campaign as a link only for those who may open campaign pages (support may not).
        campaign = "campaign_link" if request.user.has_perm("campaigns.view_campaign") else "campaign_id"
        return ["created", "channel", "priority", "category", "status", "reason_shown", campaign, "archived"]

    created = instant_display("created_at", "Created")

    class Media:
        js = [INSTANTS_JS]

    def get_queryset(self, request):
        """Live and archived rows: the recipient's history wherever it lives."""
        return records.records()

    archived = NotificationAdmin.archived

    @admin.display(description="Campaign")
    def campaign_link(self, obj):
        if obj.campaign_id is None:
            return "—"
        url = reverse("admin:campaigns_campaign_change", args=[obj.campaign_id])
        return format_html('<a href="{}">{}</a>', url, obj.campaign_id)

    @admin.display(description="Reason")
    def reason_shown(self, obj):
        if not obj.reason:
            return "—"
        shown = format_html("<code>{}</code>: {}", obj.reason, obj.get_reason_display())
        return format_html("{} ({})", shown, obj.reason_detail) if obj.reason_detail else shown


def dead_letter_depth() -> int:
    """Count of dead letters (for the admin index banner)."""
    return DeadLetter.objects.filter(DEAD_LETTERS).count()
