"""Issue 23 #11: invisible characters (Unicode Cc, Cf, Zl, Zp; lone surrogates) in ids, keys, names
and in_app data. ``admin\\u202egpj.exe`` shows as ``adminexe.jpg`` to support, ``b\\u200bob`` and
``bоb`` (Cyrillic о) were users beside ``bob``. One rule (:mod:`core.identifiers`), code
``control_character`` everywhere, ``confusable`` for an id that mixes scripts; names keep any
script and the joiners and direction marks text needs (docs/SECURITY.md). Generated over every
character of the forbidden categories, on the API and in the admin."""

from __future__ import annotations

import json
import uuid
from urllib.parse import quote

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns import services as campaign_services
from campaigns.models import Campaign, Segment, SegmentMember, Template
from core.identifiers import LINE_BREAKS, TEXT_MARKS, text_problem, user_id_problem
from notifications.events.models import NotificationType
from notifications.models import APIClient, Notification
from preferences.admin import RecipientForm
from preferences.models import Recipient
from tests.conftest import EVERY_SCOPE
from tests.test_admin_types import ADD as TYPE_ADD
from tests.test_admin_types import definition, form_post

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

#: Every character no id may hold (lone surrogates too: JSON can carry them, Postgres cannot).
INVISIBLE = st.characters(categories=["Cc", "Cf", "Zl", "Zp", "Cs"])
#: What a URL can carry of them (a lone surrogate has no UTF-8).
IN_PATHS = st.characters(categories=["Cc", "Cf", "Zl", "Zp"])
#: What no name may hold: the same but the joiners and direction marks text needs (and, in a request
#: body, NUL and lone surrogates: the JSON parser refuses those first, 400 ``unstorable_character``).
IN_NAMES = st.characters(categories=["Cc", "Cf", "Zl", "Zp"], exclude_characters=TEXT_MARKS + "\x00")
IN_BODIES = st.characters(categories=["Cc", "Cf", "Zl", "Zp"], exclude_characters="\x00")
#: The reported ones, and one beyond the BMP (a tag character), for the slower admin roads.
SAMPLES = ["\u202e", "\u200b", "\ufeff", "\x1b", "\u2028", "\u2066", "\U000e0041"]
LOOK_ALIKES = ["b\u043eb", "p\u0430ypal", "adm\u0456n", "a\u0660"]  # Cyrillic о, а, і; an Arabic-Indic 0
GENERATED = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def tool() -> tuple[APIClient, str]:
    return APIClient.objects.create_key(name="tool", scopes=list(EVERY_SCOPE))


@pytest.fixture
def http(tool) -> Client:
    return Client(headers={"Authorization": f"Api-Key {tool[1]}"})


def call(http: Client, method: str, path: str, body: dict | None = None, **headers):
    return getattr(http, method)(path, data=json.dumps(body or {}), content_type="application/json",
                                 headers=headers)


def refusal(resp) -> list[tuple[str, str]]:
    assert resp.status_code == 422, resp.content
    return [(f["field"], f["code"]) for f in resp.json()["error"]["fields"]]


# --- the rule ---------------------------------------------------------------------------------------

@given(INVISIBLE, st.text(max_size=5), st.text(max_size=5))
def test_no_id_holds_an_invisible_character(char, before, after):
    assert getattr(user_id_problem(before + char + after), "code", None) in ("control_character", "confusable")
    assert getattr(user_id_problem("x" + char), "code", None) == "control_character"


@given(IN_NAMES)
def test_no_name_holds_one_but_the_marks_text_needs(char):
    assert text_problem(f"Spring{char}sale").code == "control_character"
    assert f"U+{ord(char):04X}" in text_problem(f"Spring{char}sale")


@pytest.mark.parametrize("name", ["春のセール", "Распродажа", "خرید\u200cها", "👨\u200d👩\u200d👧 family",
                                  "שלום\u200f", "Ünïcödé — “quoted”"])
def test_names_keep_any_script_and_the_marks_text_needs(name):
    assert text_problem(name) == ""
    assert text_problem(f"line 1{LINE_BREAKS}line 2", multiline=True) == ""


# --- user ids: the path, members (API, CSV), the admin ---------------------------------------------

@GENERATED
@given(IN_PATHS)
def test_the_users_path_refuses_an_invisible_character(http, char):
    resp = call(http, "put", f"/v1/users/{quote('b' + char + 'ob', safe='')}", {})
    assert refusal(resp) == [("user_id", "control_character")]
    assert not Recipient.objects.exists()


@GENERATED
@given(IN_BODIES)
def test_segment_members_refuse_an_invisible_character(http, tool, char):
    campaign_services.upsert_segment("vip", name="VIPs", client=tool[0])
    resp = call(http, "post", "/v1/segments/vip/members", {"add": ["bob", "b" + char + "ob"]})
    assert refusal(resp) == [("add.1", "control_character")]
    assert not Recipient.objects.exists() and not SegmentMember.objects.exists()


@pytest.mark.parametrize("look_alike", LOOK_ALIKES)
def test_an_id_mixing_scripts_is_refused_everywhere_ids_are_made(http, tool, admin_client, look_alike):
    resp = call(http, "put", f"/v1/users/{quote(look_alike, safe='')}", {})
    assert refusal(resp) == [("user_id", "confusable")]
    campaign_services.upsert_segment("vip", name="VIPs", client=tool[0])
    assert refusal(call(http, "post", "/v1/segments/vip/members", {"add": [look_alike]})) == [("add.0", "confusable")]
    upload = SimpleUploadedFile("ids.csv", f"user_id\nbob\n{look_alike}\n".encode(), content_type="text/csv")
    page = admin_client.post(reverse("admin:campaigns_segment_upload_members", args=["vip"]), {"file": upload},
                             follow=True)
    assert "mixes the scripts" in " ".join(str(m) for m in page.context["messages"])
    form = RecipientForm(data={"user_id": look_alike, "attributes": "{}"})
    assert not form.is_valid() and "mixes the scripts" in str(form.errors["user_id"])
    assert not Recipient.objects.exists() and not SegmentMember.objects.exists()


@pytest.mark.parametrize("user_id", ["bob", "Müller", "ü-ß-東京", "ユーザー42", "δοκιμή", "вова", "user.42"])
def test_ids_in_one_script_are_fine(http, user_id):
    assert call(http, "put", f"/v1/users/{quote(user_id, safe='')}", {}).status_code in (200, 201)
    assert list(Recipient.objects.values_list("user_id", flat=True)) == [user_id]


@pytest.mark.parametrize("char", SAMPLES)
def test_the_admin_refuses_such_a_user_id(char):
    form = RecipientForm(data={"user_id": f"b{char}ob", "attributes": "{}"})
    assert not form.is_valid() and "control character" in str(form.errors["user_id"])


# --- notification types: key and name, API and admin ----------------------------------------------

TYPE = {"name": "Receipt", "category": "billing", "channels": ["push"],
        "templates": [{"channel": "push", "locale": "en", "body": "Thanks"}]}


@GENERATED
@given(IN_PATHS)
def test_a_type_key_with_an_invisible_character_is_refused(http, char):
    resp = call(http, "put", f"/v1/notification-types/{quote('receipt' + char, safe='')}", TYPE)
    assert refusal(resp) == [("key", "control_character")]
    assert not NotificationType.objects.exists()


@GENERATED
@given(IN_NAMES)
def test_a_type_name_with_an_invisible_character_is_refused(http, char):
    resp = call(http, "put", "/v1/notification-types/receipt", {**TYPE, "name": f"admin{char}gpj.exe"})
    assert refusal(resp) == [("name", "control_character")]
    assert not NotificationType.objects.exists()


@pytest.mark.parametrize("char", SAMPLES)
def test_the_type_admin_refuses_such_a_key_and_name(admin_client, char):
    resp = admin_client.post(TYPE_ADD, form_post(f"receipt{char}", definition()))
    assert resp.status_code == 200 and "key" in resp.context["adminform"].form.errors
    resp = admin_client.post(TYPE_ADD, form_post("receipt", definition(name=f"admin{char}gpj.exe")))
    assert resp.status_code == 200
    assert "control character" in str(resp.context["adminform"].form.errors["name"])
    assert not NotificationType.objects.exists()


# --- segment, template and campaign names: API and admin ------------------------------------------

@GENERATED
@given(IN_NAMES)
def test_segment_template_and_campaign_names_refuse_an_invisible_character(http, tool, char):
    name = f"admin{char}gpj.exe"
    assert refusal(call(http, "put", "/v1/segments/vip", {"name": name})) == [("name", "control_character")]
    resp = call(http, "put", "/v1/templates/t1", {"name": name, "default_locale": "en",
                                                   "variants": [{"locale": "en", "body": "Hi"}]})
    assert refusal(resp) == [("name", "control_character")]
    campaign_services.upsert_segment("vip", name="VIPs", client=tool[0])
    resp = call(http, "post", "/v1/campaigns", {"name": name, "segment_id": "vip", "channel": "sms",
                                                "content": {"body": "Sale!"}}, **{"Idempotency-Key": uuid.uuid4().hex})
    assert refusal(resp) == [("name", "control_character")]
    assert list(Segment.objects.values_list("name", flat=True)) == ["VIPs"]
    assert not Template.objects.exists() and not Campaign.objects.exists()


def test_a_campaign_named_in_japanese_is_fine(http, tool):
    campaign_services.upsert_segment("vip", name="VIPs", client=tool[0])
    resp = call(http, "post", "/v1/campaigns", {"name": "春のセール", "segment_id": "vip", "channel": "sms",
                                                "content": {"body": "Sale!"}}, **{"Idempotency-Key": "c1"})
    assert resp.status_code == 202, resp.content
    assert Campaign.objects.get().name == "春のセール"


@pytest.mark.parametrize("char", SAMPLES)
def test_the_campaign_admin_refuses_such_names(admin_client, char):
    name = f"admin{char}gpj.exe"
    resp = admin_client.post(reverse("admin:campaigns_segment_add"), {"segment_id": "spring", "name": name,
                                                                      "description": ""})
    assert resp.status_code == 200 and "control character" in str(resp.context["adminform"].form.errors["name"])
    resp = admin_client.post(reverse("admin:campaigns_template_add"), {
        "template_id": "welcome", "name": name, "default_locale": "en", "variants-TOTAL_FORMS": "1",
        "variants-INITIAL_FORMS": "0", "variants-MIN_NUM_FORMS": "1", "variants-MAX_NUM_FORMS": "1000",
        "variants-0-locale": "en", "variants-0-title": "", "variants-0-body": "Hi", "variants-0-html": ""})
    assert resp.status_code == 200 and "control character" in str(resp.context["adminform"].form.errors["name"])
    segment, _ = campaign_services.upsert_segment("vip", name="VIPs")
    resp = admin_client.post(reverse("admin:campaigns_campaign_add"), {
        "name": name, "segment": segment.pk, "channel": "sms", "priority": "standard", "category": "marketing",
        "template": "", "title": "", "body": "Spring sale", "html": "", "data": "", "scheduled_at_0": "",
        "scheduled_at_1": "", "local_date": "", "local_time": "", "spread_seconds": "0", "ttl_seconds": ""})
    assert resp.status_code == 200 and "control character" in str(resp.context["adminform"].form.errors["name"])
    assert list(Segment.objects.values_list("pk", flat=True)) == ["vip"]
    assert not Template.objects.exists() and not Campaign.objects.exists()


# --- in_app data: keys and values, inline and in a type's templates ---------------------------------

@GENERATED
@given(IN_NAMES.filter(lambda c: c not in LINE_BREAKS))
def test_in_app_data_keys_and_values_refuse_an_invisible_character(http, char):
    Recipient.objects.get_or_create(user_id="alice")
    for data, field in (({"file": f"admin{char}gpj.exe"}, "content.data.file"),
                        ({f"fi{char}le": "x"}, f"content.data.fi{char}le")):
        resp = call(http, "post", "/v1/notifications", {"user_id": "alice", "channel": "in_app",
                                                        "content": {"body": "New file", "data": data}},
                    **{"Idempotency-Key": uuid.uuid4().hex})
        assert refusal(resp) == [(field, "control_character")]
    resp = call(http, "put", "/v1/notification-types/shared", {
        **TYPE, "channels": ["in_app"],
        "templates": [{"channel": "in_app", "locale": "en", "body": "New file", "data": {"file": f"a{char}b"}}]})
    assert refusal(resp) == [("templates.0.data.file", "control_character")]
    assert not Notification.objects.exists() and not NotificationType.objects.exists()


def test_in_app_data_values_keep_line_breaks_and_text_marks(http):
    Recipient.objects.create(user_id="alice")
    data = {"note": "line 1\nline 2\tשלום\u200f", "emoji": "👨\u200d👩\u200d👧"}
    resp = call(http, "post", "/v1/notifications", {"user_id": "alice", "channel": "in_app", "content": {
        "body": "x", "data": data}}, **{"Idempotency-Key": "n1"})
    assert resp.status_code == 202, resp.content
