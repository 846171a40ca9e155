"""API clients in the admin: keys (hashed), scopes as checkboxes, rate limit; and their audit log
(every write through the API, read-only).

Imported by :mod:`notifications.admin` after its own classes (Django's autodiscovery loads it), so
registering here is registering there, and that module's paginator is already defined.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from rest_framework_api_key.admin import APIKeyModelAdmin
from rest_framework_api_key.models import APIKey

from core.api.scopes import Scope, canonical
from notifications.admin import EstimatedCountPaginator
from notifications.admin_time import INSTANTS_JS, instant_display
from notifications.models import APIAuditEntry, APIClient
from preferences.admin_guard import ContentLookupGuard

# One place for keys: the API clients below (the package's own "API keys" page would list the same
# model's parent without our fields).
if admin.site.is_registered(APIKey):
    admin.site.unregister(APIKey)


class APIClientForm(forms.ModelForm):
    """``scopes`` as one checkbox per :class:`~core.api.scopes.Scope` (stored in their canonical order)."""

    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, widget=forms.CheckboxSelectMultiple, required=False, label="Scopes",
        help_text="What this key may do. Least privilege: only what the service needs (README, API › Scopes). "
                  "notifications:send_high is the permission to send priority high.")

    class Meta:
        model = APIClient
        fields = ["name", "scopes", "rate_limit", "revoked", "expiry_date"]

    def clean_scopes(self) -> list[str]:
        return canonical(self.cleaned_data["scopes"])


@admin.register(APIClient)
class APIClientAdmin(ContentLookupGuard, APIKeyModelAdmin):
    form = APIClientForm
    list_display = [*APIKeyModelAdmin.list_display, "scopes_shown", "sends_high", "rate_limit"]

    @admin.display(description="Scopes")
    def scopes_shown(self, obj) -> str:
        return ", ".join(obj.scopes or []) or "—"

    @admin.display(description="Priority high", boolean=True)
    def sends_high(self, obj) -> bool:
        return obj.allow_high


@admin.register(APIAuditEntry)
class APIAuditEntryAdmin(ContentLookupGuard, admin.ModelAdmin):
    """The API audit log, read-only (support's and security's page): every write through the API,
    who (client), what (method, path, object, which fields changed: names, never values), when and the
    outcome. Filter by client and date; search an object id exactly."""

    list_display = ["at_instant", "client", "method", "path", "object_type", "object_id", "status", "error_code",
                    "fields_shown"]
    list_filter = ["client", ("at", admin.DateFieldListFilter), "status", "method", "object_type"]
    list_select_related = ["client"]
    search_fields = ["=object_id"]
    search_help_text = "Exact object id (user id, segment or template id, notification or campaign id)."
    ordering = ["-at", "-id"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = ["at_instant", "client", "method", "path", "object_type", "object_id", "status", "error_code",
              "fields_shown"]
    readonly_fields = fields
    at_instant = instant_display("at", "When")

    class Media:
        js = [INSTANTS_JS]

    @admin.display(description="Fields changed")
    def fields_shown(self, obj) -> str:
        return ", ".join(obj.fields) or "—"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
