"""API clients in the admin: keys (hashed), scopes as checkboxes, rate limit.

Imported by :mod:`notifications.admin` (which Django's autodiscovery loads), so registering here is
registering there.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from rest_framework_api_key.admin import APIKeyModelAdmin
from rest_framework_api_key.models import APIKey

from notifications.models import APIClient
from notifications.scopes import Scope, canonical

# One place for keys: the API clients below (the package's own "API keys" page would list the same
# model's parent without our fields).
if admin.site.is_registered(APIKey):
    admin.site.unregister(APIKey)


class APIClientForm(forms.ModelForm):
    """``scopes`` as one checkbox per :class:`~notifications.scopes.Scope` (stored in their canonical order)."""

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
class APIClientAdmin(APIKeyModelAdmin):
    form = APIClientForm
    list_display = [*APIKeyModelAdmin.list_display, "scopes_shown", "sends_high", "rate_limit"]

    @admin.display(description="Scopes")
    def scopes_shown(self, obj) -> str:
        return ", ".join(obj.scopes or []) or "—"

    @admin.display(description="Priority high", boolean=True)
    def sends_high(self, obj) -> bool:
        return obj.allow_high
