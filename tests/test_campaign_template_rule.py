"""One rule for a campaign's template on every road (issue 23, finding 5): saving (API and admin),
the admin preview and launching (admin and API) all ask :func:`campaigns.selectors.content_check`.

A campaign's template sees the recipient's attributes and user_id, email, locale, timezone; only a
notification type's templates have the event's ``data`` (docs/CAMPAIGNS.md, docs/TYPES.md). So
``{{ data.code }}`` fails every render ('data' is undefined) and is refused wherever it is met,
naming the variable and the line; a variable that is merely missing renders empty, and what the
preview shows is what the provider receives."""

from __future__ import annotations

import json
import uuid

import pytest
from django.contrib.auth.models import Group, User
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from campaigns import services
from campaigns.models import Campaign, CampaignStatus, Template, TemplateVariant
from notifications.delivery.pipeline import send_notifications
from notifications.models import APIClient, Notification
from preferences.models import Recipient
from providers.registry import reset_backends
from tests.conftest import MARKETING_SCOPES
from tests.providers.conftest import twilio_options

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_password_hashing")]

BROKEN = "Hi {{ first_name }}\n{{ data.code }}"
SAYS = ("line 2: 'data' is undefined (a campaign's template has no data: only a notification type's templates "
        "read the event's {{ data.* }}; a campaign's read the recipient's attributes and user_id, email, locale, "
        "timezone)")
CHECK = "a dry render on sample data (recipient 1 of 4) failed, as every send would: " + SAYS
RENDERS = "Hi {{ first_name }}, {{ nickname }}!"


@pytest.fixture
def marketing(client, as_migrated) -> Client:
    user = User.objects.create_user("mia", is_staff=True)
    user.groups.add(Group.objects.get(name="marketing"))
    client.force_login(user)
    return client


@pytest.fixture
def http() -> Client:
    _, key = APIClient.objects.create_key(name="marketing-tool", scopes=MARKETING_SCOPES)
    return Client(headers={"Authorization": f"Api-Key {key}"})


def put(http, path, body, **headers):
    return http.put(path, data=json.dumps(body), content_type="application/json", headers=headers)


def stored(template_id: str, body: str) -> Template:
    """A template as saved before the rule (written past the checks)."""
    template = Template.objects.create(template_id=template_id, name=template_id, default_locale="en")
    TemplateVariant.objects.create(template=template, locale="en", body=body)
    return template


def template_post(body: str) -> dict:
    return {"template_id": "t", "name": "T", "default_locale": "en", "variants-TOTAL_FORMS": "1",
            "variants-INITIAL_FORMS": "0", "variants-MIN_NUM_FORMS": "1", "variants-MAX_NUM_FORMS": "1000",
            "variants-0-locale": "en", "variants-0-title": "", "variants-0-body": body, "variants-0-html": ""}


def draft(template: Template) -> Campaign:
    segment, _ = services.upsert_segment("vip", name="VIPs")
    return services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.DRAFT, segment=segment,
                                    channel="sms", template=template).campaign


def test_api_save_refuses_event_data_in_a_campaign_template_naming_variable_and_line(http):
    r = put(http, "/v1/templates/t", {"name": "T", "default_locale": "en", "variants": [
        {"locale": "en", "body": "fine"}, {"locale": "de", "body": BROKEN}]})
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [{"field": "variants.1.body", "code": "undefined_variable", "message": CHECK}]
    assert not Template.objects.exists()

    r = put(http, "/v1/templates/t", {"name": "T", "default_locale": "en",
                                      "variants": [{"locale": "en", "body": RENDERS}]})
    assert r.status_code == 201, r.content  # a missing variable (nickname) renders empty: saved


def test_api_inline_campaign_content_is_refused_by_the_same_rule(http):
    assert put(http, "/v1/segments/vip", {"name": "VIPs"}).status_code == 201
    body = {"segment_id": "vip", "channel": "sms", "content": {"body": BROKEN}}
    r = http.post("/v1/campaigns", data=json.dumps(body), content_type="application/json",
                  headers={"Idempotency-Key": "c1"})
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [{"field": "content.body", "code": "undefined_variable", "message": CHECK}]
    assert not Campaign.objects.exists()


def test_admin_save_as_marketing_refuses_it_in_the_same_words(marketing):
    r = marketing.post(reverse("admin:campaigns_template_add"), template_post(BROKEN))
    assert r.status_code == 200
    assert r.context["inline_admin_formsets"][0].formset.errors[0]["body"] == [CHECK]
    assert not Template.objects.exists()

    r = marketing.post(reverse("admin:campaigns_template_add"), template_post(RENDERS))
    assert r.status_code == 302
    assert TemplateVariant.objects.get(template_id="t").body == RENDERS


def test_preview_says_what_saving_says_and_otherwise_renders_missing_variables_empty(marketing):
    Recipient.objects.create(user_id="ada", attributes={"first_name": "Ada"})
    stored("old", BROKEN)
    r = marketing.get(reverse("admin:campaigns_template_change", args=["old"]), {"preview_user": "ada"})
    assert r.context["preview"].error == f"template old [en] body: {CHECK}"

    stored("ok", RENDERS)
    r = marketing.get(reverse("admin:campaigns_template_change", args=["ok"]), {"preview_user": "ada"})
    assert r.context["preview"].error == ""
    assert r.context["preview"].rendered.body == "Hi Ada, !"


def test_admin_launch_refuses_a_template_that_will_not_render(marketing):
    campaign = draft(stored("old", BROKEN))
    r = marketing.post(reverse("admin:campaigns_campaign_launch", args=[campaign.pk]))
    assert r.status_code == 302
    assert [str(m) for m in get_messages(r.wsgi_request)] == [
        f"Not launched: template old [en] body: {CHECK}. Fix the template (or the content) first."]
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.DRAFT and not Notification.objects.exists()


def test_api_campaign_with_a_template_that_will_not_render_is_refused(http):
    stored("old", BROKEN)
    assert put(http, "/v1/segments/vip", {"name": "VIPs"}).status_code == 201
    r = http.post("/v1/campaigns", data=json.dumps({"segment_id": "vip", "channel": "sms", "template_id": "old"}),
                  content_type="application/json", headers={"Idempotency-Key": "c1"})
    assert r.status_code == 422
    assert r.json()["error"]["fields"] == [
        {"field": "template_id", "code": "template_error", "message": f"template old [en] body: {CHECK}"}]
    assert not Campaign.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_what_the_preview_shows_is_what_the_launched_campaign_sends(marketing, settings, module_emulator):
    module_emulator.reset()
    name = f"tw{uuid.uuid4().hex[:6]}"
    settings.PROVIDERS = {**settings.PROVIDERS, "sms": [{
        "NAME": name, "BACKEND": "providers.twilio.backend.TwilioSmsBackend",
        "OPTIONS": twilio_options(module_emulator, STATUS_CALLBACK_URL=None)}]}
    reset_backends()
    try:
        ada = Recipient.objects.create(user_id=f"ada-{name}", phone="+15550001234", attributes={"first_name": "Ada"})
        campaign = draft(stored(f"ok-{name}", RENDERS))
        preview = marketing.get(reverse("admin:campaigns_template_change", args=[f"ok-{name}"]),
                                {"preview_user": ada.user_id}).context["preview"]
        r = marketing.post(reverse("admin:campaigns_campaign_launch", args=[campaign.pk]))
        assert next(str(m) for m in get_messages(r.wsgi_request)).startswith("Launched.")
        n = Notification.objects.create(id=uuid.uuid4(), campaign_id=campaign.pk, recipient=ada, channel="sms",
                                        category="marketing", body="", status="queued")

        send_notifications([str(n.pk)])

        assert Notification.objects.get(pk=n.pk).status == "sent"
        assert [m["body"] for m in module_emulator.messages()] == [preview.rendered.body] == ["Hi Ada, !"]
    finally:
        reset_backends()


def test_admin_campaign_form_refuses_a_template_that_will_not_render(marketing):
    segment, _ = services.upsert_segment("vip", name="VIPs")
    stored("old", BROKEN)
    data = {"name": "Sale", "segment": segment.pk, "channel": "sms", "priority": "standard", "category": "marketing",
            "template": "old", "title": "", "body": "", "html": "", "data": "", "scheduled_at_0": "",
            "scheduled_at_1": "", "local_date": "", "local_time": "", "spread_seconds": "0", "ttl_seconds": ""}
    r = marketing.post(reverse("admin:campaigns_campaign_add"), data)
    assert r.status_code == 200
    assert r.context["adminform"].form.errors["template"] == [f"It will not render: template old [en] body: {CHECK}."]
    assert not Campaign.objects.exists()
