"""Segment member ids follow the ``/v1/users/{user_id}`` rule (issue 11, finding 7): a member added by
the API, a CSV upload or the admin is always reachable at ``/v1/users/{user_id}``.

In-process (Django test client, rolled-back transactions).
"""

from __future__ import annotations

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from campaigns import services
from campaigns.models import Segment, SegmentMember
from core.api import parameters
from core.api.errors import InvalidParameter
from core.identifiers import user_id_problem
from notifications.models import APIClient
from preferences.admin import RecipientForm
from preferences.models import Recipient
from tests.conftest import MARKETING_SCOPES

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

HOSTILE = ["a\x01b", "tab\tinside", "line\nbreak", "bell\x07", "del\x7f", "esc\x1b[31m", "cr\rx", "unit\x1fsep",
           # C1 (issue 12 #5): U+0085 NEXT LINE is a line break to many readers; U+0080 and U+009F its bounds.
           "nel\x85", "c1\x80", "c1\x9f",
           # Issue 23 #11: format characters (bidi override, zero-width space, BOM) and line separators.
           "admin\u202egpj.exe", "b\u200bob", "\ufeffbom", "with\u2028separator"]
FINE = ["alice", "user_42", "ü-ß-東京", "a:b", "x" * 255, "Müller", "ユーザー42", "δοκιμή"]


@pytest.fixture
def tool():
    return APIClient.objects.create_key(name="segment-tool", scopes=list(MARKETING_SCOPES))


@pytest.fixture
def http(tool):
    return Client(headers={"Authorization": f"Api-Key {tool[1]}"})


@pytest.fixture
def segment(tool):
    return services.upsert_segment("vip", name="VIPs", client=tool[0])[0]  # the tool's own segment


def post_members(http, body):
    return http.post("/v1/segments/vip/members", data=json.dumps(body), content_type="application/json")


def path_rule_refuses(value: str) -> bool:
    try:
        parameters.USER_ID.check("user_id", value)
    except InvalidParameter:
        return True
    return False


@pytest.mark.parametrize("value", [*HOSTILE, *FINE, "", "x" * 256])
def test_the_rule_is_the_rule_of_the_users_path(value):
    assert bool(user_id_problem(value)) == path_rule_refuses(value)


@pytest.mark.parametrize("bad", HOSTILE)
def test_api_refuses_a_member_id_with_a_control_character_and_writes_nothing(http, segment, bad):
    r = post_members(http, {"add": ["alice", bad]})
    assert r.status_code == 422, r.content
    [error] = r.json()["error"]["fields"]
    assert error["field"].startswith("add") and error["code"] == "control_character"
    assert "control character" in error["message"]
    assert not Recipient.objects.exists() and not SegmentMember.objects.exists()


def test_api_still_adds_fine_ids_and_removes_any(http, segment):
    r = post_members(http, {"add": FINE})
    assert r.status_code == 200 and r.json()["added"] == len(FINE)
    # A member made before the rule (written directly) can still be removed.
    Recipient.objects.create(user_id="old\x01id")
    SegmentMember.objects.create(segment=segment, recipient_id="old\x01id")
    r = post_members(http, {"remove": ["old\x01id"]})
    assert r.status_code == 200 and r.json()["removed"] == 1


@pytest.mark.parametrize("bad", HOSTILE)
def test_csv_upload_refuses_a_control_character_and_writes_nothing(admin_client, segment, bad):
    quoted = '"' + bad.replace('"', '""') + '"'
    upload = SimpleUploadedFile("ids.csv", f"user_id\nalice\n{quoted}\n".encode(), content_type="text/csv")
    r = admin_client.post(reverse("admin:campaigns_segment_upload_members", args=["vip"]), {"file": upload},
                          follow=True)
    text = " ".join(str(m) for m in r.context["messages"])
    assert "Upload rejected; nothing was added." in text and "control character" in text
    assert not SegmentMember.objects.exists() and not Recipient.objects.exists()


def test_the_service_refuses_such_ids_whoever_calls_it(segment):
    with pytest.raises(ValueError, match="control character"):
        services.change_members(segment, add=["alice", "a\x01b"], remove=[])
    assert not Recipient.objects.exists()


@pytest.mark.parametrize("bad", HOSTILE)
def test_admin_recipient_form_refuses_such_ids(bad):
    form = RecipientForm(data={"user_id": bad, "attributes": "{}"})
    assert not form.is_valid() and "user_id" in form.errors


def test_every_member_added_is_reachable_at_the_users_path(http, segment):
    assert post_members(http, {"add": ["alice", "user_42"]}).status_code == 200
    for user_id in Segment.objects.get(pk="vip").members.values_list("recipient_id", flat=True):
        assert not path_rule_refuses(user_id)


# --- issue 12 #5: ids are taken as given; one token rule; names and slugs -----------------------------

@pytest.mark.parametrize("value", ["\u2003sep", " spaced ", "nbsp\u00a0", "\u3000ideographic", "a/b"])
def test_member_ids_with_whitespace_or_a_slash_are_refused_not_trimmed(http, segment, value):
    """DRF trimmed member ids (``"\\u2028sep"`` was stored as ``sep``) while the path is taken as
    given; since issue hfix2 #3/#4 whitespace and ``/`` are refused outright (``a/b`` could be made
    but no /v1/users path reached it, so it could not be erased)."""
    r = post_members(http, {"add": [value]})
    assert r.status_code == 422, r.content
    assert [(f["field"], f["code"]) for f in r.json()["error"]["fields"]] == [("add.0", "invalid")]
    assert not SegmentMember.objects.exists() and not Recipient.objects.exists()


def test_a_member_made_before_the_slash_rule_can_still_be_removed(http, segment):
    Recipient.objects.create(user_id="a/b")
    SegmentMember.objects.create(segment=segment, recipient_id="a/b")
    assert post_members(http, {"remove": ["a/b"]}).json()["removed"] == 1
    assert not SegmentMember.objects.exists()


@pytest.mark.parametrize("bad", ["nel\x85", "c1\x80", "c1\x9f"])
def test_c1_controls_are_refused_in_the_users_path_and_in_csv_uploads(http, admin_client, segment, bad):
    from urllib.parse import quote

    r = http.get(f"/v1/users/{quote(bad, safe='')}")
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["field"] == "user_id"
    upload = SimpleUploadedFile("ids.csv", f"user_id\nalice\n{bad}\n".encode(), content_type="text/csv")
    r = admin_client.post(reverse("admin:campaigns_segment_upload_members", args=["vip"]), {"file": upload},
                          follow=True)
    assert "control character" in " ".join(str(m) for m in r.context["messages"])
    assert not SegmentMember.objects.exists()


def test_a_push_token_that_can_be_registered_can_be_removed():
    """``PUT …/devices`` took ``"\\u0001"`` in a token that ``DELETE …/devices/{push_token}`` refused (422),
    so it could never be removed: one token rule at both."""
    from urllib.parse import quote

    _, key = APIClient.objects.create_key(name="mobile", scopes=["devices:write", "read"])
    mobile = Client(headers={"Authorization": f"Api-Key {key}"})
    Recipient.objects.create(user_id="alice")

    def put(token):
        return mobile.put("/v1/users/alice/devices", data=json.dumps({"platform": "android", "push_token": token}),
                          content_type="application/json")

    for bad in ["tok\x01en", "tok\x85en", "x" * 1025]:
        r = put(bad)
        assert r.status_code == 422, r.content
        assert r.json()["error"]["fields"][0]["field"] == "push_token"
        assert mobile.delete(f"/v1/users/alice/devices/{quote(bad, safe='')}").status_code == 422
    for good in ["tok-1", " spaced token ", "a/b:c", "x" * 1024]:
        assert put(good).status_code == 201, good
        assert mobile.delete(f"/v1/users/alice/devices/{quote(good, safe='')}").status_code == 204, good


@pytest.mark.parametrize("bad", ["Spring\nsale", "tab\tname", "nel\x85", "esc\x1b[2J"])
def test_segment_template_and_campaign_names_refuse_control_characters(http, segment, bad):
    assert http.put("/v1/segments/vip", data=json.dumps({"name": bad}),
                    content_type="application/json").status_code == 422
    r = http.put("/v1/templates/t1", data=json.dumps({"name": bad, "variants": [{"locale": "en", "body": "Hi"}]}),
                 content_type="application/json")
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["field"] == "name"
    r = http.post("/v1/campaigns", data=json.dumps({"name": bad, "segment_id": "vip", "channel": "sms",
                                                    "content": {"body": "Hi"}}),
                  content_type="application/json", headers={"Idempotency-Key": "k"})
    assert r.status_code == 422 and r.json()["error"]["fields"][0]["field"] == "name"
    assert Segment.objects.get().name == "VIPs"


@pytest.mark.parametrize("bad", ["vip\n", "v\x85p", "vip\x00", "vïp", "v p"])
def test_segment_and_template_ids_refuse_what_is_not_a_slug(http, bad):
    """``PUT /v1/segments/vip%0A`` created ``"vip\\n"`` (a ``$`` that matched before the newline)."""
    from urllib.parse import quote

    for path, body in [("segments", {"name": "S"}), ("templates", {"name": "T", "variants": [
            {"locale": "en", "body": "Hi"}]})]:
        r = http.put(f"/v1/{path}/{quote(bad, safe='')}", data=json.dumps(body), content_type="application/json")
        assert r.status_code == 422, r.content
        assert r.json()["error"]["fields"][0]["field"] == f"{path[:-1]}_id"
    assert not Segment.objects.exists()


def test_segment_ids_are_case_sensitive(http):
    """Decided: ids are compared exactly (as user ids are): ``VIP`` and ``vip`` are two segments."""
    assert http.put("/v1/segments/vip", data=json.dumps({"name": "lower"}), content_type="application/json"
                    ).status_code == 201
    assert http.put("/v1/segments/VIP", data=json.dumps({"name": "upper"}), content_type="application/json"
                    ).status_code == 201
    assert http.get("/v1/segments/VIP").json()["name"] == "upper"
    assert sorted(Segment.objects.values_list("segment_id", flat=True)) == ["VIP", "vip"]
