"""The admin never reveals content through lookups or searches, and hostile ids are 400, never 500
(issue 11, findings 1 and 7; preferences/admin_guard.py).

In-process (Django test client, rolled-back transactions); no worker processes.
"""

from __future__ import annotations

import logging
import uuid

import pytest
from django.contrib import admin
from django.contrib.auth.models import Group, User
from django.test import Client, RequestFactory
from django.urls import NoReverseMatch, reverse

from campaigns import roles, services
from campaigns.admin import TemplateAdmin
from campaigns.models import Campaign, CampaignStatus, Template, TemplateVariant
from notifications.admin import NotificationAdmin
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification, Status
from preferences.admin_guard import content_field_of
from preferences.models import Recipient

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

OTP = "Your code is 918273"


def staff(username: str, group: str | None = None, superuser: bool = False) -> User:
    user = User.objects.create_user(username, is_staff=True, is_superuser=superuser)
    if group:
        user.groups.add(Group.objects.get(name=group))
    return User.objects.get(pk=user.pk)


def logged_in(user) -> Client:
    client = Client(raise_request_exception=False)  # a crash must show as the 500 it would be
    client.force_login(user)
    return client


@pytest.fixture
def alice() -> Recipient:
    return Recipient.objects.create(user_id="alice", email="alice@example.com", phone="+4915112345678",
                                    attributes={"first_name": "Alice"})


@pytest.fixture
def otp(alice) -> Notification:
    n = Notification.objects.create(id=uuid.uuid4(), recipient=alice, channel="sms", body=OTP, sensitive=True,
                                    status=Status.FAILED, reason_detail=f"provider said: {OTP}",
                                    request_fingerprint="ab" * 32, data={"code": "918273"},
                                    dead_lettered_at="2030-01-01T00:00:00Z")
    DeliveryAttempt.objects.create(notification=n, number=1, provider="twilio", outcome="permanent",
                                   error_message=f"rejected {OTP}")
    DeliveryEvent.objects.create(notification=n, kind="failed", detail=f"failed: {OTP}")
    return n


# --- finding 1: lookups on content ---------------------------------------------------------------

NOTIFICATION_PROBES = ["body__startswith=Your+code+is+9", "body__regex=%5EYour", "body=" + OTP.replace(" ", "+"),
                       "title__contains=", "html__startswith=", "data__code__startswith=9",
                       "data__has_key=code", "reason_detail__icontains=918", "request_fingerprint__gt=a",
                       "attempts_log__error_message__contains=918", "events__detail__contains=918",
                       "recipient__attributes__first_name__startswith=A", "pk__in=&body__startswith=Y"]


@pytest.mark.parametrize("role", ["support", "superuser"])
@pytest.mark.parametrize("probe", NOTIFICATION_PROBES)
@pytest.mark.parametrize("page", ["notification", "deadletter"])
def test_no_lookup_on_notification_content_for_any_role(role, probe, page, otp):
    user = staff("sam", roles.SUPPORT) if role == "support" else staff("root", superuser=True)
    url = reverse(f"admin:notifications_{page}_changelist") + f"?id={otp.pk}&{probe}"
    response = logged_in(user).get(url)
    assert response.status_code == 400, (url, response.status_code)  # DisallowedModelAdminLookup
    html = response.content.decode()
    assert "result" not in html and "918273" not in html


def test_the_same_list_without_the_content_lookup_still_answers(otp):
    client = logged_in(staff("sam", roles.SUPPORT))
    url = reverse("admin:notifications_notification_changelist")
    for query in (f"?id={otp.pk}", "?recipient__user_id=alice", "?status__exact=failed", f"?q={otp.pk}"):
        response = client.get(url + query)
        assert response.status_code == 200, query
        assert [n.pk for n in response.context["cl"].result_list] == [otp.pk], query  # live or archived rows
    # A search for the code finds nothing: content is not searched.
    assert list(client.get(url + "?q=918273").context["cl"].result_list) == []


@pytest.mark.parametrize("role", ["marketing", "superuser"])
def test_no_lookup_on_campaign_template_or_recipient_content(role, alice):
    user = staff("mia", roles.MARKETING) if role == "marketing" else staff("root", superuser=True)
    segment, _ = services.upsert_segment("spring", name="Spring")
    campaign = Campaign.objects.create(segment=segment, channel="sms", body="Spring code 4711",
                                       status=CampaignStatus.DRAFT)
    template = Template.objects.create(template_id="hello", name="Hello")
    TemplateVariant.objects.create(template=template, locale="en", body="Hi {{ first_name }}")
    client = logged_in(user)
    probes = {
        "campaigns_campaign": [f"id={campaign.pk}&body__startswith=Spring", "title__regex=.", "html=",
                               "data__isnull=false", "last_error__contains=x", "request_fingerprint__gt=0",
                               "template__variants__body__contains=Hi", "shards__last_error__contains=x"],
        "campaigns_template": ["template_id=hello&variants__body__startswith=Hi", "variants__title__regex=.",
                               "variants__html__contains=x", "campaigns__body__contains=x"],
        "preferences_recipient": ["user_id=alice&attributes__first_name__startswith=A",
                                  "notifications__body__startswith=Y", "attributes__has_key=first_name"],
        "campaigns_segmentmember": ["recipient__attributes__first_name=Alice",
                                    "segment__campaigns__body__contains=4711"],
    }
    for page, queries in probes.items():
        for query in queries:
            response = client.get(reverse(f"admin:{page}_changelist") + "?" + query)
            assert response.status_code == 400, (page, query, response.status_code)
            assert "result" not in response.content.decode(), (page, query)


def every_content_path(model, depth: int = 2, prefix: str = "") -> list[str]:
    """Every lookup path from ``model`` to a content field through at most ``depth`` relations."""
    paths = [prefix + name for name in getattr(model, "content_fields", ())]
    if depth:
        for field in model._meta.get_fields():
            if field.is_relation and field.related_model is not None:
                paths += every_content_path(field.related_model, depth - 1, f"{prefix}{field.name}__")
    return paths


def test_every_registered_admin_refuses_every_content_lookup():
    request = RequestFactory().get("/admin/")
    request.user = User(is_superuser=True, is_staff=True, is_active=True)
    refused = allowed = 0
    for model, model_admin in admin.site._registry.items():
        for path in every_content_path(model):
            assert content_field_of(model, path) is not None, path
            for lookup in (path, f"{path}__startswith", f"{path}__regex"):
                if model_admin.lookup_allowed(lookup, "x", request):
                    allowed += 1
                    pytest.fail(f"{type(model_admin).__name__} allows ?{lookup}=")
                refused += 1
    assert refused > 100 and allowed == 0


def test_content_field_of_follows_relations_and_stops_at_transforms():
    assert content_field_of(Notification, "body__startswith") == "notifications.Notification.body"
    assert content_field_of(Notification, "recipient__attributes__x") == "preferences.Recipient.attributes"
    assert content_field_of(Recipient, "notifications__attempts_log__error_message") == \
        "notifications.DeliveryAttempt.error_message"
    assert content_field_of(Notification, "status__exact") is None
    assert content_field_of(Notification, "recipient__user_id") is None
    assert content_field_of(Notification, "pk") is None
    assert content_field_of(Notification, "no_such_field__body") is None


def test_no_search_field_reaches_content_and_the_check_says_so():
    for model, model_admin in admin.site._registry.items():
        assert [e for e in model_admin.check() if e.id == "admin_guard.E001"] == [], model

    class Leaky(NotificationAdmin):
        search_fields = ["recipient__user_id", "=body", "attempts_log__error_message"]

    class LeakyTemplates(TemplateAdmin):
        search_fields = ["^variants__body"]

    errors = [e for e in Leaky(Notification, admin.site).check() if e.id == "admin_guard.E001"]
    assert [e.msg for e in errors] == [
        "search_fields entry '=body' searches message content (notifications.Notification.body).",
        "search_fields entry 'attempts_log__error_message' searches message content "
        "(notifications.DeliveryAttempt.error_message).",
    ]
    assert [e.id for e in LeakyTemplates(Template, admin.site).check()] == ["admin_guard.E001"]


# --- finding 7: NUL bytes and malformed ids -------------------------------------------------------

HOSTILE_QUERIES = ["id=%00", "pk=%00", "id=not-a-uuid", "pk=not-a-uuid", "q=%00", "%00=1", "id=1%00",
                   "pk__in=%00,1", "recipient__user_id=%00", "segment__segment_id__exact=%00",
                   "user_id=%00", "template_id=%00", "segment_id=%00", "name=%00"]
HOSTILE_IDS = ["%00", "a%00b", "not-a-uuid", "%01", "..%2F", "-1"]


def admin_pages():
    for model in admin.site._registry:
        yield f"{model._meta.app_label}_{model._meta.model_name}"


@pytest.fixture
def root() -> Client:
    return logged_in(staff("root", superuser=True))


@pytest.mark.parametrize("page", list(admin_pages()))
def test_every_changelist_answers_hostile_filters_without_a_500(root, page, otp):
    for query in HOSTILE_QUERIES:
        response = root.get(reverse(f"admin:{page}_changelist") + "?" + query)
        assert response.status_code < 500, (page, query, response.status_code)
        if "%00" in query:
            assert response.status_code == 400, (page, query, response.status_code)


@pytest.mark.parametrize("page", list(admin_pages()))
def test_every_object_page_answers_hostile_ids_without_a_500(root, page):
    for object_id in HOSTILE_IDS:
        for view in ("change", "history", "delete"):
            try:
                url = reverse(f"admin:{page}_{view}", args=["ID"]).replace("ID", object_id)
            except NoReverseMatch:
                continue
            response = root.get(url)
            assert response.status_code < 500, (url, response.status_code)
            if "%00" in object_id:
                assert response.status_code == 400, (url, response.status_code)
        response = root.post(reverse(f"admin:{page}_changelist"), {"action": "delete_selected",
                                                                   "_selected_action": ["\x00"]})
        assert response.status_code == 400, (page, response.status_code)


def test_our_lists_answer_400_to_a_malformed_id_instead_of_the_unfiltered_list(root, otp):
    for page in ("notifications_notification", "notifications_deadletter", "campaigns_campaign"):
        response = root.get(reverse(f"admin:{page}_changelist") + "?id=not-a-uuid")
        assert response.status_code == 400, page
    # A page number past the end is not a filter: Django's answer as before (a page, or a redirect to it).
    response = root.get(reverse("admin:notifications_notification_changelist") + "?p=99")
    assert response.status_code in (200, 302)


def test_custom_admin_views_refuse_nul(root, alice):
    segment, _ = services.upsert_segment("spring", name="Spring")
    template = Template.objects.create(template_id="hello", name="Hello")
    TemplateVariant.objects.create(template=template, locale="en", body="Hi")
    urls = [reverse("admin:campaigns_template_change", args=["hello"]) + "?preview_user=%00",
            reverse("admin:campaigns_segment_upload_members", args=["ID"]).replace("ID", "%00"),
            reverse("admin:provider_health") + "?minutes=%00"]
    for url in urls:
        assert root.get(url).status_code == 400, url
    assert root.post(reverse("admin:campaigns_segment_upload_members", args=[segment.pk]),
                     {"note": "\x00"}).status_code == 400
    # A NUL in a form field of a save: 400 before the view (Postgres could not even compare it).
    response = root.post(reverse("admin:preferences_recipient_change", args=["alice"]), {"user_id": "alice\x00"})
    assert response.status_code == 400


@pytest.mark.parametrize(("query", "logged"), [
    ("body__startswith=Your", ("django.security.DisallowedModelAdminLookup", "WARNING",
                               "Filtering by body__startswith not allowed")),
    ("id=not-a-uuid", ("django.request", "INFO", "This filter cannot be applied: ")),
    ("q=%00", ("django.request", "INFO", "A NUL character in the query.: ")),
])
def test_a_refused_admin_request_is_one_log_line_without_a_traceback(root, otp, caplog, query, logged):
    """Refusals docs/OPERATIONS.md ("The admin, page by page") documents as 400 were logged with
    ~50-line tracebacks (the lookup at ERROR)."""
    caplog.set_level(logging.DEBUG)
    response = root.get(reverse("admin:notifications_notification_changelist") + "?" + query)
    assert response.status_code == 400
    (record,) = [r for r in caplog.records if r.name.startswith(("django.request", "django.security"))]
    name, level, message = logged
    assert (record.name, record.levelname, record.exc_info, record.exc_text) == (name, level, None, None)
    assert record.getMessage().startswith(message), record.getMessage()
    assert "Traceback" not in caplog.text
