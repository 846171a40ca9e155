"""Recipients with their preferences and devices, for support agents."""

from django.contrib import admin

from campaigns.admin import RecipientCampaignNotificationInline
from preferences.models import Device, Preferences, Recipient


class PreferencesInline(admin.StackedInline):
    model = Preferences
    can_delete = False
    fields = ["opt_outs", "category_opt_outs", "quiet_start", "quiet_end", "quiet_timezone"]


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0
    fields = ["platform", "push_token", "active", "deactivated_reason", "deactivated_at", "registered_at"]
    readonly_fields = ["deactivated_at", "registered_at"]


@admin.register(Recipient)
class RecipientAdmin(admin.ModelAdmin):
    list_display = ["user_id", "email", "phone", "timezone", "locale", "email_invalid_reason",
                    "phone_invalid_reason", "created_at"]
    search_fields = ["=user_id", "=phone", "email"]
    search_help_text = "Exact user id or E.164 phone; email (contains)."
    readonly_fields = ["created_at", "updated_at", "email_invalid_at", "phone_invalid_at"]
    inlines = [PreferencesInline, DeviceInline, RecipientCampaignNotificationInline]
    show_full_result_count = False


@admin.register(Device)
class DeviceAdmin(admin.ModelAdmin):
    list_display = ["recipient", "platform", "active", "deactivated_reason", "registered_at"]
    list_filter = ["platform", "active"]
    search_fields = ["=recipient__user_id", "=push_token"]
    raw_id_fields = ["recipient"]
