"""Issue 11 #2, least privilege between clients: the five attacks found against the running platform,
each refused with 403 naming the scope or the ownership rule, and changing nothing; and the
ownership rules of segments, templates and campaigns (campaigns.ownership).

Client ``a`` is the auth service (OTPs, priority high, its own template, segment and a scheduled
high-priority campaign); client ``b`` is a marketing tool (its own segments, templates and
campaigns; no ``notifications:send_high``).

In-process (Django test client, rolled-back transactions); no worker processes.
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.test import Client

from campaigns import services as campaign_services
from campaigns.models import Campaign, Segment, SegmentMember, Template, TemplateVariant
from core import clock
from core.api.scopes import Scope
from notifications.models import APIClient
from preferences.models import Device, Preferences, Recipient
from tests.conftest import MARKETING_SCOPES
from tests.test_scopes import snapshot

pytestmark = pytest.mark.django_db

A_SCOPES = [Scope.SEND, Scope.SEND_HIGH, Scope.SEGMENTS_WRITE, Scope.TEMPLATES_WRITE, Scope.CAMPAIGNS_WRITE,
            Scope.READ]
OTP_TEXT = "Your code is {{ code }}"


def http_for(key: str) -> Client:
    return Client(headers={"Authorization": f"Api-Key {key}"})


def call(http, method, path, body=None, **headers):
    return getattr(http, method)(path, data=json.dumps(body) if body is not None else None,
                                 content_type="application/json", headers=headers)


def refusal(code: str, field: str, message: str) -> dict:
    return {"error": {"status": 403, "code": code, "message": f"{field}: {message}",
                      "fields": [{"field": field, "code": code, "message": message}]}}


def missing(scope: str) -> dict:
    return refusal("missing_scope", "Authorization", f"this API key lacks the scope {scope}")


def not_owner(kind: str, action: str = "change") -> dict:
    return refusal("not_owner", f"{kind}_id",
                   f"this {kind} belongs to another API client; only its owner may {action} it")


@pytest.fixture
def a():
    return APIClient.objects.create_key(name="auth-service", scopes=A_SCOPES)


@pytest.fixture
def b():
    return APIClient.objects.create_key(name="marketing-tool", scopes=MARKETING_SCOPES)


@pytest.fixture
def world(a):
    """alice (phone, email, device) and mallory; a's segment, OTP template and scheduled high-priority
    campaign using it."""
    client, _ = a
    alice = Recipient.objects.create(user_id="alice", email="alice@example.com", phone="+4915112345678")
    Device.objects.create(recipient=alice, platform="android", push_token="tok-alice")
    Recipient.objects.create(user_id="mallory", phone="+4915199999999")
    segment = Segment.objects.create(segment_id="a-seg", name="Account holders", client=client)
    SegmentMember.objects.create(segment=segment, recipient=alice)
    template = Template.objects.create(template_id="otp", name="OTP", default_locale="en", client=client)
    TemplateVariant.objects.create(template=template, locale="en", body=OTP_TEXT)
    campaign = campaign_services.create_campaign(
        client=client, idempotency_key="otp-wave", segment=segment, channel="sms", priority="high",
        category="security", template=template, scheduled_at=clock.now() + timedelta(hours=1)).campaign
    return {"alice": alice, "segment": segment, "template": template, "campaign": campaign}


# --- the five attacks --------------------------------------------------------------------------------

def test_b_cannot_redirect_alices_otps_to_its_number(b, world):
    before = snapshot()
    r = call(http_for(b[1]), "put", "/v1/users/alice", {"phone": "+4915100000666"})
    assert (r.status_code, r.json()) == (403, missing("recipients:write"))
    assert snapshot() == before
    assert Recipient.objects.get(pk="alice").phone == "+4915112345678"


def test_b_cannot_opt_alice_out_of_every_channel(b, world):
    before = snapshot()
    r = call(http_for(b[1]), "put", "/v1/users/alice/preferences", {"opt_outs": ["sms", "email", "push"]})
    assert (r.status_code, r.json()) == (403, missing("preferences:write"))
    assert snapshot() == before
    assert not Preferences.objects.exists()


def test_b_cannot_move_alices_push_token_to_mallory(b, world):
    before = snapshot()
    r = call(http_for(b[1]), "put", "/v1/users/mallory/devices", {"platform": "android", "push_token": "tok-alice"})
    assert (r.status_code, r.json()) == (403, missing("devices:write"))
    assert snapshot() == before
    assert list(Device.objects.values_list("recipient_id", "push_token", "active")) == [("alice", "tok-alice", True)]


def test_b_cannot_rewrite_the_template_of_as_scheduled_high_priority_campaign(b, world):
    before = snapshot()
    r = call(http_for(b[1]), "put", "/v1/templates/otp", {
        "name": "OTP", "default_locale": "en", "variants": [{"locale": "en", "body": "Call +1 900 SCAM"}]})
    assert (r.status_code, r.json()) == (403, not_owner("template"))
    assert snapshot() == before
    assert list(TemplateVariant.objects.values_list("body", flat=True)) == [OTP_TEXT]


def test_b_can_neither_read_nor_edit_as_segments(b, world):
    http = http_for(b[1])
    before = snapshot()
    for method, path, body, action in [
        ("get", "/v1/segments/a-seg", None, "read"),
        ("get", "/v1/segments/a-seg/members", None, "read"),
        ("put", "/v1/segments/a-seg", {"name": "Mine now"}, "change"),
        ("post", "/v1/segments/a-seg/members", {"add": ["mallory"], "remove": ["alice"]}, "change"),
    ]:
        r = call(http, method, path, body)
        assert (r.status_code, r.json()) == (403, not_owner("segment", action)), (method, path)
    assert http.get("/v1/segments").json() == {"items": [], "next_cursor": None}
    assert snapshot() == before


# --- ownership rules ---------------------------------------------------------------------------------

def test_the_owner_without_send_high_cannot_change_a_template_an_active_high_campaign_uses(world):
    client, key = APIClient.objects.create_key(name="no-high", scopes=MARKETING_SCOPES)
    Template.objects.filter(pk="otp").update(client=client)
    before = snapshot()
    r = call(http_for(key), "put", "/v1/templates/otp", {
        "name": "OTP", "default_locale": "en", "variants": [{"locale": "en", "body": "Changed"}]})
    message = (f"this API key lacks the scope notifications:send_high (this template is used by the "
               f"high-priority campaign {world['campaign'].pk})")
    assert (r.status_code, r.json()) == (403, refusal("missing_scope", "template_id", message))
    assert snapshot() == before
    # Once that campaign is over, the owner may change it again.
    Campaign.objects.filter(pk=world["campaign"].pk).update(status="completed")
    r = call(http_for(key), "put", "/v1/templates/otp", {
        "name": "OTP", "default_locale": "en", "variants": [{"locale": "en", "body": "Changed"}]})
    assert r.status_code == 200, r.content


def test_the_owner_with_send_high_changes_its_template(a, world):
    r = call(http_for(a[1]), "put", "/v1/templates/otp", {
        "name": "OTP", "default_locale": "en", "variants": [{"locale": "en", "body": "Code: {{ code }}"}]})
    assert r.status_code == 200, r.content
    assert list(TemplateVariant.objects.values_list("body", flat=True)) == ["Code: {{ code }}"]


def test_new_segments_and_templates_belong_to_their_creator(b):
    client, key = b
    http = http_for(key)
    assert call(http, "put", "/v1/segments/b-seg", {"name": "B"}).status_code == 201
    assert call(http, "put", "/v1/templates/b-tpl", {
        "name": "B", "default_locale": "en", "variants": [{"locale": "en", "body": "Hi"}]}).status_code == 201
    assert (Segment.objects.get().client, Template.objects.get().client) == (client, client)
    assert call(http, "put", "/v1/segments/b-seg", {"name": "B2"}).status_code == 200
    assert call(http, "post", "/v1/segments/b-seg/members", {"add": ["u1"]}).status_code == 200
    assert [s["segment_id"] for s in http.get("/v1/segments").json()["items"]] == ["b-seg"]


def test_others_templates_are_readable_but_not_usable_in_a_campaign(b, world):
    http = http_for(b[1])
    assert http.get("/v1/templates/otp").json()["variants"][0]["body"] == OTP_TEXT
    assert [t["template_id"] for t in http.get("/v1/templates").json()["items"]] == ["otp"]
    assert call(http, "put", "/v1/segments/b-seg", {"name": "B"}).status_code == 201
    before = snapshot()
    r = call(http, "post", "/v1/campaigns", {"segment_id": "b-seg", "channel": "sms", "template_id": "otp"},
             **{"Idempotency-Key": "k1"})
    assert (r.status_code, r.json()) == (403, not_owner("template", "use"))
    r = call(http, "post", "/v1/campaigns", {"segment_id": "a-seg", "channel": "sms", "content": {"body": "Hi"}},
             **{"Idempotency-Key": "k2"})
    assert (r.status_code, r.json()) == (403, not_owner("segment", "use"))
    assert snapshot() == before


def test_admin_made_segments_and_templates_are_read_and_used_by_all_but_written_by_none(b):
    http = http_for(b[1])
    campaign_services.upsert_segment("newsletter", name="Newsletter")  # as the admin does: no owner
    campaign_services.upsert_template("promo", name="Promo", default_locale="en", variants=[{"locale": "en",
                                                                                             "body": "Sale"}])
    assert (Segment.objects.get().client, Template.objects.get().client) == (None, None)
    assert http.get("/v1/segments/newsletter").status_code == 200
    assert http.get("/v1/templates/promo").status_code == 200
    before = snapshot()
    r = call(http, "put", "/v1/segments/newsletter", {"name": "Hijacked"})
    admin_made = "this segment was made in the admin; only staff may change it, in the admin"
    assert (r.status_code, r.json()) == (403, refusal("not_owner", "segment_id", admin_made))
    r = call(http, "put", "/v1/templates/promo", {"name": "P", "default_locale": "en",
                                                  "variants": [{"locale": "en", "body": "Hijacked"}]})
    admin_made = "this template was made in the admin; only staff may change it, in the admin"
    assert (r.status_code, r.json()) == (403, refusal("not_owner", "template_id", admin_made))
    assert snapshot() == before
    r = call(http, "post", "/v1/campaigns", {"segment_id": "newsletter", "channel": "sms", "template_id": "promo"},
             **{"Idempotency-Key": "k1"})
    assert r.status_code == 202, r.content


def test_another_clients_campaign_cannot_be_cancelled(b, world):
    r = call(http_for(b[1]), "post", f"/v1/campaigns/{world['campaign'].pk}/cancel")
    assert r.status_code == 404
    assert Campaign.objects.get(pk=world["campaign"].pk).status == "scheduled"


def test_staff_give_a_segment_an_owner_in_the_admin(admin_client, fast_password_hashing, b):
    client, key = b
    campaign_services.upsert_segment("newsletter", name="Newsletter")
    page = admin_client.get("/admin/campaigns/segment/newsletter/change/").content.decode()
    assert 'name="client"' in page
    r = admin_client.post("/admin/campaigns/segment/newsletter/change/",
                          {"name": "Newsletter", "description": "", "client": client.prefix})
    assert r.status_code == 302, r.content.decode()[:2000]
    assert Segment.objects.get().client == client
    assert call(http_for(key), "put", "/v1/segments/newsletter", {"name": "Weekly"}).status_code == 200


# --- reading notifications: one rule for the list and the detail -------------------------------------

def test_a_users_notification_list_shows_exactly_what_the_client_may_open(a, world):
    """Issue 12 #1: ``GET /v1/users/{id}/notifications`` showed every client's notifications (ids,
    content, status, reason_detail) to a key with only the default scopes, while
    ``GET /v1/notifications/{id}`` answered 404 for the same rows. The list now follows the detail's
    rule (notifications.readers.readable_notifications): own single sends, and sends of campaigns the
    client may read (its own, and those made in the admin)."""
    from notifications.models import Notification

    alice = world["alice"]
    a_client, _ = a
    plain, plain_key = APIClient.objects.create_key(name="shop")  # the default scopes only
    assert plain.scopes == [Scope.SEND, Scope.READ]
    http = http_for(plain_key)
    r = call(http, "post", "/v1/notifications", {"user_id": "alice", "channel": "sms", "content": {"body": "Order"}},
             **{"Idempotency-Key": "order-1"})
    assert r.status_code == 202, r.content
    own = r.json()["id"]
    admin_made = campaign_services.create_campaign(client=None, idempotency_key=None, name="Newsletter",
                                                   segment=world["segment"], channel="sms", body="News").campaign

    def row(**fields):
        return str(Notification.objects.create(id=uuid.uuid4(), recipient=alice, channel="sms", body="secret",
                                               status="failed", reason="provider_rejected",
                                               reason_detail="Twilio 21610 for +4915112345678", **fields).pk)

    others_single = row(client=a_client)
    others_campaign = row(campaign_id=world["campaign"].pk)
    admin_campaign = row(campaign_id=admin_made.pk)

    listed = [i["id"] for i in http.get("/v1/users/alice/notifications").json()["items"]]
    openable = [nid for nid in (own, others_single, others_campaign, admin_campaign)
                if http.get(f"/v1/notifications/{nid}").status_code == 200]
    assert sorted(listed) == sorted(openable) == sorted([own, admin_campaign])
    for query in ({"status": "failed"}, {"channel": "sms"}, {"limit": "1"}):
        assert set(i["id"] for i in http.get("/v1/users/alice/notifications", query).json()["items"]) <= {
            own, admin_campaign}
    # The owner of the others sees its own, and the admin-made campaign's send, not the shop's.
    a_listed = {i["id"] for i in http_for(a[1]).get("/v1/users/alice/notifications").json()["items"]}
    assert a_listed == {others_single, others_campaign, admin_campaign}


# --- the high tier beyond template text (review finding 3a) ---------------------------------------------

@pytest.mark.parametrize("status", ["draft", "scheduled", "fanning_out", "sending"])
def test_a_key_without_send_high_cannot_change_the_members_of_a_segment_a_high_campaign_uses(b, status):
    client, key = b
    segment = Segment.objects.create(segment_id="b-seg", name="B", client=client)
    SegmentMember.objects.create(segment=segment, recipient=Recipient.objects.create(user_id="alice"))
    campaign = campaign_services.create_campaign(  # made by staff (the admin), who may use any segment
        client=None, idempotency_key=None, status=status, segment=segment, channel="sms", priority="high",
        category="security", body="Your account was accessed").campaign
    before = snapshot()
    message = (f"this API key lacks the scope notifications:send_high (this segment is used by the high-priority "
               f"campaign {campaign.pk})")
    for body in ({"add": ["mallory"]}, {"remove": ["alice"]}, {"add": ["mallory"], "remove": ["alice"]}):
        r = call(http_for(key), "post", "/v1/segments/b-seg/members", body)
        assert (r.status_code, r.json()) == (403, refusal("missing_scope", "segment_id", message)), body
    assert snapshot() == before
    # Once that campaign is over, the owner may change its members again.
    Campaign.objects.filter(pk=campaign.pk).update(status="completed")
    r = call(http_for(key), "post", "/v1/segments/b-seg/members", {"add": ["mallory"]})
    assert (r.status_code, r.json()["added"]) == (200, 1)


def test_a_key_with_send_high_changes_the_members_of_its_high_campaigns_segment(a, world):
    r = call(http_for(a[1]), "post", "/v1/segments/a-seg/members", {"add": ["mallory"]})
    assert (r.status_code, r.json()["added"]) == (200, 1)


def test_cancelling_a_high_priority_campaign_needs_send_high(a, world):
    client, _ = a
    narrowed, key = APIClient.objects.create_key(name="narrowed", scopes=[Scope.CAMPAIGNS_WRITE, Scope.READ])
    Campaign.objects.filter(pk=world["campaign"].pk).update(client=narrowed)  # its key lost send_high since
    before = snapshot()
    r = call(http_for(key), "post", f"/v1/campaigns/{world['campaign'].pk}/cancel")
    message = "this API key lacks the scope notifications:send_high (cancelling a high-priority campaign)"
    assert (r.status_code, r.json()) == (403, refusal("missing_scope", "campaign_id", message))
    assert snapshot() == before
    Campaign.objects.filter(pk=world["campaign"].pk).update(client=client)
    r = call(http_for(a[1]), "post", f"/v1/campaigns/{world['campaign'].pk}/cancel")
    assert (r.status_code, Campaign.objects.get(pk=world["campaign"].pk).status) == (200, "cancelled")
