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
from notifications.models import APIClient
from preferences.admin import RecipientForm
from preferences.api.views import BadPathId, check_path_id
from preferences.models import Recipient
from preferences.validation import user_id_problem
from tests.conftest import MARKETING_SCOPES

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

HOSTILE = ["a\x01b", "tab\tinside", "line\nbreak", "bell\x07", "del\x7f", "esc\x1b[31m", "cr\rx", "unit\x1fsep"]
FINE = ["alice", "user 42", "ü-ß-東京", "a/b", "x" * 255, "with\u2028separator"]


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
        check_path_id("user_id", value)
    except BadPathId:
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
    assert error["field"].startswith("add") and error["code"] == "invalid"
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
    assert post_members(http, {"add": ["alice", "user 42"]}).status_code == 200
    for user_id in Segment.objects.get(pk="vip").members.values_list("recipient_id", flat=True):
        assert not path_rule_refuses(user_id)
