"""Everyday API reads (issue 10, finding 8): keyset-paginated lists with filters, personal-data
erasure (``DELETE /v1/users/{id}``), and campaigns made in the admin readable through the API."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group, Permission, User
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaigns import roles
from campaigns import services as campaign_services
from campaigns.models import Campaign, CampaignStatus, Segment, SegmentMember
from core import clock
from notifications.models import APIClient, DeliveryAttempt, DeliveryEvent, Notification
from preferences.models import Device, Erasure, Preferences, Recipient, SmsStop
from tests.conftest import EVERY_SCOPE, MARKETING_SCOPES

pytestmark = pytest.mark.django_db


@pytest.fixture
def api_client():
    return APIClient.objects.create_key(name="support-backend", scopes=EVERY_SCOPE)


@pytest.fixture
def http(api_client):
    return Client(headers={"Authorization": f"Api-Key {api_client[1]}"})


def call(http, method, path, body=None, **headers):
    if method == "get":
        return http.get(path, headers=headers)
    return getattr(http, method)(path, data=json.dumps(body) if body is not None else None,
                                 content_type="application/json", headers=headers)


def fields(r):
    return {(f["field"], f["code"]) for f in r.json()["error"].get("fields", [])}


def send(http, i, **over):
    body = {"user_id": "alice", "channel": "sms", "content": {"body": f"message {i}"}} | over
    r = call(http, "post", "/v1/notifications", body, **{"Idempotency-Key": f"n{i}"})
    assert r.status_code == 202, r.content
    return r.json()["id"]


@pytest.fixture
def alice():
    r = Recipient.objects.create(user_id="alice", email="alice@example.com", phone="+4915123456789",
                                 timezone="Europe/Berlin", locale="de-DE", attributes={"first_name": "Alice"})
    Device.objects.create(recipient=r, platform="android", push_token="tok-alice")
    return r


def walk(http, path, limit):
    """Every item of a list, page by page; also the number of pages."""
    items, cursor, pages = [], None, 0
    while True:
        r = http.get(path, {"limit": limit, **({"cursor": cursor} if cursor else {})})
        assert r.status_code == 200, r.content
        body = r.json()
        assert set(body) == {"items", "next_cursor"}
        assert len(body["items"]) <= limit
        items += body["items"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            return items, pages


# --- a user's notifications -------------------------------------------------------------------

def test_user_notifications_newest_first_every_one_once_across_pages(http, alice):
    ids = [send(http, i) for i in range(7)]
    # The same instant for several rows: the id breaks the tie, so no row is skipped or repeated.
    Notification.objects.filter(pk__in=ids[2:5]).update(created_at=clock.now())
    items, pages = walk(http, "/v1/users/alice/notifications", limit=3)
    assert pages == 3
    assert sorted(i["id"] for i in items) == sorted(ids)
    keys = [(i["created_at"], i["id"]) for i in items]
    assert keys == sorted(keys, reverse=True)
    assert items[0]["content"]["body"].startswith("message ")
    assert set(items[0]) >= {"id", "user_id", "campaign_id", "channel", "status", "reason", "content", "created_at"}


@pytest.mark.parametrize("later", [1, 3600])
def test_a_list_cursor_still_reads_the_next_page_after_the_clock_moved(http, alice, host_clock, monkeypatch, later):
    # Issue 23 #1: a cursor is not a time-limited token (the inbox's expired after a second).
    ids = [send(http, i) for i in range(3)]
    first = http.get("/v1/users/alice/notifications", {"limit": 2}).json()
    moved = clock.now() + timedelta(seconds=later)
    monkeypatch.setattr(clock, "now", lambda: moved)
    host_clock[0] += later
    r = http.get("/v1/users/alice/notifications", {"limit": 2, "cursor": first["next_cursor"]})
    assert r.status_code == 200, r.content
    assert sorted(i["id"] for i in first["items"] + r.json()["items"]) == sorted(ids)
    assert r.json()["next_cursor"] is None


def test_a_list_cursor_reads_on_only_in_its_own_listing(http, alice):
    # A fresh attack on main: list cursors were unsigned, so one user's (or one filter's) cursor read
    # on in another listing. A cursor is bound to its list, path ids and filters (core/cursors.py).
    Recipient.objects.create(user_id="bob")
    for i in range(3):
        send(http, i)
    first = http.get("/v1/users/alice/notifications", {"limit": 1, "channel": "sms"}).json()
    assert first["next_cursor"]
    for path, query in (("/v1/users/bob/notifications", {"channel": "sms"}),
                        ("/v1/users/alice/notifications", {}),
                        ("/v1/users/alice/notifications", {"channel": "sms", "status": "queued"}),
                        ("/v1/campaigns", {"channel": "sms"})):
        r = http.get(path, {"limit": 1, "cursor": first["next_cursor"], **query})
        assert (r.status_code, fields(r)) == (422, {("cursor", "invalid_cursor")}), (path, query, r.content)
    r = http.get("/v1/users/alice/notifications", {"limit": 5, "channel": "sms", "cursor": first["next_cursor"]})
    assert r.status_code == 200 and len(r.json()["items"]) == 2


def test_user_notifications_filters(http, alice):
    send(http, 1)
    send(http, 2, channel="email", content={"title": "t", "body": "b"}, category="security")
    cancelled = send(http, 3)
    assert call(http, "post", f"/v1/notifications/{cancelled}/cancel").status_code == 200
    get = lambda **q: [i["id"] for i in http.get("/v1/users/alice/notifications", q).json()["items"]]  # noqa: E731
    assert len(get(channel="email")) == 1
    assert get(status="cancelled") == [cancelled]
    assert len(get(category="security")) == 1
    assert len(get(channel="sms", status="queued")) == 1


def test_sensitive_content_is_null_in_the_list(http, alice):
    send(http, 1, sensitive=True)
    item = http.get("/v1/users/alice/notifications").json()["items"][0]
    assert (item["sensitive"], item["content"]) == (True, None)


@pytest.mark.parametrize(("query", "field", "code"), [
    ({"status": "lost"}, "status", "invalid_choice"),
    ({"channel": "fax"}, "channel", "invalid_choice"),
    ({"limit": "0"}, "limit", "min_value"),
    ({"limit": "201"}, "limit", "max_value"),
    ({"limit": "ten"}, "limit", "invalid"),
    # Digits to str.isdigit() but not ASCII integers (issue 11 #7): "²" was a 500, "٣" read as 3.
    ({"limit": "²"}, "limit", "invalid"),
    ({"limit": "٣"}, "limit", "invalid"),
    ({"cursor": "bm90IGEgY3Vyc29y"}, "cursor", "invalid_cursor"),
    ({"cursor": "!!!"}, "cursor", "invalid_cursor"),
    ({"stauts": "sent"}, "stauts", "unknown_parameter"),
])
def test_bad_list_query_is_422_naming_the_parameter(http, alice, query, field, code):
    r = http.get("/v1/users/alice/notifications", query)
    assert r.status_code == 422
    assert fields(r) == {(field, code)}


def test_an_unknown_query_parameter_suggests_the_near_one(http, alice):
    """``stauts`` listed the valid parameters without saying which was meant."""
    r = http.get("/v1/users/alice/notifications", {"stauts": "sent"})
    assert (r.status_code, r.json()["error"]["fields"]) == (422, [{
        "field": "stauts", "code": "unknown_parameter",
        "message": "unknown query parameter; did you mean status? this list takes category, channel, cursor, "
                   "limit, status"}])
    r = http.get("/v1/users/alice/notifications", {"colour": "red"})
    assert r.json()["error"]["fields"][0]["message"] == ("unknown query parameter; this list takes category, "
                                                         "channel, cursor, limit, status")


def test_forged_cursor_with_bad_values_is_422_not_500(http, alice):
    import base64

    forged = base64.urlsafe_b64encode(json.dumps(["yesterday", "not-a-uuid"]).encode()).decode()
    r = http.get("/v1/users/alice/notifications", {"cursor": forged})
    assert r.status_code == 422
    assert fields(r) == {("cursor", "invalid_cursor")}


def test_notifications_of_unknown_user_is_404(http):
    r = http.get("/v1/users/ghost/notifications")
    assert r.status_code == 404
    assert fields(r) == {("user_id", "not_found")}


# --- campaigns, segments, templates ------------------------------------------------------------

@pytest.fixture
def segment(http):
    assert call(http, "put", "/v1/segments/vip", {"name": "VIPs"}).status_code == 201
    return Segment.objects.get(pk="vip")


def test_campaigns_made_in_the_admin_are_readable_through_the_api(http, segment):
    admin_user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    made = campaign_services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.DRAFT,
                                             name="From the admin", segment=segment, channel="sms",
                                             body="Sale", created_by=admin_user).campaign
    r = http.get(f"/v1/campaigns/{made.pk}")
    assert r.status_code == 200, r.content
    assert (r.json()["name"], r.json()["status"]) == ("From the admin", "draft")
    items = http.get("/v1/campaigns").json()["items"]
    assert [(i["id"], i["created_via"]) for i in items] == [(str(made.pk), "admin")]
    # Readable, not cancellable: only the client's own campaigns can be cancelled.
    assert http.post(f"/v1/campaigns/{made.pk}/cancel").status_code == 404
    assert Campaign.objects.get(pk=made.pk).status == "draft"


def test_campaign_list_own_and_admin_not_other_clients_with_filters(http, segment):
    _, other_key = APIClient.objects.create_key(name="other", scopes=MARKETING_SCOPES)
    other = Client(headers={"Authorization": f"Api-Key {other_key}"})
    body = {"segment_id": "vip", "channel": "sms", "content": {"body": "Sale"}}
    mine = [call(http, "post", "/v1/campaigns", body | {"name": f"c{i}"}, **{"Idempotency-Key": f"c{i}"}).json()["id"]
            for i in range(3)]
    assert call(other, "put", "/v1/segments/theirs", {"name": "Theirs"}).status_code == 201
    theirs = call(other, "post", "/v1/campaigns", body | {"segment_id": "theirs"},
                  **{"Idempotency-Key": "x"}).json()["id"]
    email = call(http, "post", "/v1/campaigns", body | {"channel": "email", "content": {"title": "t", "body": "b"}},
                 **{"Idempotency-Key": "e"}).json()["id"]
    items, pages = walk(http, "/v1/campaigns", limit=2)
    assert pages == 2
    assert sorted(i["id"] for i in items) == sorted([*mine, email])
    assert theirs not in {i["id"] for i in items}
    assert http.get(f"/v1/campaigns/{theirs}").status_code == 404
    assert [i["id"] for i in http.get("/v1/campaigns", {"channel": "email"}).json()["items"]] == [email]
    assert len(http.get("/v1/campaigns", {"segment_id": "vip", "status": "scheduled"}).json()["items"]) == 4
    assert http.get("/v1/campaigns", {"status": "done"}).status_code == 422


def test_segments_and_members_lists(http, segment):
    for sid in ("a-seg", "b-seg"):
        call(http, "put", f"/v1/segments/{sid}", {"name": sid})
    users = [f"u{i:02d}" for i in range(5)]
    assert call(http, "post", "/v1/segments/vip/members", {"add": users}).status_code == 200
    items, pages = walk(http, "/v1/segments", limit=2)
    assert [(i["segment_id"], i["member_count"]) for i in items] == [("a-seg", 0), ("b-seg", 0), ("vip", 5)]
    assert pages == 2
    members, pages = walk(http, "/v1/segments/vip/members", limit=2)
    assert [m["user_id"] for m in members] == users
    assert pages == 3
    assert http.get("/v1/segments/ghost/members").status_code == 404


def test_templates_list(http):
    for tid in ("welcome", "bye"):
        assert call(http, "put", f"/v1/templates/{tid}", {"name": tid, "default_locale": "en", "variants": [
            {"locale": "en", "title": "T", "body": f"{tid} body"}]}).status_code == 201
    items, pages = walk(http, "/v1/templates", limit=1)
    assert [(t["template_id"], t["variants"][0]["body"]) for t in items] == [("bye", "bye body"),
                                                                             ("welcome", "welcome body")]
    assert pages == 2


# --- erasure -----------------------------------------------------------------------------------

def test_delete_user_erases_personal_data_keeps_counts_and_records_it(http, api_client, alice, segment):
    Preferences.objects.create(recipient=alice, opt_outs=["email"])
    SegmentMember.objects.create(segment=segment, recipient=alice)
    SmsStop.objects.create(phone=alice.phone, sender="+15005550006", source="twilio 21610")
    sent = send(http, 1)
    Notification.objects.filter(pk=sent).update(status="failed", reason="contact_invalid",
                                                reason_detail=f"Twilio: {alice.phone} is not reachable")
    DeliveryAttempt.objects.create(notification_id=sent, number=1, provider="twilio", outcome="contact_invalid",
                                   error_message=f"The 'To' number {alice.phone} is not a valid phone number.")
    pending = send(http, 2, scheduled_at=(clock.now() + timedelta(hours=1)).isoformat())
    other = Recipient.objects.create(user_id="bob", phone="+4915199999999")
    bob_n = Notification.objects.create(id=uuid.uuid4(), recipient=other, channel="sms", body="for bob")

    r = http.delete("/v1/users/alice")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body == {"user_id": "alice", "erased_at": body["erased_at"], "requested_by": "api client support-backend",
                    "contacts_erased": True, "devices_deleted": 1, "preferences_deleted": True,
                    "segment_memberships_removed": 1, "notifications_erased": 2, "notifications_cancelled": 1,
                    "replayed": False}
    alice.refresh_from_db()
    assert (alice.email, alice.phone, alice.timezone, alice.locale, alice.attributes) == ("", "", "", "", {})
    assert not Device.objects.filter(recipient=alice).exists()
    assert not Preferences.objects.filter(recipient=alice).exists()
    assert not SegmentMember.objects.filter(recipient=alice).exists()
    # Counts survive; content and echoed contacts do not.
    rows = {n.pk: n for n in Notification.objects.filter(recipient=alice)}
    assert len(rows) == 2
    assert all((n.title, n.body, n.html, n.data) == ("", "", "", None) for n in rows.values())
    assert rows[uuid.UUID(sent)].reason_detail == "Twilio: [erased] is not reachable"
    assert (rows[uuid.UUID(pending)].status, rows[uuid.UUID(pending)].reason) == ("cancelled", "recipient_erased")
    assert DeliveryEvent.objects.filter(notification_id=pending, kind="cancelled",
                                        detail="recipient's personal data erased by api client support-backend"
                                        ).count() == 1
    assert DeliveryAttempt.objects.get(notification_id=sent).error_message == (
        "The 'To' number [erased] is not a valid phone number.")
    assert "+4915123456789" not in json.dumps(http.get("/v1/users/alice/notifications").json())
    # The STOP list is kept (it keeps the number from being texted again); other users untouched.
    assert SmsStop.objects.count() == 1
    assert Notification.objects.get(pk=bob_n.pk).body == "for bob"
    assert Recipient.objects.get(pk="bob").phone == "+4915199999999"
    erasure = Erasure.objects.get()
    assert (erasure.recipient_id, erasure.requested_by) == ("alice", "api client support-backend")


def test_delete_user_is_idempotent(http, alice):
    first = http.delete("/v1/users/alice").json()
    again = http.delete("/v1/users/alice")
    assert again.status_code == 200
    assert again.json() == first | {"replayed": True}
    assert Erasure.objects.count() == 1
    # Re-created with new contacts, then erased again: a second record.
    assert call(http, "put", "/v1/users/alice", {"email": "new@example.com"}).status_code == 200
    third = http.delete("/v1/users/alice").json()
    assert (third["contacts_erased"], third["replayed"]) == (True, False)
    assert Erasure.objects.count() == 2
    assert Recipient.objects.get(pk="alice").email == ""


def test_delete_unknown_user_is_404_and_records_nothing(http):
    r = http.delete("/v1/users/ghost")
    assert r.status_code == 404
    assert fields(r) == {("user_id", "not_found")}
    assert not Erasure.objects.exists()


def test_erasure_is_visible_to_support_on_the_recipient_page(http, alice):
    http.delete("/v1/users/alice")
    support = User.objects.create_user("sam", password="pw", is_staff=True)
    roles_group, _ = Group.objects.get_or_create(name=roles.SUPPORT)
    for dotted in roles.GROUP_PERMISSIONS[roles.SUPPORT]:
        app, codename = dotted.split(".")
        perm = Permission.objects.filter(content_type__app_label=app, codename=codename).first()
        if perm:
            roles_group.permissions.add(perm)
    support.groups.add(roles_group)
    c = Client()
    c.force_login(support)
    page = c.get(reverse("admin:preferences_recipient_change", args=["alice"])).content.decode()
    assert "Personal-data erasures" in page
    assert "UTC by api client support-backend: 0 notification(s) emptied" in page


def test_a_campaign_send_listed_for_a_user_can_be_opened(http, alice, segment):
    """The list shows campaign sends too; their timeline opens for clients that may read the campaign."""
    made = campaign_services.create_campaign(client=None, idempotency_key=None, name="admin-made", segment=segment,
                                             channel="sms", body="Sale").campaign
    row = Notification.objects.create(id=uuid.uuid4(), recipient=alice, channel="sms", body="", campaign_id=made.pk,
                                      status="suppressed", reason="opted_out_channel")
    items = http.get("/v1/users/alice/notifications").json()["items"]
    assert [(i["id"], i["campaign_id"]) for i in items] == [(str(row.pk), str(made.pk))]
    r = http.get(f"/v1/notifications/{row.pk}")
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["reason"]) == ("suppressed", "opted_out_channel")
    # Another client's campaign: neither listed nor openable (one rule for both, issue 12 #1).
    other, _ = APIClient.objects.create_key(name="other")
    theirs = campaign_services.create_campaign(client=other, idempotency_key="k", name="theirs", segment=segment,
                                               channel="sms", body="x").campaign
    hidden = Notification.objects.create(id=uuid.uuid4(), recipient=alice, channel="sms", body="",
                                         campaign_id=theirs.pk)
    assert http.get(f"/v1/notifications/{hidden.pk}").status_code == 404
    assert [i["id"] for i in http.get("/v1/users/alice/notifications").json()["items"]] == [str(row.pk)]
    assert http.post(f"/v1/notifications/{row.pk}/cancel").status_code == 404  # cancel: own single sends only


_users = iter(range(10**9))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stamps=st.lists(st.integers(0, 4), max_size=25), statuses=st.lists(st.sampled_from(["queued", "sent"]),
                                                                             min_size=25, max_size=25),
       limit=st.integers(1, 7), status=st.sampled_from([None, "queued", "sent"]))
def test_keyset_pages_return_every_row_once_in_order(http, api_client, stamps, statuses, limit, status):
    """Generated histories with many equal creation instants (ties broken by id), any page size and
    filter: walking the pages yields exactly the matching rows, each once, newest first."""
    uid = f"walker-{next(_users)}"
    recipient = Recipient.objects.create(user_id=uid)
    base = clock.now()
    rows = Notification.objects.bulk_create([
        Notification(id=uuid.uuid4(), client=api_client[0], recipient=recipient, channel="sms", body="x",
                     status=statuses[i])
        for i in range(len(stamps))])
    for row, stamp in zip(rows, stamps, strict=True):
        Notification.objects.filter(pk=row.pk).update(created_at=base - timedelta(seconds=stamp))
    items, cursor = [], None
    for _ in range(30):
        query = {"limit": limit, **({"cursor": cursor} if cursor else {}), **({"status": status} if status else {})}
        body = http.get(f"/v1/users/{uid}/notifications", query).json()
        items += body["items"]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    expected = sorted(((base - timedelta(seconds=stamp)), str(row.pk)) for row, stamp, row_status in
                      zip(rows, stamps, statuses, strict=False) if status in (None, row_status))
    assert [i["id"] for i in items] == [pk for _, pk in reversed(expected)]
