"""The admin's charts in a real browser against ``make run``'s web process (issue 27): Chart.js is
served by WhiteNoise (no CDN), a campaign's page draws its per-minute pace from beat's samples and
says its rate and ETA, the provider health page each provider's last hour; with JavaScript off the
numbers and sentences are all still there."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from campaigns import pace, services
from campaigns.models import Campaign, CampaignMinute, CampaignStatus
from core import clock
from notifications.models import DeliveryAttempt, Notification
from notifications.provider_minutes import sampler
from preferences.models import Recipient
from providers import isolation
from tests.conftest import reset_isolation

pytestmark = pytest.mark.browser

expect = pytest.importorskip("playwright.sync_api", reason="the pip package `playwright` is not installed").expect


def sending_campaign() -> Campaign:
    """A campaign sending for four minutes: 40, then 60 sent per minute, 10 suppressed; 100 queued. The
    fourth minute is in progress: sampled, not drawn."""
    segment, _ = services.upsert_segment("charted", name="Charted")
    now = clock.now()
    c = Campaign.objects.create(name="Spring sale", segment=segment, channel="email", title="T", body="b",
                                status=CampaignStatus.SENDING, member_count=210, started_at=now, snapshot_at=now)
    users = [Recipient.objects.create(user_id=f"c{k:03d}", email=f"c{k:03d}@example.com") for k in range(210)]
    Notification.objects.bulk_create([
        Notification(id=uuid.uuid4(), campaign_id=c.pk, recipient=u, channel="email",
                     status="sent" if k < 100 else "suppressed" if k < 110 else "queued",
                     reason="opted_out_channel" if 100 <= k < 110 else "", sent_at=now if k < 100 else None,
                     queued_at=now - timedelta(seconds=2), created_at=now, updated_at=now)
        for k, u in enumerate(users)])
    earlier = [(3, 0, 0), (2, 40, 10)]  # minutes ago: sent, suppressed
    for ago, sent, suppressed in earlier:
        at = now - timedelta(minutes=ago)
        queued = 210 - sent - suppressed
        counts = {"total": 210, "by_status": {"sent": sent, "suppressed": suppressed, "queued": queued},
                  "outcome": {"sent": sent, "not_sent": suppressed, "suppressed": suppressed}}
        CampaignMinute.objects.create(campaign=c, minute=at.replace(second=0, microsecond=0), sampled_at=at,
                                      counts=counts)
    pace.sample(c, now - timedelta(minutes=1))
    pace.sample(c, now)
    return c


def test_the_campaign_page_charts_its_pace_and_says_its_eta(page, log_in, staff_member):
    c = sending_campaign()
    log_in(*staff_member("mara", "marketing"))

    response = page.goto(f"/admin/campaigns/campaign/{c.pk}/change/")
    assert response.status == 200

    expect(page.locator("#campaign-pace-chart[data-chart-ready='1']")).to_have_count(1)
    drawn = page.evaluate("""() => { const c = Chart.getChart(document.getElementById('campaign-pace-chart'));
        return {labels: c.data.labels.length, sets: c.data.datasets.map(d => [d.label, d.data])}; }""")
    assert drawn["labels"] == 3
    assert [name for name, _ in drawn["sets"]] == ["sent / min", "delivered / min", "failed / min",
                                                  "suppressed / min"]
    assert (drawn["sets"][0][1], drawn["sets"][3][1]) == ([0, 40, 60], [0, 10, 0])
    expect(page.locator("[data-pace='eta_text']")).to_contain_text("for 100 due")
    expect(page.locator("[data-pace='rate_text']")).to_contain_text("/s over the last 5 min")
    static = page.evaluate("() => [...document.scripts].map(s => s.src).filter(s => s.includes('chart'))")
    assert all(s.startswith(page.url.split("/admin/")[0]) for s in static) and len(static) == 2, static


def without_javascript(browser, web_server, user: str, password: str):
    context = browser.new_context(base_url=web_server, java_script_enabled=False)
    page = context.new_page()
    page.goto("/admin/")
    page.fill("#id_username", user)
    page.fill("#id_password", password)
    page.click("input[type=submit]")
    return context, page


def test_with_javascript_off_the_numbers_remain(browser, web_server, transactional_db, staff_member):
    c = sending_campaign()
    context, page = without_javascript(browser, web_server, *staff_member("mara", "marketing"))
    try:
        page.goto(f"/admin/campaigns/campaign/{c.pk}/change/")
        expect(page.locator("[data-field='sent']")).to_have_text("100")
        expect(page.locator("[data-pace='eta_text']")).to_contain_text("for 100 due")
        expect(page.locator("#campaign-pace-chart[data-chart-ready='1']")).to_have_count(0)
    finally:
        context.close()


def test_the_recipient_page_shows_the_last_30_days_with_the_reason_on_hover(page, log_in, staff_member):
    eve = Recipient.objects.create(user_id="eve", email="eve@example.org")
    now = clock.now()
    for channel, status, reason, hours in (("email", "delivered", "", 2), ("email", "suppressed", "quiet_hours", 30),
                                           ("push", "failed", "token_invalid", 50)):
        Notification.objects.create(id=uuid.uuid4(), recipient=eve, channel=channel, status=status, reason=reason,
                                    body="b", created_at=now - timedelta(hours=hours))
    log_in(*staff_member("sam", "support"))

    page.goto("/admin/preferences/recipient/eve/change/")

    expect(page.locator("#recipient-timeline-chart[data-chart-ready='1']")).to_have_count(1)
    drawn = page.evaluate("""() => Chart.getChart(document.getElementById('recipient-timeline-chart'))
        .data.datasets.map(d => [d.label, d.data.map(p => p.point.status + ':' + p.point.reason)])""")
    assert [d for d in drawn if d[1]] == [["delivered", ["delivered:"]], ["failed", ["failed:token_invalid"]],
                                          ["suppressed", ["suppressed:quiet_hours"]]]
    expect(page.locator("#recipient-timeline-table tr[data-channel='email'] td").nth(1)).to_have_text("1")


def test_each_channel_row_of_the_timeline_is_labelled(page, log_in, staff_member):
    """hadv34 #2: with more than one channel the y ticks fell between the rows (-0.5, 0.5, …), unlabelled."""
    ann = Recipient.objects.create(user_id="ann", email="ann@example.org")
    for channel, hours in (("email", 2), ("sms", 5), ("push", 9)):
        Notification.objects.create(id=uuid.uuid4(), recipient=ann, channel=channel, status="delivered", body="b",
                                    created_at=clock.now() - timedelta(hours=hours))
    log_in(*staff_member("sid", "support"))

    page.goto("/admin/preferences/recipient/ann/change/")

    expect(page.locator("#recipient-timeline-chart[data-chart-ready='1']")).to_have_count(1)
    ticks = page.evaluate("""() => Chart.getChart(document.getElementById('recipient-timeline-chart'))
        .scales.y.ticks.map(t => [t.value, t.label])""")
    assert ticks == [[0, "push"], [1, "email"], [2, "sms"]]  # notifications.admin.timeline.CHANNELS' order
    days = page.evaluate("""() => Chart.getChart(document.getElementById('recipient-timeline-chart'))
        .scales.x.ticks.map(t => t.value)""")  # hadv34 #10: a grid line at each UTC midnight of the window
    steps = {b - a for a, b in itertools.pairwise(days)}  # as many as room allows, evenly
    assert len(days) >= 5 and all(v % 86_400_000 == 0 for v in days)
    assert len(steps) == 1 and next(iter(steps)) % 86_400_000 == 0 and next(iter(steps)) * len(days) >= 28 * 86_400_000


def providers_last_hour() -> str:
    """Beat's samples of a provider's last hour: twilio made 4 calls (one transient error) and its
    breaker opened and closed again. Returns the summary the page says."""
    reset_isolation()
    sampler.sample()
    now = clock.now()
    DeliveryAttempt.objects.bulk_create([
        DeliveryAttempt(notification_id=uuid.uuid4(), number=1, provider="twilio", outcome=outcome, latency_ms=ms,
                        created_at=now) for outcome, ms in (("accepted", 100), ("accepted", 100), ("accepted", 100),
                                                           ("transient", 100))])
    isolation.record_calls("twilio", failed=20)
    sampler.sample()
    isolation.record_calls("twilio", ok=1, probe=True)
    sampler.sample()
    state = isolation.breaker_state("twilio")
    began, ended = (datetime.fromtimestamp(state[k] / 1000, UTC) for k in ("since_ms", "closed_ms"))
    seconds = round((ended - began).total_seconds())
    return (f"Last hour: 4 attempts, error share 25.0% (1), worst p95 100 ms (at {now:%H:%M}), breaker open 1×: "
            f"{began:%H:%M:%S}–{ended:%H:%M:%S} ({seconds} s).")


def test_the_provider_health_page_charts_each_providers_last_hour(page, log_in, staff_member):
    summary = providers_last_hour()
    log_in(*staff_member("sam", "support"))

    assert page.goto("/admin/provider-health/").status == 200

    expect(page.locator(".last-hour canvas[data-chart-ready='1']")).to_have_count(5 * 4)
    drawn = page.evaluate("""() => ['attempts', 'error_share', 'p95_ms', 'breaker'].map(key => {
        const c = Chart.getChart(document.getElementById('last-hour-twilio-' + key));
        const values = c.data.datasets[0].data.filter(v => v !== null);
        return [c.options.plugins.title.text, c.data.labels.length, values]; })""")
    assert [(title, labels) for title, labels, _ in drawn] == [
        ("attempts / min", 60), ("error share %", 60), ("latency p95 (ms)", 60), ("breaker open", 60)]
    assert sum(drawn[0][2]) == 4 and 25 in drawn[1][2] and 100 in drawn[2][2] and 1 in drawn[3][2]
    expect(page.locator(".last-hour-summary[data-provider='twilio']")).to_have_text(summary)


def test_with_javascript_off_the_provider_health_page_says_the_last_hour(browser, web_server, transactional_db,
                                                                          staff_member):
    summary = providers_last_hour()
    context, page = without_javascript(browser, web_server, *staff_member("sam", "support"))
    try:
        page.goto("/admin/provider-health/")
        expect(page.locator(".last-hour-summary[data-provider='twilio']")).to_have_text(summary)
        expect(page.locator(".last-hour[data-provider='twilio'] .help")).to_contain_text("Open: at least 20 calls")
        expect(page.locator(".last-hour-charts").first).to_be_hidden()
        expect(page.locator("canvas[data-chart-ready='1']")).to_have_count(0)
    finally:
        context.close()
