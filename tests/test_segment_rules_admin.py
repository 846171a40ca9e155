"""Rule segments in the admin (docs/SEGMENTS.md): the segment page saves a valid rule and shows its
count now, refuses a bad rule naming its path, takes no CSV upload; a draft campaign on a rule
segment shows its reach over the rule's matches."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from campaigns import services
from campaigns.models import CampaignStatus, Segment, SegmentMember
from preferences.models import Recipient

pytestmark = pytest.mark.django_db

RULE = {"and": [{"locale": ["de"]}, {"has": "email"}]}


@pytest.fixture
def people():
    Recipient.objects.create(user_id="ada", locale="de", email="ada@example.org")
    Recipient.objects.create(user_id="bob", locale="de-AT", email="bob@example.org")
    Recipient.objects.create(user_id="cyd", locale="de")  # no email
    Recipient.objects.create(user_id="dee", locale="en", email="dee@example.org")


def save(client, segment_id: str, rules) -> object:
    url = reverse("admin:campaigns_segment_add")
    return client.post(url, {"segment_id": segment_id, "name": "Rule", "description": "",
                             "rules": json.dumps(rules) if rules is not None else "", "client": ""})


def test_a_rule_segment_is_saved_and_its_page_shows_the_count_and_no_upload(admin_client, people):
    r = save(admin_client, "de-mail", RULE)
    assert r.status_code == 302, r.content.decode()[:2000]
    assert Segment.objects.get(pk="de-mail").rules == RULE
    page = admin_client.get(reverse("admin:campaigns_segment_change", args=["de-mail"])).content.decode()
    assert re.search(r'<div class="readonly">2</div>', page)  # ada, bob
    assert "takes no CSV upload" in page and "Upload and add members" not in page
    url = reverse("admin:campaigns_segment_upload_members", args=["de-mail"])
    r = admin_client.post(url, {"file": SimpleUploadedFile("ids.csv", b"ada\n", content_type="text/csv")})
    assert next(str(m) for m in get_messages(r.wsgi_request)).startswith("Upload rejected; nothing was added")
    assert not SegmentMember.objects.exists()


def test_a_bad_rule_is_refused_on_the_form_naming_its_path(admin_client):
    r = save(admin_client, "bad", {"and": [{"locale": ["de"]}, {"attribute": "plan", "op": "gt", "value": "a"}]})
    assert r.status_code == 200
    assert "rules.and[1].op: op is one of eq, in, exists, not &#x27;gt&#x27; (unknown_operator)." in r.content.decode()
    assert not Segment.objects.exists()


def test_a_list_segment_with_members_takes_no_rule_in_the_admin(admin_client, people):
    segment, _ = services.upsert_segment("vip", name="VIP")
    services.change_members(segment, add=["ada"], remove=[])
    url = reverse("admin:campaigns_segment_change", args=["vip"])
    r = admin_client.post(url, {"name": "VIP", "description": "", "rules": json.dumps(RULE), "client": ""})
    assert r.status_code == 200 and "Not saved: this segment has members" in r.content.decode()
    assert Segment.objects.get(pk="vip").rules is None


def test_a_draft_on_a_rule_segment_shows_the_reach_of_its_matches(admin_client, people):
    segment, _ = services.upsert_segment("de-mail", name="x", rules={"locale": ["de"]})
    draft = services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.DRAFT,
                                     segment=segment, channel="email", title="Hi", body="Sale").campaign
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[draft.pk])).content.decode()
    assert re.search(r'id="campaign-reach"><strong data-field="eligible">2</strong> eligible of\s+'
                     r'<span data-field="members">3</span> members', page)
    assert re.search(r'id="campaign-reach-suppressed">no_email: 1\n', page)
