"""One clock: with the platform clock shifted (``NOTIFY["CLOCK_OFFSET_FILE"]``, as the end-to-end and
chaos tests shift it for every process), an API accept, a standard-tier batch send (against a real
emulator subprocess) and a SendGrid receipt stamp every timeline instant with the shifted clock, never
the host's. In-process, real Postgres and Redis."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from notifications.delivery.pipeline import send_notifications
from notifications.models import DeliveryAttempt, Notification, TimelineEntry
from preferences.models import Recipient
from providers.registry import reset_backends
from tests.conftest import make_client
from tests.providers.conftest import sendgrid_options
from tests.test_webhooks import sg_event, sg_key, sg_post  # noqa: F401 - sg_key is a fixture

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]

#: Far enough that a host-clock stamp can never pass for a shifted one, and past the API's 366-day
#: scheduling window, so that window must be measured on the platform clock too.
OFFSET = timedelta(days=400)


@pytest.fixture
def shifted(settings, tmp_path):
    offset_file = tmp_path / "clock-offset"
    offset_file.write_text(str(OFFSET.total_seconds()))
    settings.NOTIFY = {**settings.NOTIFY, "CLOCK_OFFSET_FILE": str(offset_file)}


@pytest.fixture
def sendgrid_only(settings, module_emulator):
    module_emulator.reset()
    name = f"sg{uuid.uuid4().hex[:6]}"
    settings.PROVIDERS = {**settings.PROVIDERS, "email": [
        {"NAME": name, "BACKEND": "providers.sendgrid.backend.SendGridEmailBackend",
         "OPTIONS": sendgrid_options(module_emulator)}]}
    settings.PROVIDER_LIMITS = {**settings.PROVIDER_LIMITS, name: {"RATE_PER_S": 100000.0}}
    reset_backends()
    yield name
    reset_backends()


class Window:
    """The shifted clock's readings between :meth:`open` and :meth:`close` (host clock + OFFSET)."""

    def open(self):
        self.start = timezone.now() + OFFSET
        return self

    def close(self):
        self.end = timezone.now() + OFFSET
        return self

    def holds(self, *instants) -> bool:
        return all(at is not None and self.start <= at <= self.end for at in instants)


def test_accept_batch_send_and_receipt_stamp_the_shifted_clock(shifted, sendgrid_only, sg_key):  # noqa: F811
    _, key = make_client()
    api = Client(headers={"Authorization": f"Api-Key {key}"})
    uid = f"c-{uuid.uuid4().hex[:8]}"
    Recipient.objects.create(user_id=uid, email=f"{uid}@example.com")
    body = {"user_id": uid, "channel": "email", "content": {"title": "Hi", "body": "hello"}}

    accept = Window().open()
    r = api.post("/v1/notifications", body, content_type="application/json", headers={"Idempotency-Key": uid})
    later = (timezone.now() + OFFSET + timedelta(hours=1)).isoformat()
    r_later = api.post("/v1/notifications", {**body, "scheduled_at": later}, content_type="application/json",
                       headers={"Idempotency-Key": f"{uid}-later"})
    accept.close()
    assert (r.status_code, r.json().get("status")) == (202, "queued"), r.content
    assert (r_later.status_code, r_later.json().get("status")) == (202, "scheduled"), r_later.content
    n = Notification.objects.get(pk=r.json()["id"])
    assert accept.holds(n.created_at, n.updated_at, n.queued_at)

    send = Window().open()
    send_notifications([str(n.pk)])  # standard priority: the batch path
    send.close()
    n.refresh_from_db()
    assert (n.status, n.provider, n.attempts) == ("sent", sendgrid_only, 1)
    assert send.holds(n.first_attempt_at, n.sent_at)

    receipt = Window().open()
    assert sg_post(sg_key, [sg_event(n, "delivered")]).status_code == 204
    receipt.close()
    n.refresh_from_db()
    assert n.status == "delivered"
    assert receipt.holds(n.delivered_at, n.updated_at)

    events = list(TimelineEntry.objects.filter(notification=n).order_by("created_at", "id")
                  .values_list("kind", "status", "created_at"))
    assert [(kind, status) for kind, status, _ in events] == [
        ("accepted", "queued"), ("sent", "sent"), ("receipt:delivered", "delivered")]
    assert [window.holds(at) for window, (_, _, at) in zip((accept, send, receipt), events, strict=True)] == [
        True, True, True]
    attempts = list(DeliveryAttempt.objects.filter(notification=n).values_list("number", "outcome", "created_at"))
    assert [(number, outcome) for number, outcome, _ in attempts] == [(1, "accepted")]
    assert send.holds(attempts[0][2])


def test_the_campaign_form_states_now_on_the_platform_clock(shifted):
    from campaigns.forms import CampaignForm

    before = timezone.now() + OFFSET
    help_text = CampaignForm().fields["scheduled_at"].help_text
    after = timezone.now() + OFFSET
    assert any(f"= {at:%Y-%m-%d %H:%M} UTC)" in help_text for at in (before, after)), help_text


def test_segments_members_templates_and_campaigns_are_stamped_on_the_shifted_clock(shifted):
    """hadv32: a campaign's ``created_at`` was the host's (Django's ``auto_now``) while its schedule,
    runs and rows read the platform clock."""
    from campaigns.models import Campaign, SegmentMember, Template
    from tests.conftest import MARKETING_SCOPES

    _, key = make_client(scopes=list(MARKETING_SCOPES))
    api = Client(headers={"Authorization": f"Api-Key {key}"})
    uid = f"c-{uuid.uuid4().hex[:8]}"
    Recipient.objects.create(user_id=uid, email=f"{uid}@example.com")

    window = Window().open()
    made = [api.put("/v1/segments/vip", {"name": "VIPs"}, content_type="application/json"),
            api.post("/v1/segments/vip/members", {"add": [uid]}, content_type="application/json"),
            api.put("/v1/templates/t1", {"name": "T", "variants": [
                {"locale": "en", "title": "Hi", "body": "Hello"}]}, content_type="application/json"),
            api.post("/v1/campaigns", {"segment_id": "vip", "channel": "email", "template_id": "t1"},
                     content_type="application/json", headers={"Idempotency-Key": uid})]
    window.close()
    assert [r.status_code for r in made] == [201, 200, 201, 202], [r.content for r in made]
    campaign = Campaign.objects.get(pk=made[-1].json()["id"])
    template = Template.objects.get(pk="t1")
    assert window.holds(campaign.created_at, campaign.updated_at, template.created_at, template.updated_at,
                        template.variants.get().updated_at, campaign.segment.created_at,
                        campaign.segment.updated_at, SegmentMember.objects.get(segment_id="vip").added_at)
