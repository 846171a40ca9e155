"""What a support agent reads and edits, in a real browser against the ``make run`` web process:
instants to the millisecond in UTC and in the viewer's zone, "no provider call" for a notification
that never reached a provider, opt-outs as checkboxes; and campaign pages that refresh themselves."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from campaigns import roles, services
from campaigns.models import Campaign, CampaignStatus
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification, Reason, Status
from preferences.models import Preferences, Recipient
from tests.browser.conftest import POLL_TIMEOUT_MS

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed").expect

T0 = datetime(2030, 3, 1, 9, 0, 0, 123_000, tzinfo=UTC)


def at(model, obj, when: datetime) -> None:
    model.objects.filter(pk=obj.pk).update(created_at=when)


@pytest.mark.parametrize("timezone_id", ["Asia/Kolkata"])  # UTC+05:30 all year: no DST to think about
def test_support_reads_a_timeline_to_the_millisecond_in_utc_and_in_their_own_zone(page, log_in, staff_member):
    carol = Recipient.objects.create(user_id="carol", phone="+4915112345678")
    sent = Notification.objects.create(id=uuid.uuid4(), recipient=carol, channel="sms", body="Parcel",
                                       status=Status.SENT, attempts=1, provider="twilio", sent_at=T0 + timedelta(
                                           milliseconds=850))
    at(Notification, sent, T0)
    at(DeliveryEvent, DeliveryEvent.objects.create(notification=sent, kind="accepted", status="queued"), T0)
    at(DeliveryEvent, DeliveryEvent.objects.create(notification=sent, kind="sent", status="sent"),
       T0 + timedelta(milliseconds=851))
    at(DeliveryAttempt, DeliveryAttempt.objects.create(notification=sent, number=1, provider="twilio",
                                                       outcome="accepted", latency_ms=92), T0 + timedelta(
                                                           milliseconds=849))
    log_in(*staff_member("sam", roles.SUPPORT))
    page.goto(f"/admin/notifications/notification/{sent.pk}/change/")

    expect(page.locator(".field-created_at_instant .readonly")).to_have_text(
        "2030-03-01 14:30:00.123 GMT+5:30 (your zone)2030-03-01 09:00:00.123 UTC")
    expect(page.locator(".field-sent_at_instant .readonly")).to_contain_text("2030-03-01 09:00:00.973 UTC")
    timeline = page.locator("#events-group tbody tr.has_original td.field-at")
    expect(timeline).to_have_text(["2030-03-01 14:30:00.123 GMT+5:30 (your zone)2030-03-01 09:00:00.123 UTC",
                                   "2030-03-01 14:30:00.974 GMT+5:30 (your zone)2030-03-01 09:00:00.974 UTC"])
    expect(page.locator("#attempts_log-group tbody tr.has_original td.field-at")).to_have_text(
        "2030-03-01 14:30:00.972 GMT+5:30 (your zone)2030-03-01 09:00:00.972 UTC")
    expect(page.locator(".field-attempts_shown .readonly")).to_have_text("1 (1 provider call)")


def test_a_suppressed_notification_says_no_provider_call(page, log_in, staff_member):
    carol = Recipient.objects.create(user_id="carol", email="carol@example.com")
    # Claimed once by a worker (attempts = 1), then suppressed at send time: no provider was called.
    suppressed = Notification.objects.create(id=uuid.uuid4(), recipient=carol, channel="email", body="Hi",
                                             status=Status.SUPPRESSED, reason=Reason.OPTED_OUT_CHANNEL, attempts=1)
    log_in(*staff_member("sam", roles.SUPPORT))
    page.goto(f"/admin/notifications/notification/{suppressed.pk}/change/")
    expect(page.locator(".field-attempts_shown .readonly")).to_have_text(
        "No provider call (suppressed before sending: Recipient opted out of this channel)")
    expect(page.locator("#attempts_log-group tbody tr.has_original")).to_have_count(0)


def test_support_edits_opt_outs_with_checkboxes(page, log_in, staff_member):
    carol = Recipient.objects.create(user_id="carol", email="carol@example.com", phone="+4915112345678")
    Preferences.objects.create(recipient=carol, opt_outs=["push"], category_opt_outs={"orders": ["sms"]})
    log_in(*staff_member("sam", roles.SUPPORT))
    page.goto("/admin/preferences/recipient/carol/change/")
    assert page.locator("textarea[name^=preferences]").count() == 0  # no raw JSON to type

    prefs = page.locator("#preferences-0")  # the inline form (not its hidden "add another" template)
    expect(prefs.locator("input[name='preferences-0-opt_outs']:checked")).to_have_count(1)
    prefs.get_by_label("SMS", exact=True).check()
    prefs.get_by_label("Push", exact=True).uncheck()
    grid = prefs.locator("table.category-opt-outs")
    expect(grid.locator("tbody tr")).to_have_count(3)  # marketing (configured), orders (hers), a blank row
    expect(grid.get_by_label("orders: SMS")).to_be_checked()
    grid.get_by_label("marketing: Email").check()
    grid.get_by_label("orders: SMS").uncheck()
    grid.locator("input[placeholder='another category']").fill("newsletter")
    grid.get_by_label("another category: Push").check()
    page.click("input[name=_continue]")
    expect(page.locator(".messagelist .success")).to_be_visible()

    prefs_row = Preferences.objects.get(recipient=carol)
    assert (prefs_row.opt_outs, prefs_row.category_opt_outs) == (["sms"], {"marketing": ["email"],
                                                                           "newsletter": ["push"]})
    # Shown back as checked boxes; the new category has its own row now.
    expect(grid.locator("tbody tr")).to_have_count(3)
    expect(grid.get_by_label("newsletter: Push")).to_be_checked()
    expect(grid.locator("input:checked")).to_have_count(2)

    # A category name that sends could never carry: refused with the rule, nothing saved.
    grid.locator("input[placeholder='another category']").fill("Black Friday!")
    grid.get_by_label("another category: Email").check()
    page.click("input[name=_continue]")
    expect(prefs.locator(".errorlist")).to_contain_text("must be lower-case letters")
    assert Preferences.objects.get(recipient=carol).category_opt_outs == {"marketing": ["email"],
                                                                          "newsletter": ["push"]}


def test_campaign_list_and_page_refresh_themselves_until_the_campaign_is_done(page, log_in, staff_member):
    segment, _ = services.upsert_segment("spring", name="Spring audience")
    campaign = services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.DRAFT,
                                        segment=segment, channel="sms", body="Spring sale").campaign
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.SENDING, member_count=0)
    log_in(*staff_member("mia", roles.MARKETING))

    page.goto("/admin/campaigns/campaign/")
    row = page.locator("#result_list tbody tr", has_text="Spring")
    expect(row.locator("td.field-status")).to_have_text("Sending")
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.COMPLETED, completed_at=T0)
    expect(row.locator("td.field-status")).to_have_text("Completed", timeout=POLL_TIMEOUT_MS)  # reloaded by itself

    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.SENDING, completed_at=None)
    page.goto(f"/admin/campaigns/campaign/{campaign.pk}/change/")
    expect(page.locator(".field-status .readonly")).to_have_text("Sending")
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.COMPLETED, completed_at=T0)
    # The progress poll sees the new status and reloads the page: the Status section follows.
    expect(page.locator(".field-status .readonly")).to_have_text("Completed", timeout=POLL_TIMEOUT_MS)
    expect(page.locator(".field-completed_at .readonly")).to_have_text("2030-03-01 09:00:00 UTC")
