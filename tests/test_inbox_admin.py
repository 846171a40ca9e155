"""The in-app inbox in the admin (issue 16): support sees a user's inbox (counts, newest items with
their seen/read/archived state) on the recipient page, and a read-only item list filtered by
recipient with each item's content; marketing sees none of it; content is never a lookup.

In-process (Django test client, rolled-back transactions)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.urls import reverse

from campaigns import roles
from notifications.admin import HIDDEN
from notifications.admin.inbox import RECIPIENT_INBOX_LIMIT
from notifications.inbox import marks, store
from notifications.models import Notification
from preferences.models import Recipient

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def staff(username: str, group: str) -> User:
    user = User.objects.create_user(username, is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


def put(recipient, n, *, sensitive=False, start=NOW - timedelta(hours=2)) -> list[uuid.UUID]:
    ids = [uuid.uuid4() for _ in range(n)]
    Notification.objects.bulk_create([Notification(id=i, recipient=recipient, channel="in_app", status="sent",
                                                    body="b", sensitive=sensitive) for i in ids])
    store.write([store.NewItem(i, recipient.pk, "order", "orders", f"Title {k}", f"Body {k}", {"order": str(k)},
                               start + timedelta(minutes=k), None) for k, i in enumerate(ids)])
    return ids


@pytest.fixture
def alice():
    return Recipient.objects.create(user_id="alice")


def test_support_sees_the_counts_and_newest_items_with_their_state_on_the_recipient_page(client, alice):
    ids = put(alice, RECIPIENT_INBOX_LIMIT + 5)
    marks.mark("alice", "read", ids=[ids[-1]])
    marks.mark("alice", "archived", ids=[ids[-2]])
    marks.mark("alice", "seen", ids=[ids[-3]])
    client.force_login(staff("sam", roles.SUPPORT))
    r = client.get(reverse("admin:preferences_recipient_change", args=["alice"]))
    assert r.status_code == 200
    page = r.content.decode()
    inline = next(f for f in r.context["inline_admin_formsets"] if f.opts.__class__.__name__ == "RecipientInboxInline")
    shown = [form.original.pk for form in inline]
    assert shown == list(reversed(ids))[:RECIPIENT_INBOX_LIMIT]  # newest 50, archived included
    states = {form.original.pk: inline.opts.state(form.original) for form in inline}
    assert (states[ids[-1]], states[ids[-2]], states[ids[-3]], states[ids[-4]]) == ("read, seen", "archived",
                                                                                    "seen", "new")
    counts = next(f for f in r.context["inline_admin_formsets"]
                  if f.opts.__class__.__name__ == "RecipientInboxCountsInline")
    (row,) = [form.original for form in counts]
    assert (row.unseen, row.unread, row.total) == (RECIPIENT_INBOX_LIMIT + 2, RECIPIENT_INBOX_LIMIT + 3,
                                                   RECIPIENT_INBOX_LIMIT + 4)
    assert "Every inbox item of alice" in page
    assert "Body 3" not in page  # no content on the recipient page, as for notifications


def test_support_reads_the_item_list_by_recipient_and_an_items_content(client, alice):
    bob = Recipient.objects.create(user_id="bob")
    mine = put(alice, 3)
    put(bob, 2)
    client.force_login(staff("sam", roles.SUPPORT))
    r = client.get(reverse("admin:notifications_inboxitem_changelist"), {"recipient": "alice"})
    assert r.status_code == 200
    assert {o.pk for o in r.context["cl"].result_list} == set(mine)
    r = client.get(reverse("admin:notifications_inboxitem_change", args=[mine[0]]))
    assert r.status_code == 200
    page = r.content.decode()
    assert "Title 0" in page and "Body 0" in page
    assert reverse("admin:notifications_notification_change", args=[mine[0]]) in page


def test_sensitive_content_is_hidden_on_the_item_page(client, alice):
    (nid,) = put(alice, 1, sensitive=True)
    client.force_login(staff("sam", roles.SUPPORT))
    page = client.get(reverse("admin:notifications_inboxitem_change", args=[nid])).content.decode()
    assert HIDDEN in page and "Body 0" not in page


def test_support_cannot_change_or_delete_items(client, alice):
    (nid,) = put(alice, 1)
    client.force_login(staff("sam", roles.SUPPORT))
    assert client.post(reverse("admin:notifications_inboxitem_delete", args=[nid]), {"post": "yes"}).status_code == 403
    assert client.get(reverse("admin:notifications_inboxitem_add")).status_code == 403


def test_content_is_never_a_lookup(client, alice):
    put(alice, 1)
    client.force_login(staff("sam", roles.SUPPORT))
    r = client.get(reverse("admin:notifications_inboxitem_changelist"), {"recipient": "alice", "body__startswith": "B"})
    assert r.status_code == 400


def test_marketing_sees_no_inbox(client, alice):
    (nid,) = put(alice, 1)
    client.force_login(staff("mia", roles.MARKETING))
    assert client.get(reverse("admin:notifications_inboxitem_changelist")).status_code == 403
    assert client.get(reverse("admin:notifications_inboxitem_change", args=[nid])).status_code == 403
    r = client.get(reverse("admin:preferences_recipient_change", args=["alice"]))
    assert r.status_code == 200
    names = {f.opts.__class__.__name__ for f in r.context["inline_admin_formsets"]}
    assert not names & {"RecipientInboxInline", "RecipientInboxCountsInline"}
    assert "Every inbox item" not in r.content.decode()
