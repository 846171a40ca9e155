"""Status webhooks in the admin (docs/WEBHOOKS.md, "Support"): each client's endpoints, their
deliveries with every attempt (status code, latency, error), and a replay of chosen deliveries.

Endpoints are created by their client through the API (only it can receive the secret, which no
page shows) and deleted by it there; a superuser may disable or re-enable one and edit its
description. Support reads everything and replays deliveries
(``notifications.replay_webhookdelivery``, campaigns/roles.py).
"""

from __future__ import annotations

from django.contrib import admin, messages

from core import clock
from notifications.admin.base import ReadOnly
from notifications.admin.clients import ClientByPrefix
from notifications.webhooks import delivery
from notifications.webhooks.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from preferences.admin_guard import ContentLookupGuard


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ContentLookupGuard, ClientByPrefix, admin.ModelAdmin):
    list_display = ("url", "client", "active", "disabled_reason", "failing_since", "created_at")
    list_filter = ("active",)
    search_fields = ("url", "client__name", "description")
    list_select_related = ("client",)
    fields = ("client", "url", "events", "description", "active", "disabled_reason", "disabled_at", "failing_since",
              "created_at", "updated_at")
    readonly_fields = ("client", "url", "events", "disabled_at", "failing_since", "created_at", "updated_at")

    def has_add_permission(self, request):
        return False  # the client registers it through the API, which answers the secret once

    def has_change_permission(self, request, obj=None):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        # Its client deletes it through the API (set-based, notifications/webhooks/retention.py); the
        # admin's confirmation page would list every delivery of a busy endpoint. Disable it here.
        return False

    def save_model(self, request, obj, form, change):
        if "active" in form.changed_data:
            obj.disabled_at = None if obj.active else obj.disabled_at or clock.now()
            if obj.active:
                obj.failing_since = None
                obj.disabled_reason = ""
            elif not obj.disabled_reason:
                obj.disabled_reason = f"disabled by {request.user.get_username()}"
        super().save_model(request, obj, form, change)


class AttemptInline(ReadOnly, admin.TabularInline):
    model = WebhookAttempt
    fields = ("number", "created_at", "http_status", "latency_ms", "error", "retry_at")
    readonly_fields = fields
    extra = 0


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnly, admin.ModelAdmin):
    list_display = ("created_at", "event_type", "endpoint", "state", "attempts", "last_http_status",
                    "next_attempt_at", "delivered_at")
    list_filter = ("state", "event_type")
    search_fields = ("=notification_id", "=endpoint__url")
    list_select_related = ("endpoint",)
    fields = ("id", "endpoint", "event_type", "notification_id", "state", "attempts", "next_attempt_at",
              "give_up_at", "last_http_status", "last_error", "delivered_at", "created_at", "payload")
    readonly_fields = fields
    inlines = [AttemptInline]
    actions = ["replay"]

    def has_replay_permission(self, request):
        return request.user.has_perm("notifications.replay_webhookdelivery")

    @admin.action(description="Replay selected deliveries now (same webhook-id; a fresh retry window)",
                  permissions=["replay"])
    def replay(self, request, queryset):
        done = delivery.replay(queryset)
        if done.due or not (done.disabled or done.already_due):
            self.message_user(request, f"{_deliveries(done.due)} due again now.", messages.SUCCESS)
        if done.disabled:
            urls = ", ".join(done.disabled_endpoints)
            self.message_user(request, f"{_deliveries(done.disabled)} not sent now, endpoint disabled: {urls}. "
                                       "Pending until a superuser re-enables it.", messages.WARNING)
        if done.already_due:
            self.message_user(request, f"{_deliveries(done.already_due)} "
                                       f"{'was' if done.already_due == 1 else 'were'} already due: unchanged.",
                              messages.INFO)


def _deliveries(n: int) -> str:
    return f"{n} deliver{'y' if n == 1 else 'ies'}"
