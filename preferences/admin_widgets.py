"""Opt-outs edited with checkboxes in the admin, not as raw JSON.

* ``opt_outs`` (``["sms", …]``): one checkbox per channel (:func:`channel_checkboxes`).
* ``category_opt_outs`` (``{category: [channel…]}``): a grid, one row per category and one checkbox
  per channel (:class:`CategoryOptOutsField`). The rows are the categories of
  ``settings.PREFERENCE_CATEGORIES``, then the recipient's other categories, then
  :data:`BLANK_ROWS` empty rows where a support agent types another category name.

The form still validates the result with the API's own serializer (category names, channels).
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

    def rows(self, value: dict[str, list[str]]) -> list[tuple[str, list[str], bool]]:
        """``(category, channels, fixed)`` per row; ``fixed`` rows have a name that is not edited."""
        known = list(dict.fromkeys(getattr(settings, "PREFERENCE_CATEGORIES", ["marketing"])))
        names = known + sorted(k for k in value if k not in known)
        return [(n, value.get(n, []), True) for n in names] + [("", [], False)] * BLANK_ROWS

    def render(self, name, value, attrs=None, renderer=None):
        rows = self.rows(normalize(value))
        head = format_html_join("", "<th>{}</th>", ((label,) for _, label in Channel.choices))
        body = format_html_join("", '<tr data-category="{}"><td>{}</td>{}</tr>', (
            (category, self._name_cell(f"{name}-{i}-category", category, fixed),
             self._boxes(f"{name}-{i}-channels", category, checked))
            for i, (category, checked, fixed) in enumerate(rows)))
        element_id = (attrs or {}).get("id", "")
        return format_html('<table class="category-opt-outs" id="{}"><thead><tr><th>Category</th>{}</tr></thead>'
                           '<tbody>{}</tbody></table><input type="hidden" name="{}-rows" value="{}">',
                           element_id, head, body, name, len(rows))

    @staticmethod
    def _name_cell(field: str, category: str, fixed: bool):
        if fixed:
            return format_html('<input type="hidden" name="{}" value="{}"><code>{}</code>', field, category, category)
        return format_html('<input type="text" name="{}" value="" maxlength="64" size="16" '
                           'placeholder="another category" aria-label="another category">', field)

    @staticmethod
    def _boxes(field: str, category: str, checked: list[str]):
        return format_html_join("", '<td><input type="checkbox" name="{}" value="{}"{} aria-label="{}: {}"></td>', (
            (field, channel, " checked" if channel in checked else "", category or "another category", label)
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
