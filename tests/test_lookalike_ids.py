"""Issue hfix2 #3 and #4: ids that look like others, and ids no path can reach. A user id is in
NFKC (``Mu\\u0308ller`` beside ``Müller``, ``ﬁnn`` beside ``finn``: 422 ``not_normalized``), holds no
default-ignorable character (Hangul fillers, variation selectors, the grapheme joiner: 422
``control_character``), no whitespace and no ``/`` (``a/b`` could be made but never read or erased:
422 ``invalid``). Names and texts refuse the default-ignorable characters too, but the joiners,
direction marks and emoji presentation selectors text needs; segment descriptions and attribute
values follow a type description's rule; a type name is not trimmed of U+0085 (docs/SECURITY.md
"Invisible characters and look-alike ids")."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns import services as campaign_services
from campaigns.models import Segment, SegmentMember, Template
from core.identifiers import DEFAULT_IGNORABLE, PRESENTATION_SELECTORS, TEXT_MARKS, text_problem, user_id_problem
from notifications.events.models import NotificationType
from notifications.models import APIClient
from preferences.admin import RecipientForm
from preferences.models import Recipient
from tests.conftest import EVERY_SCOPE

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

#: Every default-ignorable code point (Unicode DerivedCoreProperties).
IGNORABLE = st.sampled_from(DEFAULT_IGNORABLE).flatmap(lambda span: st.integers(*span)).map(chr)
GENERATED = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

#: The attacker's ids, each with the code it is refused with.
REPORTED = [("bob\u3164", "control_character"), ("\u3164", "control_character"), ("bob\u115f", "control_character"),
            ("bob\uffa0", "control_character"), ("bob\ufe0f", "control_character"), ("\ufe0f", "control_character"),
            ("bo\u034fb", "control_character"), ("bob\u3000", "invalid"), ("bob smith", "invalid"),
            ("Mu\u0308ller", "not_normalized"), ("\u212bngstr\u00f6m", "not_normalized"),
            ("\ufb01nn", "not_normalized"), ("\u2160", "not_normalized"), ("a/b", "invalid")]
TYPE = {"name": "Receipt", "category": "billing", "channels": ["push"],
        "templates": [{"channel": "push", "locale": "en", "body": "Thanks"}]}


@pytest.fixture
def tool() -> tuple[APIClient, str]:
    return APIClient.objects.create_key(name="tool", scopes=list(EVERY_SCOPE))


@pytest.fixture
def http(tool) -> Client:
    return Client(headers={"Authorization": f"Api-Key {tool[1]}"})


def call(http: Client, method: str, path: str, body: dict | None = None):
    return getattr(http, method)(path, data=json.dumps(body or {}), content_type="application/json")


def refusal(resp) -> list[tuple[str, str]]:
    assert resp.status_code == 422, resp.content
    return [(f["field"], f["code"]) for f in resp.json()["error"]["fields"]]


@pytest.mark.parametrize(("user_id", "code"), REPORTED)
def test_the_reported_ids_are_refused_where_ids_are_made(http, tool, user_id, code):
    campaign_services.upsert_segment("vip", name="VIPs", client=tool[0])
    resp = call(http, "post", "/v1/segments/vip/members", {"add": ["bob", user_id]})
    assert refusal(resp) == [("add.1", code)]
    if "/" not in user_id:  # a / in a path is another route (404): why such an id may not exist
        assert refusal(call(http, "put", f"/v1/users/{quote(user_id, safe='')}", {})) == [("user_id", code)]
    assert not RecipientForm(data={"user_id": user_id, "attributes": "{}"}).is_valid()
    assert not Recipient.objects.exists() and not SegmentMember.objects.exists()


def test_the_messages_name_the_rule():
    assert user_id_problem("Mu\u0308ller") == ("is not in Unicode normalization form NFKC (as NFKC: 'Müller'): an id "
                                               "has one spelling, so no two ids look alike")
    assert user_id_problem("bob\u3000") == "contains whitespace (U+3000 IDEOGRAPHIC SPACE): an id has none"
    assert user_id_problem("a/b") == "contains '/': an id has none, so /v1/users/{user_id} can address it"
    assert user_id_problem("bob\u3164") == "contains a control character (U+3164 HANGUL FILLER)"


@pytest.mark.parametrize(("made", "twin"), [("Müller", "Mu\u0308ller"), ("\u00c5ngstr\u00f6m", "\u212bngstr\u00f6m"),
                                            ("finn", "\ufb01nn"), ("I", "\u2160")])
def test_an_id_and_its_look_alike_are_never_two_users(http, made, twin):
    assert call(http, "put", f"/v1/users/{quote(made, safe='')}", {}).status_code == 201
    assert refusal(call(http, "put", f"/v1/users/{quote(twin, safe='')}", {})) == [("user_id", "not_normalized")]
    assert list(Recipient.objects.values_list("user_id", flat=True)) == [made]


@given(IGNORABLE, st.text(max_size=4))
def test_no_id_holds_a_default_ignorable_character(char, rest):
    assert getattr(user_id_problem("x" + char + rest), "code", None) == "control_character"


@given(IGNORABLE.filter(lambda c: c not in TEXT_MARKS + PRESENTATION_SELECTORS))
def test_no_name_holds_one_but_the_marks_and_selectors_text_needs(char):
    assert getattr(text_problem(f"Spring{char}sale"), "code", None) == "control_character"


def test_names_keep_emoji_with_their_selector():
    assert text_problem("Sale \u2764\ufe0f") == "" and text_problem("\u2764\ufe0e") == ""


@pytest.mark.parametrize("filler", ["\u3164", "\u115f", "\uffa0", "\u034f"])
def test_names_refuse_fillers_everywhere(http, tool, filler):
    name = f"Sale{filler}"
    assert refusal(call(http, "put", "/v1/segments/vip", {"name": name})) == [("name", "control_character")]
    assert refusal(call(http, "put", "/v1/templates/t1", {"name": name, "default_locale": "en", "variants": [
        {"locale": "en", "body": "Hi"}]})) == [("name", "control_character")]
    assert refusal(call(http, "put", "/v1/notification-types/receipt", {**TYPE, "name": name})) == [
        ("name", "control_character")]
    assert not Segment.objects.exists() and not Template.objects.exists() and not NotificationType.objects.exists()


@pytest.mark.parametrize("char", ["\u202e", "\u200b", "\x07", "\u3164"])
def test_segment_descriptions_and_attribute_values_follow_the_text_rule(http, char):
    resp = call(http, "put", "/v1/segments/descseg", {"name": "n", "description": f"a{char}b"})
    assert refusal(resp) == [("description", "control_character")]
    resp = call(http, "put", "/v1/users/alice", {"attributes": {"first_name": f"a{char}b"}})
    assert refusal(resp) == [("attributes.first_name", "control_character")]
    assert not Segment.objects.exists() and not Recipient.objects.exists()


@pytest.mark.parametrize("char", ["\u202e", "\x07", "\u3164"])
def test_the_admin_applies_the_same_text_rule(admin_client, char):
    resp = admin_client.post(reverse("admin:campaigns_segment_add"), {"segment_id": "descseg", "name": "n",
                                                                      "description": f"a{char}b"})
    assert resp.status_code == 200
    assert "control character" in str(resp.context["adminform"].form.errors["description"])
    form = RecipientForm(data={"user_id": "alice", "attributes": json.dumps({"first_name": f"a{char}b"})})
    assert not form.is_valid() and "control character" in str(form.errors["attributes"])
    assert not Segment.objects.exists() and not Recipient.objects.exists()


def test_descriptions_and_attributes_keep_line_breaks_and_marks(http):
    assert call(http, "put", "/v1/segments/descseg", {"name": "n", "description": "line 1\nשלום\u200f"}
                ).status_code == 201
    assert call(http, "put", "/v1/users/alice", {"attributes": {"first_name": "Ali \u2764\ufe0f"}}).status_code == 201
    assert Recipient.objects.get().attributes == {"first_name": "Ali \u2764\ufe0f"}


def test_a_type_name_ending_in_nel_is_refused_like_every_other_name(http):
    """It was trimmed to ``Sale`` and saved (200) while segment names with it were 422."""
    resp = call(http, "put", "/v1/notification-types/receipt", {**TYPE, "name": "Sale\x85"})
    assert refusal(resp) == [("name", "control_character")]
    assert not NotificationType.objects.exists()
