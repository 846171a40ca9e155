"""Render bounds count the *total* size of what an operation reads or makes (hardening review,
finding 1; notifications/rendering/sizes.py, render_calls.py): a short template can make a small value that
stands for a huge one (``[[1] * 10000] * 10000``: two lists, 100,000,000 items to ``str()``), and the
work a filter, operator or method then does in C cannot be interrupted by the CPU bound. Every such
operation is sized before it runs; these tests assert the exact refusal, that the huge value was
never built (peak memory of the render, traced), and, for the reported bombs at full size, that
they were refused by the size or iteration bound (before any work), not by the CPU bound after it.
Plus generated nested constructions (Hypothesis) against the CPU bound: the render thread's CPU
time, which a busy neighbour does not stretch as it does wall time.

In-process (Django test client for the API); production bounds (the settings' defaults).
"""

from __future__ import annotations

import json
import time
import tracemalloc

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.urls import reverse
from hypothesis import HealthCheck, event, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from campaigns.models import Template, TemplateVariant
from campaigns.selectors import render_template
from notifications.models import APIClient
from notifications.rendering import Rendered, RenderError, _compiled, render_strings
from notifications.rendering.budget import MADE_PER_OUTPUT, limits
from preferences.models import Recipient
from tests.conftest import MARKETING_SCOPES

CTX = {"first_name": "Ada", "user_id": "u1"}
#: What the issue reported: 10,000 references to one list of 10,000 items, written as text.
BOMB = "{{ ([[1]*10000]*10000)|string|length }}"


def render_traced(source: str, html: bool = False) -> tuple[Exception | Rendered, int, float]:
    """(the RenderError or the result, peak bytes allocated by the render, wall seconds); the
    template is compiled before tracing starts."""
    _compiled(source, html)
    tracemalloc.start()
    started = time.monotonic()
    try:
        outcome = render_strings("", "" if html else source, source if html else "", CTX)
    except RenderError as exc:
        outcome = exc
    finally:
        elapsed = time.monotonic() - started
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return outcome, peak, elapsed


def refused(source: str, bound: str, fragment: str, *, peak_below: int = 2_000_000) -> RenderError:
    """Render ``source`` traced and check it was refused by ``bound`` before the value was built.
    For a bound other than ``time`` the CPU bound is raised out of reach: tracemalloc on a busy
    machine can spend the default 0.1 s first, and the refusal must come from the bound named."""
    cpu = settings.CAMPAIGNS.get("RENDER_CPU_MS", 100) if bound == "time" else 60_000
    with override_settings(CAMPAIGNS={**settings.CAMPAIGNS, "RENDER_CPU_MS": cpu}):
        outcome, peak, _elapsed = render_traced(source)
    assert isinstance(outcome, RenderError), (source, outcome)
    assert (outcome.bound, fragment in str(outcome)) == (bound, True), str(outcome)
    assert peak < peak_below, f"{source}: {peak:,} bytes allocated: the value was built before it was refused"
    return outcome


# --- the reported bomb, at full size ------------------------------------------------------------------

def test_the_reported_bomb_fails_at_once_when_sent(db):
    template = Template.objects.create(template_id="bomb", name="Bomb")
    TemplateVariant.objects.create(template=template, locale="en", body=BOMB)  # the ORM: no save-time check
    with pytest.raises(RenderError) as caught:
        render_template(template, list(template.variants.all()), Recipient.objects.create(user_id="alice"))
    # Refused by the iteration bound (before anything was built), not by the CPU bound after 0.1 s
    # of work: "at once" without timing it.
    assert caught.value.bound == "iterations"
    assert "counting those of nested lists and every repeated reference" in str(caught.value)


def test_the_api_refuses_the_reported_bomb_at_once(db):
    _, key = APIClient.objects.create_key(name="marketing-tool", scopes=list(MARKETING_SCOPES))
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    r = http.put("/v1/templates/x", data=json.dumps({"name": "X", "default_locale": "en", "variants": [
        {"locale": "en", "body": BOMB}]}), content_type="application/json")
    assert r.status_code == 422, r.content
    [error] = r.json()["error"]["fields"]
    assert (error["field"], error["code"]) == ("variants.0.body", "render_bound")
    assert "TEMPLATE_RENDER_MAX_ITERATIONS" in error["message"]
    assert not Template.objects.exists()


def test_the_admin_preview_of_an_8000_by_8000_bomb_answers_at_once(admin_client):
    template = Template.objects.create(template_id="bomb", name="Bomb")
    TemplateVariant.objects.create(template=template, locale="en",
                                   body="{% set a = [1] * 8000 %}{{ ([a] * 8000)|string|length }}")
    Recipient.objects.create(user_id="alice")
    page = admin_client.get(reverse("admin:campaigns_template_change", args=["bomb"]), {"preview_user": "alice"})
    assert page.status_code == 200 and "TEMPLATE_RENDER_MAX_ITERATIONS" in page.content.decode()


# --- making: repetition, concatenation, literals ----------------------------------------------------

NESTED = "counting those of nested lists and every repeated reference"
EACH_REFERENCE = "counting nested items, each reference"


@pytest.mark.parametrize(("source", "fragment"), [
    ("{{ ([[1] * 1000] * 1000)|length }}", EACH_REFERENCE),  # the * of a list of lists
    ("{% set a = [1] * 1000 %}{{ [a, a, a, a, a, a, a, a, a, a, a]|length }}", NESTED),  # a list literal
    ("{% set a = [1] * 1000 %}{{ (a, a, a, a, a, a, a, a, a, a, a)|length }}", NESTED),  # a tuple literal
    ("{% set a = [1] * 6000 %}{{ {'x': a, 'y': a}|length }}", NESTED),  # a dict literal
    ("{% set a = [[1] * 6000] %}{{ (a + a)|length }}", NESTED),  # + of lists
])
def test_a_value_holding_too_many_items_is_refused_as_it_is_made(db, source, fragment):
    refused(source, "iterations", fragment)


def test_repeating_a_list_of_long_strings_is_refused_by_its_text():
    refused("{% set s = 'x' * 1000 %}{{ ([s] * 5000)|length }}", "output", "the result of * as text")


# --- reading: every operation that walks a value in C -------------------------------------------------

#: ``l``: 1,000 references to one list of 1,000 items (3,000,000 characters as text), made by
#: appends, which no single operation sees whole; each consumer below would walk all of it.
SHARED = ("{% set inner = [1] * 1000 %}{% set l = [] %}{% for i in range(1000) %}{% set _ = l.append(inner) %}"
          "{% endfor %}")
CONSUMERS = [
    "{{ l }}", "{{ l|string }}", "{{ l|tojson }}", "{{ l|pprint }}", "{{ '%s'|format(l) }}", "{{ l|join(',') }}",
    "{{ l ~ '' }}", "{{ '%s' % (l,) }}", "{{ '{}'.format(l) }}", "{{ [l, 1]|length }}", "{{ {'a': l}|length }}",
    "{{ (l + [1])|length }}", "{{ (l * 2)|length }}", "{{ l == l|list }}", "{{ [9] in l }}",
    "{{ l|sum(start=[])|length }}", "{{ l|sort|length }}", "{{ l|max }}", "{{ l|unique|list }}",
    "{{ l.count(inner) }}", "{{ l.index([2]) }}", "{% for x in [1, 2] %}{{ loop.changed(l) }}{% endfor %}",
    "{{ l|e }}", "{{ l|safe }}", "{{ l|upper }}", "{{ l|center(10) }}", "{{ l|indent }}",
    "{{ l|replace('1', '2') }}", "{{ l|truncate(5) }}", "{{ l|wordcount }}", "{{ l|urlize }}", "{{ l|title }}",
    "{{ l|trim }}", "{{ l|striptags }}", "{{ l|wordwrap }}", "{{ l is lower }}", "{{ l is in [l] }}",
    "{{ l is eq(l|list) }}", "{{ l|xmlattr if false else l|dictsort }}",
]


def test_reading_a_large_value_without_walking_it_is_not_refused():
    # Passing, copying or counting it costs its length, not its nested size: no walk, no refusal.
    source = SHARED + ("{{ dict(a=l)|length }} {{ namespace(a=l).a|length }} {{ (l|list)|length }} "
                       "{{ l|batch(300)|list|length }} {{ l|first|length }} {% macro m(x) %}{{ x|length }}"
                       "{% endmacro %}{{ m(l) }} {{ l[0][0] }}")
    assert render_strings("", source, "", CTX).body == "1 1000 1000 4 1000 1000 1"


@pytest.mark.parametrize("consumer", CONSUMERS)
def test_an_operation_that_would_walk_a_huge_value_is_refused_before_it_runs(db, consumer):
    refused(SHARED + consumer, "iterations", NESTED)


@pytest.mark.parametrize("consumer", ["{{ l|string|length }}", "{{ l|tojson|length }}", "{{ l == l|list }}"])
def test_the_reported_shape_read_at_full_size_is_refused_at_once(consumer, settings):
    # The CPU bound is raised out of reach: on a busy machine the 9,000-step loop alone could spend
    # the default 0.1 s, and the refusal must come from the shape (before the walk), not from time.
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "RENDER_CPU_MS": 60_000}
    source = ("{% set inner = [1] * 10000 %}{% set l = [] %}{% for i in range(9000) %}{% set _ = l.append(inner) %}"
              "{% endfor %}" + consumer)
    with pytest.raises(RenderError) as caught:
        render_strings("", source, "", CTX)
    assert caught.value.bound == "iterations" and NESTED in str(caught.value)


# --- text: formats, widths, joins ---------------------------------------------------------------------

@pytest.mark.parametrize(("source", "fragment"), [
    ("{% set s = 'x' * 900000 %}{{ '%(a)s%(a)s%(a)s' % {'a': s} }}", "the result of %"),
    ("{% set s = 'x' * 900000 %}{{ '%1200000s%s' % (s, s) }}", "the result of %"),
    ("{% set s = 'x' * 900000 %}{{ '%1200000s%s'|format(s, s) }}", "the result of |format"),
    ("{% set s = 'x' * 900000 %}{{ '{0}{0}{0}'.format(s) }}", "str.format()"),
    ("{% set s = 'x' * 900000 %}{{ '{a}{a}{a}'.format_map({'a': s}) }}", "str.format_map()"),
    ("{{ [1, [2, [3]]]|tojson(indent=3000000) }}", "the result of |tojson"),
    ("{{ lipsum(20000) }}", "lipsum()"),
])
def test_text_an_operation_would_make_is_estimated_before_it_is_made(db, source, fragment):
    refused(source, "output", fragment, peak_below=2_500_000)  # the one 900,000-character string is allowed


def test_a_per_character_python_filter_takes_at_most_its_share_of_the_cpu_bound(db):
    most = int(limits().cpu_seconds * 1000 * 1000)
    assert render_strings("", "{{ ('x ' * 20000)|urlize|length }}", "", CTX).body == "40000"
    error = refused(f"{{{{ ('x' * {most + 1})|urlize }}}}", "time", f"at most {most:,} characters")
    assert "TEMPLATE_RENDER_CPU_MS" in str(error)


@pytest.mark.parametrize("source", [
    "{{ ('x'.encode() * 100000000)|length }}",  # bytes: no size checks of their own; codecs (punycode) quadratic
    "{{ (1).to_bytes(100000000, 'big')|length }}",  # a length argument sizes the result
    "{{ 'a'.translate({97: 'x' * 1000000})|length }}",  # one character to a string of any length
    "{{ ''.maketrans('a', 'b') }}",
])
def test_builtin_methods_outside_the_allowlist_are_refused(db, source):
    outcome, peak, _ = render_traced(source)
    assert isinstance(outcome, RenderError) and outcome.bound is None, outcome
    assert "is unsafe" in str(outcome)
    assert peak < 2_000_000


def test_a_render_keeps_at_most_ten_times_its_output_bound_of_new_values(db):
    made = limits().output * MADE_PER_OUTPUT
    source = "{% set l = [] %}{% for i in range(100) %}{% set _ = l.append('y' * 1000000) %}{% endfor %}{{ l|length }}"
    error = refused(source, "output", f"made more than {made:,} characters and items", peak_below=made * 2)
    assert "TEMPLATE_RENDER_MAX_OUTPUT" in str(error)


def test_ordinary_uses_of_these_operations_still_render():
    source = ("{{ [1, 2, 3]|join(',') }} {{ '{:>4}|{}'.format(7, first_name) }} {{ '%s-%05d' % (first_name, 42) }} "
              "{{ (range(5)|list) == [0, 1, 2, 3, 4] }} {{ 'da' in first_name|lower }} {{ {'a': 1}.items()|list }} "
              "{{ ([1] * 3 + [2])|sum }} {{ {'b': [1, 2]}|tojson }} {{ (range(10000)|list)|length }} "
              "{{ ([[1, 2]] * 3)|string }} {% set ns = namespace(l=[]) %}{% for i in range(3) %}"
              "{% set _ = ns.l.append(i) %}{% endfor %}{{ ns.l }} {{ 'x'|center(7) }}|{{ user_id.upper() }}")
    assert render_strings("", source, "", CTX).body == (
        "1,2,3    7|Ada Ada-00042 True True [('a', 1)] 5 {\"b\": [1, 2]} 10000 [[1, 2], [1, 2], [1, 2]] [0, 1, 2]"
        "    x   |U1")


# --- generated nested constructions -----------------------------------------------------------------

_n = st.sampled_from([1000, 9999, 10000, 5000, 100000, 100, 10, 3, 2, 1, 0])
_atom = st.one_of(st.sampled_from(["1", "'x'", "first_name", "'%s'", "none", "2.5", "[]"]),
                  _n.map(lambda n: f"('ab' * {n})"))
_value = st.recursive(_atom, lambda inner: st.one_of(
    st.tuples(inner, _n).map(lambda t: f"([{t[0]}] * {t[1]})"),
    inner.map(lambda e: f"[{e}, {e}, {e}]"),
    inner.map(lambda e: f"({e}, {e})"),
    inner.map(lambda e: f"{{'a': {e}, 'b': {e}}}"),
    st.tuples(inner, inner).map(lambda t: f"({t[0]} + {t[1]})"),
    inner.map(lambda e: f"({e} ~ {e})"),
), max_leaves=6)
_consumer = st.sampled_from([
    "{{ v }}", "{{ v|string|length }}", "{{ v|tojson|length }}", "{{ v|pprint|length }}",
    "{{ '%s'|format(v)|length }}", "{{ v|join(',')|length }}", "{{ (v ~ '')|length }}", "{{ ('%s' % (v,))|length }}",
    "{{ '{}{}'.format(v, v)|length }}", "{{ v == w }}", "{{ v in [w] }}", "{{ v|list|length }}",
    "{{ v|sum(start=[])|length }}", "{{ v|unique|list|length }}", "{{ v|sort|length }}",
    "{{ v|batch(3)|list|length }}", "{{ v|map('string')|join|length }}", "{{ v|dictsort|length }}",
    "{{ v|center(100)|length }}", "{{ v|wordwrap(5)|length }}", "{{ v|urlize|length }}", "{{ v|title|length }}",
    "{{ v|replace('1', '22')|length }}", "{{ v|indent(8)|length }}", "{{ v|e|length }}", "{{ v|max }}",
    "{{ [v, w]|length }}", "{{ (v * 3)|length }}", "{{ v.count(w) }}", "{{ v|groupby(0)|list|length }}",
])
_program = st.one_of(
    st.tuples(_value, _consumer).map(lambda t: f"{{% set v = {t[0]} %}}{{% set w = {t[0]} %}}{t[1]}"),
    st.tuples(_value, _n, _consumer).map(  # grown by appends: no single operation sees the whole value
        lambda t: f"{{% set v = [] %}}{{% for i in range({min(t[1], 9000)}) %}}{{% set _ = v.append({t[0]}) %}}"
                  f"{{% endfor %}}{{% set w = v %}}{t[2]}"),
    st.tuples(_value, st.integers(0, 40), _consumer).map(  # doubled through a namespace
        lambda t: f"{{% set ns = namespace(v={t[0]}) %}}{{% for i in range({t[1]}) %}}{{% set ns.v = [ns.v, ns.v] %}}"
                  f"{{% endfor %}}{{% set v = ns.v %}}{{% set w = ns.v %}}{t[2]}"),
)


@hsettings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(source=_program)
def test_generated_nested_constructions_render_within_ten_times_the_cpu_bound(source):
    most = 10 * limits().cpu_seconds
    cpu, started = time.thread_time(), time.monotonic()
    try:
        result = render_strings("", source, "", CTX)
        event("rendered")
        assert len(result.body) <= limits().output
    except RenderError as exc:  # any other exception fails the test
        event(f"RenderError, bound: {exc.bound}")
    wall, cpu = time.monotonic() - started, time.thread_time() - cpu
    assert cpu < most, (source, wall, cpu)
