"""Rule segments through the API and a campaign (docs/SEGMENTS.md): a bad rule is 422 naming its
path and the rule broken, with nothing written; a rule segment takes no members and a list segment
with members takes no rule (409); the preview counts (or estimates past its timeout); a campaign on a
rule segment creates notifications for exactly the recipients matching at its snapshot."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import QuerySet

from campaigns import audience, fanout
from campaigns.models import Campaign, CampaignMember, CampaignStatus, Segment, SegmentMember
from campaigns.rules import MAX_DEPTH, MAX_NODES
from core import clock
from notifications.models import Notification, Reason, Status
from preferences.models import Device, Preferences, Recipient
from tests.test_campaign_api import call, fields, http  # noqa: F401 - fixtures

pytestmark = pytest.mark.django_db

GOLD_GERMANS = {"and": [{"attribute": "plan", "op": "eq", "value": "gold"}, {"locale": ["de"]},
                        {"subscribed": True}]}


@pytest.fixture
def people():
    Recipient.objects.create(user_id="ada", email="ada@example.org", locale="de", attributes={"plan": "gold"})
    Recipient.objects.create(user_id="bob", email="bob@example.org", locale="de-AT", attributes={"plan": "gold"})
    Recipient.objects.create(user_id="cyd", email="cyd@example.org", locale="de", attributes={"plan": "free"})
    Recipient.objects.create(user_id="dee", email="dee@example.org", locale="en", attributes={"plan": "gold"})
    Recipient.objects.create(user_id="eve", email="", locale="de", attributes={"plan": "gold"})  # no email
    Recipient.objects.create(user_id="fay", email="fay@example.org", locale="de", attributes={"plan": "gold"})
    Preferences.objects.create(recipient_id="fay", category_opt_outs={"marketing": ["email"]})


def test_a_rule_segment_is_created_read_and_listed_with_its_rule(http, people):  # noqa: F811
    r = call(http, "put", "/v1/segments/gold-de", {"name": "Gold, German", "rules": GOLD_GERMANS})
    assert r.status_code == 201, r.content
    expected = {"segment_id": "gold-de", "name": "Gold, German", "description": "", "rules": GOLD_GERMANS,
                "member_count": None}
    assert r.json() == expected
    assert call(http, "get", "/v1/segments/gold-de").json() == expected
    assert call(http, "get", "/v1/segments").json()["items"] == [expected]
    assert Segment.objects.get().rules == GOLD_GERMANS


def deep(n: int) -> dict:
    rule: dict = {"has": "email"}
    for _ in range(n - 1):
        rule = {"not": rule}
    return rule


BAD = [
    ({"and": [{"has": "email"}, {"locale": ["de"]}, {"attribute": "plan", "op": "gt", "value": "a"}]},
     "rules.and[2].op", "unknown_operator"),
    ({"and": [{"has": "email"}, {"locale": ["de"]}, {"attribute": "pl an", "op": "eq", "value": "a"}]},
     "rules.and[2].attribute", "invalid_name"),
    ({"or": [{"attribute": "plan", "op": "eq", "value": 3}]}, "rules.or[0].value", "wrong_type"),
    ({"attribute": "plan", "op": "in", "value": ["a", None]}, "rules.value[1]", "wrong_type"),
    ({"attribute": "plan", "op": "eq"}, "rules.value", "required"),
    ({"attribute": "plan", "op": "eq", "value": "a", "extra": 1}, "rules.extra", "unknown_key"),
    ({"plan": "gold"}, "rules.plan", "unknown_rule"),
    ({"has": "email", "locale": ["de"]}, "rules", "invalid"),
    ({"and": []}, "rules.and", "empty"),
    ({"and": {"has": "email"}}, "rules.and", "wrong_type"),
    ({"not": [{"has": "email"}]}, "rules.not", "wrong_type"),
    ({"has": "fax"}, "rules.has", "unknown_operator"),
    ({"locale": ["de_DE!"]}, "rules.locale[0]", "invalid"),
    ({"timezone": ["Mars/Olympus"]}, "rules.timezone[0]", "invalid"),
    ({"subscribed": False}, "rules.subscribed", "wrong_type"),
    ({"engaged": "clicked", "within_days": 7}, "rules.engaged", "unknown_operator"),
    ({"engaged": "opened", "within_days": 91}, "rules.within_days", "out_of_range"),
    ({"engaged": "opened", "within_days": "7"}, "rules.within_days", "wrong_type"),
    ({"engaged": "opened"}, "rules.within_days", "required"),
    ("gold", "rules", "wrong_type"),
    (deep(MAX_DEPTH + 1), "rules" + ".not" * MAX_DEPTH, "too_deep"),
    ({"or": [{"has": "email"}] * MAX_NODES}, f"rules.or[{MAX_NODES - 1}]", "too_many_rules"),
    ({"locale": ["de"] * 1001}, "rules.locale", "max_length"),
    ({"or": [{"locale": ["de"] * 600}, {"timezone": ["UTC"] * 401}]}, "rules.or[1].timezone", "max_length"),
]


@pytest.mark.parametrize(("rules", "field", "code"), BAD)
def test_a_bad_rule_is_422_naming_its_path_and_the_rule_and_writes_nothing(http, rules, field, code):  # noqa: F811
    r = call(http, "put", "/v1/segments/bad", {"name": "Bad", "rules": rules})
    assert r.status_code == 422, r.content
    assert fields(r) == {(field, code)}
    assert r.json()["error"]["message"].startswith(f"{field}: ")
    assert not Segment.objects.exists()
    r = call(http, "post", "/v1/segment-preview", {"rules": rules, "channel": "email"})
    assert r.status_code == 422 and fields(r) == {(field, code)}


def test_the_deepest_and_largest_rules_allowed_are_accepted(http):  # noqa: F811
    assert call(http, "put", "/v1/segments/deep", {"name": "x", "rules": deep(MAX_DEPTH)}).status_code == 201
    wide = {"or": [{"has": "email"}] * (MAX_NODES - 1)}
    assert call(http, "put", "/v1/segments/wide", {"name": "x", "rules": wide}).status_code == 201


def test_changing_the_rule_of_a_segment_an_active_high_priority_campaign_uses_needs_send_high(http):  # noqa: F811
    """Whom the quiet-hours-bypassing lane reaches: as for a segment's members (403 missing_scope),
    and nothing changed; a rename that keeps the rule is allowed."""
    from campaigns import services
    from notifications.models import APIClient

    call(http, "put", "/v1/segments/otp-users", {"name": "x", "rules": {"has": "phone"}})
    owner = APIClient.objects.get(name="marketing-tool")
    services.create_campaign(client=owner, idempotency_key=None, segment=Segment.objects.get(pk="otp-users"),
                             channel="sms", priority="high", category="security", body="code")
    r = call(http, "put", "/v1/segments/otp-users", {"name": "x", "rules": {"not": {"has": "phone"}}})
    assert r.status_code == 403, r.content
    assert fields(r) == {("segment_id", "missing_scope")}
    assert Segment.objects.get(pk="otp-users").rules == {"has": "phone"}
    r = call(http, "put", "/v1/segments/otp-users", {"name": "renamed", "rules": {"has": "phone"}})
    assert r.status_code == 200 and Segment.objects.get(pk="otp-users").name == "renamed"


def test_another_clients_segment_is_not_previewed(http, people):  # noqa: F811
    from campaigns import services
    from notifications.models import APIClient

    other, _ = APIClient.objects.create_key(name="other")
    services.upsert_segment("theirs", name="x", rules={"subscribed": True}, client=other)
    r = call(http, "post", "/v1/segment-preview", {"segment_id": "theirs"})
    assert r.status_code == 403 and fields(r) == {("segment_id", "not_owner")}


def test_a_rule_segment_takes_no_members_and_a_list_segment_with_members_no_rule(http, people):  # noqa: F811
    call(http, "put", "/v1/segments/rule", {"name": "Rule", "rules": GOLD_GERMANS})
    r = call(http, "post", "/v1/segments/rule/members", {"add": ["ada"]})
    assert r.status_code == 409, r.content
    assert fields(r) == {("add", "rule_segment")}
    assert not SegmentMember.objects.exists()
    call(http, "put", "/v1/segments/list", {"name": "List"})
    call(http, "post", "/v1/segments/list/members", {"add": ["ada"]})
    r = call(http, "put", "/v1/segments/list", {"name": "List", "rules": GOLD_GERMANS})
    assert r.status_code == 409 and fields(r) == {("rules", "list_segment")}
    assert Segment.objects.get(pk="list").rules is None


def test_the_preview_counts_a_draft_rule_or_a_stored_segment(http, people):  # noqa: F811
    r = call(http, "post", "/v1/segment-preview", {"rules": GOLD_GERMANS, "channel": "email"})
    assert r.status_code == 200, r.content
    assert r.json() == {"count": 3, "exact": True}  # ada, bob, eve (no email: still a member), not fay
    r = call(http, "post", "/v1/segment-preview", {"rules": GOLD_GERMANS, "channel": "sms"})
    assert r.json() == {"count": 4, "exact": True}  # fay opted out of marketing email only
    call(http, "put", "/v1/segments/gold-de", {"name": "x", "rules": {"and": [*GOLD_GERMANS["and"], {"has": "email"}]}})
    r = call(http, "post", "/v1/segment-preview", {"segment_id": "gold-de", "channel": "email"})
    assert r.json() == {"count": 2, "exact": True}


@pytest.mark.parametrize(("body", "expected"), [
    ({"rules": GOLD_GERMANS}, {("channel", "required")}),  # subscribed needs the campaign's channel
    ({"channel": "email"}, {("rules", "required")}),
    ({"rules": {"has": "email"}, "segment_id": "x"}, {("rules", "invalid")}),
    ({"segment_id": "nope"}, {("segment_id", "not_found")}),
    ({"rules": {"has": "email"}, "channel": "fax"}, {("channel", "invalid_choice")}),
    # Before: 200, the subscribed rule counted against a type no one can opt out of.
    ({"rules": {"subscribed": True}, "channel": "email", "notification_type": "nope"},
     {("notification_type", "unknown_type")}),
])
def test_a_bad_preview_request_is_422(http, body, expected):  # noqa: F811
    r = call(http, "post", "/v1/segment-preview", body)
    assert r.status_code == 422, r.content
    assert fields(r) == expected


def test_a_preview_past_its_timeout_answers_the_planners_estimate(http, people, settings, monkeypatch):  # noqa: F811
    """The count is cancelled by statement_timeout (here: it sleeps past 1 ms) and the answer is
    EXPLAIN's row estimate, marked inexact."""
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "PREVIEW_TIMEOUT_MS": 1}
    real_count = QuerySet.count

    def slow_count(self):
        with connection.cursor() as cur:
            cur.execute("SELECT pg_sleep(0.05)")
        return real_count(self)

    monkeypatch.setattr(QuerySet, "count", slow_count)
    r = call(http, "post", "/v1/segment-preview", {"rules": {"locale": ["de"]}})
    assert r.status_code == 200, r.content
    assert r.json()["exact"] is False
    assert isinstance(r.json()["count"], int) and r.json()["count"] >= 1
    with connection.cursor() as cur:  # the timeout was local to the count's transaction
        cur.execute("SHOW statement_timeout")
        before = cur.fetchone()[0]
    assert before != "1ms"
    monkeypatch.setattr(QuerySet, "count", real_count)
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "PREVIEW_TIMEOUT_MS": 5000}
    r = call(http, "post", "/v1/segment-preview", {"rules": {"locale": ["de"]}})
    assert r.json() == {"count": 5, "exact": True}
    with connection.cursor() as cur:  # and put back after a count that fit in it
        cur.execute("SHOW statement_timeout")
        assert cur.fetchone()[0] == before


def slow_counts(monkeypatch) -> None:
    """Every count before launch sleeps 50 ms in SQL (a preview's count, a reach's grouped query per
    row): past a 1 ms statement timeout, as a rule no index narrows is past 2 s on a million."""
    real_count = QuerySet.count

    def slow_count(self):
        with connection.cursor() as cur:
            cur.execute("SELECT pg_sleep(0.05)")
        return real_count(self)

    monkeypatch.setattr(QuerySet, "count", slow_count)
    monkeypatch.setattr(audience, "_REACH_SQL", audience._REACH_SQL.replace(
        "GROUP BY", "WHERE pg_sleep(0.05)::text IS NOT NULL\n GROUP BY", 1))


@pytest.mark.usefixtures("fast_password_hashing")
def test_a_campaigns_reach_past_the_preview_timeout_is_the_planners_estimate(http, people, settings,  # noqa: F811
                                                                             monkeypatch, admin_client):
    """Before: the reach (GET /v1/campaigns/{id}, the admin's draft page) had no timeout: a broad
    ``not`` over a million recipients held a request ~60 s and parallel GETs froze the API. Now it is
    bounded as the preview is, by the same rule: past SEGMENT_PREVIEW_TIMEOUT_MS the members are the
    planner's estimate (the preview's, for the same rule), ``eligible`` null, ``exact: false``."""
    broad = {"not": {"attribute": "n", "op": "in", "value": [str(i) for i in range(999)]}}
    call(http, "put", "/v1/segments/broad", {"name": "x", "rules": broad})
    r = call(http, "post", "/v1/campaigns", {"segment_id": "broad", "channel": "email",
                                             "content": {"title": "Hi", "body": "Sale"},
                                             "scheduled_at": (clock.now() + timedelta(days=1)).isoformat()},
             **{"Idempotency-Key": "broad-1"})
    assert r.status_code == 202, r.content
    cid = r.json()["id"]
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "PREVIEW_TIMEOUT_MS": 1}
    slow_counts(monkeypatch)
    estimate = call(http, "post", "/v1/segment-preview", {"segment_id": "broad"}).json()
    assert estimate["exact"] is False
    reach = call(http, "get", f"/v1/campaigns/{cid}").json()["reach"]
    assert reach == {"members": estimate["count"], "eligible": None, "suppressed_by_reason": {}, "exact": False}
    with connection.cursor() as cur:  # the timeout was local to the reach's transaction
        cur.execute("SHOW statement_timeout")
        assert cur.fetchone()[0] != "1ms"
    Campaign.objects.filter(pk=cid).update(status=CampaignStatus.DRAFT)
    page = admin_client.get(f"/admin/campaigns/campaign/{cid}/change/").content.decode()
    assert (f'about <span data-field="members">{estimate["count"]}</span> member'
            f'{"" if estimate["count"] == 1 else "s"} of segment') in page
    assert "(estimate: counting took too long; eligible not counted)" in page

    monkeypatch.undo()
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "PREVIEW_TIMEOUT_MS": 5000}
    assert audience.reach(Campaign.objects.get(pk=cid), clock.now()).as_dict() == {
        "members": 6, "eligible": 4, "suppressed_by_reason": {"no_email": 1, "opted_out_category": 1}, "exact": True}


# --- a campaign on a rule segment ------------------------------------------------------------------

def run_fan_out(campaign_id) -> None:
    assert fanout.start_due_campaigns() == [str(campaign_id)]
    for shard in Campaign.objects.get(pk=campaign_id).shards.all():
        while fanout.fan_out_page(str(campaign_id), shard.number) == "page":
            pass


def test_a_campaign_on_a_rule_segment_sends_to_exactly_the_matching_recipients(http, people):  # noqa: F811
    """Reach before launch, the snapshot at fan-out, and the notifications: the recipients the rule
    matches then (eve is a member without an email: suppressed no_email, as any member), none who
    matched later, and the snapshot rows released when fan-out completes."""
    Device.objects.create(recipient_id="dee", platform="ios", push_token="t", active=True)
    call(http, "put", "/v1/segments/gold-de", {"name": "x", "rules": GOLD_GERMANS})
    r = call(http, "post", "/v1/campaigns", {"segment_id": "gold-de", "channel": "email",
                                             "content": {"title": "Hi", "body": "Sale"}},
             **{"Idempotency-Key": "rule-1"})
    assert r.status_code == 202, r.content
    cid = r.json()["id"]
    reach = call(http, "get", f"/v1/campaigns/{cid}").json()["reach"]
    assert reach == {"members": 3, "eligible": 2, "suppressed_by_reason": {"no_email": 1}, "exact": True}
    assert fanout.start_due_campaigns() == [cid]
    assert set(CampaignMember.objects.filter(campaign_id=cid).values_list("recipient_id", flat=True)) == {
        "ada", "bob", "eve"}
    Recipient.objects.filter(pk="cyd").update(attributes={"plan": "gold"})  # matches only after the snapshot
    c = Campaign.objects.get(pk=cid)
    assert c.member_count == 3
    for shard in c.shards.all():
        while fanout.fan_out_page(cid, shard.number) == "page":
            pass
    rows = {n.recipient_id: (n.status, n.reason) for n in Notification.objects.filter(campaign_id=cid)}
    assert rows == {"ada": (Status.QUEUED, ""), "bob": (Status.QUEUED, ""),
                    "eve": (Status.SUPPRESSED, Reason.NO_EMAIL)}
    assert Campaign.objects.get(pk=cid).status == CampaignStatus.SENDING
    assert not CampaignMember.objects.exists()


def test_a_recipient_erased_after_the_snapshot_gets_nothing(http, people):  # noqa: F811
    from preferences.api.erasure import erase_user

    call(http, "put", "/v1/segments/gold-de", {"name": "x", "rules": GOLD_GERMANS})
    r = call(http, "post", "/v1/campaigns", {"segment_id": "gold-de", "channel": "email",
                                             "content": {"title": "Hi", "body": "Sale"}},
             **{"Idempotency-Key": "rule-2"})
    cid = r.json()["id"]
    assert fanout.start_due_campaigns() == [cid]
    erase_user(Recipient.objects.get(pk="bob"), requested_by="test")
    for shard in Campaign.objects.get(pk=cid).shards.all():
        while fanout.fan_out_page(cid, shard.number) == "page":
            pass
    assert set(Notification.objects.filter(campaign_id=cid).values_list("recipient_id", flat=True)) == {"ada", "eve"}


def test_a_list_segment_campaign_still_reads_its_members_added_before_the_snapshot(http, people):  # noqa: F811
    call(http, "put", "/v1/segments/vip", {"name": "VIP"})
    call(http, "post", "/v1/segments/vip/members", {"add": ["ada", "dee"]})
    r = call(http, "post", "/v1/campaigns", {"segment_id": "vip", "channel": "email",
                                             "content": {"title": "Hi", "body": "Sale"}},
             **{"Idempotency-Key": "list-1"})
    cid = r.json()["id"]
    assert fanout.start_due_campaigns() == [cid]
    assert Campaign.objects.get(pk=cid).member_count == 2
    call(http, "post", "/v1/segments/vip/members", {"add": ["bob"]})
    for shard in Campaign.objects.get(pk=cid).shards.all():
        while fanout.fan_out_page(cid, shard.number) == "page":
            pass
    assert set(Notification.objects.filter(campaign_id=cid).values_list("recipient_id", flat=True)) == {"ada", "dee"}
    assert clock.now()  # the platform clock ran the whole way


def fan_out_one_page(cid) -> None:
    assert fanout.start_due_campaigns() == [cid]
    (shard,) = Campaign.objects.get(pk=cid).shards.all()
    assert fanout.fan_out_page(cid, shard.number) == "page"


def finish_fan_out(cid) -> None:
    for shard in Campaign.objects.get(pk=cid).shards.all():
        while fanout.fan_out_page(cid, shard.number) == "page":
            pass


EVERYONE_BY_EMAIL = {"ada": (Status.QUEUED, ""), "bob": (Status.QUEUED, ""), "cyd": (Status.QUEUED, ""),
                     "dee": (Status.QUEUED, ""), "eve": (Status.SUPPRESSED, Reason.NO_EMAIL),
                     "fay": (Status.SUPPRESSED, Reason.OPTED_OUT_CATEGORY)}


def test_a_rule_segment_made_a_list_segment_mid_fan_out_keeps_its_campaigns_snapshot(http, people,  # noqa: F811
                                                                                     settings):
    """Before: each page asked the segment's kind now; a PUT without rules (a list segment, no
    members) mid fan-out made the rest of the pages read no one (6,000 members, 0 notifications).
    Pages read the snapshot the campaign took, recorded on it; its rows are released at completion."""
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "PAGE_SIZE": 2}
    call(http, "put", "/v1/segments/r6k", {"name": "x", "rules": {"attribute": "plan", "op": "exists", "value": True}})
    cid = call(http, "post", "/v1/campaigns", {"segment_id": "r6k", "channel": "email",
                                               "content": {"title": "Hi", "body": "Sale"}},
               **{"Idempotency-Key": "r6k-1"}).json()["id"]
    fan_out_one_page(cid)
    assert call(http, "put", "/v1/segments/r6k", {"name": "now a list"}).status_code == 200
    assert Segment.objects.get(pk="r6k").is_rule is False
    assert CampaignMember.objects.filter(campaign_id=cid).count() == 6  # the snapshot in use is kept
    finish_fan_out(cid)
    rows = {n.recipient_id: (n.status, n.reason) for n in Notification.objects.filter(campaign_id=cid)}
    assert rows == EVERYONE_BY_EMAIL
    c = Campaign.objects.get(pk=cid)
    assert (c.status, c.member_count, c.created_count, c.snapshot_kind) == (CampaignStatus.SENDING, 6, 6, "rule")
    assert not CampaignMember.objects.exists()  # released once fan-out completed


def test_a_list_segment_given_a_rule_mid_fan_out_keeps_its_campaigns_members(http, people, settings):  # noqa: F811
    """The reverse: the API refuses a rule for a segment with members (409), but however the segment
    became a rule meanwhile (here: written directly), its campaign pages on through the members it
    had at the snapshot, never through an empty rule snapshot."""
    settings.CAMPAIGNS = {**settings.CAMPAIGNS, "PAGE_SIZE": 2}
    call(http, "put", "/v1/segments/vip", {"name": "VIP"})
    call(http, "post", "/v1/segments/vip/members", {"add": sorted(EVERYONE_BY_EMAIL)})
    cid = call(http, "post", "/v1/campaigns", {"segment_id": "vip", "channel": "email",
                                               "content": {"title": "Hi", "body": "Sale"}},
               **{"Idempotency-Key": "vip-1"}).json()["id"]
    fan_out_one_page(cid)
    Segment.objects.filter(pk="vip").update(rules={"has": "phone"})
    finish_fan_out(cid)
    rows = {n.recipient_id: (n.status, n.reason) for n in Notification.objects.filter(campaign_id=cid)}
    assert rows == EVERYONE_BY_EMAIL
    c = Campaign.objects.get(pk=cid)
    assert (c.member_count, c.created_count, c.snapshot_kind) == (6, 6, "list")


def test_a_user_re_created_after_its_erasure_matches_again_on_what_was_written_since(people):
    """Before: erased_at was never cleared and every rule left the id out for good (preview 1, DELETE,
    PUT 200, preview 0). A PUT /v1/users after the erasure re-creates the user: it matches on what was
    written since, and nothing of the erased user counts (its send before the erasure is no
    engagement of the new one)."""
    import uuid

    from django.test import Client

    from tests.conftest import make_client

    _, key = make_client()
    api = Client(headers={"Authorization": f"Api-Key {key}"})
    zed = {"attribute": "plan", "op": "eq", "value": "zed"}
    sent = {"engaged": "sent", "within_days": 7}

    def count(rules) -> int:
        r = call(api, "post", "/v1/segment-preview", {"rules": rules})
        assert r.json()["exact"] is True, r.content
        return r.json()["count"]

    assert call(api, "put", "/v1/users/zed", {"attributes": {"plan": "zed"}}).status_code == 201
    before = clock.now() - timedelta(hours=1)
    Notification.objects.create(id=uuid.uuid4(), recipient_id="zed", channel="sms", body="b", status=Status.DELIVERED,
                                created_at=before, updated_at=before)
    assert (count(zed), count({"and": [zed, sent]}), count({"not": zed})) == (1, 1, 6)
    assert call(api, "delete", "/v1/users/zed").status_code == 200
    assert (count(zed), count({"not": zed})) == (0, 6)  # the bare row matches nothing, not even a not
    assert call(api, "put", "/v1/users/zed", {"attributes": {"plan": "zed"}}).status_code == 200
    assert (count(zed), count({"and": [zed, sent]}), count({"and": [zed, {"not": sent}]})) == (1, 0, 1)
    assert count({"not": zed}) == 6
