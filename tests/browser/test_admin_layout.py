"""Admin pages on a 1366×768 laptop window (issue 23), each as the role that uses it: the page is no
wider than the window, and the controls and headers a person needs are wholly inside their box
(a select cut off by its fieldset, a list header hidden in a scrolled table). And a cleared JSON
field (a campaign's data, a type's digest) shows and saves empty, not ``null``.

The data are the long values people have: a 163-character FCM token, 40-character type keys,
sentence-long routing choices.
"""

from __future__ import annotations

import uuid

import pytest

from campaigns import roles
from campaigns.models import Campaign, CampaignStatus, Segment
from notifications.events.models import Event, NotificationType, TypeTemplate
from notifications.models import APIClient, Notification, Status
from preferences.models import Device, Preferences, Recipient

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed").expect

WIDTH = 1366
FCM_TOKEN = "fcm-" + "dQw4w9WgXcQ:APA91bH" * 8 + "x" * 11  # 163 characters, no break opportunity
LONG_KEY = "marketplace_seller_payout_settled_weekly"


@pytest.fixture
def laptop(page):
    page.set_viewport_size({"width": WIDTH, "height": 768})
    return page


def page_width(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth")


def assert_wholly_inside(page, selector: str, container: str) -> None:
    """Every element matching ``selector`` that has a text is visible and inside ``container`` (its
    nearest ancestor matching that selector) and inside the window: nothing clipped or scrolled away."""
    boxes = page.eval_on_selector_all(selector, """(els, container) => els.filter(el => el.textContent.trim())
      .map(el => {
        const r = el.getBoundingClientRect(), c = el.closest(container).getBoundingClientRect();
        return {text: el.textContent.trim(), left: r.left, right: r.right, width: r.width,
                boxLeft: c.left, boxRight: c.right}; })""", container)
    assert boxes
    for box in boxes:
        assert box["width"] > 0, box
        assert box["boxLeft"] - 0.5 <= box["left"] and box["right"] <= box["boxRight"] + 0.5, box
        assert box["right"] <= WIDTH, box


def a_type(key: str = LONG_KEY, **fields) -> NotificationType:
    kind = NotificationType.objects.create(key=key, name="Seller payout settled", category="payouts",
                                           channels=["email"], **fields)
    TypeTemplate.objects.create(type=kind, channel="email", locale="en", title="Payout", body="Paid")
    return kind


def test_type_form_routing_select_fits_its_row(laptop, log_in, staff_member):
    log_in(*staff_member("pia", roles.PRODUCT))
    laptop.goto("/admin/notifications/notificationtype/add/")
    assert_wholly_inside(laptop, "#id_routing", "fieldset")
    assert_wholly_inside(laptop, "#id_quiet_hours", "fieldset")
    assert page_width(laptop) <= WIDTH


def test_event_list_headers_are_all_visible(laptop, log_in, staff_member):
    kind = a_type()
    client, _ = APIClient.objects.create_key(name="checkout-service-eu-west-1-production")
    for n in range(3):
        Event.objects.create(id=uuid.uuid4(), type=kind, client=client, channels=["push", "email", "in_app"],
                             user_ids=[f"seller-{n}-{m:04d}-0f9a8b7c" for m in range(5)])
    log_in(*staff_member("sam", roles.SUPPORT))
    laptop.goto("/admin/notifications/event/")
    expect(laptop.locator("#result_list tbody tr")).to_have_count(3)
    assert_wholly_inside(laptop, "#result_list thead th", ".results")
    assert page_width(laptop) <= WIDTH


def test_support_recipient_page_fits_the_window(laptop, log_in, staff_member):
    carol = Recipient.objects.create(user_id="carol", phone="+4915112345678", email="carol@example.com")
    Preferences.objects.create(recipient=carol, opt_outs=["email"])
    Device.objects.create(recipient=carol, platform="android", push_token=FCM_TOKEN)
    kind = a_type()
    client, _ = APIClient.objects.create_key(name="shop")
    event = Event.objects.create(id=uuid.uuid4(), type=kind, client=client, user_ids=["carol"],
                                 channels=["push", "email"])
    Notification.objects.create(id=uuid.uuid4(), recipient=carol, channel="email", body="Paid", event=event,
                                notification_type=kind, status=Status.SENT)
    log_in(*staff_member("sam", roles.SUPPORT))
    laptop.goto("/admin/preferences/recipient/carol/change/")
    expect(laptop.locator("#devices-group td.field-push_token")).to_have_text(FCM_TOKEN)
    assert page_width(laptop) <= WIDTH
    assert_wholly_inside(laptop, "#devices-group thead th", ".tabular")
    assert_wholly_inside(laptop, "#recipient_events-group thead th", ".tabular")


def test_provider_health_fits_the_window(laptop, log_in, staff_member):
    log_in(*staff_member("sam", roles.SUPPORT))
    laptop.goto("/admin/provider-health/")
    expect(laptop.locator("#providers tbody tr").first).to_be_visible()
    assert page_width(laptop) <= WIDTH
    assert_wholly_inside(laptop, "#providers thead th", ".table-scroll")


def test_a_cleared_digest_saves_and_shows_empty_not_null(laptop, log_in, staff_member):
    a_type(digest={"window_seconds": 600, "key": ""})
    log_in(*staff_member("pia", roles.PRODUCT))
    laptop.goto("/admin/notifications/notificationtype/add/")
    expect(laptop.locator("#id_digest")).to_have_value("")  # a new type: no digest, no "null"

    laptop.goto(f"/admin/notifications/notificationtype/{LONG_KEY}/change/")
    expect(laptop.locator("#id_digest")).to_have_value('{"key": "", "window_seconds": 600}')
    laptop.fill("#id_digest", "")
    laptop.click("input[name=_continue]")
    expect(laptop.locator(".messagelist .success")).to_contain_text(LONG_KEY)
    assert NotificationType.objects.get(key=LONG_KEY).digest is None
    expect(laptop.locator("#id_digest")).to_have_value("")


def test_a_cleared_campaign_data_saves_and_shows_empty_not_null(laptop, log_in, staff_member):
    segment = Segment.objects.create(segment_id="sellers", name="Sellers")
    campaign = Campaign.objects.create(name="Payout day", segment=segment, channel="push", title="Payouts",
                                       body="Your payout is on its way", data={"screen": "payouts"},
                                       status=CampaignStatus.DRAFT)
    log_in(*staff_member("mia", roles.MARKETING))
    laptop.goto("/admin/campaigns/campaign/add/")
    expect(laptop.locator("#id_data")).to_have_value("")

    laptop.goto(f"/admin/campaigns/campaign/{campaign.pk}/change/")
    expect(laptop.locator("#id_data")).to_have_value('{"screen": "payouts"}')
    laptop.fill("#id_data", "")
    laptop.click("input[name=_continue]")
    expect(laptop.locator(".messagelist .success")).to_contain_text("Payout day")
    campaign.refresh_from_db()
    assert campaign.data is None
    expect(laptop.locator("#id_data")).to_have_value("")
