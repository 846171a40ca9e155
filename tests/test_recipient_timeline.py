"""A recipient's last 30 days on their admin page (issue 27 part 3): every notification by channel and
outcome, the reason on each dot, and per channel a table (what stays with JavaScript off); support
sees it, marketing does not. In-process, real Postgres."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import Group, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from notifications.admin import timeline as timeline_module
from notifications.admin.timeline import timeline
from notifications.models import Notification
from preferences.models import Recipient
from tests.history import archive

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

NOW = datetime(2030, 5, 20, 12, 0, tzinfo=UTC)


def note(r, channel, status, days_ago, reason=""):
    at = NOW - timedelta(days=days_ago)
    return Notification.objects.create(id=uuid.uuid4(), recipient=r, channel=channel, status=status, reason=reason,
                                       body="b", created_at=at, updated_at=at)


@pytest.fixture
def eve():
    r = Recipient.objects.create(user_id="eve", email="eve@example.org")
    note(r, "email", "delivered", 1)
    note(r, "email", "suppressed", 2, "quiet_hours")
    note(r, "push", "failed", 3, "token_invalid")
    note(r, "sms", "sent", 6)
    note(r, "email", "sent", 10)
    note(r, "push", "queued", 0)
    note(r, "email", "delivered", 31)  # outside the window
    Recipient.objects.create(user_id="bob")
    note(Recipient.objects.get(pk="bob"), "email", "failed", 1, "provider_rejected")
    return r


def test_the_window_by_channel_and_outcome(frozen, eve):
    t = timeline("eve", NOW)
    assert [(p["channel"], p["group"], p["status"], p["reason"]) for p in t["points"]] == [
        ("push", "pending", "queued", ""), ("email", "delivered", "delivered", ""),
        ("email", "suppressed", "suppressed", "quiet_hours"), ("push", "failed", "failed", "token_invalid"),
        ("sms", "sent", "sent", ""), ("email", "sent", "sent", "")]
    assert t["groups"] == ["delivered", "sent", "failed", "suppressed", "not sent", "pending"]
    assert [(c, counts, last) for c, counts, last in t["table"]] == [
        ("push", [0, 0, 1, 0, 0, 1], None),
        ("email", [1, 1, 0, 1, 0, 0], NOW - timedelta(days=1)),
        ("sms", [0, 1, 0, 0, 0, 0], NOW - timedelta(days=6))]
    assert t["truncated"] is False
    assert (t["chart"]["since"], t["chart"]["until"]) == (int((NOW - timedelta(days=30)).timestamp() * 1000),
                                                        int(NOW.timestamp() * 1000))


def test_a_deferred_send_is_placed_when_it_was_sent(frozen, eve):
    late = note(eve, "sms", "sent", 5)
    Notification.objects.filter(pk=late.pk).update(sent_at=NOW - timedelta(hours=2))
    t = timeline("eve", NOW)
    assert dict((c, last) for c, _counts, last in t["table"])["sms"] == NOW - timedelta(hours=2)
    assert sorted(p["t"] for p in t["points"] if p["channel"] == "sms") == [
        int((NOW - timedelta(days=6)).timestamp() * 1000), int((NOW - timedelta(hours=2)).timestamp() * 1000)]


def test_a_send_made_before_the_window_and_sent_in_it_is_there_live_or_archived(frozen):
    """Scheduled ahead: made 35 and 40 days ago, sent 2 h and 3 days ago (the second archived since);
    one made 45 days ago and sent 31 days ago (archived 30.5 days ago) is outside."""
    ann = Recipient.objects.create(user_id="ann")
    live, moved, old = note(ann, "email", "delivered", 35), note(ann, "push", "sent", 40), note(ann, "sms", "sent", 45)
    Notification.objects.filter(pk=live.pk).update(sent_at=NOW - timedelta(hours=2))
    Notification.objects.filter(pk=moved.pk).update(sent_at=NOW - timedelta(days=3))
    Notification.objects.filter(pk=old.pk).update(sent_at=NOW - timedelta(days=31))
    assert archive(moved.pk, at=NOW - timedelta(days=2)) == 1
    assert archive(old.pk, at=NOW - timedelta(days=30, hours=12)) == 1
    t = timeline("ann", NOW)
    assert [(p["t"], p["channel"], p["status"]) for p in t["points"]] == [
        (int((NOW - timedelta(hours=2)).timestamp() * 1000), "email", "delivered"),
        (int((NOW - timedelta(days=3)).timestamp() * 1000), "push", "sent")]
    assert [(c, last) for c, _counts, last in t["table"]] == [
        ("push", NOW - timedelta(days=3)), ("email", NOW - timedelta(hours=2))]


def staff(group: str) -> Client:
    user = User.objects.create_user(f"{group}-1", is_staff=True)
    user.groups.add(Group.objects.get(name=group))
    client = Client()
    client.force_login(user)
    return client


def test_support_sees_the_timeline_and_marketing_does_not(frozen, eve):
    page = staff("support").get("/admin/preferences/recipient/eve/change/").content.decode()
    assert 'id="recipient-timeline"' in page and 'id="recipient-timeline-chart"' in page
    data = json.loads(re.search(r'<script id="recipient-timeline-data" type="application/json">(.*?)</script>',
                                page).group(1))
    assert data["channels"] == ["push", "email", "sms"] and len(data["points"]) == 6
    rows = re.findall(r'<tr data-channel="(\w+)"><td>\w+</td>((?:<td>\d+</td>)+)', page)
    assert [(c, re.findall(r"\d+", cells)) for c, cells in rows] == [
        ("push", ["0", "0", "1", "0", "0", "1"]), ("email", ["1", "1", "0", "1", "0", "0"]),
        ("sms", ["0", "1", "0", "0", "0", "0"])]
    assert "vendor/chartjs/chart.umd.min" in page
    marketing = staff("marketing").get("/admin/preferences/recipient/eve/change/")
    assert marketing.status_code == 200
    assert 'id="recipient-timeline"' not in marketing.content.decode()


def test_the_page_reads_the_window_once(frozen, eve):
    """hadv34 #11: Django built the inline's formset a second time to learn its fields, reading the window again."""
    client = staff("support")
    with CaptureQueriesContext(connection) as queries:
        assert client.get("/admin/preferences/recipient/eve/change/").status_code == 200
    window = [q["sql"] for q in queries.captured_queries if "COALESCE" in q["sql"] and '"archived_at"' in q["sql"]]
    assert len(window) == 1


def test_a_truncated_window_says_so_where_it_is_named(frozen, eve, monkeypatch):
    """hadv34 #8: 120k rows in the window showed 100 per channel under "Last 30 days", with a small note."""
    monkeypatch.setattr(timeline_module, "MAX_POINTS", 4)
    client = staff("support")
    page = client.get("/admin/preferences/recipient/eve/change/").content.decode()
    assert "<h2>Last 30 days: the newest 4 of the window shown by channel and outcome</h2>" in page
    note = re.search(r'<p class="help" id="recipient-timeline-truncated">(.*?)</p>', page).group(1)
    assert re.sub(r"<[^>]+>", "", note) == (
        "More than 4 notifications in the last 30 days: the chart and the table count the newest 4 only, back to "
        "2030-05-17 12:00:00 UTC; each notification's list has them all.")
    bob = client.get("/admin/preferences/recipient/bob/change/").content.decode()
    assert 'id="recipient-timeline-truncated"' not in bob
