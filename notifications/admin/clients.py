"""API clients in the admin: keys (hashed), scopes as checkboxes, rate limit; and their audit log
(every write through the API, read-only).

A client's primary key is ``prefix.<SHA-512 hash of its key>``: no page, link, URL or filter shows
it (URLs land in logs; the hash is what an attacker would brute-force). The admin addresses a client
by its ``prefix``; no lookup or search reaches the id or hash (``APIClient.content_fields``,
preferences/admin_guard.py). Clients are revoked, never deleted here (docs/SECURITY.md). Imported by
:mod:`notifications.admin` (Django's autodiscovery loads the package).
"""

from __future__ import annotations

import copy

from django import forms
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import ChangeList
from django.urls import reverse
from django.utils.html import format_html
from rest_framework_api_key.admin import APIKeyModelAdmin
from rest_framework_api_key.models import APIKey

from core.api.scopes import Scope, canonical
from notifications.admin.base import EstimatedCountPaginator
from notifications.admin.time import INSTANTS_JS, PlatformDateFilter, instant_display
from notifications.models import APIAuditEntry, APIClient
from preferences.admin_guard import ContentLookupGuard

# One place for keys: the API clients below (the package's own "API keys" page would list the same
# model's parent without our fields).
if admin.site.is_registered(APIKey):
    admin.site.unregister(APIKey)


def client_label(client: APIClient | None) -> str:
    """How every admin page names an API client: ``name (prefix)``; ``—`` for none."""
    return f"{client.name} ({client.prefix})" if client is not None else "—"


class ClientChoiceField(forms.ModelChoiceField):
    """An API client chosen by its prefix (the options' values), never by its id."""

    def __init__(self, *args, **kwargs):
        kwargs["to_field_name"] = "prefix"
        super().__init__(*args, **kwargs)

    def prepare_value(self, value):
        if isinstance(value, str) and "." in value:  # an id (a form's initial value): its prefix
            return value.split(".", 1)[0]
        return super().prepare_value(value)

    def label_from_instance(self, obj) -> str:
        return client_label(obj)


class ClientByPrefix:
    """ModelAdmin mixin (before ``admin.ModelAdmin``) for a model with a foreign key to
    :class:`APIClient`: its select offers clients by prefix (:class:`ClientChoiceField`), so neither
    the page nor its view/change links carry a client's id."""

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.related_model is APIClient:
            kwargs["form_class"] = ClientChoiceField
        return super().formfield_for_foreignkey(db_field, request, **kwargs)


class APIClientForm(forms.ModelForm):
    """``scopes`` as one checkbox per :class:`~core.api.scopes.Scope` (stored in their canonical order)."""

    scopes = forms.MultipleChoiceField(
        choices=Scope.choices, widget=forms.CheckboxSelectMultiple, required=False, label="Scopes",
        help_text="What this key may do. Least privilege: only what the service needs (docs/API.md, "
                  "Authentication and scopes). "
                  "notifications:send_high is the permission to send priority high.")

    class Meta:
        model = APIClient
        fields = ["name", "scopes", "rate_limit", "revoked", "expiry_date"]

    def clean_scopes(self) -> list[str]:
        return canonical(self.cleaned_data["scopes"])


def change_url(client: APIClient) -> str:
    """The admin page of ``client``, by its prefix."""
    return reverse("admin:notifications_apiclient_change", args=[quote(client.prefix)])


def by_prefix(client: APIClient) -> APIClient:
    """A copy of ``client`` whose ``pk`` is its prefix: what Django's admin writes into URLs, messages
    and the admin log when handed an object."""
    shown = copy.copy(client)
    shown.pk = client.prefix
    return shown


class PrefixChangeList(ChangeList):
    """The list of API clients, each linked by its prefix."""

    def url_for_result(self, result):
        return change_url(result)


@admin.register(APIClient)
class APIClientAdmin(ContentLookupGuard, APIKeyModelAdmin):
    form = APIClientForm
    # rest_framework_api_key leaves list_display unannotated: mypy infers its exact 6-tuple.
    list_display = [*APIKeyModelAdmin.list_display, "scopes_shown", "sends_high", "rate_limit"]  # type: ignore[assignment]
    actions = None

    def get_changelist(self, request, **kwargs):
        return PrefixChangeList

    def get_object(self, request, object_id, from_field=None):
        """The client whose prefix is ``object_id``; ``None`` (Django's "does not exist") for anything
        else, a full id included."""
        return self.get_queryset(request).filter(prefix=object_id).first()

    def has_delete_permission(self, request, obj=None) -> bool:
        return False  # revoke instead

    def get_search_fields(self, request):
        """The list's search (name, prefix); none for the admin's autocomplete, whose answers are the
        clients' ids (404 there: the selects offer clients by prefix, :class:`ClientChoiceField`)."""
        match = getattr(request, "resolver_match", None)
        if match is not None and match.url_name == "autocomplete":
            return ()
        return super().get_search_fields(request)

    def response_add(self, request, obj, post_url_continue=None):
        return super().response_add(request, by_prefix(obj), post_url_continue)

    def log_addition(self, request, obj, message):
        return super().log_addition(request, by_prefix(obj), message)

    def log_change(self, request, obj, message):
        return super().log_change(request, by_prefix(obj), message)

    @admin.display(description="Scopes")
    def scopes_shown(self, obj) -> str:
        return ", ".join(obj.scopes or []) or "—"

    @admin.display(description="Priority high", boolean=True)
    def sends_high(self, obj) -> bool:
        return obj.allow_high


@admin.display(description="Client", ordering="client__name")
def linked_client(entry):
    """``name (prefix)``, linked to the client's page by its prefix."""
    return format_html('<a href="{}">{}</a>', change_url(entry.client), client_label(entry.client))


class ClientFilter(admin.SimpleListFilter):
    """By client: ``?client=<prefix>``, listed as ``name (prefix)``."""

    title = "client"
    parameter_name = "client"

    def lookups(self, request, model_admin):
        return [(prefix, f"{name} ({prefix})")
                for prefix, name in APIClient.objects.order_by("name", "prefix").values_list("prefix", "name")]

    def queryset(self, request, queryset):
        return queryset.filter(client__prefix=self.value()) if self.value() else queryset


@admin.register(APIAuditEntry)
class APIAuditEntryAdmin(ContentLookupGuard, admin.ModelAdmin):
    """The API audit log, read-only (support's and security's page): every write through the API,
    who (client), what (method, path, object, which fields changed: names, never values), when and the
    outcome. Filter by client and date; search an object id exactly."""

    list_display = ["at_instant", "client_shown", "method", "path", "object_type", "object_id", "status",
                    "error_code", "fields_shown"]
    list_filter = [ClientFilter, ("at", PlatformDateFilter), "status", "method", "object_type"]
    list_select_related = ["client"]
    search_fields = ["=object_id"]
    search_help_text = "Exact object id (user id, segment or template id, notification or campaign id)."
    ordering = ["-at", "-id"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = readonly_fields = ("at_instant", "client_shown", "method", "path", "object_type", "object_id", "status",
                                "error_code", "fields_shown")
    at_instant = instant_display("at", "When")

    class Media:
        js = [INSTANTS_JS]

    def get_list_display(self, request):
        """The client column linked to the client's page (by prefix) for whoever may view API clients."""
        shown = super().get_list_display(request)
        if not request.user.has_perm("notifications.view_apiclient"):
            return shown
        return [linked_client if f == "client_shown" else f for f in shown]

    @admin.display(description="Client", ordering="client__name")
    def client_shown(self, obj):
        return client_label(obj.client)

    @admin.display(description="Fields changed")
    def fields_shown(self, obj) -> str:
        return ", ".join(obj.fields) or "—"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False
