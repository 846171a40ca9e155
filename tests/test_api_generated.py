"""The API's validation over generated bodies (Hypothesis): ``POST /v1/notifications``,
``PUT /v1/users/{id}``, ``PUT /v1/users/{id}/preferences``, ``POST /v1/campaigns``.

Bodies mix valid values, near misses (wrong choice, naive instants, out-of-range numbers, bad
phones and zones) and arbitrary JSON of any type in any field, plus unknown keys. For every request:

* the answer is 2xx or 4xx, never 5xx;
* a 4xx has the documented shape ``{"error": {status, code, message, fields?}}`` with ``status``
  repeated; a 422 names a field for every entry, and the top-level message starts with the first;
* a rejected request writes nothing (row counts of every table it could touch are unchanged), and an
  accepted one writes exactly its rows.

In-process (Django test client) so the examples stay fast; one API client and fixed recipients,
segment and template shared by all examples of a test.
"""

from __future__ import annotations

import itertools
import json

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns.models import Campaign, Segment, SegmentMember, Template, TemplateVariant
from notifications.models import APIClient, DeliveryEvent, Notification
from preferences.models import Device, Preferences, Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
_keys = itertools.count()

# Strings Hypothesis's default alphabet leaves out or rarely reaches: a lone surrogate (valid JSON
# "\ud800", not encodable as UTF-8), NUL (PostgreSQL text cannot hold it), bidi and astral characters.
HOSTILE = st.sampled_from(["\ud800", "a\udfffb", "a\x00b", "\u202etxt", "😀", "\t", "é" * 40])
STRINGS = st.text(max_size=12) | HOSTILE
# Arbitrary JSON: any type, any nesting (small).
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | STRINGS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(STRINGS, inner, max_size=3),
    max_leaves=6)


def with_stray_key(bodies: st.SearchStrategy) -> st.SearchStrategy:
    """Bodies, sometimes with one more key of any spelling (a typo, a hostile string)."""
    return st.tuples(bodies, st.dictionaries(STRINGS, JSON, max_size=1)).map(lambda t: {**t[1], **t[0]})


def maybe(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Mostly plausible values, sometimes arbitrary JSON."""
    return st.one_of(valid, valid, JSON)


INSTANTS = st.sampled_from(["2030-01-01T09:00:00+01:00", "2030-01-01T09:00:00Z", "2030-01-01T09:00:00",
                            "2099-01-01T00:00:00Z", "0001-01-01T00:00:00+05:00", "tomorrow", "2026-02-30T10:00:00Z",
                            "1999-01-01T00:00:00Z"])
TEXT = st.text(max_size=30) | HOSTILE
CONTENT = st.fixed_dictionaries({}, optional={
    "title": maybe(st.sampled_from(["", "Hello", "x" * 999]) | TEXT),
    "body": maybe(st.sampled_from(["Hi", " ", "x" * 1601, "x" * 5001, "{{ first_name }}", "{% for %}"]) | TEXT),
    "html": maybe(st.sampled_from(["", "<p>Hi</p>"])),
    "data": maybe(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)),
    "extra": JSON,
})
CHANNELS = st.sampled_from(["sms", "email", "push", "in_app", "fax", ""])
PRIORITIES = st.sampled_from(["high", "standard", "urgent"])
CATEGORIES = st.sampled_from(["", "marketing", "security", "transactional", "orders", "Bad Category", "x" * 65])

SEND = with_stray_key(st.fixed_dictionaries({}, optional={
    "user_id": maybe(st.sampled_from(["alice", "bare", "nobody", ""])),
    "channel": maybe(CHANNELS),
    "priority": maybe(PRIORITIES),
    "category": maybe(CATEGORIES),
    "content": maybe(CONTENT),
    "scheduled_at": maybe(INSTANTS | st.none()),
    "ttl_seconds": maybe(st.integers(-5, 3_000_000) | st.none()),
    "sensitive": maybe(st.booleans()),
    "prio": JSON,
}))
USER = with_stray_key(st.fixed_dictionaries({}, optional={
    "email": maybe(st.sampled_from(["a@example.com", "", "not-an-email", "a@b"])),
    "phone": maybe(st.sampled_from(["+4915123456789", "+49 151 2345 6789", "", "12345", "abc", "+1 555 0100",
                                    "+4915123456789012345678", "+999 1"])),
    "timezone": maybe(st.sampled_from(["Europe/Berlin", "UTC", "", "America", "Mars/Olympus", "+03:00", "EST"])),
    "locale": maybe(st.sampled_from(["de-DE", "en", "", "english please"])),
    "attributes": maybe(st.dictionaries(st.sampled_from(["first_name", "1bad", "ok_2"]), TEXT, max_size=3)),
    "phon": JSON,
}))
WALL = st.sampled_from(["22:00", "07:00", "7:5", "25:00", "22:00:00", "noon", ""])
PREFERENCES = with_stray_key(st.fixed_dictionaries({}, optional={
    "opt_outs": maybe(st.lists(CHANNELS, max_size=4)),
    "category_opt_outs": maybe(st.dictionaries(CATEGORIES, st.lists(CHANNELS, max_size=3), max_size=3)),
    "quiet_hours": maybe(st.none() | st.fixed_dictionaries({}, optional={
        "start": maybe(WALL), "end": maybe(WALL),
        "timezone": maybe(st.sampled_from(["Europe/Berlin", "", "America", "+01:00"]))})),
    "opt_out": JSON,
}))
CAMPAIGN = with_stray_key(st.fixed_dictionaries({}, optional={
    "name": maybe(TEXT),
    "segment_id": maybe(st.sampled_from(["vip", "nope", ""])),
    "channel": maybe(CHANNELS),
    "priority": maybe(PRIORITIES),
    "category": maybe(CATEGORIES),
    "content": maybe(CONTENT | st.none()),
    "template_id": maybe(st.sampled_from(["welcome", "missing"]) | st.none()),
    "scheduled_at": maybe(INSTANTS | st.none()),
    "local_time": maybe(st.none() | st.fixed_dictionaries({}, optional={
        "date": maybe(st.sampled_from(["2030-03-01", "0001-01-01", "9999-12-31", "2030-02-30", "soon"])),
        "time": maybe(WALL)})),
    "spread_seconds": maybe(st.integers(-1, 90_000)),
    "ttl_seconds": maybe(st.integers(-1, 3_000_000) | st.none()),
}))


def counts() -> dict[str, int]:
    return {m.__name__: m.objects.count() for m in (Notification, DeliveryEvent, Recipient, Preferences, Device,
                                                    Campaign, Segment, SegmentMember, Template, TemplateVariant)}


def check_answer(r, before: dict[str, int]) -> None:
    """The invariants every answer must keep (module docstring)."""
    assert r.status_code < 500, r.content
    if r.status_code < 400:
        return
    body = r.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert error["status"] == r.status_code
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    for leaked in ("The string supplied", "default region", "matches the given query", "Traceback"):
        assert leaked not in error["message"], error  # our words, not a library's
    if r.status_code == 422:
        assert error["fields"], error
        for f in error["fields"]:
            assert f["field"], error  # every entry names its field…
            assert f["code"] and f["message"]
        assert error["message"].startswith(f"{error['fields'][0]['field']}: "), error  # …and so does the message
    assert counts() == before, f"a rejected request wrote rows: {error}"


@pytest.fixture
def http():
    _, key = APIClient.objects.create_key(name="generated", scopes=EVERY_SCOPE)
    return Client(headers={"Authorization": f"Api-Key {key}"})


@pytest.fixture
def world():
    alice = Recipient.objects.create(user_id="alice", email="a@example.com", phone="+4915123456789",
                                     timezone="Europe/Berlin")
    Device.objects.create(recipient=alice, platform="android", push_token="tok-alice")
    Recipient.objects.create(user_id="bare")
    vip = Segment.objects.create(segment_id="vip", name="VIP")
    SegmentMember.objects.create(segment=vip, recipient=alice)
    welcome = Template.objects.create(template_id="welcome", name="Welcome", default_locale="en")
    TemplateVariant.objects.create(template=welcome, locale="en", title="Hi", body="Hi {{ first_name }}")


def _post(http, path, body):
    return http.post(path, data=json.dumps(body), content_type="application/json",
                     headers={"Idempotency-Key": f"gen-{next(_keys)}"})


@SETTINGS
@given(body=SEND)
def test_generated_sends(http, world, body):
    before = counts()
    r = _post(http, "/v1/notifications", body)
    check_answer(r, before)
    if r.status_code == 202:
        after = counts()
        assert (after["Notification"], after["DeliveryEvent"]) == (before["Notification"] + 1,
                                                                   before["DeliveryEvent"] + 1)
        n = Notification.objects.get(pk=r.json()["id"])
        assert n.priority in ("high", "standard") and n.channel in ("sms", "email", "push")
        assert not (n.priority == "high" and n.category == "marketing")


@SETTINGS
@given(body=USER)
def test_generated_user_puts(http, world, body):
    before = counts()
    r = http.put("/v1/users/gen-user", data=json.dumps(body), content_type="application/json")
    check_answer(r, before)
    if r.status_code in (200, 201):
        stored = Recipient.objects.get(pk="gen-user")
        assert stored.phone == "" or stored.phone.startswith("+")
        assert r.json()["phone"] == stored.phone


@SETTINGS
@given(body=PREFERENCES)
def test_generated_preferences(http, world, body):
    before = counts()
    r = http.put("/v1/users/alice/preferences", data=json.dumps(body), content_type="application/json")
    check_answer(r, before)
    if r.status_code == 200:
        assert http.get("/v1/users/alice/preferences").json() == r.json()


@SETTINGS
@given(body=CAMPAIGN)
def test_generated_campaigns(http, world, body):
    before = counts()
    r = _post(http, "/v1/campaigns", body)
    check_answer(r, before)
    if r.status_code == 202:
        assert counts()["Campaign"] == before["Campaign"] + 1
        c = Campaign.objects.get(pk=r.json()["id"])
        assert not (c.priority == "high" and c.category == "marketing")
        assert not (c.priority == "standard" and c.category in ("security", "transactional"))  # bulk: never those
