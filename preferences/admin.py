"""Recipients with their preferences, devices and notifications, for support agents.

The ``support`` group (see :mod:`campaigns.roles`) sees a recipient read-only except the preferences,
which it edits on the user's behalf: ``preferences.change_preferences`` alone opens the page for
saving, with the recipient's own fields (contacts) read-only. Every save goes to the admin log
(LogEntry on the recipient, naming the preference fields changed).
"""

from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from core.identifiers import text_problem, user_id_problem
from preferences.admin_guard import ContentLookupGuard
from preferences.admin_widgets import CategoryOptOutsField, TypeOptOutsField, channel_checkboxes
from preferences.api.serializers import PreferencesSerializer
from preferences.models import Device, Erasure, Preferences, Recipient, Unsubscribe
from preferences.validation import phone_search_term, validate_iana_zone


def _messages(detail) -> list[str]:
    """Flatten a DRF error structure into its messages."""
    if isinstance(detail, dict):
        return [m for value in detail.values() for m in _messages(value)]
    if isinstance(detail, list):
        return [m for value in detail for m in _messages(value)]
    return [str(detail)]


class PreferencesForm(forms.ModelForm):
    """The API's rules (``PUT /v1/users/{id}/preferences``) for edits made in the admin: channels from
    sms/email/push, category keys as on sends, notification type keys as types are keyed, quiet hours
    as a start/end pair in an IANA zone. Opt-outs are checkboxes (per channel, per category and
    channel, per notification type and channel), see
    :mod:`preferences.admin_widgets`."""

    opt_outs = channel_checkboxes()
    category_opt_outs = CategoryOptOutsField()
    type_opt_outs = TypeOptOutsField()

    class Meta:
        model = Preferences
        fields = ["opt_outs", "category_opt_outs", "type_opt_outs", "quiet_start", "quiet_end", "quiet_timezone"]
        # Plain HH:MM inputs: the admin's clock widget would offer "Now" in the server's zone and
        # note the viewer's offset from it, but quiet hours are wall times in the quiet-hours zone.
        widgets = {"quiet_start": forms.TimeInput(format="%H:%M", attrs={"size": 6}),
                   "quiet_end": forms.TimeInput(format="%H:%M", attrs={"size": 6})}
        help_texts = {
            "quiet_start": "Local wall time (HH:MM) in the quiet-hours zone; the window may cross midnight.",
            "quiet_timezone": "IANA zone; empty: the recipient's zone, then UTC.",
        }

    def clean(self):
        cleaned = super().clean()
        start, end = cleaned.get("quiet_start"), cleaned.get("quiet_end")
        if (start is None) != (end is None) and not {"quiet_start", "quiet_end"} & set(self.errors):
            self.add_error("quiet_end" if end is None else "quiet_start", "Quiet hours need both a start and an end.")
        if self.errors:
            return cleaned
        quiet = None
        if start is not None:
            quiet = {"start": start.strftime("%H:%M"), "end": end.strftime("%H:%M"),
                     "timezone": cleaned.get("quiet_timezone") or ""}
        opt_outs = cleaned.get("opt_outs")
        categories = cleaned.get("category_opt_outs")
        types = cleaned.get("type_opt_outs")
        serializer = PreferencesSerializer(data={"opt_outs": [] if opt_outs is None else opt_outs,
                                                 "category_opt_outs": {} if categories is None else categories,
                                                 "type_opt_outs": {} if types is None else types,
                                                 "quiet_hours": quiet})
        if not serializer.is_valid():
            fields = {"opt_outs": "opt_outs", "category_opt_outs": "category_opt_outs",
                      "type_opt_outs": "type_opt_outs"}
            quiet_fields = {"start": "quiet_start", "end": "quiet_end", "timezone": "quiet_timezone"}
            for key, detail in serializer.errors.items():
                if key == "quiet_hours" and isinstance(detail, dict):
                    for sub, sub_detail in detail.items():
                        for message in _messages(sub_detail):
                            self.add_error(quiet_fields.get(sub), message)
                else:
                    for message in _messages(detail):
                        self.add_error(fields.get(key), message)
            return cleaned
        if self.errors:
            return cleaned
        data = serializer.validated_data
        cleaned["opt_outs"] = sorted(set(data["opt_outs"]))
        cleaned["category_opt_outs"] = {k: sorted(set(v)) for k, v in data["category_opt_outs"].items()}
        cleaned["type_opt_outs"] = {k: sorted(set(v)) for k, v in data["type_opt_outs"].items()}
        return cleaned


class PreferencesInline(admin.StackedInline):
    model = Preferences
    form = PreferencesForm
    can_delete = False
    fields = ["opt_outs", "category_opt_outs", "type_opt_outs", "quiet_start", "quiet_end", "quiet_timezone"]


class DeviceInline(admin.TabularInline):
    model = Device
    extra = 0
    fields = ["platform", "push_token", "active", "deactivated_reason", "deactivated_at", "registered_at"]
    readonly_fields = ["deactivated_at", "registered_at"]


@admin.register(Erasure)
class ErasureAdmin(ContentLookupGuard, admin.ModelAdmin):
    list_display = ["recipient", "erased_at", "requested_by", "notifications_erased", "notifications_cancelled",
                    "devices_deleted", "segment_memberships_removed"]
    search_fields = ["=recipient__user_id", "requested_by"]
    date_hierarchy = "erased_at"
    readonly_fields = [f.name for f in Erasure._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the record of an erasure is kept

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Unsubscribe)
class UnsubscribeAdmin(ContentLookupGuard, admin.ModelAdmin):
    """Opt-outs made through emails' unsubscribe links (docs/TYPES.md "Unsubscribe"): read only, the
    record of how a recipient left a category (the opt-out itself is on their preferences)."""

    list_display = ["recipient", "category", "channel", "source", "campaign_id", "at"]
    list_filter = ["source", "channel", "category"]
    search_fields = ["=recipient__user_id"]
    date_hierarchy = "at"
    readonly_fields = [f.name for f in Unsubscribe._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class RecipientForm(forms.ModelForm):
    """The recipient's own fields, with the API's zone rule (``PUT /v1/users/{id}``): an IANA zone
    name or empty; ``America``, ``Mars/Olympus`` or ``+03:00`` are refused with the reason."""

    class Meta:
        model = Recipient
        fields = ["user_id", "email", "phone", "timezone", "locale", "attributes", "email_invalid_reason",
                  "phone_invalid_reason"]

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if "user_id" in self.fields:  # taken as given, as the API takes it: never trimmed
            self.fields["user_id"].strip = False

    def clean_user_id(self) -> str:
        """The ``/v1/users/{user_id}`` rule: a recipient made here must be reachable there."""
        value = self.cleaned_data["user_id"]
        problem = user_id_problem(value)
        if problem:
            raise forms.ValidationError(f"A user id {problem}.")
        return value

    def clean_attributes(self):
        """The API's rule for attribute values (:class:`core.api.fields.TextField`): no invisible
        character but the ones text needs; line breaks and tabs allowed."""
        value = self.cleaned_data.get("attributes")
        for name, text in (value or {}).items() if isinstance(value, dict) else ():
            problem = text_problem(text, multiline=True) if isinstance(text, str) else ""
            if problem:
                raise forms.ValidationError(f"The attribute {name!r} {problem}.", code=getattr(problem, "code", None))
        return value if value is not None else {}  # an empty box is no attributes, not NULL

    def clean_timezone(self) -> str:
        value = (self.cleaned_data.get("timezone") or "").strip()
        return validate_iana_zone(value) if value else ""


@admin.register(Recipient)
class RecipientAdmin(ContentLookupGuard, admin.ModelAdmin):
    form = RecipientForm
    list_display = ["user_id", "email", "phone", "timezone", "locale", "email_invalid_reason",
                    "phone_invalid_reason", "created_at"]
    search_fields = ["=user_id", "=phone", "email"]
    search_help_text = "Exact user id, or phone in international format (+49 151 1234 5678); email (contains)."
    readonly_fields = ["created_at", "updated_at", "email_invalid_at", "phone_invalid_at", "erasure_history"]
    #: notifications/admin/__init__.py appends the recipient's notifications, events and inbox
    #: (RecipientNotificationInline, RecipientEventInline, the inbox inlines).
    inlines = [PreferencesInline, DeviceInline]
    show_full_result_count = False

    def get_search_results(self, request, queryset, search_term):
        phone = phone_search_term(search_term)
        if phone is not None:
            # Typed with spaces or dashes: compare the E.164 form, as stored (indexed).
            return queryset.filter(Q(phone=phone) | Q(user_id=search_term.strip())), False
        return super().get_search_results(request, queryset, search_term)

    # --- support: preferences editable, the recipient's own fields not ---

    @staticmethod
    def _may_change_contacts(request) -> bool:
        return request.user.has_perm("preferences.change_recipient")

    def has_change_permission(self, request, obj=None):
        # Saving the page is how the preferences inline is saved: change_preferences is enough.
        return super().has_change_permission(request, obj) or request.user.has_perm("preferences.change_preferences")

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None and not self._may_change_contacts(request):
            own = [f.name for f in self.model._meta.fields]  # all of them, in the model's order
            fields = own + [f for f in fields if f not in own]
        if obj is not None and request.user.has_perm("notifications.view_notification"):
            fields.append("notifications_link")
        return fields

    def save_model(self, request, obj, form, change):
        if change and not self._may_change_contacts(request):
            return  # only the inlines (preferences) can have changed: leave the recipient row alone
        super().save_model(request, obj, form, change)

    @admin.display(description="Personal-data erasures")
    def erasure_history(self, obj):
        """Who erased this recipient's personal data and when (DELETE /v1/users/{id}), shown to whoever may
        view the recipient (support), so "why is this user empty?" has its answer on the page."""
        erasures = list(obj.erasures.order_by("-erased_at")[:20]) if obj is not None and obj.pk else []
        if not erasures:
            return "none"
        return format_html_join(
            "", "<div>{} UTC by {}: {} notification(s) emptied, {} cancelled, {} device(s), "
                "{} segment membership(s)</div>",
            ((f"{e.erased_at:%Y-%m-%d %H:%M:%S}", e.requested_by, e.notifications_erased, e.notifications_cancelled,
              e.devices_deleted, e.segment_memberships_removed) for e in erasures))

    @admin.display(description="All notifications")
    def notifications_link(self, obj):
        url = reverse("admin:notifications_notification_changelist") + "?" + urlencode({"recipient__user_id": obj.pk})
        return format_html('<a href="{}" id="recipient-notifications-link">Every notification of {} '
                           "(filter by status, channel, priority, reason, date)</a>", url, obj.pk)


@admin.register(Device)
class DeviceAdmin(ContentLookupGuard, admin.ModelAdmin):
    list_display = ["recipient", "platform", "active", "deactivated_reason", "registered_at"]
    list_filter = ["platform", "active"]
    search_fields = ["=recipient__user_id", "=push_token"]
    raw_id_fields = ["recipient"]
