"""Opt-outs edited with checkboxes in the admin, not as raw JSON.

``opt_outs``: one checkbox per channel (:func:`channel_checkboxes`); ``category_opt_outs``: a grid
of categories × channels (:class:`CategoryOptOutsField`: ``settings.PREFERENCE_CATEGORIES``, the
recipient's own, then :data:`BLANK_ROWS` empty rows to type another); ``type_opt_outs``: the same
per notification type (:class:`TypeOptOutsField`; this floor cannot list the types, so the
recipient's own and blank rows). The form validates the result with the API's own serializer.
"""

from __future__ import annotations

import json

from django import forms
from django.conf import settings
from django.utils.html import format_html, format_html_join

from preferences.models import Channel

BLANK_ROWS = 1


def channel_checkboxes() -> forms.MultipleChoiceField:
    """The ``opt_outs`` form field: a checkbox per channel; cleans to a list of channel values."""
    return forms.MultipleChoiceField(choices=Channel.choices, widget=forms.CheckboxSelectMultiple, required=False,
                                     label="Opted out of channels",
                                     help_text="No message on a checked channel, whatever its category.")


def normalize(value) -> dict[str, list[str]]:
    """``{category: sorted channels}`` without empty entries, from a dict or its JSON text."""
    if isinstance(value, str):
        try:
            value = json.loads(value or "{}")
        except ValueError:
            return {}
    if not isinstance(value, dict):
        return {}
    return {str(k): sorted(set(v)) for k, v in value.items() if isinstance(v, list | tuple) and v}


class CategoryOptOutsWidget(forms.Widget):
    """A table: a row per category (its name, then a checkbox per channel). Posts
    ``<name>-rows``, and for each row ``<name>-<i>-category`` and ``<name>-<i>-channels`` (repeated)."""

    #: The table's class, its first column's heading, a blank row's placeholder, each row's data attribute.
    css_class = "category-opt-outs"
    heading = "Category"
    another = "another category"
    row_attribute = "data-category"

    def known_names(self) -> list[str]:
        """The rows shown even when not opted out: ``settings.PREFERENCE_CATEGORIES``."""
        return list(dict.fromkeys(getattr(settings, "PREFERENCE_CATEGORIES", ["marketing"])))

    def rows(self, value: dict[str, list[str]]) -> list[tuple[str, list[str], bool]]:
        """``(name, channels, fixed)`` per row; ``fixed`` rows have a name that is not edited."""
        known = self.known_names()
        names = known + sorted(k for k in value if k not in known)
        return [(n, value.get(n, []), True) for n in names] + [("", [], False)] * BLANK_ROWS

    def render(self, name, value, attrs=None, renderer=None):
        rows = self.rows(normalize(value))
        head = format_html_join("", "<th>{}</th>", ((label,) for _, label in Channel.choices))
        body = format_html_join("", '<tr {}="{}"><td>{}</td>{}</tr>', (
            (self.row_attribute, category, self._name_cell(f"{name}-{i}-category", category, fixed),
             self._boxes(f"{name}-{i}-channels", category, checked))
            for i, (category, checked, fixed) in enumerate(rows)))
        element_id = (attrs or {}).get("id", "")
        return format_html('<table class="{}" id="{}"><thead><tr><th>{}</th>{}</tr></thead>'
                           '<tbody>{}</tbody></table><input type="hidden" name="{}-rows" value="{}">',
                           self.css_class, element_id, self.heading, head, body, name, len(rows))

    def _name_cell(self, field: str, category: str, fixed: bool):
        if fixed:
            return format_html('<input type="hidden" name="{}" value="{}"><code>{}</code>', field, category, category)
        return format_html('<input type="text" name="{}" value="" maxlength="64" size="16" '
                           'placeholder="{}" aria-label="{}">', field, self.another, self.another)

    def _boxes(self, field: str, category: str, checked: list[str]):
        return format_html_join("", '<td><input type="checkbox" name="{}" value="{}"{} aria-label="{}: {}"></td>', (
            (field, channel, " checked" if channel in checked else "", category or self.another, label)
            for channel, label in Channel.choices))

    def value_from_datadict(self, data, files, name):
        try:
            count = int(data.get(f"{name}-rows", 0))
        except ValueError:
            count = 0
        value: dict[str, list[str]] = {}
        for i in range(min(count, 1000)):
            category = (data.get(f"{name}-{i}-category") or "").strip()
            channels = data.getlist(f"{name}-{i}-channels") if hasattr(data, "getlist") else []
            if channels:
                value.setdefault(category, []).extend(channels)
        return value

    def value_omitted_from_data(self, data, files, name):
        return f"{name}-rows" not in data

    def id_for_label(self, id_):
        return id_


class CategoryOptOutsField(forms.Field):
    """``category_opt_outs`` as a grid of checkboxes; cleans to ``{category: [channel…]}``. A checked
    box in a row without a category name gives the category ``""``, which the form's validation
    refuses with the rule for category names."""

    widget = CategoryOptOutsWidget

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        kwargs.setdefault("label", "Opted out per category")
        kwargs.setdefault("help_text", "No message of that category on a checked channel. Type a name in the "
                                       "empty row to add another category.")
        super().__init__(**kwargs)

    def to_python(self, value):
        return normalize(value)

    def has_changed(self, initial, data):
        return normalize(initial) != normalize(data)


class TypeOptOutsWidget(CategoryOptOutsWidget):
    """The grid for ``type_opt_outs``: a row per notification type the recipient opted out of, then a
    blank row for another type key (the types themselves are a floor above: not listed here)."""

    css_class = "type-opt-outs"
    heading = "Notification type"
    another = "another type"
    row_attribute = "data-type"

    def known_names(self) -> list[str]:
        return []


class TypeOptOutsField(CategoryOptOutsField):
    """``type_opt_outs`` as a grid of checkboxes; cleans to ``{type key: [channel…]}`` (a checked box
    in a row without a key gives ``""``, refused by the type-key rule)."""

    widget = TypeOptOutsWidget

    def __init__(self, **kwargs):
        kwargs.setdefault("label", "Opted out per notification type")
        kwargs.setdefault("help_text", "No message of that notification type (e.g. new_follower) on a checked "
                                       "channel; required types (security, legal) ignore it. Type a key in the "
                                       "empty row to add another; it need not exist yet.")
        super().__init__(**kwargs)
