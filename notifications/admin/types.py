"""Notification types in the admin, for the staff who define them (the ``product`` group,
:mod:`campaigns.roles`; docs/OPERATIONS.md "Staff roles").

The list; the change page with the type's fields and its templates as rows, validated together by
the API's rules (:mod:`notifications.admin.type_forms`) and saved through :func:`services.save_type`;
below it the channel × locale matrix (:func:`channel_matrix`) and a preview rendered by the
send-time code (:func:`notifications.events.content.preview`). A ``high`` type is defined, changed
or deleted only with ``notifications.define_high_priority_type``; a type events use is never deleted.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.urls import reverse
from django.utils.html import format_html

from notifications.admin.type_forms import PreviewForm, TemplateForm, TemplateFormSet, TypeForm
from notifications.events import services
from notifications.events.content import ChannelPreview, preview
from notifications.events.models import NotificationType, TypeTemplate
from notifications.models import Priority
from notifications.rendering import pick_variant
from preferences.admin_guard import ContentLookupGuard

HIGH_PERMISSION = "notifications.define_high_priority_type"
HIDDEN = "•••• (sensitive type: shown only to staff who may change it)"


def may_define_high(user) -> bool:
    """Whether ``user`` may give a type priority ``high``, or change or delete a high one."""
    return user.has_perm(HIGH_PERMISSION)


# --- the matrix ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    """One channel × locale: ``exact`` (a template of that locale), else the locale of the template
    a recipient of that locale gets (``falls_back_to``), or neither (the channel has none)."""

    exact: bool
    falls_back_to: str = ""


@dataclass(frozen=True)
class MatrixRow:
    channel: str
    cells: list[Cell]
    missing: bool  # a channel of the type with no template: each of its sends fails (template_error)
    extra: bool  # templates for a channel the type does not use (never sent)


@dataclass(frozen=True)
class Matrix:
    locales: list[str]
    rows: list[MatrixRow]


def channel_matrix(kind: NotificationType) -> Matrix:
    """The saved templates of ``kind`` as channels (the type's, in order, then any other channel that
    has templates) × locales (the default locale first, then every locale a template has, sorted);
    each cell per :class:`Cell`, the fallback computed by :func:`pick_variant` as a send does."""
    by_channel: dict[str, list[TypeTemplate]] = {}
    for template in kind.templates.all():
        by_channel.setdefault(template.channel, []).append(template)
    found = sorted({t.locale for ts in by_channel.values() for t in ts} - {kind.default_locale})
    locales = [kind.default_locale, *found]
    channels = [*kind.channels, *sorted(set(by_channel) - set(kind.channels))]
    rows = []
    for channel in channels:
        variants = by_channel.get(channel, [])
        have = {v.locale.lower() for v in variants}
        cells = []
        for locale in locales:
            if locale.lower() in have:
                cells.append(Cell(exact=True))
            else:
                chosen = pick_variant(variants, locale, kind.default_locale)
                cells.append(Cell(exact=False, falls_back_to=chosen.locale if chosen else ""))
        rows.append(MatrixRow(channel, cells, missing=not variants and channel in kind.channels,
                              extra=channel not in kind.channels))
    return Matrix(locales, rows)


# --- the admin -------------------------------------------------------------------------------------

class TypeTemplateInline(admin.StackedInline):
    model = TypeTemplate
    form = TemplateForm
    formset = TemplateFormSet
    fields = [("channel", "locale"), "title", "body", "html", "data"]
    verbose_name = "template"
    verbose_name_plural = "Templates (per channel and locale; every channel of the type needs one)"

    def get_extra(self, request, obj=None, **kwargs):
        return 0 if obj is not None else 1


@admin.register(NotificationType)
class NotificationTypeAdmin(ContentLookupGuard, admin.ModelAdmin):
    form = TypeForm
    inlines = [TypeTemplateInline]
    list_display = ["key", "name", "category", "priority", "channel_list", "routing", "quiet_hours", "required",
                    "updated_at"]
    list_filter = ["category", "priority", "routing", "quiet_hours", "required", "sensitive"]
    search_fields = ["key", "name"]
    search_help_text = "Key or name (contains)."
    ordering = ["key"]
    change_form_template = "admin/notifications/notificationtype/change_form.html"
    fieldsets = [
        (None, {"fields": ["key", "name", "description", "category"]}),
        ("Delivery", {"fields": ["priority", "channels", "routing", "quiet_hours", "in_app_quiet_hours", "required",
                                 "sensitive",
                                 "ttl_seconds"]}),
        ("Content", {"fields": ["default_locale", "required_data", "collapse_key"],
                     "description": "Templates are sandboxed Jinja2 over the recipient ({{ user_id }}, {{ email }}, "
                                    "{{ locale }}, {{ timezone }}, their attributes such as {{ first_name }}) and "
                                    "the event's data ({{ data.tracking_url }}); rendered when each notification "
                                    "is sent, so a saved fix applies to those still queued."}),
        ("Digest (empty: every event is sent on its own)", {
            "fields": ["digest"],
            "description": 'A JSON object, e.g. {"window_seconds": 600, "key": "{{ data.post_id }}"}: a user\'s '
                           "events of one key within the window (60 to 86,400 s from the first) are sent as one "
                           "notification when it ends; templates then see {{ items }} (the events' data in "
                           "order), {{ count }}, {{ first }} and {{ last }}."}),
        ("Senders (empty: the provider's defaults)", {"fields": ["sms_from", "email_from", "email_reply_to"]}),
        ("Owner and history", {"fields": ["owner", "created_at", "updated_at", "events_link"]}),
    ]

    def get_readonly_fields(self, request, obj=None):
        fixed = ["owner", "created_at", "updated_at", "events_link"]
        return ["key", *fixed] if obj is not None else fixed

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("client")

    # --- permissions ---

    def has_change_permission(self, request, obj=None):
        return super().has_change_permission(request, obj) and (
            obj is None or obj.priority != Priority.HIGH or may_define_high(request.user))

    def has_delete_permission(self, request, obj=None):
        """Only a type no event or notification refers to (they keep it), and a high one only with
        the high permission."""
        if not super().has_delete_permission(request, obj):
            return False
        if obj is None:
            return True
        return (obj.priority != Priority.HIGH or may_define_high(request.user)) and not (
            obj.events.exists() or obj.notifications.exists())

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # one at a time, on the page that says whether it is in use
        return actions

    def formfield_for_choice_field(self, db_field, request, **kwargs):
        if db_field.name == "priority" and not may_define_high(request.user):
            kwargs["choices"] = [(Priority.STANDARD, Priority.STANDARD.label)]
        return super().formfield_for_choice_field(db_field, request, **kwargs)

    # --- saving: one call, the type and exactly its templates ---

    def save_model(self, request, obj, form, change):
        """Nothing here: :meth:`save_related` saves the type with its templates in one service call."""

    def save_formset(self, request, form, formset, change):
        """Nothing here either (see :meth:`save_related`)."""

    def save_related(self, request, form, formsets, change):
        [templates] = [f for f in formsets if isinstance(f, TemplateFormSet)]
        fields, rows = templates.validated
        kind, _created = services.save_type(form.instance.pk, fields, rows, client=None)
        form.instance.created_at, form.instance.updated_at = kind.created_at, kind.updated_at
        # What the admin log's change message lists (construct_change_message reads these).
        kept = [f for f in templates.initial_forms if not templates._should_delete_form(f)]
        templates.new_objects = [f.instance for f in templates.extra_forms
                                 if f.has_changed() and not templates._should_delete_form(f)]
        templates.changed_objects = [(f.instance, f.changed_data) for f in kept if f.has_changed()]
        templates.deleted_objects = [f.instance for f in templates.initial_forms if templates._should_delete_form(f)]

    # --- display ---

    @admin.display(description="Channels")
    def channel_list(self, obj):
        return ", ".join(obj.channels)

    @admin.display(description="Owner")
    def owner(self, obj):
        if obj is None or not obj.client_id:
            return "— (defined in the admin)"
        return (f"API client {obj.client.name}: it defined this type through the API; its next PUT replaces what "
                "is saved here")

    @admin.display(description="Events")
    def events_link(self, obj):
        if obj is None or obj.pk is None:
            return "—"
        url = reverse("admin:notifications_event_changelist") + "?" + urlencode({"type__key__exact": obj.pk})
        return format_html('<a href="{}">Events of this type</a>', url)

    def get_fieldsets(self, request, obj=None):
        if obj is None:  # no owner or history yet
            return self.fieldsets[:-1]
        fieldsets = [(name, {**options, "fields": list(options["fields"])}) for name, options in self.fieldsets]
        if not request.user.has_perm("notifications.view_event"):
            fieldsets[-1][1]["fields"].remove("events_link")
        return fieldsets

    # --- the matrix and the preview ---

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra = {}
        kind = self.get_object(request, unquote(object_id)) if request.method == "GET" else None
        if kind is not None and self.has_view_or_change_permission(request, kind):
            extra["matrix"] = channel_matrix(kind)
            extra.update(self._preview(request, kind))
            if kind.priority == Priority.HIGH and not may_define_high(request.user):
                messages.info(request, "A high-priority type is changed only by staff with the permission "
                                       f"{HIGH_PERMISSION}.")
        return super().change_view(request, object_id, form_url, {**extra, **(extra_context or {})})

    def _preview(self, request, kind: NotificationType) -> dict:
        """``preview_form`` (and ``previews``: ``[(channel, ChannelPreview)]``) for the change page;
        only for staff who may view recipients (a preview shows a recipient's attributes)."""
        if not request.user.has_perm("preferences.view_recipient"):
            return {}
        if "preview_user" not in request.GET:
            return {"preview_form": PreviewForm(kind=kind)}
        form = PreviewForm(request.GET, kind=kind)
        if not form.is_valid():
            return {"preview_form": form}
        shown = preview(kind, form.cleaned_data["preview_user"], form.cleaned_data["preview_data"])
        if kind.sensitive and not self.has_change_permission(request, kind):
            shown = {channel: ChannelPreview(locale=p.locale, title=HIDDEN, body=HIDDEN, error=p.error and HIDDEN)
                     for channel, p in shown.items()}
        return {"preview_form": form, "previews": list(shown.items())}
