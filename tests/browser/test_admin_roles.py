"""Staff roles in a real browser: a marketer runs a campaign end to end, a support agent finds a user
by phone and reads why a notification was suppressed, and is refused a campaign page.

No worker processes: after the launch the test plays the scheduler in-process (``start_due_campaigns``
and ``fan_out_page`` with the clock at the scheduled instant) and marks the queued notifications
sent in the database; the campaign page, still open, picks the progress up by polling.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from campaigns import fanout, roles, services
from campaigns.models import Campaign, CampaignShard, CampaignStatus
from core import clock
from notifications.admin import HIDDEN
from notifications.models import Notification, Reason, Status
from preferences.models import Preferences, Recipient
from tests.browser.conftest import POLL_TIMEOUT_MS

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed").expect


def pick_autocomplete(page, field: str, typed: str, choice: str) -> None:
    """Choose ``choice`` in the admin's autocomplete (select2) widget of ``field``."""
    page.click(f".field-{field} .select2-selection")
    page.fill(".select2-container--open .select2-search__field", typed)
    page.click(f".select2-results__option:has-text('{choice}')")
    expect(page.locator(f".field-{field} .select2-selection__rendered")).to_contain_text(choice)


def test_marketer_builds_launches_and_watches_a_templated_campaign(page, log_in, staff_member, monkeypatch):
    for user_id, phone in [("u1", "+4915111111111"), ("u2", "+4915122222222"), ("u3", "+4915133333333")]:
        Recipient.objects.create(user_id=user_id, phone=phone, locale="en", attributes={"first_name": user_id})
    Preferences.objects.create(recipient_id="u3", opt_outs=["sms"])
    log_in(*staff_member("mia", roles.MARKETING))
    assert page.locator("a[href='/admin/notifications/notification/']").count() == 0  # no notification pages

    # A segment, then its members from a CSV file.
    page.goto("/admin/campaigns/segment/add/")
    page.fill("#id_segment_id", "spring")
    page.fill("#id_name", "Spring audience")
    page.click("input[name=_continue]")
    page.set_input_files("#member-upload input[type=file]",
                         files=[{"name": "ids.csv", "mimeType": "text/csv", "buffer": b"user_id\nu1\nu2\nu3\n"}])
    page.click("#member-upload input[type=submit]")
    expect(page.locator(".messagelist .success")).to_contain_text("3 user ids uploaded: 3 added")

    # A template with one variant.
    page.goto("/admin/campaigns/template/add/")
    page.fill("#id_template_id", "spring-sms")
    page.fill("#id_name", "Spring SMS")
    page.fill("#id_variants-0-locale", "en")
    page.fill("#id_variants-0-body", "Hi {{ first_name }}, spring sale today!")
    page.click("input[name=_save]")
    expect(page.locator(".messagelist .success")).to_contain_text("Spring SMS")

    # A templated SMS campaign scheduled two hours ahead; priority high is not offered.
    scheduled = (datetime.now(UTC) + timedelta(hours=2)).replace(second=0, microsecond=0)
    page.goto("/admin/campaigns/campaign/add/")
    page.fill("#id_name", "Spring sale")
    pick_autocomplete(page, "segment", "spring", "Spring audience")
    page.select_option("#id_channel", "sms")
    assert page.locator("#id_priority option").all_inner_texts() == ["Standard"]
    pick_autocomplete(page, "template", "spring", "Spring SMS")
    page.fill("#id_scheduled_at_0", scheduled.strftime("%Y-%m-%d"))  # the admin's zone is UTC
    page.fill("#id_scheduled_at_1", scheduled.strftime("%H:%M:%S"))
    page.click("input[name=_continue]")
    expect(page.locator("#campaign-reach")).to_contain_text("2 eligible of 3 members")  # u3 opted out of SMS
    expect(page.locator("#campaign-reach-suppressed")).to_contain_text("opted_out_channel: 1")

    dialogs = []
    page.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
    page.click("#campaign-launch input[type=submit]")
    expect(page.locator(".messagelist .success")).to_contain_text("Launched. Fan-out starts at "
                                                                   + scheduled.strftime("%Y-%m-%d %H:%M:%S UTC"))
    assert dialogs == ["Launch this campaign to 2 eligible members (of 3)?"]
    progress = page.locator("#campaign-progress")
    expect(progress.locator("[data-field=status_label]")).to_have_text("Scheduled")
    expect(progress.locator("[data-field=percent]")).to_have_text("0.0")

    # The scheduled instant arrives: fan out in-process (no broker), then the "workers" send.
    campaign = Campaign.objects.get(name="Spring sale")
    assert (campaign.status, campaign.template_id, campaign.fanout_at) == (CampaignStatus.SCHEDULED, "spring-sms",
                                                                         scheduled)
    at = scheduled + timedelta(seconds=1)
    queued = []
    monkeypatch.setattr(clock, "now", lambda: at)
    monkeypatch.setattr(fanout, "_enqueue_page_on_commit", lambda campaign_id, shard_number: None)
    monkeypatch.setattr(fanout, "enqueue_on_commit", lambda rows, countdown=None: queued.extend(rows))
    assert fanout.start_due_campaigns() == [str(campaign.pk)]
    for shard in CampaignShard.objects.filter(campaign=campaign):
        while fanout.fan_out_page(str(campaign.pk), shard.number) == "page":
            pass
    assert len(queued) == 2  # u3 opted out of SMS: suppressed at fan-out
    Notification.objects.filter(campaign_id=campaign.pk, status=Status.QUEUED).update(
        status=Status.SENT, sent_at=at, provider="twilio")
    assert fanout.reconcile_campaigns()["completed"] == 1

    # The open page polls every 3 s and, the status having changed, reloads itself (no click): wait for
    # the reloaded page's status, with a bound well past a poll and a reload on a loaded machine.
    expect(page.locator(".field-status .readonly")).to_have_text("Completed", timeout=POLL_TIMEOUT_MS)
    expect(progress.locator("[data-field=status_label]")).to_have_text("Completed")
    expect(progress.locator("[data-field=percent]")).to_have_text(re.compile(r"^100(\.0)?$"))
    assert progress.locator("progress").evaluate("bar => bar.value") == 100
    expect(progress.locator("[data-field=done]")).to_have_text("3")
    expect(progress.locator("[data-field=suppressed_by_reason]")).to_have_text("opted_out_channel: 1")
    expect(progress.locator("[data-status=sent]")).to_have_text("2")


def notify(recipient, created_at, **fields) -> Notification:
    n = Notification.objects.create(id=uuid.uuid4(), recipient=recipient, **fields)
    Notification.objects.filter(pk=n.pk).update(created_at=created_at)
    return n


def test_support_finds_a_user_by_phone_and_reads_why_a_notification_was_suppressed(page, log_in, staff_member):
    carol = Recipient.objects.create(user_id="carol-42", phone="+4915112345678", email="carol@example.com")
    Preferences.objects.create(recipient=carol, opt_outs=["email"])
    Recipient.objects.create(user_id="dave", phone="+4915112345679")
    t0 = datetime(2030, 3, 1, 9, 0, tzinfo=UTC)
    notify(carol, t0, channel="sms", body="Your parcel is on its way", status=Status.DELIVERED)
    suppressed = notify(carol, t0 + timedelta(minutes=1), channel="email", title="Receipt", body="Thanks",
                        status=Status.SUPPRESSED, reason=Reason.OPTED_OUT_CHANNEL, category="orders")
    notify(carol, t0 + timedelta(minutes=2), channel="sms", body="Your code is 551177", sensitive=True,
           priority="high", status=Status.SENT)
    log_in(*staff_member("sam", roles.SUPPORT))

    page.click("a[href='/admin/preferences/recipient/']")
    page.fill("#searchbar", "+49 151 1234 5678")
    page.press("#searchbar", "Enter")
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    rows.locator("a", has_text="carol-42").click()

    history = page.locator("#notifications-group")
    expect(history.locator("tbody tr.has_original")).to_have_count(3)
    assert "551177" not in page.content()  # the OTP: never shown, not even its start
    expect(page.locator("#recipient-notifications-link")).to_have_attribute(
        "href", "/admin/notifications/notification/?recipient__user_id=carol-42")
    row = history.locator("tbody tr.has_original", has_text="suppressed")
    expect(row).to_contain_text("Recipient opted out of this channel")
    row.locator("a.inlineviewlink").click()

    expect(page).to_have_url(re.compile(f"/admin/notifications/notification/{suppressed.pk}/change/$"))
    expect(page.locator(".field-reason .readonly")).to_have_text("Recipient opted out of this channel")
    expect(page.locator(".field-status .readonly")).to_have_text("Suppressed")
    expect(page.locator(".field-shown_body .readonly")).to_have_text("Thanks")  # not sensitive: shown
    expect(page.locator("input[name=_save]")).to_have_count(0)  # read-only

    # The OTP's own page hides its content.
    page.go_back()
    page.locator("#notifications-group tbody tr.has_original", has_text="high").locator("a.inlineviewlink").click()
    expect(page.locator(".field-shown_body .readonly")).to_have_text(HIDDEN)
    assert "551177" not in page.content()


def test_support_is_refused_a_campaign_page_with_403(page, log_in, staff_member):
    segment, _ = services.upsert_segment("spring", name="Spring audience")
    campaign = services.create_campaign(client=None, idempotency_key=None, status=CampaignStatus.DRAFT,
                                        segment=segment, channel="sms", body="Spring sale").campaign
    log_in(*staff_member("sam", roles.SUPPORT))
    assert page.locator("a[href='/admin/campaigns/campaign/']").count() == 0  # not on the index

    url = f"/admin/campaigns/campaign/{campaign.pk}/change/"
    response = page.goto(url)
    # Exactly: Django's 403 page at the same URL (no redirect to the login page: sam is logged in).
    assert response.status == 403
    assert page.url.endswith(url)
    expect(page.locator("h1")).to_have_text("403 Forbidden")
    assert "Spring sale" not in page.content()
