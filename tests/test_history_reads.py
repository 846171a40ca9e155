"""Every support and API read sees a notification wherever it lives (issue 25): a row the archiver
moved to the history reads exactly as it read live, and counts include it once
(docs/ARCHITECTURE.md, "Reading across live and history"). Rows are moved with the archiver's
statement (tests/history.py)."""

from __future__ import annotations

import re
import uuid

import pytest
from django.urls import reverse

from campaigns import services as campaign_services
from campaigns.models import Campaign, CampaignStatus
from campaigns.selectors import campaign_counts, counts_for
from core import clock
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification, NotificationRecord, Reason, Status
from preferences.models import Recipient
from tests.history import archive
from tests.test_api_lists import alice, api_client, http, send, walk  # noqa: F401 - fixtures
from tests.test_event_reads import event  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db


def where(pk) -> tuple[bool, bool]:
    """(in the live table, in the view as archived)."""
    return (Notification.objects.filter(pk=pk).exists(),
            NotificationRecord.objects.filter(pk=pk, live=False).exists())


# --- by id: GET /v1/notifications/{id} --------------------------------------------------------------

def test_a_notification_reads_the_same_after_it_is_archived(http, alice):  # noqa: F811
    nid = send(http, 1)
    n = Notification.objects.get(pk=nid)
    DeliveryAttempt.objects.create(notification=n, number=1, provider="twilio", outcome="accepted",
                                   provider_message_id="SM1", latency_ms=12)
    DeliveryEvent.objects.create(notification=n, kind="delivered", status="delivered")
    Notification.objects.filter(pk=nid).update(status=Status.DELIVERED, provider="twilio", provider_message_id="SM1")
    live = http.get(f"/v1/notifications/{nid}")
    assert live.status_code == 200
    assert [e["kind"] for e in live.json()["timeline"]] == ["accepted", "sent", "delivered"]
    assert [a["provider_message_id"] for a in live.json()["attempts_log"]] == ["SM1"]

    assert archive(nid) == 1
    assert where(nid) == (False, True)
    archived = http.get(f"/v1/notifications/{nid}")
    assert (archived.status_code, archived.json()) == (200, live.json())


def test_an_archived_notification_of_another_client_stays_404(http, alice):  # noqa: F811
    from tests.test_events_api import http_for

    nid = send(http, 1)
    archive(nid)
    _other, other = http_for("someone-else")
    r = other.get(f"/v1/notifications/{nid}")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")


# --- by recipient: GET /v1/users/{id}/notifications -------------------------------------------------

def test_a_users_list_shows_archived_rows_and_a_row_archived_mid_paging_once(http, alice):  # noqa: F811
    ids = [send(http, i) for i in range(7)]  # newest first: ids[6] … ids[0]
    archive(ids[0], ids[1])
    path = "/v1/users/alice/notifications"
    first = http.get(path, {"limit": 3}).json()
    assert [n["id"] for n in first["items"]] == [ids[6], ids[5], ids[4]]
    archive(ids[5], ids[3])  # one already shown, one on the next page: moved between two pages
    seen = [n["id"] for n in first["items"]]
    cursor = first["next_cursor"]
    while cursor:
        body = http.get(path, {"limit": 3, "cursor": cursor}).json()
        seen += [n["id"] for n in body["items"]]
        cursor = body["next_cursor"]
    assert seen == ids[::-1]
    items, _pages = walk(http, path, 2)
    assert [n["id"] for n in items] == ids[::-1]
    assert {n["id"]: n["status"] for n in items} == dict.fromkeys(ids, "queued")


def test_the_users_list_filters_reach_archived_rows(http, alice):  # noqa: F811
    sms = send(http, 1)
    email = send(http, 2, channel="email", content={"title": "Hi", "body": "b"})
    archive(sms, email)
    r = http.get("/v1/users/alice/notifications", {"channel": "email"})
    assert [n["id"] for n in r.json()["items"]] == [email]


# --- by event: GET /v1/events/{id} and its recipients -----------------------------------------------

def test_an_events_detail_and_recipients_read_the_same_after_its_rows_are_archived(event):  # noqa: F811
    client, eid = event
    before = client.get(f"/v1/events/{eid}").json()
    listing = client.get(f"/v1/events/{eid}/recipients?limit=100").json()
    rows = list(Notification.objects.filter(event_id=eid).values_list("pk", flat=True))
    assert archive(*rows) == len(rows) == 75
    assert client.get(f"/v1/events/{eid}").json() == before
    assert client.get(f"/v1/events/{eid}/recipients?limit=100").json() == listing
    assert before["summary"]["outcomes"] == {"reached": 1, "pending": 23, "not_reached": 1, "unknown": 0}


# --- by campaign: its counts (API, admin page and list) ---------------------------------------------

@pytest.fixture
def campaign(api_client):  # noqa: F811
    owner, _key = api_client
    segment, _ = campaign_services.upsert_segment("spring", name="Spring")
    c = campaign_services.create_campaign(client=owner, idempotency_key="k", segment=segment, channel="push",
                                          body="hi", name="Push sale").campaign
    Campaign.objects.filter(pk=c.pk).update(status=CampaignStatus.COMPLETED, member_count=20, created_count=20)
    mix = [(Status.SENT, "")] * 8 + [(Status.DELIVERED, "")] * 4 + [(Status.SUPPRESSED, Reason.NO_ACTIVE_DEVICE)] * 6 \
        + [(Status.FAILED, Reason.CONTACT_INVALID)] * 2
    rows = []
    for i, (status, reason) in enumerate(mix):
        r = Recipient.objects.create(user_id=f"c{i:02}")
        rows.append(Notification.objects.create(id=uuid.uuid4(), campaign_id=c.pk, recipient=r, channel="push",
                                                body="hi", status=status, reason=reason).pk)
    return c, rows


def test_campaign_counts_include_archived_rows_once(campaign, http):  # noqa: F811
    c, rows = campaign
    before = campaign_counts(c)
    assert before["total"] == 20
    api_before = http.get(f"/v1/campaigns/{c.pk}").json()["counts"]
    assert archive(*rows[::2]) == 10
    assert campaign_counts(c) == before
    assert counts_for([c]) == {c.pk: before}
    assert http.get(f"/v1/campaigns/{c.pk}").json()["counts"] == api_before
    assert before["outcome"] == {"sent": 12, "delivered": 4, "displayed": 0, "opened": 0, "not_sent": 8,
                                 "suppressed": 6, "failed": 2, "expired": 0, "cancelled": 0, "pending": 0}


# --- the admin: the list, a notification's page, the recipient's page, an event's page, dead letters ----

def archived_cell(html: str, where: str) -> str:
    """The icon of the ``archived`` field in ``where`` (``td`` in the list, ``div`` on the page)."""
    found = re.search(rf'<{where} class="[^"]*field-archived[^"]*">.*?icon-(yes|no)\.svg', html, re.S)
    assert found, html
    return found.group(1)


def test_the_admin_shows_an_archived_notification_read_only_with_its_timeline(admin_client, http, alice):  # noqa: F811
    nid = send(http, 1)
    n = Notification.objects.get(pk=nid)
    DeliveryAttempt.objects.create(notification=n, number=1, provider="twilio", outcome="accepted",
                                   provider_message_id="SM-archived")
    DeliveryEvent.objects.create(notification=n, kind="delivered", status="delivered", detail="receipt-detail")
    live = admin_client.get(reverse("admin:notifications_notification_change", args=[nid])).content.decode()
    assert archived_cell(live, "div") == "no"
    archive(nid)
    page = admin_client.get(reverse("admin:notifications_notification_change", args=[nid]))
    html = page.content.decode()
    assert page.status_code == 200
    assert archived_cell(html, "div") == "yes"
    assert ("SM-archived" in html, "receipt-detail" in html, "0 (1 provider call)" in html) == (True, True, True)
    assert 'name="_save"' not in html  # read-only, as a live row's page
    listing = admin_client.get(reverse("admin:notifications_notification_changelist"), {"q": nid}).content.decode()
    assert (nid in listing, archived_cell(listing, "td")) == (True, "yes")
    everyone = admin_client.get(reverse("admin:notifications_notification_changelist"),
                                {"recipient__user_id": "alice"}).content.decode()
    assert nid in everyone


def test_the_recipient_page_lists_archived_notifications(admin_client, http, alice):  # noqa: F811
    kept, moved = send(http, 1), send(http, 2)
    archive(moved)
    html = admin_client.get(reverse("admin:preferences_recipient_change", args=["alice"])).content.decode()
    for nid in (kept, moved):
        assert reverse("admin:notifications_notification_change", args=[nid]) in html


def test_an_events_admin_page_shows_the_same_outcomes_after_archive(admin_client, event):  # noqa: F811
    _client, eid = event
    url = reverse("admin:notifications_event_change", args=[eid])

    def shown():
        return re.findall(r'<span class="outcome[^"]*">.*?</span>', admin_client.get(url).content.decode(), re.S)

    before = shown()
    assert len(before) == 75
    archive(*Notification.objects.filter(event_id=eid).values_list("pk", flat=True))
    assert shown() == before


def test_replaying_an_archived_dead_letter_is_refused_with_a_message(admin_client, alice):  # noqa: F811
    dead = Notification.objects.create(id=uuid.uuid4(), recipient=alice, channel="sms", body="b",
                                       status=Status.FAILED, reason=Reason.ATTEMPTS_EXHAUSTED,
                                       dead_lettered_at=clock.now())
    archive(dead.pk)
    r = admin_client.post(reverse("admin:notifications_deadletter_changelist"),
                          {"action": "replay", "_selected_action": [str(dead.pk)]}, follow=True)
    shown = [str(m) for m in r.context["messages"]]
    assert shown == ["1 selected were archived (expired dead letters, kept as history): not replayed."]
    row = NotificationRecord.objects.get(pk=dead.pk)
    assert (row.live, row.status, Notification.objects.count()) == (False, Status.FAILED, 0)


def test_a_link_to_a_dead_letter_archived_since_says_so_and_opens_its_notification(admin_client, alice):  # noqa: F811
    dead = Notification.objects.create(id=uuid.uuid4(), recipient=alice, channel="sms", body="b",
                                       status=Status.FAILED, reason=Reason.ATTEMPTS_EXHAUSTED,
                                       dead_lettered_at=clock.now())
    link = reverse("admin:notifications_deadletter_change", args=[dead.pk])
    assert admin_client.get(link).status_code == 200
    archive(dead.pk)

    r = admin_client.get(link)

    assert (r.status_code, r["Location"]) == (302, reverse("admin:notifications_notification_change",
                                                           args=[dead.pk]))
    shown = [str(m) for m in admin_client.get(r["Location"]).context["messages"]]
    assert shown == [f"Dead letter {dead.pk} was archived (an expired dead letter, kept as history): not "
                     "replayable. Its notification page follows."]


def test_a_link_to_a_replayed_dead_letter_says_it_is_no_longer_one(admin_client, alice):  # noqa: F811
    n = Notification.objects.create(id=uuid.uuid4(), recipient=alice, channel="sms", body="b", status=Status.QUEUED)
    r = admin_client.get(reverse("admin:notifications_deadletter_change", args=[n.pk]), follow=True)
    assert r.redirect_chain == [(reverse("admin:notifications_notification_change", args=[n.pk]), 302)]
    assert [str(m) for m in r.context["messages"]] == [
        f"{n.pk} is no longer a dead letter (replayed or changed since). Its notification page follows."]
    missing = uuid.uuid4()
    r = admin_client.get(reverse("admin:notifications_deadletter_change", args=[missing]), follow=True)
    assert [str(m) for m in r.context["messages"]] == [
        f"dead letter with ID “{missing}” doesn’t exist. Perhaps it was deleted?"]


def test_an_inbox_item_of_an_archived_notification_stays_listed_with_its_content(admin_client, alice):  # noqa: F811
    from notifications.inbox.models import InboxItem

    n = Notification.objects.create(id=uuid.uuid4(), recipient=alice, channel="in_app", body="inbox-body",
                                    status=Status.DELIVERED)
    InboxItem.objects.create(notification=n, recipient=alice, body="inbox-body")
    secret = Notification.objects.create(id=uuid.uuid4(), recipient=alice, channel="in_app", body="b",
                                         status=Status.DELIVERED, sensitive=True)
    InboxItem.objects.create(notification=secret, recipient=alice, body="secret-body")
    archive(n.pk, secret.pk)
    listing = admin_client.get(reverse("admin:notifications_inboxitem_changelist")).content.decode()
    assert (str(n.pk) in listing, str(secret.pk) in listing) == (True, True)
    page = admin_client.get(reverse("admin:notifications_inboxitem_change", args=[n.pk])).content.decode()
    hidden = admin_client.get(reverse("admin:notifications_inboxitem_change", args=[secret.pk])).content.decode()
    assert ("inbox-body" in page, "secret-body" in hidden, "sensitive: hidden" in hidden) == (True, False, True)
