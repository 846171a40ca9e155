"""The admin's opt-out checkboxes (preferences/admin_widgets.py) over generated preferences and edits:
the form is rendered, "a browser" posts it back (text and hidden inputs as they are, checkboxes only
when checked) after ticking and unticking boxes and typing a new category, and the saved value is
exactly what the boxes said."""

from __future__ import annotations

from html.parser import HTMLParser

from django.http import QueryDict
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from preferences.admin import PreferencesForm
from preferences.models import Preferences

CHANNELS = ["sms", "email", "push"]
CATEGORY = st.from_regex(r"[a-z0-9][a-z0-9_.-]{0,15}", fullmatch=True)
CHANNEL_SETS = st.lists(st.sampled_from(CHANNELS), unique=True)


class Inputs(HTMLParser):
    """The form's <input> elements in document order: (name, type, value, checked)."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "input":
            a = dict(attrs)
            self.inputs.append({"name": a.get("name"), "type": a.get("type", "text"), "value": a.get("value") or "",
                                "checked": "checked" in a})


def inputs_of(form) -> list[dict]:
    parser = Inputs()
    parser.feed(str(form))
    return parser.inputs


def post(inputs: list[dict]) -> QueryDict:
    data = QueryDict(mutable=True)
    for i in inputs:
        if i["name"] and (i["type"] != "checkbox" or i["checked"]):
            data.appendlist(i["name"], i["value"])
    return data


def row_category(inputs: list[dict], name: str) -> str | None:
    """The category of the grid row a ``…-<i>-channels`` checkbox belongs to ("" for the blank row)."""
    category_field = name.rsplit("-", 1)[0] + "-category"
    return next((i["value"] for i in inputs if i["name"] == category_field), None)


@hsettings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(opt_outs=CHANNEL_SETS, categories=st.dictionaries(CATEGORY, CHANNEL_SETS, max_size=4),
       toggles=st.sets(st.tuples(st.integers(0, 5), st.sampled_from(CHANNELS)), max_size=6),
       channel_toggles=st.sets(st.sampled_from(CHANNELS)), new=st.one_of(st.none(), st.tuples(CATEGORY, CHANNEL_SETS)))
def test_checkboxes_save_exactly_what_is_checked(opt_outs, categories, toggles, channel_toggles, new):
    saved = Preferences(opt_outs=opt_outs, category_opt_outs=categories)
    inputs = inputs_of(PreferencesForm(instance=saved))
    grid = [i for i in inputs if i["type"] == "checkbox" and i["name"].startswith("category_opt_outs-")]
    rows = sorted({i["name"] for i in grid}, key=lambda n: int(n.split("-")[1]))

    # Shown as saved: every stored (category, channel) is a checked box, nothing else is.
    shown = {(row_category(inputs, i["name"]), i["value"]) for i in grid if i["checked"]}
    assert shown == {(c, ch) for c, chs in categories.items() for ch in chs}
    assert {i["value"] for i in inputs if i["name"] == "opt_outs" and i["checked"]} == set(opt_outs)

    # The agent's edits: tick/untick boxes of existing rows and channels; maybe type a new category.
    expected = {c: set(chs) for c, chs in categories.items()}
    fixed_rows = [n for n in rows if row_category(inputs, n)]
    for row, channel in toggles:
        if row < len(fixed_rows):
            name = fixed_rows[row]
            box = next(i for i in grid if i["name"] == name and i["value"] == channel)
            box["checked"] = not box["checked"]
            expected.setdefault(row_category(inputs, name), set()).symmetric_difference_update({channel})
    for i in inputs:
        if i["name"] == "opt_outs" and i["value"] in channel_toggles:
            i["checked"] = not i["checked"]
    if new is not None:
        name, channels = new
        blank = next(n for n in rows if row_category(inputs, n) == "")
        next(i for i in inputs if i["name"] == blank.rsplit("-", 1)[0] + "-category")["value"] = name
        for i in grid:
            if i["name"] == blank and i["value"] in channels:
                i["checked"] = True
        if channels:
            expected.setdefault(name, set()).update(channels)

    form = PreferencesForm(data=post(inputs), instance=Preferences(opt_outs=opt_outs, category_opt_outs=categories))
    assert form.is_valid(), form.errors
    assert form.cleaned_data["opt_outs"] == sorted(set(opt_outs) ^ channel_toggles)
    assert form.cleaned_data["category_opt_outs"] == {c: sorted(chs) for c, chs in expected.items() if chs}
    assert form.has_changed() == (bool(channel_toggles) or form.cleaned_data["category_opt_outs"] != {
        c: sorted(chs) for c, chs in categories.items() if chs})
