"""Segments, templates and campaigns over the API: validation, idempotency, nothing written on errors.
In-process (Django test client); delivery is covered by test_e2e_campaigns.py."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns.models import Campaign, Segment, SegmentMember, Template
from notifications.models import APIClient
from preferences.models import Recipient
from tests.conftest import MARKETING_SCOPES

pytestmark = pytest.mark.django_db


@pytest.fixture
def http():
    _, key = APIClient.objects.create_key(name="marketing-tool", scopes=MARKETING_SCOPES)
    return Client(headers={"Authorization": f"Api-Key {key}"})


def call(http, method, path, body=None, **headers):
    return getattr(http, method)(path, data=json.dumps(body) if body is not None else None,
                                 content_type="application/json", headers=headers)


def fields(resp):
    return {(f["field"], f["code"]) for f in resp.json()["error"].get("fields", [])}


@pytest.fixture
def segment(http):
    assert call(http, "put", "/v1/segments/vip", {"name": "VIPs"}).status_code == 201
    return Segment.objects.get(pk="vip")


def test_segment_members_add_remove_and_count(http, segment):
    Recipient.objects.create(user_id="known", email="k@example.com")
    r = call(http, "post", "/v1/segments/vip/members", {"add": ["known", "new-1", "new-2", "new-1"]})
    assert r.status_code == 200
    assert r.json() == {"added": 3, "removed": 0, "created_recipients": 2, "member_count": 3}
    assert Recipient.objects.get(pk="new-1").phone == ""  # bare recipient
    r = call(http, "post", "/v1/segments/vip/members", {"add": ["known"], "remove": ["new-2", "ghost"]})
    assert r.json() == {"added": 0, "removed": 1, "created_recipients": 0, "member_count": 2}
    assert call(http, "get", "/v1/segments/vip").json() == {
        "segment_id": "vip", "name": "VIPs", "description": "", "rules": None, "member_count": 2}


def test_segment_member_call_limit_is_10000_and_writes_nothing(http, segment):
    r = call(http, "post", "/v1/segments/vip/members", {"add": [f"u{i}" for i in range(10_001)]})
    assert r.status_code == 422
    assert fields(r) == {("add", "max_length")}
    assert not SegmentMember.objects.exists()
    assert not Recipient.objects.exists()


def test_invalid_segment_id_is_422(http):
    r = call(http, "put", "/v1/segments/has space", {"name": "x"})
    assert r.status_code == 422
    assert fields(r) == {("segment_id", "invalid")}
    assert not Segment.objects.exists()


def test_template_with_syntax_error_is_422_naming_the_variant_field(http):
    r = call(http, "put", "/v1/templates/t1", {"name": "T", "default_locale": "en", "variants": [
        {"locale": "en", "body": "Hi {{ first_name "}]})
    assert r.status_code == 422
    assert fields(r) == {("variants.0.body", "template_syntax")}
    assert not Template.objects.exists()


def test_template_default_locale_must_have_a_variant(http):
    r = call(http, "put", "/v1/templates/t1", {"name": "T", "default_locale": "fr", "variants": [
        {"locale": "en", "body": "Hi"}]})
    assert r.status_code == 422
    assert fields(r) == {("default_locale", "no_such_variant")}


def campaign(**over):
    body = {"segment_id": "vip", "channel": "sms", "content": {"body": "Sale!"}}
    body.update(over)
    return body


@pytest.mark.parametrize(("body", "expected"), [
    (campaign(segment_id="nope"), {("segment_id", "unknown_segment")}),
    (campaign(content=None, template_id=None), {("content", "content_xor_template")}),
    ({"segment_id": "vip", "channel": "sms"}, {("content", "content_xor_template")}),
    (campaign(template_id="missing"), {("content", "content_xor_template"), ("template_id", "unknown_template")}),
    (campaign(content={"body": "x" * 1601}), {("content.body", "max_length")}),
    (campaign(channel="email", content={"body": "no subject"}), {("content.title", "required")}),
    (campaign(content={"body": "{% for %}"}), {("content.body", "template_syntax")}),
    (campaign(scheduled_at="2030-01-01T09:00:00"), {("scheduled_at", "naive_datetime")}),
    (campaign(scheduled_at="2026-12-24T09:00:00Z", local_time={"date": "2026-12-24", "time": "09:00"}),
     {("local_time", "schedule_conflict")}),
    (campaign(local_time={"date": "2026-12-24", "time": "9am"}), {("local_time.time", "invalid")}),
    (campaign(scheduled_at="0001-01-01T00:00:00+05:00"), {("scheduled_at", "too_far_past")}),
    (campaign(local_time={"date": "0001-01-01", "time": "00:00"}), {("local_time", "local_time_passed")}),
    (campaign(local_time={"date": "9999-12-31", "time": "23:59"}), {("local_time.date", "too_far_ahead")}),
    (campaign(spread_seconds=-1), {("spread_seconds", "min_value")}),
    (campaign(spread_seconds=86401), {("spread_seconds", "max_value")}),
    (campaign(category="Black Friday"), {("category", "invalid")}),
    (campaign(category="security"), {("category", "bulk_transactional_category")}),
    (campaign(category="transactional", channel="push"), {("category", "bulk_transactional_category")}),
])
def test_invalid_campaign_is_422_and_not_written(http, segment, body, expected):
    r = call(http, "post", "/v1/campaigns", body, **{"Idempotency-Key": "c1"})
    assert r.status_code == 422, r.content
    assert fields(r) == expected
    assert not Campaign.objects.exists()


def test_campaign_high_priority_needs_permission(http, segment):
    r = call(http, "post", "/v1/campaigns", campaign(priority="high", category="security"),
             **{"Idempotency-Key": "c1"})
    assert r.status_code == 403
    assert fields(r) == {("priority", "missing_scope")}
    assert r.json()["error"]["code"] == "missing_scope"
    assert r.json()["error"]["message"] == ("priority: this API key lacks the scope notifications:send_high "
                                            "(needed for priority=high)")
    assert not Campaign.objects.exists()


def test_campaign_needs_idempotency_key(http, segment):
    r = call(http, "post", "/v1/campaigns", campaign())
    assert r.status_code == 400
    assert fields(r) == {("Idempotency-Key", "required")}


def test_campaign_accept_replay_and_mismatch(http, segment):
    r1 = call(http, "post", "/v1/campaigns", campaign(), **{"Idempotency-Key": "c1"})
    assert r1.status_code == 202
    r2 = call(http, "post", "/v1/campaigns", campaign(), **{"Idempotency-Key": "c1"})
    assert r2.status_code == 202
    assert r2.json() == r1.json()
    assert r2.headers["Idempotent-Replayed"] == "true"
    r3 = call(http, "post", "/v1/campaigns", campaign(content={"body": "Other"}), **{"Idempotency-Key": "c1"})
    assert r3.status_code == 422
    assert fields(r3) == {("Idempotency-Key", "idempotency_key_reused")}
    c = Campaign.objects.get()
    assert (c.status, c.category, c.body, c.priority) == ("scheduled", "marketing", "Sale!", "standard")
    detail = call(http, "get", f"/v1/campaigns/{c.pk}").json()
    assert detail["status"] == "scheduled"
    assert detail["counts"]["total"] == 0


def test_local_time_campaign_fans_out_when_the_earliest_zone_reaches_it(http, segment):
    r = call(http, "post", "/v1/campaigns", campaign(local_time={"date": "2027-01-10", "time": "09:00"}),
             **{"Idempotency-Key": "lt"})
    assert r.status_code == 202
    c = Campaign.objects.get()
    assert c.fanout_at.isoformat() == "2027-01-09T19:00:00+00:00"


def test_cancel_scheduled_campaign_then_409(http, segment):
    cid = call(http, "post", "/v1/campaigns", campaign(), **{"Idempotency-Key": "c1"}).json()["id"]
    r = call(http, "post", f"/v1/campaigns/{cid}/cancel")
    assert r.status_code == 200
    assert r.json()["status"] == "cancelled"
    assert call(http, "post", f"/v1/campaigns/{cid}/cancel").status_code == 409


def test_segment_member_added_and_removed_in_one_call_is_422_naming_both_and_writes_nothing(http, segment):
    Recipient.objects.create(user_id="known", email="k@example.com")
    SegmentMember.objects.create(segment=segment, recipient_id="known")
    r = call(http, "post", "/v1/segments/vip/members", {"add": ["known", "new-1", "b\u00e9a"],
                                                         "remove": ["b\u00e9a", "known", "ghost"]})
    assert r.status_code == 422, r.content
    message = '2 id(s) both to add and to remove: "known", "b\u00e9a"; give each id once'
    assert r.json() == {"error": {"status": 422, "code": "validation_error", "message": f"add: {message}",
                                  "fields": [{"field": "add", "code": "add_and_remove", "message": message},
                                             {"field": "remove", "code": "add_and_remove", "message": message}]}}
    assert list(SegmentMember.objects.values_list("recipient_id", flat=True)) == ["known"]
    assert list(Recipient.objects.values_list("user_id", flat=True)) == ["known"]


def test_segment_member_overlap_message_lists_at_most_ten_ids(http, segment):
    ids = [f"u{i:02}" for i in range(12)]
    r = call(http, "post", "/v1/segments/vip/members", {"add": ids, "remove": ids})
    assert r.status_code == 422
    shown = ", ".join(f'"{i}"' for i in ids[:10])
    assert r.json()["error"]["fields"][0]["message"] == (
        f"12 id(s) both to add and to remove: {shown} … and 2 more; give each id once")
    assert not SegmentMember.objects.exists() and not Recipient.objects.exists()


_MEMBER_IDS = st.sampled_from(["a", "b", "c", "d", "A", "a."])  # case-sensitive, taken as given


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(add=st.lists(_MEMBER_IDS, max_size=4), remove=st.lists(_MEMBER_IDS, max_size=4))
def test_generated_member_changes(http, segment, add, remove):
    """422 ``add_and_remove`` on both fields exactly when an id (exact string) is in both lists, and then
    nothing changes; otherwise (if anything is given) 200."""
    before = (sorted(SegmentMember.objects.values_list("recipient_id", flat=True)),
              sorted(Recipient.objects.values_list("user_id", flat=True)))
    r = call(http, "post", "/v1/segments/vip/members", {"add": add, "remove": remove})
    both = set(add) & set(remove)
    if not add and not remove:
        assert r.status_code == 422 and fields(r) == {("add", "required")}
    elif both:
        assert r.status_code == 422, r.content
        assert fields(r) == {("add", "add_and_remove"), ("remove", "add_and_remove")}
        message = r.json()["error"]["fields"][0]["message"]
        assert message.startswith(f"{len(both)} id(s) both to add and to remove: ")
        assert all(json.dumps(i) in message for i in both)
        assert (sorted(SegmentMember.objects.values_list("recipient_id", flat=True)),
                sorted(Recipient.objects.values_list("user_id", flat=True))) == before
    else:
        assert r.status_code == 200, r.content
        members = set(SegmentMember.objects.filter(segment=segment).values_list("recipient_id", flat=True))
        assert set(add) <= members and not (set(remove) & members)


def test_a_campaign_may_use_a_notification_type_and_its_data_and_bad_uses_are_refused(http, segment):
    from notifications.events.models import NotificationType

    NotificationType.objects.create(key="weekly", name="Weekly", category="news", channels=["email", "push"],
                                    required_data=["week"])
    stranger = APIClient.objects.create_key(name="stranger")[0]
    NotificationType.objects.create(key="theirs", name="T", category="news", channels=["email"], client=stranger)
    base = {"segment_id": "vip", "channel": "email", "type": "weekly", "data": {"week": "49"}}
    ok = call(http, "post", "/v1/campaigns", base, **{"Idempotency-Key": "typed-campaign"})
    assert ok.status_code == 202, ok.content
    campaign = Campaign.objects.get(pk=ok.json()["id"])
    assert (campaign.notification_type_id, campaign.data, campaign.template_id, campaign.body) == (
        "weekly", {"week": "49"}, None, "")
    for change, field, code in [({"type": "nope"}, "type", "unknown_type"),
                                ({"channel": "sms"}, "channel", "not_in_type"),
                                ({"data": {}}, "data.week", "required"),
                                ({"content": {"title": "x", "body": "y"}}, "content", "content_xor_template"),
                                ({"type": None, "content": {"title": "x", "body": "y"}}, "data",
                                 "not_allowed_without_type")]:
        resp = call(http, "post", "/v1/campaigns", base | change, **{"Idempotency-Key": f"bad-{field}-{code}"})
        assert resp.status_code == 422 and (field, code) in fields(resp), (change, resp.json())
    resp = call(http, "post", "/v1/campaigns", base | {"type": "theirs"}, **{"Idempotency-Key": "theirs"})
    assert resp.status_code == 403 and resp.json()["error"]["fields"][0]["field"] == "type"
    assert Campaign.objects.count() == 1


def test_a_typed_campaign_takes_the_types_priority_and_category_and_conflicts_are_refused(http, segment):
    """One way in (docs/POLICIES.md, "Abuse limits"): a campaign of a type sends with the type's
    priority and category (giving either is refused, as on a typed send); a high type needs
    notifications:send_high."""
    from notifications.events.models import NotificationType

    NotificationType.objects.create(key="news_t", name="N", category="news", channels=["email"])
    NotificationType.objects.create(key="adm_high", name="H", category="security", channels=["sms"],
                                    priority="high")
    ok = call(http, "post", "/v1/campaigns", {"segment_id": "vip", "channel": "email", "type": "news_t"},
              **{"Idempotency-Key": "t1"})
    assert ok.status_code == 202, ok.content
    assert Campaign.objects.filter(pk=ok.json()["id"]).values_list("priority", "category").get() == (
        "standard", "news")
    conflict = call(http, "post", "/v1/campaigns", {"segment_id": "vip", "channel": "email", "type": "news_t",
                                                    "category": "marketing"}, **{"Idempotency-Key": "t2"})
    assert conflict.status_code == 422 and fields(conflict) == {("category", "not_allowed_with_type")}
    # The finding: a key without send_high sent a high type's content through a standard campaign.
    high = call(http, "post", "/v1/campaigns", {"segment_id": "vip", "channel": "sms", "type": "adm_high",
                                                "priority": "standard"}, **{"Idempotency-Key": "t3"})
    assert high.status_code == 422 and ("priority", "not_allowed_with_type") in fields(high)
    high = call(http, "post", "/v1/campaigns", {"segment_id": "vip", "channel": "sms", "type": "adm_high"},
                **{"Idempotency-Key": "t4"})
    assert high.status_code == 403, high.content
    assert high.json()["error"]["code"] == "missing_scope"
    assert Campaign.objects.count() == 1


def test_a_campaign_of_a_type_under_an_abuse_limit_is_refused_naming_the_rule(segment):
    """The finding: a campaign with type otp sent 15 codes to one shared phone, past otp_per_phone."""
    from notifications.events.models import NotificationType
    from tests.conftest import EVERY_SCOPE

    _, key = APIClient.objects.create_key(name="admin-tool", scopes=EVERY_SCOPE)
    http = Client(headers={"Authorization": f"Api-Key {key}"})
    NotificationType.objects.create(key="otp", name="OTP", category="security", channels=["sms"], priority="high",
                                    required_data=["code"])
    resp = call(http, "post", "/v1/campaigns", {"segment_id": "vip", "channel": "sms", "type": "otp",
                                                "data": {"code": "313131"}}, **{"Idempotency-Key": "otp"})
    assert resp.status_code == 422, resp.content
    assert fields(resp) == {("type", "acceptance_limited")}
    assert "otp_per_user" in resp.json()["error"]["fields"][0]["message"]
    assert Campaign.objects.count() == 0


def test_a_campaign_may_not_send_a_digest_type_or_one_that_overrides_users(http, segment):
    """Every road (hroads): a digest type's campaign went out undigested; a required or quiet-hours
    bypass type would override users' choices in bulk. A type's ttl is the campaign's default."""
    from notifications.events.models import NotificationType

    NotificationType.objects.create(key="dig", name="D", category="news", channels=["email"],
                                    digest={"window_seconds": 60, "key": ""})
    NotificationType.objects.create(key="req", name="R", category="news", channels=["email"], required=True)
    NotificationType.objects.create(key="byp", name="B", category="news", channels=["email"], quiet_hours="bypass")
    NotificationType.objects.create(key="ttl", name="T", category="news", channels=["email"], ttl_seconds=120)
    for key in ("dig", "req", "byp"):
        resp = call(http, "post", "/v1/campaigns", {"segment_id": "vip", "channel": "email", "type": key},
                    **{"Idempotency-Key": f"k-{key}"})
        assert resp.status_code == 422 and fields(resp) == {("type", "not_for_campaigns")}, resp.content
    ok = call(http, "post", "/v1/campaigns", {"segment_id": "vip", "channel": "email", "type": "ttl"},
              **{"Idempotency-Key": "k-ttl"})
    assert ok.status_code == 202, ok.content
    assert Campaign.objects.values_list("ttl_seconds", flat=True).get() == 120
