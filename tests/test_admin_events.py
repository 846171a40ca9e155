"""The events admin (notifications/admin/events.py): support reads an event per user and channel
with each notification's status, reason and reason detail (the silent push from its timeline event),
a sensitive type's data hidden, nothing changeable; and the recipient page's list of their events.

In-process (Django test client, rolled-back transactions); no worker processes: the notifications'
outcomes are written as the pipeline would leave them.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Group, User
from django.urls import reverse

from campaigns import roles
from notifications.admin import HIDDEN
from notifications.admin import events as admin_events
from notifications.events import services
from notifications.models import APIClient, DeliveryEvent, Notification, Reason, Status
from preferences.models import Recipient

pytestmark = pytest.mark.django_db

SILENT = "quiet hours until 2030-01-02T06:00:00+00:00: sent now as a silent (data-only) push, no alert or sound"
TEMPLATES = [{"channel": "push", "locale": "en", "body": "Order {{ data.order_id }} shipped"},
             {"channel": "email", "locale": "en", "title": "Shipped", "body": "Order {{ data.order_id }}"},
             {"channel": "sms", "locale": "en", "body": "Order {{ data.order_id }}"}]


def staff(username: str, group: str) -> User:
    user = User.objects.create_user(username, is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def support(client):
    client.force_login(staff("sam", roles.SUPPORT))
    return client


@pytest.fixture
def shop() -> APIClient:
    return APIClient.objects.create_key(name="shop")[0]


@pytest.fixture
def users() -> list[Recipient]:
    return [Recipient.objects.create(user_id=u, email=f"{u}@example.com") for u in ("alice", "bob")]


def outcome(pk, status, reason="", detail="") -> None:
    Notification.objects.filter(pk=pk).update(status=status, reason=reason, reason_detail=detail)


@pytest.fixture
def shipped(shop, users):
    """order_shipped (push, email, sms; all; silent) to alice and bob: alice's push went silently,
    her email waits for her quiet hours' end, she opted out of SMS; bob's push failed, his email was
    delivered, his SMS is due (scheduled, released by the scheduler in a batch)."""
    kind, _ = services.save_type("order_shipped", {"name": "Order shipped", "category": "shipping",
                                                   "channels": ["push", "email", "sms"], "quiet_hours": "silent"},
                                 TEMPLATES, client=None)
    accepted = services.accept_event(client=shop, idempotency_key="order-8812:shipped", fingerprint="f", kind=kind,
                                     recipients=users, data={"order_id": "8812"})
    rows = {(n.recipient_id, n.channel): n.pk for n in accepted.notifications}
    outcome(rows["alice", "push"], Status.SENT)
    DeliveryEvent.objects.create(notification_id=rows["alice", "push"], kind="silent", status=Status.SENDING,
                                 detail=SILENT)
    outcome(rows["alice", "email"], Status.SCHEDULED, Reason.QUIET_HOURS, "until 2030-01-02T06:00:00+00:00")
    outcome(rows["alice", "sms"], Status.SUPPRESSED, Reason.OPTED_OUT_CHANNEL)
    outcome(rows["bob", "push"], Status.FAILED, Reason.CONTACT_INVALID, "fcm UNREGISTERED")
    outcome(rows["bob", "email"], Status.DELIVERED)
    return accepted.event, rows


def lines(html: str) -> list[str]:
    """The per-channel outcome lines of a page, tags stripped."""
    return [re.sub(r"<[^>]+>", "", m) for m in re.findall(r'<span class="outcome outcome-\w+">(.*?)</span>', html)]


def test_support_reads_an_event_per_user_and_channel_with_each_reason(support, shipped):
    event, rows = shipped
    listing = support.get(reverse("admin:notifications_event_changelist"))
    assert listing.status_code == 200 and [e.pk for e in listing.context["cl"].result_list] == [event.pk]
    assert "2: alice, bob" in listing.content.decode()

    page = support.get(reverse("admin:notifications_event_change", args=[event.pk]))
    html = page.content.decode()
    assert page.status_code == 200 and page.context["has_change_permission"] is False
    assert lines(html) == [
        f"push: sent — silent push: {SILENT}",
        "email: scheduled — quiet_hours: Deferred: recipient&#x27;s quiet hours (until 2030-01-02T06:00:00+00:00)",
        "sms: suppressed — opted_out_channel: Recipient opted out of this channel",
        "push: failed — contact_invalid: Provider said the address/number/token is invalid (fcm UNREGISTERED)",
        "email: delivered",
        "sms: scheduled"]
    for pk in rows.values():
        assert reverse("admin:notifications_notification_change", args=[pk]) in html
    assert reverse("admin:preferences_recipient_change", args=["bob"]) in html
    assert '<pre class="event-data">{\n  &quot;order_id&quot;: &quot;8812&quot;\n}</pre>' in html  # not sensitive
    assert reverse("admin:notifications_notificationtype_change", args=[quote("order_shipped")]) in html


def test_a_page_of_users_at_a_time(support, shipped, monkeypatch):
    event, _ = shipped
    monkeypatch.setattr(admin_events, "USERS_PER_PAGE", 1)
    url = reverse("admin:notifications_event_change", args=[event.pk])
    first = support.get(url).content.decode()
    second = support.get(url, {"users_page": "2"}).content.decode()
    assert lines(first)[0].startswith("push: sent") and len(lines(first)) == 3
    assert lines(second)[0].startswith("push: failed") and len(lines(second)) == 3
    assert "users 2–2 of 2" in second


def test_a_sensitive_types_event_data_is_hidden(support, shop, users):
    kind, _ = services.save_type("login_code", {"name": "Login code", "category": "security", "channels": ["push"],
                                                "sensitive": True}, TEMPLATES[:1], client=None)
    event = services.accept_event(client=shop, idempotency_key="k", fingerprint="f", kind=kind, recipients=users[:1],
                                  data={"code": "918273"}).event
    html = support.get(reverse("admin:notifications_event_change", args=[event.pk])).content.decode()
    assert HIDDEN in html and "918273" not in html


def test_events_are_read_only_for_everyone(admin_client, shipped):
    event, _ = shipped
    change = reverse("admin:notifications_event_change", args=[event.pk])
    assert admin_client.get(reverse("admin:notifications_event_add")).status_code == 403
    assert admin_client.post(change, {"data": "{}"}).status_code == 403
    assert admin_client.post(reverse("admin:notifications_event_delete", args=[event.pk]),
                             {"post": "yes"}).status_code == 403
    listing = admin_client.get(reverse("admin:notifications_event_changelist")).content.decode()
    assert 'value="delete_selected"' not in listing


@pytest.mark.parametrize("group", [roles.PRODUCT, roles.MARKETING])
def test_only_support_reads_events(client, shipped, group):
    event, _ = shipped
    client.force_login(staff("x", group))
    assert client.get(reverse("admin:notifications_event_changelist")).status_code == 403
    assert client.get(reverse("admin:notifications_event_change", args=[event.pk])).status_code == 403


def test_support_finds_an_event_by_id_or_idempotency_key(support, shipped):
    event, _ = shipped
    url = reverse("admin:notifications_event_changelist")
    for term, found in [(str(event.pk), [event.pk]), ("order-8812:shipped", [event.pk]), ("order-8812", [])]:
        assert [e.pk for e in support.get(url, {"q": term}).context["cl"].result_list] == found, term


def test_the_recipient_page_lists_their_events_with_each_channels_outcome(client, shipped, shop, users):
    event, _ = shipped
    kind = event.type
    later = services.accept_event(client=shop, idempotency_key="order-9000:shipped", fingerprint="f", kind=kind,
                                  recipients=users[:1], data={"order_id": "9000"}).event
    Notification.objects.filter(event=later).update(created_at=event.created_at.replace(year=2100))
    client.force_login(staff("sam", roles.SUPPORT))
    page = client.get(reverse("admin:preferences_recipient_change", args=["alice"]))
    html = page.content.decode()
    assert page.status_code == 200
    mine = lines(html)
    assert mine == ["push: scheduled", "email: scheduled", "sms: scheduled",  # the newer event first
                    f"push: sent — silent push: {SILENT}",
                    "email: scheduled — quiet_hours: Deferred: recipient&#x27;s quiet hours "
                    "(until 2030-01-02T06:00:00+00:00)",
                    "sms: suppressed — opted_out_channel: Recipient opted out of this channel"]
    assert html.index(str(later.pk)) < html.index(str(event.pk))
    assert reverse("admin:notifications_event_change", args=[event.pk]) in html
    assert "order_shipped (Order shipped)" in html and "failed" not in "".join(mine)  # bob's rows are not hers

    client.force_login(staff("mia", roles.MARKETING))
    html = client.get(reverse("admin:preferences_recipient_change", args=["alice"])).content.decode()
    assert str(event.pk) not in html and lines(html) == []
