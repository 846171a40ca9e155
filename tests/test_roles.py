"""Staff roles: the ``marketing``, ``product`` and ``support`` groups made by the migration
campaigns/0002_staff_groups (last changed by ``campaigns.roles.MIGRATION``),
what each can see and do in the admin, and that their state changes land in the admin log.

In-process (Django test client, rolled-back transactions); no worker processes.
"""

from __future__ import annotations

import importlib
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth.models import Group, Permission, User
from django.contrib.contenttypes.models import ContentType
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from campaigns import roles, services
from campaigns.models import Campaign, CampaignStatus, Segment, SegmentMember, Template, TemplateVariant
from notifications.admin import HIDDEN
from notifications.events.models import NotificationType
from notifications.models import DeadLetter, DeliveryEvent, FrequencyCap, Notification, Reason, Status
from preferences.models import Preferences, Recipient
from preferences.validation import phone_search_term

pytestmark = pytest.mark.django_db

OTP = "Your code is 918273"
MIGRATION = importlib.import_module(roles.MIGRATION)  # the newest staff-groups migration


def staff(username: str, group: str | None) -> User:
    user = User.objects.create_user(username, is_staff=True)
    if group:
        user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)  # no cached permissions


@pytest.fixture
def marketer() -> User:
    return staff("mia", roles.MARKETING)


@pytest.fixture
def supporter() -> User:
    return staff("sam", roles.SUPPORT)


@pytest.fixture
def designer() -> User:
    return staff("pia", roles.PRODUCT)


def as_user(client, user):
    client.force_login(user)
    return client


@pytest.fixture
def alice() -> Recipient:
    return Recipient.objects.create(user_id="alice", email="alice@example.com", phone="+4915112345678",
                                    locale="en", attributes={"first_name": "Alice"})


def notify(recipient, *, status=Status.SENT, reason="", campaign_id=None, created_at=None, **fields) -> Notification:
    fields = {"channel": "sms", "body": "hello", **fields}
    n = Notification.objects.create(id=uuid.uuid4(), recipient=recipient, status=status, reason=reason,
                                    campaign_id=campaign_id, **fields)
    if created_at is not None:
        Notification.objects.filter(pk=n.pk).update(created_at=created_at)
    return n


def dotted(permissions) -> set[str]:
    return {f"{p.content_type.app_label}.{p.codename}" for p in permissions}


# --- the groups ------------------------------------------------------------------------------------

def test_groups_have_exactly_the_roles_permissions():
    for name, wanted in roles.GROUP_PERMISSIONS.items():
        group = Group.objects.get(name=name)
        assert dotted(group.permissions.select_related("content_type")) == set(wanted), name
    # The migration is a frozen copy of campaigns.roles: a role changed in one place only fails here.
    assert MIGRATION.GROUP_PERMISSIONS == roles.GROUP_PERMISSIONS
    assert MIGRATION.CUSTOM_PERMISSIONS == roles.CUSTOM_PERMISSIONS


def test_custom_permissions_exist_on_the_right_content_types():
    high = Permission.objects.get(codename="send_high_priority")
    assert high.content_type == ContentType.objects.get_for_model(Campaign)
    replay = Permission.objects.get(codename="replay_deadletter")
    assert replay.content_type == ContentType.objects.get_for_model(DeadLetter, for_concrete_model=False)
    assert replay.content_type.model == "deadletter"
    high_type = Permission.objects.get(codename="define_high_priority_type")
    assert high_type.content_type == ContentType.objects.get_for_model(NotificationType)
    assert not Group.objects.filter(permissions=high_type).exists()  # granted to a person, never a group


@pytest.mark.parametrize(("group", "allowed", "denied"), [
    (roles.MARKETING,
     ["campaigns.add_segment", "campaigns.delete_segmentmember", "campaigns.change_template",
      "campaigns.add_templatevariant", "campaigns.add_campaign", "campaigns.change_campaign",
      "campaigns.view_campaign", "preferences.view_recipient"],
     ["campaigns.send_high_priority", "preferences.change_recipient", "preferences.view_preferences",
      "preferences.view_device", "notifications.view_notification", "notifications.view_deadletter",
      "notifications.replay_deadletter", "notifications.view_deliveryevent", "notifications.view_apiclient",
      "notifications.view_notificationtype", "notifications.change_typetemplate", "notifications.view_event",
      "auth.change_user", "auth.add_group"]),
    (roles.PRODUCT,
     ["notifications.add_notificationtype", "notifications.change_notificationtype",
      "notifications.delete_notificationtype", "notifications.view_notificationtype",
      "notifications.add_typetemplate", "notifications.change_typetemplate", "notifications.delete_typetemplate",
      "preferences.view_recipient"],
     ["notifications.define_high_priority_type", "notifications.view_event", "notifications.view_notification",
      "notifications.view_deliveryevent", "notifications.view_apiclient", "preferences.change_recipient",
      "preferences.view_preferences", "campaigns.view_campaign", "campaigns.change_template", "auth.change_user"]),
    (roles.SUPPORT,
     ["preferences.view_recipient", "preferences.view_device", "preferences.view_preferences",
      "preferences.change_preferences", "notifications.view_notification", "notifications.view_deliveryattempt",
      "notifications.view_deliveryevent", "notifications.view_deadletter", "notifications.replay_deadletter",
      "notifications.view_event", "notifications.view_notificationtype", "notifications.view_typetemplate"],
     ["preferences.change_recipient", "preferences.delete_preferences", "preferences.change_device",
      "notifications.change_notification", "notifications.delete_notification", "notifications.view_apiclient",
      "notifications.change_event", "notifications.change_notificationtype", "notifications.add_typetemplate",
      "notifications.define_high_priority_type",
      "campaigns.view_campaign", "campaigns.view_segment", "campaigns.view_template",
      "campaigns.send_high_priority", "auth.change_user"]),
])
def test_role_spot_checks(group, allowed, denied):
    user = staff(f"user-{group}", group)
    assert [p for p in allowed if not user.has_perm(p)] == []
    assert [p for p in denied if user.has_perm(p)] == []


def admin_models(client) -> set[str]:
    """The model admins the index lists for the logged-in user (not extra, non-model entries)."""
    app_list = client.get(reverse("admin:index")).context["app_list"]
    return {m["object_name"] for app in app_list for m in app["models"] if m.get("model") is not None}


def test_admin_index_shows_each_role_its_pages(client, marketer, supporter, designer):
    assert admin_models(as_user(client, marketer)) == {"Segment", "SegmentMember", "Template", "Campaign",
                                                       "Recipient", "Unsubscribe", "FrequencyCap"}
    assert admin_models(as_user(client, supporter)) == {"Recipient", "Device", "Notification", "DeadLetter",
                                                        "APIAuditEntry", "Event", "Digest", "NotificationType",
                                                        "Unsubscribe", "FrequencyCap", "AcceptanceLimit", "InboxItem",
                                                            "WebhookEndpoint", "WebhookDelivery"}
    assert admin_models(as_user(client, designer)) == {"NotificationType", "Recipient", "FrequencyCap",
                                                       "AcceptanceLimit", "AllowedSender"}


def test_the_policy_pages_are_managed_by_product_and_read_by_support_and_marketing(client, marketer, supporter,
                                                                                    designer):
    caps, limits = (reverse("admin:notifications_frequencycap_changelist"),
                    reverse("admin:notifications_acceptancelimit_changelist"))
    unsubscribes = reverse("admin:preferences_unsubscribe_changelist")
    seen = {}
    for name, user in (("marketing", marketer), ("support", supporter), ("product", designer)):
        as_user(client, user)
        seen[name] = tuple(client.get(url).status_code for url in (caps, limits, unsubscribes))
        page = client.get(caps)
        if page.status_code == 200:
            assert "marketing-push" in page.content.decode()  # the effective rules, settings' included
            assert page.context["has_add_permission"] is (name == "product")
        page = client.get(limits)
        if page.status_code == 200:
            assert "otp_per_user" in page.content.decode()
            assert page.context["has_add_permission"] is False  # a security control: superusers only
    assert seen == {"marketing": (200, 403, 200), "support": (200, 200, 200), "product": (200, 200, 403)}


def test_the_sender_allow_list_is_read_by_product_and_changed_by_superusers_only(client, marketer, supporter,
                                                                                   designer, admin_user):
    """Issue 23 #10: whoever writes a type's sender (product, an API key) cannot also approve it."""
    changelist, add = (reverse("admin:notifications_allowedsender_changelist"),
                       reverse("admin:notifications_allowedsender_add"))
    post = {"channel": "email", "value": "shop@example.com", "note": ""}
    seen = {}
    for name, user in (("marketing", marketer), ("support", supporter), ("product", designer)):
        as_user(client, user)
        seen[name] = (client.get(changelist).status_code, client.get(add).status_code,
                      client.post(add, post).status_code)
    assert seen == {"marketing": (403, 403, 403), "support": (403, 403, 403), "product": (200, 403, 403)}
    as_user(client, admin_user)
    assert client.post(add, post).status_code == 302
    from notifications.senders import AllowedSender

    assert list(AllowedSender.objects.values_list("channel", "value", "client")) == [("email", "shop@example.com",
                                                                                      None)]


@pytest.mark.parametrize(("fields", "words"), [
    ({"category": "security", "channel": "sms", "limit": "0"}, "only a superuser may cap it"),
    ({"include_high": "on"}, "only a superuser may save one"),
    ({"include_required": "on"}, "only a superuser may save one"),
])
def test_product_cannot_save_a_cap_on_what_users_must_get(client, designer, fields, words):
    """A limit-0 cap on security SMS (or one including high or required rows) would silence every
    one-time code: a security control, a superuser's (like the abuse limits)."""
    post = {"name": "block", "category": "marketing", "channel": "push", "limit": "3", "window_seconds": "3600",
            "active": "on", **fields}
    as_user(client, designer)
    page = client.post(reverse("admin:notifications_frequencycap_add"), post)
    assert page.status_code == 200 and words in page.content.decode()
    assert not FrequencyCap.objects.exists()
    ok = client.post(reverse("admin:notifications_frequencycap_add"), {**post, "category": "marketing",
                                                                       "include_high": "", "include_required": ""})
    assert ok.status_code == 302 and FrequencyCap.objects.get().name == "block"


# --- marketing -------------------------------------------------------------------------------------

def test_marketing_sees_no_notification_pages_and_recipients_read_only(client, marketer, alice):
    n = notify(alice, body="Order 42 shipped", category="orders")
    as_user(client, marketer)
    for url in (reverse("admin:notifications_notification_changelist"),
                reverse("admin:notifications_notification_change", args=[n.pk]),
                reverse("admin:notifications_deadletter_changelist")):
        assert client.get(url).status_code == 403, url
    url = reverse("admin:preferences_recipient_change", args=["alice"])
    page = client.get(url)
    html = page.content.decode()
    assert page.status_code == 200 and page.context["has_change_permission"] is False
    assert "alice@example.com" in html
    assert "Order 42 shipped" not in html and str(n.pk) not in html and "All notifications" not in html
    assert client.post(url, {"email": "x@example.com"}).status_code == 403
    assert Recipient.objects.get(pk="alice").email == "alice@example.com"


def test_product_defines_types_and_sees_no_notifications_events_or_campaigns(client, designer, alice):
    n = notify(alice, body="Order 42 shipped", category="orders")
    as_user(client, designer)
    for url in (reverse("admin:notifications_notification_changelist"),
                reverse("admin:notifications_notification_change", args=[n.pk]),
                reverse("admin:notifications_event_changelist"),
                reverse("admin:campaigns_campaign_changelist"),
                reverse("admin:campaigns_template_changelist")):
        assert client.get(url).status_code == 403, url
    assert client.get(reverse("admin:notifications_notificationtype_add")).status_code == 200
    page = client.get(reverse("admin:preferences_recipient_change", args=["alice"]))
    html = page.content.decode()
    assert page.status_code == 200 and page.context["has_change_permission"] is False
    assert "Order 42 shipped" not in html and str(n.pk) not in html


def campaign_post(segment, **over) -> dict:
    data = {"name": "Spring", "segment": segment.pk, "channel": "sms", "priority": "standard",
            "category": "marketing", "template": "", "title": "", "body": "Spring sale", "html": "", "data": "",
            "scheduled_at_0": "", "scheduled_at_1": "", "local_date": "", "local_time": "", "spread_seconds": "0",
            "ttl_seconds": ""}
    return {**data, **over}


def test_marketing_cannot_choose_high_priority_unless_granted(client, marketer):
    segment, _ = services.upsert_segment("spring", name="Spring")
    as_user(client, marketer)
    add = reverse("admin:campaigns_campaign_add")
    assert 'value="high"' not in client.get(add).content.decode()
    r = client.post(add, campaign_post(segment, priority="high"))
    assert r.status_code == 200 and "priority" in r.context["adminform"].form.errors
    assert not Campaign.objects.exists()

    # The permission exists (migration) and works when granted to a person.
    marketer.user_permissions.add(Permission.objects.get(codename="send_high_priority"))
    granted = User.objects.get(pk=marketer.pk)
    as_user(client, granted)
    assert 'value="high"' in client.get(add).content.decode()
    # (Marketing is never high priority: a high campaign carries a category that bypasses quiet hours.)
    assert client.post(add, campaign_post(segment, priority="high", category="security")).status_code == 302
    assert Campaign.objects.get().priority == "high"


def log_of(user, obj=None) -> list[tuple[int, str]]:
    entries = LogEntry.objects.filter(user=user).order_by("action_time", "id")
    if obj is not None:
        entries = entries.filter(object_id=str(obj.pk))
    return [(e.action_flag, e.get_change_message()) for e in entries]


def test_marketing_state_changes_are_in_the_admin_log(client, marketer):
    as_user(client, marketer)
    r = client.post(reverse("admin:campaigns_segment_add"), {"segment_id": "spring", "name": "Spring",
                                                             "description": ""})
    assert r.status_code == 302
    segment = Segment.objects.get(pk="spring")
    upload = SimpleUploadedFile("ids.csv", b"user_id\nu1\nu2\n", content_type="text/csv")
    r = client.post(reverse("admin:campaigns_segment_upload_members", args=["spring"]), {"file": upload})
    assert r.status_code == 302
    assert log_of(marketer, segment) == [
        (ADDITION, "Added."),
        (CHANGE, "2 user ids uploaded: 2 added, 0 already members, 2 new recipients created (without contacts yet)."),
    ]

    assert client.post(reverse("admin:campaigns_campaign_add"), campaign_post(segment)).status_code == 302
    campaign = Campaign.objects.get()
    assert campaign.created_by == marketer
    assert client.post(reverse("admin:campaigns_campaign_launch", args=[campaign.pk])).status_code == 302
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.SCHEDULED
    assert client.post(reverse("admin:campaigns_campaign_cancel", args=[campaign.pk])).status_code == 302
    assert Campaign.objects.get().status == CampaignStatus.CANCELLED
    flags, messages = zip(*log_of(marketer, campaign), strict=True)
    assert flags == (ADDITION, CHANGE, CHANGE)
    assert messages[1].startswith("Launched; fan-out at ") and messages[2].startswith("Cancelled; ")


# --- the high tier in the admin (review finding 3b, 3c) ---------------------------------------------

NEEDS_HIGH = "needs the permission campaigns.send_high_priority"


def msgs(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def granted(user: User) -> User:
    user.user_permissions.add(Permission.objects.get(codename="send_high_priority"))
    return User.objects.get(pk=user.pk)


@pytest.fixture
def security():
    """A scheduled high-priority security campaign (made by a superuser) with its template and segment."""
    segment, _ = services.upsert_segment("accounts", name="Account holders")
    services.change_members(segment, add=["alice"], remove=[])
    template = services.upsert_template("new-login", name="New login", default_locale="en",
                                        variants=[{"locale": "en", "body": "New login to your account"}])
    campaign = services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.SCHEDULED,
                                        segment=segment, channel="sms", priority="high", category="security",
                                        template=template).campaign
    return {"segment": segment, "template": template, "campaign": campaign}


def variant_post(template: Template, body: str) -> dict:
    variant = template.variants.get()
    return {"name": template.name, "default_locale": "en", "client": "",
            "variants-TOTAL_FORMS": "1", "variants-INITIAL_FORMS": "1", "variants-MIN_NUM_FORMS": "1",
            "variants-MAX_NUM_FORMS": "1000", "variants-0-id": str(variant.pk), "variants-0-template": template.pk,
            "variants-0-locale": "en", "variants-0-title": "", "variants-0-body": body, "variants-0-html": ""}


def test_marketing_cannot_change_a_template_an_active_high_campaign_uses(client, marketer, security):
    template, url = security["template"], reverse("admin:campaigns_template_change", args=["new-login"])
    as_user(client, marketer)
    page = client.get(url)
    assert page.status_code == 200 and page.context["has_change_permission"] is False  # read-only
    assert msgs(page) == [f"Read-only. This template is used by the active high-priority campaign "
                          f"“{security['campaign']}” (Scheduled): changing it {NEEDS_HIGH}."]
    assert client.post(url, variant_post(template, "Call +1 900 SCAM")).status_code == 403
    assert TemplateVariant.objects.get().body == "New login to your account"
    # Granted the permission, or once the campaign is over, the template is theirs to change again.
    as_user(client, granted(marketer))
    assert client.post(url, variant_post(template, "A new login")).status_code == 302
    assert TemplateVariant.objects.get().body == "A new login"
    Campaign.objects.filter(pk=security["campaign"].pk).update(status=CampaignStatus.COMPLETED)
    as_user(client, staff("max", roles.MARKETING))
    assert client.post(url, variant_post(template, "Hello")).status_code == 302


def test_marketing_cannot_change_the_members_of_a_segment_an_active_high_campaign_uses(client, marketer, security):
    segment = security["segment"]
    Recipient.objects.create(user_id="mallory")
    as_user(client, marketer)
    page = client.get(reverse("admin:campaigns_segment_change", args=["accounts"])).content.decode()
    assert f"changing its members {NEEDS_HIGH}" in page and 'name="file"' not in page
    upload = SimpleUploadedFile("ids.csv", b"user_id\nmallory\n", content_type="text/csv")
    r = client.post(reverse("admin:campaigns_segment_upload_members", args=["accounts"]), {"file": upload})
    assert r.status_code == 302
    assert msgs(r) == [f"Upload rejected; nothing was added. This segment is used by the active high-priority "
                       f"campaign “{security['campaign']}” (Scheduled): changing its members {NEEDS_HIGH}."]
    r = client.post(reverse("admin:campaigns_segmentmember_add"), {"segment": "accounts", "recipient": "mallory"})
    assert r.status_code == 200 and NEEDS_HIGH in r.context["adminform"].form.errors["segment"][0]
    member = SegmentMember.objects.get(segment=segment)
    assert client.post(reverse("admin:campaigns_segmentmember_delete", args=[member.pk]), {"post": "yes"}
                       ).status_code == 403
    assert set(SegmentMember.objects.values_list("recipient_id", flat=True)) == {"alice"}
    as_user(client, granted(marketer))
    upload = SimpleUploadedFile("ids.csv", b"user_id\nmallory\n", content_type="text/csv")
    client.post(reverse("admin:campaigns_segment_upload_members", args=["accounts"]), {"file": upload})
    assert set(SegmentMember.objects.values_list("recipient_id", flat=True)) == {"alice", "mallory"}


def test_marketing_cannot_cancel_or_change_a_high_priority_campaign(client, marketer, security):
    campaign = security["campaign"]
    as_user(client, marketer)
    page = client.get(reverse("admin:campaigns_campaign_change", args=[campaign.pk]))
    assert page.status_code == 200 and not page.context["can_cancel"]
    assert client.post(reverse("admin:campaigns_campaign_cancel", args=[campaign.pk])).status_code == 403
    r = client.post(reverse("admin:campaigns_campaign_changelist"),
                    {"action": "cancel_selected", "_selected_action": [str(campaign.pk)]})
    assert msgs(r) == [f"{campaign}: not cancelled: cancelling a high-priority campaign {NEEDS_HIGH}."]
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.SCHEDULED
    draft = services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.DRAFT,
                                     segment=security["segment"], channel="sms", priority="high", category="security",
                                     body="Reset your password").campaign
    assert client.post(reverse("admin:campaigns_campaign_change", args=[draft.pk]),
                       campaign_post(security["segment"], priority="standard", body="Sale!")).status_code == 403
    assert client.post(reverse("admin:campaigns_campaign_delete", args=[draft.pk]), {"post": "yes"}
                       ).status_code == 403
    assert Campaign.objects.get(pk=draft.pk).body == "Reset your password"
    # With the permission (as launching needs), cancelling works and is logged.
    as_user(client, granted(marketer))
    assert client.post(reverse("admin:campaigns_campaign_cancel", args=[campaign.pk])).status_code == 302
    assert Campaign.objects.get(pk=campaign.pk).status == CampaignStatus.CANCELLED
    assert log_of(marketer, campaign)[0][1].startswith("Cancelled; ")


# --- support ---------------------------------------------------------------------------------------

def test_support_cannot_open_campaign_pages(client, supporter, alice):
    segment, _ = services.upsert_segment("spring", name="Spring")
    campaign = services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.DRAFT,
                                        segment=segment, channel="sms", body="hi").campaign
    notify(alice, campaign_id=campaign.id, status=Status.SUPPRESSED, reason=Reason.OPTED_OUT_CHANNEL)
    as_user(client, supporter)
    for url in (reverse("admin:campaigns_campaign_changelist"),
                reverse("admin:campaigns_campaign_change", args=[campaign.pk]),
                reverse("admin:campaigns_campaign_progress", args=[campaign.pk]),
                reverse("admin:campaigns_template_changelist"),
                reverse("admin:campaigns_segment_changelist")):
        assert client.get(url).status_code == 403, url
    # On the recipient page the campaign is named, not linked (the link would only lead to a 403).
    html = client.get(reverse("admin:preferences_recipient_change", args=["alice"])).content.decode()
    assert str(campaign.pk) in html
    assert reverse("admin:campaigns_campaign_change", args=[campaign.pk]) not in html


@pytest.fixture
def dead(alice) -> Notification:
    return notify(alice, status=Status.FAILED, reason=Reason.ATTEMPTS_EXHAUSTED, reason_detail="twilio 503",
                  attempts=8, dead_lettered_at=datetime.now(UTC))


def test_support_replays_a_dead_letter_and_it_is_logged(client, supporter, dead, django_capture_on_commit_callbacks):
    as_user(client, supporter)
    listing = client.get(reverse("admin:notifications_deadletter_changelist")).content.decode()
    assert 'value="replay"' in listing
    detail = client.get(reverse("admin:notifications_deadletter_change", args=[dead.pk]))
    assert detail.status_code == 200 and detail.context["has_change_permission"] is False  # read-only page
    with django_capture_on_commit_callbacks(execute=False):
        r = client.post(reverse("admin:notifications_deadletter_changelist"),
                        {"action": "replay", "_selected_action": [str(dead.pk)]})
    assert r.status_code == 302
    dead.refresh_from_db()
    assert (dead.status, dead.dead_lettered_at) == ("queued", None)
    assert DeliveryEvent.objects.filter(notification=dead, kind="replayed", detail__contains="by sam").exists()
    entry = LogEntry.objects.get(user=supporter, object_id=str(dead.pk))
    assert (entry.action_flag, entry.change_message, entry.content_type.model) == (CHANGE, "Replayed dead letter",
                                                                                   "deadletter")


def test_viewing_dead_letters_without_the_replay_permission_cannot_replay(client, dead):
    viewer = staff("vic", None)
    viewer.user_permissions.set(Permission.objects.filter(codename__in=["view_deadletter", "view_notification"]))
    viewer = User.objects.get(pk=viewer.pk)
    as_user(client, viewer)
    listing = client.get(reverse("admin:notifications_deadletter_changelist"))
    assert listing.status_code == 200 and 'value="replay"' not in listing.content.decode()
    client.post(reverse("admin:notifications_deadletter_changelist"),
                {"action": "replay", "_selected_action": [str(dead.pk)]})
    dead.refresh_from_db()
    assert dead.status == "failed" and not LogEntry.objects.exists()


def category_grid(category_opt_outs: dict[str, list[str]]) -> dict:
    """The per-category checkbox grid's POST fields (preferences/admin_widgets.py) for these opt-outs."""
    data = {"preferences-0-category_opt_outs-rows": str(len(category_opt_outs))}
    for i, (category, channels) in enumerate(category_opt_outs.items()):
        data[f"preferences-0-category_opt_outs-{i}-category"] = category
        data[f"preferences-0-category_opt_outs-{i}-channels"] = channels
    return data


def recipient_post(recipient, *, opt_outs=(), category_opt_outs=None, **preferences) -> dict:
    """The recipient page's POST as the browser sends it for a support agent (no recipient fields:
    they are read-only) plus what is given for the preferences form: the channels checked, the
    per-category grid's checked boxes, the other fields as typed."""
    n = recipient.notifications.count()
    data = {"preferences-TOTAL_FORMS": "1", "preferences-INITIAL_FORMS": "0", "preferences-MIN_NUM_FORMS": "0",
            "preferences-MAX_NUM_FORMS": "1", "preferences-0-recipient": recipient.pk,
            "preferences-0-opt_outs": list(opt_outs), **category_grid(category_opt_outs or {}),
            "preferences-0-quiet_start": "", "preferences-0-quiet_end": "", "preferences-0-quiet_timezone": "",
            "devices-TOTAL_FORMS": "0", "devices-INITIAL_FORMS": "0",
            "notifications-TOTAL_FORMS": str(n), "notifications-INITIAL_FORMS": str(n),
            # Contacts are read-only for support: posted values are ignored.
            "email": "attacker@example.com", "phone": "+4930123456"}
    for i, nid in enumerate(recipient.notifications.values_list("pk", flat=True)):
        data.update({f"notifications-{i}-id": str(nid), f"notifications-{i}-recipient": recipient.pk})
    data.update({f"preferences-0-{k}": v for k, v in preferences.items()})
    return data


def test_support_changes_preferences_on_a_users_behalf_and_it_is_logged(client, supporter, alice):
    notify(alice)
    url = reverse("admin:preferences_recipient_change", args=["alice"])
    as_user(client, supporter)
    page = client.get(url)
    assert page.status_code == 200 and 'name="preferences-0-opt_outs"' in page.content.decode()
    assert 'name="email"' not in page.content.decode()  # contacts read-only

    bad = client.post(url, recipient_post(alice, opt_outs=["fax"], quiet_start="22:00"))
    assert bad.status_code == 200 and not Preferences.objects.exists()
    preferences = next(f for f in bad.context["inline_admin_formsets"] if f.formset.prefix == "preferences")
    errors = str(preferences.formset.errors)
    assert "fax is not one of the available choices" in errors and "Quiet hours need both a start and an end." in errors

    r = client.post(url, recipient_post(alice, opt_outs=["sms", "sms"], category_opt_outs={"marketing": ["email"]},
                                        quiet_start="22:00", quiet_end="07:00", quiet_timezone="Europe/Berlin"))
    assert r.status_code == 302, r.context and [f.errors for f in r.context["inline_admin_formsets"][0].formset]
    prefs = Preferences.objects.get(recipient=alice)
    assert (prefs.opt_outs, prefs.category_opt_outs, prefs.quiet_timezone) == (["sms"], {"marketing": ["email"]},
                                                                               "Europe/Berlin")
    alice.refresh_from_db()
    assert (alice.email, alice.phone) == ("alice@example.com", "+4915112345678")
    entry = LogEntry.objects.get(user=supporter)
    assert (entry.action_flag, entry.object_id, entry.content_type.model) == (CHANGE, "alice", "recipient")
    assert entry.get_change_message() == "Added preferences “preferences of alice”."

    r = client.post(url, {**recipient_post(alice, opt_outs=[], category_opt_outs={"marketing": ["email"]},
                                           quiet_start="22:00", quiet_end="07:00", quiet_timezone="Europe/Berlin"),
                          "preferences-INITIAL_FORMS": "1"})
    assert r.status_code == 302
    assert Preferences.objects.get(recipient=alice).opt_outs == []
    latest = LogEntry.objects.filter(user=supporter).latest("action_time")
    assert latest.get_change_message() == "Changed Opted out of channels for preferences “preferences of alice”."


def test_support_never_sees_sensitive_content(client, supporter, marketer, alice):
    otp = notify(alice, body=OTP, title="Login code", sensitive=True, priority="high")
    plain = notify(alice, body="Your parcel is on its way")
    as_user(client, supporter)
    detail = client.get(reverse("admin:notifications_notification_change", args=[otp.pk])).content.decode()
    assert HIDDEN in detail and OTP not in detail and "Login code" not in detail
    assert "Your parcel is on its way" in client.get(
        reverse("admin:notifications_notification_change", args=[plain.pk])).content.decode()
    for url in (reverse("admin:notifications_notification_changelist"),
                reverse("admin:notifications_notification_changelist") + "?q=%2B49+151+1234+5678",
                reverse("admin:preferences_recipient_change", args=["alice"])):
        html = client.get(url).content.decode()
        assert str(otp.pk) in html and OTP not in html, url
    # Marketing's template preview renders the template for the recipient, never their notifications.
    services.upsert_template("hello", name="Hello", default_locale="en",
                             variants=[{"locale": "en", "body": "Hi {{ first_name }}"}])
    as_user(client, marketer)
    preview = client.get(reverse("admin:campaigns_template_change", args=["hello"]) + "?preview_user=alice")
    html = preview.content.decode()
    assert preview.status_code == 200 and "Hi Alice" in html and OTP not in html


# --- support UX: history and phone search ------------------------------------------------------------

def test_recipient_page_lists_every_notification_newest_first_and_links_the_filtered_list(client, supporter, alice):
    start = datetime(2030, 1, 1, tzinfo=UTC)
    api = notify(alice, status=Status.SUPPRESSED, reason=Reason.OPTED_OUT_CHANNEL, created_at=start)
    campaign = notify(alice, campaign_id=uuid.uuid4(), channel="email", status=Status.DELIVERED,
                      created_at=start + timedelta(minutes=5))
    bob = Recipient.objects.create(user_id="bob")
    other = notify(bob)
    as_user(client, supporter)
    html = client.get(reverse("admin:preferences_recipient_change", args=["alice"])).content.decode()
    assert "<code>opted_out_channel</code>: Recipient opted out of this channel" in html
    api_link = reverse("admin:notifications_notification_change", args=[api.pk])
    campaign_link = reverse("admin:notifications_notification_change", args=[campaign.pk])
    assert api_link in html and campaign_link in html and str(other.pk) not in html
    assert html.index(campaign_link) < html.index(api_link)  # newest first
    listing_url = reverse("admin:notifications_notification_changelist") + "?recipient__user_id=alice"
    assert f'href="{listing_url}"' in html
    listing = client.get(listing_url + "&status__exact=suppressed")
    assert listing.status_code == 200
    assert [n.pk for n in listing.context["cl"].result_list] == [api.pk]


@pytest.mark.parametrize(("typed", "expected"), [
    ("+49 151 1234 5678", "+4915112345678"),
    ("  +49 (151) 1234-5678 ", "+4915112345678"),
    ("+4915112345678", "+4915112345678"),
    ("+1 415 555 2671", "+14155552671"),
    ("+49 151", None),          # not a valid number
    ("0151 1234 5678", None),   # no country code
    ("+49 abc", None),
    ("alice", None),
])
def test_phone_search_term(typed, expected):
    assert phone_search_term(typed) == expected


def test_support_finds_a_user_by_phone_typed_with_spaces(client, supporter, alice):
    Recipient.objects.create(user_id="bob", phone="+4915112345679")
    mine = notify(alice)
    notify(Recipient.objects.get(pk="bob"))
    as_user(client, supporter)
    recipients = client.get(reverse("admin:preferences_recipient_changelist"), {"q": "+49 151 1234 5678"})
    assert [r.pk for r in recipients.context["cl"].result_list] == ["alice"]
    by_id = client.get(reverse("admin:preferences_recipient_changelist"), {"q": "alice"})
    assert [r.pk for r in by_id.context["cl"].result_list] == ["alice"]
    notifications = client.get(reverse("admin:notifications_notification_changelist"), {"q": "+49 151 1234-5678"})
    assert [n.pk for n in notifications.context["cl"].result_list] == [mine.pk]
