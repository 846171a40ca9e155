"""The marketing and support admin: segment CSV uploads, template validation and preview, campaign
drafts, launch, cancel and progress, the high-priority rule, and a recipient's campaign history.

In-process (Django test client, rolled-back transactions); no worker processes.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, date, datetime, time, timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from campaigns import admin_views, services
from campaigns.models import Campaign, CampaignShard, CampaignStatus, SegmentMember, Template, TemplateVariant
from notifications.models import Notification, Reason, Status
from preferences.models import Recipient

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

# Dates the forms accept (at most 366 days ahead), whenever the tests run.
TODAY = timezone.now().date()
NEXT_JANUARY = date(TODAY.year + 1, 1, 15)
SOON = TODAY + timedelta(days=30)



def msgs(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def members(segment) -> set[str]:
    return set(SegmentMember.objects.filter(segment=segment).values_list("recipient_id", flat=True))


@pytest.fixture
def segment():
    segment, _ = services.upsert_segment("vip", name="VIPs")
    return segment


@pytest.fixture
def alice():
    return Recipient.objects.create(user_id="alice", email="alice@example.com", phone="+4915123456789",
                                    locale="de-DE", attributes={"first_name": "<script>alert(1)</script>"})


def make_campaign(segment, status=CampaignStatus.DRAFT, **fields) -> Campaign:
    fields = {"channel": "sms", "body": "hello", **fields}
    return services.create_campaign(client=None, idempotency_key=None, status=status, segment=segment,
                                    **fields).campaign


def notify(recipient, campaign_id, status, reason="", **fields) -> Notification:
    return Notification.objects.create(id=uuid.uuid4(), campaign_id=campaign_id, recipient=recipient,
                                       channel="sms", body="x", status=status, reason=reason, **fields)


# --- segments --------------------------------------------------------------------------------------

def upload(client, segment, text: str, name="ids.csv"):
    url = reverse("admin:campaigns_segment_upload_members", args=[segment.pk])
    return client.post(url, {"file": SimpleUploadedFile(name, text.encode(), content_type="text/csv")})


def test_csv_upload_adds_members_and_reports_counts(admin_client, segment):
    services.change_members(segment, add=["u1"], remove=[])
    Recipient.objects.create(user_id="u2")
    r = upload(admin_client, segment, "user_id\r\nu1\r\nu2\r\n u3 \r\nu2\r\n")
    assert r.status_code == 302 and r.url == reverse("admin:campaigns_segment_change", args=["vip"])
    assert msgs(r) == ["3 user ids uploaded: 2 added, 1 already members, 1 new recipients created "
                       "(without contacts yet)."]
    assert members(segment) == {"u1", "u2", "u3"}
    assert LogEntry.objects.get(object_id="vip", action_flag=CHANGE).change_message.startswith("3 user ids")

    r = upload(admin_client, segment, "u4\nu5\n")  # a single unnamed column: the first row is an id
    assert "2 added" in msgs(r)[0]
    assert members(segment) == {"u1", "u2", "u3", "u4", "u5"}
    page = admin_client.get(reverse("admin:campaigns_segment_change", args=["vip"])).content.decode()
    assert "members added later are not included" in page and 'id="member-upload"' in page
    assert re.search(r"<div class=\"readonly\">5</div>", page)


def test_csv_upload_calls_change_members_in_chunks(admin_client, segment, monkeypatch):
    calls = []
    real = services.change_members
    monkeypatch.setattr(admin_views, "UPLOAD_CHUNK", 2)
    monkeypatch.setattr(services, "change_members", lambda s, add, remove: calls.append(add) or real(
        s, add=add, remove=remove))
    upload(admin_client, segment, "user_id,name\na,A\nb,B\nc,C\n")  # a user_id column among others
    assert calls == [["a", "b"], ["c"]]
    assert members(segment) == {"a", "b", "c"}


@pytest.mark.parametrize(("text", "expected"), [
    ('user_id\nok\n""\n' + "x" * 256 + "\n",
     ["Row 3: empty user id.", "Row 4: user id is 256 characters; at most 255."]),
    ("ok\n\n\nbad\x00id\n", ["Row 4: user id contains a control character (U+0000)."]),
    ("a,b\nc,d\n", ["Row 1 has 2 columns and no user_id header"]),
    ("a\nb,c\n", ["Row 2: 2 values where row 1 has 1"]),
    ("", ["The submitted file is empty."]),  # Django's FileField
    ("\n\n", ["The file is empty"]),
    ("user_id\n", ["The file has a header but no user ids."]),
    ("\n".join(f"u{i}" for i in range(100_001)), ["100,001 rows; at most 100,000 user ids per upload."]),
])
def test_csv_upload_rejects_a_bad_file_and_writes_nothing(admin_client, segment, text, expected):
    recipients = Recipient.objects.count()
    r = upload(admin_client, segment, text)
    [message] = msgs(r)
    assert message.startswith("Upload rejected; nothing was added.")
    for fragment in expected:
        assert fragment in message
    assert members(segment) == set()
    assert Recipient.objects.count() == recipients


def test_csv_upload_rejects_non_utf8(admin_client, segment):
    url = reverse("admin:campaigns_segment_upload_members", args=["vip"])
    r = admin_client.post(url, {"file": SimpleUploadedFile("ids.csv", "Müller".encode("latin-1"))})
    assert "not UTF-8" in msgs(r)[0]
    assert members(segment) == set()


def test_segment_list_shows_member_counts(admin_client, segment):
    services.change_members(segment, add=["a", "b"], remove=[])
    services.upsert_segment("empty", name="Nobody")
    page = admin_client.get(reverse("admin:campaigns_segment_changelist")).content.decode()
    assert re.search(r'field-member_count">2<', page) and re.search(r'field-member_count">0<', page)
    other, _ = services.upsert_segment("other", name="Other")
    services.change_members(other, add=["z"], remove=[])
    r = admin_client.get(reverse("admin:campaigns_segmentmember_changelist"), {"segment__segment_id__exact": "vip"})
    assert [m.recipient_id for m in r.context["cl"].result_list] == ["a", "b"]


# --- templates -------------------------------------------------------------------------------------

def template_post(**variant) -> dict:
    data = {"template_id": "welcome", "name": "Welcome", "default_locale": "en",
            "variants-TOTAL_FORMS": "1", "variants-INITIAL_FORMS": "0", "variants-MIN_NUM_FORMS": "1",
            "variants-MAX_NUM_FORMS": "1000"}
    data.update({f"variants-0-{k}": v for k, v in {"locale": "en", "title": "", "body": "Hi", "html": "",
                                                     **variant}.items()})
    return data


def test_template_inline_rejects_a_syntax_error(admin_client):
    r = admin_client.post(reverse("admin:campaigns_template_add"), template_post(body="Hi {{ first_name "))
    assert r.status_code == 200
    errors = r.context["inline_admin_formsets"][0].formset.errors
    assert "template syntax error" in errors[0]["body"][0]
    assert not Template.objects.exists()

    r = admin_client.post(reverse("admin:campaigns_template_add"), {**template_post(), "default_locale": "fr"})
    formset = r.context["inline_admin_formsets"][0].formset
    assert "No variant for the default locale 'fr'" in formset.non_form_errors()[0]

    r = admin_client.post(reverse("admin:campaigns_template_add"), template_post(body="Hi {{ first_name }}"))
    assert r.status_code == 302
    assert TemplateVariant.objects.get(template_id="welcome").body == "Hi {{ first_name }}"


def test_preview_renders_for_a_recipient_with_html_escaped(admin_client, alice):
    services.upsert_template("welcome", name="Welcome", default_locale="en", variants=[
        {"locale": "en", "title": "Hello", "body": "Hi {{ first_name }}", "html": "<p>Hi</p>"},
        {"locale": "de", "title": "Hallo {{ first_name }}", "body": "Hallo {{ first_name }}",
         "html": "<p>Hallo {{ first_name }}</p>"},
    ])
    url = reverse("admin:campaigns_template_change", args=["welcome"])
    page = admin_client.get(url, {"preview_user": "alice"}).content.decode()
    assert "<script>alert(1)" not in page  # neither the text parts nor the html reach the page unescaped
    assert '<div class="readonly">de</div>' in page  # de-DE falls back to the "de" variant
    assert '<pre class="readonly" id="preview-body">Hallo &lt;script&gt;alert(1)&lt;/script&gt;</pre>' in page
    # html: rendered with autoescape (&lt;script&gt;), then escaped again as source / srcdoc attribute.
    assert "<p>Hallo &amp;lt;script&amp;gt;" not in page
    assert "&lt;p&gt;Hallo &amp;lt;script&amp;gt;alert(1)&amp;lt;/script&amp;gt;&lt;/p&gt;" in page
    assert re.search(r'<iframe id="preview-html" sandbox="" [^>]*srcdoc="&lt;p&gt;Hallo', page)

    page = admin_client.get(url, {"preview_user": "nobody"}).content.decode()
    assert "No recipient with user id &#x27;nobody&#x27;." in page


# --- campaigns: creating drafts ----------------------------------------------------------------------

def campaign_post(segment, **over) -> dict:
    data = {"name": "Winter sale", "segment": segment.pk, "channel": "sms", "priority": "standard",
            "category": "marketing", "template": "", "title": "", "body": "Sale starts now", "html": "",
            "data": "", "scheduled_at_0": "", "scheduled_at_1": "", "local_date": "", "local_time": "",
            "spread_seconds": "0", "ttl_seconds": ""}
    data.update(over)
    return data


@override_settings(TIME_ZONE="Europe/Berlin")
def test_add_form_creates_a_draft_with_naive_time_in_the_admin_timezone(admin_client, segment):
    r = admin_client.post(reverse("admin:campaigns_campaign_add"), campaign_post(
        segment, scheduled_at_0=NEXT_JANUARY.isoformat(), scheduled_at_1="09:00:00", spread_seconds="600",
        ttl_seconds="3600"))
    assert r.status_code == 302, r.context["adminform"].form.errors
    c = Campaign.objects.get()
    assert (c.status, c.name, c.segment_id, c.channel, c.priority, c.category, c.body) == (
        "draft", "Winter sale", "vip", "sms", "standard", "marketing", "Sale starts now")
    assert c.scheduled_at == datetime.combine(NEXT_JANUARY, time(8, 0), tzinfo=UTC)  # 09:00 in Berlin (CET)
    assert c.fanout_at == c.scheduled_at
    assert (c.spread_seconds, c.ttl_seconds, c.client, c.idempotency_key) == (600, 3600, None, None)
    assert c.created_by.username == "admin" and c.id.version == 4
    page = admin_client.get(reverse("admin:campaigns_campaign_add")).content.decode()
    assert "admin time zone Europe/Berlin" in page and " UTC)" in page


def test_add_form_local_time_campaign(admin_client, segment):
    r = admin_client.post(reverse("admin:campaigns_campaign_add"), campaign_post(
        segment, local_date=SOON.isoformat(), local_time="10:00"))
    assert r.status_code == 302
    c = Campaign.objects.get()
    assert (c.local_date, c.local_time, c.scheduled_at) == (SOON, time(10, 0), None)
    assert c.fanout_at == datetime.combine(SOON, time(10), tzinfo=UTC) - timedelta(hours=14)  # UTC+14 first


@pytest.mark.parametrize(("over", "field", "fragment"), [
    ({"template": "welcome"}, "template", "exactly one of a template or inline content"),
    ({"body": ""}, "template", "exactly one of a template or inline content"),
    ({"title": "Hi"}, "title", "not used by SMS"),
    ({"body": "x" * 1601}, "body", "at most 1600"),
    ({"body": "Hi {{ name "}, "body", "template syntax error"),
    ({"channel": "email"}, "title", "email needs a subject"),
    ({"scheduled_at_0": SOON.isoformat(), "scheduled_at_1": "09:00", "local_date": SOON.isoformat(),
      "local_time": "09:00"}, "scheduled_at", "not both"),
    ({"local_date": SOON.isoformat()}, "local_time", "needs both a date and a time"),
    ({"scheduled_at_0": (TODAY + timedelta(days=400)).isoformat(), "scheduled_at_1": "09:00"}, "scheduled_at",
     "At most 366 days ahead"),
    ({"category": "Not Valid"}, "category", "Lower-case letters"),
    ({"priority": "high"}, "priority", "marketing is never high priority"),
    ({"category": "security"}, "category", "A standard campaign is bulk mail and may not use category 'security'"),
    ({"data": '{"n": 1}'}, "data", "values are strings"),
    ({"channel": "push", "title": "Hi", "data": '{"Google.x": "1"}'}, "data", "a prefix FCM reserves"),
])
def test_add_form_rejects_invalid_definitions(admin_client, segment, over, field, fragment):
    services.upsert_template("welcome", name="Welcome", default_locale="en", variants=[{"locale": "en", "body": "Hi"}])
    r = admin_client.post(reverse("admin:campaigns_campaign_add"), campaign_post(segment, **over))
    assert r.status_code == 200
    assert any(fragment in e for e in r.context["adminform"].form.errors[field]), r.context["adminform"].form.errors
    assert not Campaign.objects.exists()


def test_add_form_with_a_template_and_no_inline_content(admin_client, segment):
    services.upsert_template("welcome", name="Welcome", default_locale="en", variants=[{"locale": "en", "body": "Hi"}])
    r = admin_client.post(reverse("admin:campaigns_campaign_add"), campaign_post(segment, template="welcome", body=""))
    assert r.status_code == 302
    assert Campaign.objects.get().template_id == "welcome"


def test_staff_without_superuser_cannot_choose_high_priority(client, segment):
    user = User.objects.create_user("marketer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="campaigns", codename__in=["add_campaign", "change_campaign", "view_campaign",
                                                           "view_segment", "view_template"]))
    client.force_login(user)
    page = client.get(reverse("admin:campaigns_campaign_add")).content.decode()
    assert 'value="standard"' in page and 'value="high"' not in page
    r = client.post(reverse("admin:campaigns_campaign_add"), campaign_post(segment, priority="high"))
    assert r.status_code == 200 and "priority" in r.context["adminform"].form.errors
    assert not Campaign.objects.exists()
    r = client.post(reverse("admin:campaigns_campaign_add"), campaign_post(segment))
    assert r.status_code == 302 and Campaign.objects.get().priority == "standard"
    # Nor launch a high-priority draft someone else made.
    high = make_campaign(segment, priority="high")
    assert client.post(reverse("admin:campaigns_campaign_launch", args=[high.pk])).status_code == 403
    assert Campaign.objects.get(pk=high.pk).status == "draft"


# --- campaigns: before launch, launch, cancel, progress -------------------------------------------

def test_draft_page_shows_reach_and_sms_encoding(admin_client, segment):
    services.change_members(segment, add=["a", "b", "c"], remove=[])
    gsm = make_campaign(segment, body="hello")
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[gsm.pk])).content.decode()
    assert re.search(r'id="campaign-reach"><strong data-field="eligible">0</strong> eligible of\s+'
                     r'<span data-field="members">3</span> members', page)  # bare recipients: no phone
    assert re.search(r'id="campaign-reach-suppressed">no_phone: 3\n', page)
    assert "GSM-7, 5 septets,\n      1 segment per message" in page
    assert "Launch campaign" in page and "Cancel campaign" not in page

    ucs = make_campaign(segment, body="hello 🎉")
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[ucs.pk])).content.decode()
    assert "UCS-2, 8 UTF-16 units,\n      1 segment per message" in page

    services.upsert_template("t", name="T", default_locale="en", variants=[
        {"locale": "en", "body": "x" * 161}, {"locale": "ja", "body": "こんにちは"}])
    templated = make_campaign(segment, body="", template_id="t")
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[templated.pk])).content.decode()
    assert "SMS Variant en:" in page and "GSM-7, 161 septets,\n      2 segments" in page
    assert "SMS Variant ja:" in page and "UCS-2, 5 UTF-16 units,\n      1 segment " in page


def test_launch_moves_draft_to_scheduled_and_logs_it(admin_client, segment):
    when = datetime.combine(SOON, time(9), tzinfo=UTC)
    draft = make_campaign(segment, scheduled_at=when)
    url = reverse("admin:campaigns_campaign_launch", args=[draft.pk])
    assert admin_client.get(url).status_code == 405  # POST only
    r = admin_client.post(url)
    assert r.status_code == 302
    c = Campaign.objects.get(pk=draft.pk)
    assert c.status == "scheduled" and c.fanout_at == when
    assert msgs(r) == [f"Launched. Fan-out starts at {SOON} 09:00:00 UTC."]
    entry = LogEntry.objects.get(object_id=str(draft.pk))
    assert entry.user.username == "admin" and entry.change_message.startswith("Launched")
    assert "already Scheduled" in msgs(admin_client.post(url))[-1]  # a second launch does nothing


def test_launch_and_cancel_need_the_csrf_token(admin_user, segment):
    csrf_client = Client(enforce_csrf_checks=True)
    csrf_client.force_login(admin_user)
    draft = make_campaign(segment)
    assert csrf_client.post(reverse("admin:campaigns_campaign_launch", args=[draft.pk])).status_code == 403
    launched = make_campaign(segment, status=CampaignStatus.SCHEDULED)
    assert csrf_client.post(reverse("admin:campaigns_campaign_cancel", args=[launched.pk])).status_code == 403
    assert list(Campaign.objects.order_by("status").values_list("status", flat=True)) == ["draft", "scheduled"]


def test_launched_campaign_definition_is_read_only_except_name(admin_client, segment):
    c = make_campaign(segment, status=CampaignStatus.SCHEDULED)
    Campaign.objects.filter(pk=c.pk).update(created_count=7)  # as if fan-out wrote it meanwhile
    url = reverse("admin:campaigns_campaign_change", args=[c.pk])
    form = admin_client.get(url).context["adminform"].form
    assert list(form.fields) == ["name"]
    r = admin_client.post(url, {"name": "Renamed", "body": "changed", "channel": "email"})
    assert r.status_code == 302
    c.refresh_from_db()
    assert (c.name, c.body, c.channel, c.status, c.created_count) == ("Renamed", "hello", "sms", "scheduled", 7)


def test_draft_edit_recomputes_fanout(admin_client, segment):
    c = make_campaign(segment)
    r = admin_client.post(reverse("admin:campaigns_campaign_change", args=[c.pk]), campaign_post(
        segment, body="New text", scheduled_at_0=SOON.isoformat(), scheduled_at_1="12:00"))
    assert r.status_code == 302
    c.refresh_from_db()
    assert (c.body, c.status, c.fanout_at) == ("New text", "draft", datetime.combine(SOON, time(12), tzinfo=UTC))


def test_cancel_sets_cancelled_and_cancels_unclaimed_notifications(admin_client, segment, alice):
    c = make_campaign(segment, status=CampaignStatus.SENDING)
    scheduled, queued, sent = (notify(alice, c.pk, s) for s in (Status.SCHEDULED, Status.QUEUED, Status.SENT))
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[c.pk])).content.decode()
    assert "Cancel campaign" in page and "Launch campaign" not in page
    r = admin_client.post(reverse("admin:campaigns_campaign_cancel", args=[c.pk]))
    assert r.status_code == 302
    c.refresh_from_db()
    assert c.status == "cancelled" and c.cancelled_at is not None
    for n, status in ((scheduled, "cancelled"), (queued, "cancelled"), (sent, "sent")):
        n.refresh_from_db()
        assert n.status == status
    assert Notification.objects.filter(reason=Reason.CAMPAIGN_CANCELLED).count() == 2
    assert "2 notifications not yet sent were cancelled" in msgs(r)[0]
    assert LogEntry.objects.get(object_id=str(c.pk)).change_message.startswith("Cancelled")


def test_cancel_selected_action(admin_client, segment, alice):
    active, done, draft = (make_campaign(segment, status=s) for s in (CampaignStatus.SCHEDULED,
                                                                      CampaignStatus.COMPLETED, CampaignStatus.DRAFT))
    notify(alice, active.pk, Status.SCHEDULED)
    r = admin_client.post(reverse("admin:campaigns_campaign_changelist"), {
        "action": "cancel_selected", "_selected_action": [str(active.pk), str(done.pk), str(draft.pk)]})
    assert r.status_code == 302
    statuses = dict(Campaign.objects.values_list("pk", "status"))
    assert statuses == {active.pk: "cancelled", done.pk: "completed", draft.pk: "draft"}
    assert sum("not cancelled" in m for m in msgs(r)) == 2


def test_progress_json_returns_counts(admin_client, client, segment, alice):
    c = make_campaign(segment, status=CampaignStatus.SENDING)
    Campaign.objects.filter(pk=c.pk).update(member_count=5, created_count=4)
    for status, reason in [(Status.SENT, ""), (Status.DELIVERED, ""), (Status.QUEUED, ""),
                           (Status.SUPPRESSED, Reason.NO_PHONE)]:
        notify(alice, c.pk, status, reason)
    url = reverse("admin:campaigns_campaign_progress", args=[c.pk])
    p = admin_client.get(url).json()
    assert p["by_status"] == {"scheduled": 0, "queued": 1, "sending": 0, "sent": 1, "delivered": 1, "displayed": 0,
                              "dismissed": 0, "opened": 0, "failed": 0, "suppressed": 1, "expired": 0, "cancelled": 0}
    assert (p["done"], p["denominator"], p["percent"], p["status"], p["active"]) == (3, 5, 60.0, "sending", True)
    assert p["suppressed_by_reason"] == {"no_phone": 1}
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[c.pk])).content.decode()
    assert f'data-url="{url}"' in page and '<td data-status="delivered">1</td>' in page
    fanning = make_campaign(segment, status=CampaignStatus.FANNING_OUT, name="fanning")
    Campaign.objects.filter(pk=fanning.pk).update(member_count=10)
    CampaignShard.objects.create(campaign=fanning, number=0, created=3)
    CampaignShard.objects.create(campaign=fanning, number=1, created=2)
    listing = admin_client.get(reverse("admin:campaigns_campaign_changelist")).content.decode()
    assert '<progress max="5" value="4"></progress> 4 / 5' in listing  # created_count once fanned out
    assert '<progress max="10" value="5"></progress> 5 / 10' in listing  # the shards' counters meanwhile
    assert client.get(url).status_code == 302  # anonymous: to the admin login
    assert admin_client.get(reverse("admin:campaigns_campaign_progress", args=[uuid.uuid4()])).status_code == 404


# --- support: the recipient page ---------------------------------------------------------------------

def test_recipient_page_lists_newest_campaign_notifications_with_reasons(admin_client, alice):
    campaign_ids = [uuid.uuid4() for _ in range(52)]
    start = datetime(2030, 1, 1, tzinfo=UTC)
    for i, cid in enumerate(campaign_ids):
        n = notify(alice, cid, Status.SUPPRESSED, Reason.OPTED_OUT_CATEGORY)
        Notification.objects.filter(pk=n.pk).update(created_at=start + timedelta(minutes=i))
    api_send = notify(alice, None, Status.SENT)
    url = reverse("admin:preferences_recipient_change", args=["alice"])
    page = admin_client.get(url).content.decode()
    assert page.count("<code>opted_out_category</code>: Recipient opted out of this category") == 50
    assert str(campaign_ids[-1]) in page and str(campaign_ids[2]) in page
    assert str(campaign_ids[1]) not in page and str(api_send.pk) not in page
    assert page.index(str(campaign_ids[-1])) < page.index(str(campaign_ids[2]))  # newest first

    # Saving the recipient still works with the read-only inline on the page.
    shown = Notification.objects.filter(campaign_id__in=campaign_ids[2:])
    data = {"user_id": "alice", "email": "new@example.com", "phone": alice.phone, "timezone": "", "locale": "de-DE",
            "attributes": '{"first_name": "Ada"}', "email_invalid_reason": "", "phone_invalid_reason": "",
            "preferences-TOTAL_FORMS": "0", "preferences-INITIAL_FORMS": "0", "devices-TOTAL_FORMS": "0",
            "devices-INITIAL_FORMS": "0", "notifications-TOTAL_FORMS": "50", "notifications-INITIAL_FORMS": "50"}
    for i, n in enumerate(shown):
        data.update({f"notifications-{i}-id": str(n.pk), f"notifications-{i}-recipient": "alice"})
    r = admin_client.post(url, data)
    assert r.status_code == 302, r.context and r.context["errors"]
    assert Recipient.objects.get(pk="alice").email == "new@example.com"
    assert Notification.objects.filter(recipient=alice, status=Status.SUPPRESSED).count() == 52


@pytest.mark.parametrize("status", [CampaignStatus.DRAFT, CampaignStatus.SCHEDULED])
def test_a_sensitive_types_campaign_data_is_hidden_from_marketing(client, segment, status):
    """hadvroads 5: the campaign page showed a sensitive type's data (``{"code": …}``) to marketing
    staff; it is hidden as on the event and notification pages, drafts included."""
    from notifications.events.models import NotificationType

    kind = NotificationType.objects.create(key="sens", name="Sensitive", category="account", channels=["sms"],
                                           sensitive=True)
    campaign = make_campaign(segment, status=status, notification_type=kind, body="", data={"code": "SECRETCAMP1"})
    user = User.objects.create_user("marketer", password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        content_type__app_label="campaigns", codename__in=["change_campaign", "view_campaign"]))
    client.force_login(user)
    page = client.get(reverse("admin:campaigns_campaign_change", args=[campaign.pk]))
    assert page.status_code == 200
    assert "SECRETCAMP1" not in page.content.decode() and "sensitive: hidden" in page.content.decode()


def test_the_add_form_refuses_a_category_under_an_abuse_limit_as_the_api_does(admin_client, segment):
    """hadvroads 4: a campaign made in the admin skipped the limit check the API makes (a limited
    category's campaign would send to every member of a shared phone at once)."""
    from notifications.acceptance.models import AcceptanceLimit

    AcceptanceLimit.objects.create(name="acct_per_phone", category="account", per="phone", limit=2,
                                   window_seconds=600)
    r = admin_client.post(reverse("admin:campaigns_campaign_add"), campaign_post(segment, category="account"))
    assert r.status_code == 200
    assert "acct_per_phone" in " ".join(r.context["adminform"].form.errors["category"])
    assert not Campaign.objects.exists()


def test_add_form_stores_the_send_time_option_and_starts_fan_out_at_the_windows_first_hour(admin_client, segment):
    r = admin_client.post(reverse("admin:campaigns_campaign_add"), campaign_post(
        segment, local_date=SOON.isoformat(), local_time="18:00",
        send_time='{"window": {"start": "09:00", "end": "21:00"}, "holdout_percent": 10}'))
    assert r.status_code == 302, r.context["adminform"].form.errors
    c = Campaign.objects.get()
    assert c.send_time == {"window": {"start": "09:00", "end": "21:00"}, "holdout_percent": 10}
    assert c.fanout_at == datetime.combine(SOON, time(9), tzinfo=UTC) - timedelta(hours=14)
    page = admin_client.get(reverse("admin:campaigns_campaign_change", args=[c.pk])).content.decode()
    assert "holdout_percent&quot;: 10" in page  # the draft's form shows the stored option


@pytest.mark.parametrize(("over", "fragment"), [
    ({"send_time": '{"window": {"start": "09:00", "end": "21:00"}, "holdout_percent": 60}'}, "holdout_percent"),
    ({"send_time": '{"window": {"start": "09:00", "end": "09:00"}}'}, "must differ from window.start"),
    ({"send_time": '{"window": {"start": "09:00", "end": "21:00"}, "best": 1}'}, "best"),
    ({"send_time": '{"window": {"start": "09:00", "end": "21:00"}}', "local_date": "", "local_time": ""},
     "needs a local date and time"),
])
def test_add_form_refuses_a_bad_send_time_option(admin_client, segment, over, fragment):
    r = admin_client.post(reverse("admin:campaigns_campaign_add"), campaign_post(
        segment, **{"local_date": SOON.isoformat(), "local_time": "18:00", **over}))
    assert r.status_code == 200
    assert any(fragment in e for e in r.context["adminform"].form.errors["send_time"]), \
        r.context["adminform"].form.errors
    assert not Campaign.objects.exists()
