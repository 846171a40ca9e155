"""End to end: campaigns to segments through real workers, beat, Postgres, Redis and the emulator."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from datetime import UTC, date, datetime, timedelta

import pytest

from bench.stack import wait_until
from campaigns.models import Campaign, CampaignShard
from notifications.models import DeliveryEvent, Notification
from preferences.models import Preferences, Recipient
from tests.e2e import SENT, make_segment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def sent(counts: dict) -> int:
    """Accepted by the provider: `sent`, or already `delivered` by the emulator's receipt."""
    return counts["by_status"]["sent"] + counts["by_status"]["delivered"]


def create_campaign(api, body: dict, key: str | None = None) -> str:
    r = api.request("POST", "/v1/campaigns", json=body, key=key or uuid.uuid4().hex)
    assert r.status_code == 202, r.text
    return r.json()["id"]


def wait_campaign(api, cid: str, statuses, timeout: float = 120) -> dict:
    statuses = {statuses} if isinstance(statuses, str) else set(statuses)

    def check():
        body = api.request("GET", f"/v1/campaigns/{cid}").json()
        return body if body["status"] in statuses else None

    return wait_until(check, timeout, interval=0.5, message=f"campaign {cid} in {statuses}")


def content_for(channel: str) -> dict:
    if channel == "sms":
        return {"body": "Hi {{ first_name }}, 20% off today"}
    return {"title": "Sale for {{ first_name }}", "body": "Hi {{ first_name }}, 20% off today"}


def test_small_campaign_with_template_renders_per_recipient_and_completes(api, emulator):
    segment_id, users, _ = make_segment(api, 30, channel="email")
    Recipient.objects.filter(pk__in=users[:10]).update(locale="de-AT")
    template_id = f"welcome-{uuid.uuid4().hex[:8]}"  # templates are owned by the client that made them
    r = api.request("PUT", f"/v1/templates/{template_id}", json={
        "name": "Welcome", "default_locale": "en",
        "variants": [
            {"locale": "en", "title": "Hello {{ first_name }}", "body": "Welcome, {{ first_name }}!",
             "html": "<p>Welcome, {{ first_name }}!</p>"},
            {"locale": "de", "title": "Hallo {{ first_name }}", "body": "Willkommen, {{ first_name }}!"},
        ]})
    assert r.status_code in (200, 201), r.text
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "email", "template_id": template_id})
    body = wait_campaign(api, cid, "completed", timeout=60)
    assert sent(body["counts"]) == 30
    assert body["counts"]["total"] == 30
    got = {m["to"]: m for m in emulator.messages(channel="email") if m["to"].startswith(segment_id[4:])}
    assert len(got) == 30
    assert got[f"{users[0]}@example.com"]["title"] == "Hallo User0"
    assert got[f"{users[29]}@example.com"]["title"] == "Hello User29"
    assert got[f"{users[29]}@example.com"]["body"] == "Welcome, User29!"


def test_campaigns_to_5000_members_deliver_once_per_eligible_member_on_every_channel(api, emulator):
    """One 5,000-member campaign per channel, all three running at once."""
    runs = {}
    for channel in ("sms", "email", "push"):
        segment_id, users, opted = make_segment(api, 5000, channel=channel, opted_out_every=10)
        cid = create_campaign(api, {"segment_id": segment_id, "channel": channel, "content": content_for(channel)})
        runs[channel] = (cid, users, opted)
    expected_to = {
        "sms": lambda i, u: f"+49151{i:08d}", "email": lambda i, u: f"{u}@example.com",
        "push": lambda i, u: f"tok-{u}"}
    for channel, (cid, users, opted) in runs.items():
        body = wait_campaign(api, cid, "completed", timeout=420)
        counts = body["counts"]
        assert counts["total"] == 5000 == body["member_count"]
        assert sent(counts) == 5000 - len(opted)
        assert counts["by_status"]["suppressed"] == len(opted) == 500
        assert counts["suppressed_by_reason"] == {"opted_out_channel": 500}
        assert sum(counts["by_status"].values()) == 5000
        ids = {str(i) for i in Notification.objects.filter(campaign_id=cid).values_list("id", flat=True)}
        received = [m for m in emulator.messages(channel=channel) if m["notification_id"] in ids]
        per_to = Counter(m["to"] for m in received)
        assert len(per_to) == 5000 - len(opted), channel
        assert set(per_to.values()) == {1}, channel
        assert set(per_to) == {expected_to[channel](i, u) for i, u in enumerate(users) if u not in opted}
        assert all(m["body"].startswith("Hi User") for m in received)


def test_members_whose_saved_preferences_allow_the_campaign_are_sent_to(api, emulator):
    """Finding 1 of issue 10: any preferences row (here a category opt-out on another channel, quiet
    hours that are not now, an opt-out of other channels) made every fan-out page fail, and the
    campaign stayed fanning_out with nothing created."""
    segment_id, users, _ = make_segment(api, 5, channel="sms")
    later = datetime.now(UTC) + timedelta(hours=3)
    Preferences.objects.bulk_create([
        Preferences(recipient_id=users[0], category_opt_outs={"marketing": ["email"]}),
        Preferences(recipient_id=users[1], quiet_timezone="UTC", quiet_start=later.time().replace(microsecond=0),
                    quiet_end=(later + timedelta(hours=1)).time().replace(microsecond=0)),
        Preferences(recipient_id=users[2], opt_outs=["email", "push"]),
        Preferences(recipient_id=users[3], opt_outs=["sms"]),
    ])
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "sms", "content": content_for("sms")})
    body = wait_campaign(api, cid, "completed", timeout=60)
    assert (sent(body["counts"]), body["counts"]["total"]) == (4, 5)
    assert body["counts"]["suppressed_by_reason"] == {"opted_out_channel": 1}
    ids = {str(i) for i in Notification.objects.filter(campaign_id=cid).values_list("id", flat=True)}
    received = Counter(m["to"] for m in emulator.messages(channel="sms") if m["notification_id"] in ids)
    phones = dict(Recipient.objects.filter(pk__in=users).values_list("user_id", "phone"))
    assert received == {phones[u]: 1 for u in (users[0], users[1], users[2], users[4])}


def _cancel_quietly(api, cid: str) -> None:
    """Clean-up after a test: stop the campaign so later tests do not share the machine with it.
    The API cancels rows for up to 2 s and the campaign reconciler the rest within seconds; best
    effort all the same (a broken clean-up must not fail the test it follows)."""
    import contextlib

    import requests

    with contextlib.suppress(requests.RequestException):
        api.request("POST", f"/v1/campaigns/{cid}/cancel")


def test_fan_out_killed_halfway_resumes_and_creates_each_member_once(api, emulator, stack):
    segment_id, _users, opted = make_segment(api, 30_000, channel="email", opted_out_every=7)
    at = datetime.now(UTC) + timedelta(seconds=1)
    # Sends an hour after the start (spread) so this test watches fan-out, not delivery.
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "email", "content": content_for("email"),
                                "scheduled_at": (at + timedelta(hours=1)).isoformat()})
    Campaign.objects.filter(pk=cid).update(fanout_at=at)  # fan out now, send in an hour
    wait_until(lambda: sum(CampaignShard.objects.filter(campaign_id=cid).values_list("pages", flat=True)) >= 3,
               60, interval=0.05, message="a few fan-out pages")
    stack.kill("worker_fanout")  # SIGKILL mid fan-out
    pages_at_kill = sum(CampaignShard.objects.filter(campaign_id=cid).values_list("pages", flat=True))
    assert Campaign.objects.get(pk=cid).status == "fanning_out"
    stack.start("worker_fanout")
    try:
        campaign = wait_until(lambda: (c := Campaign.objects.get(pk=cid)).status == "sending" and c, 120,
                              interval=0.5, message="fan-out to finish")
        assert pages_at_kill < 30
        rows = Notification.objects.filter(campaign_id=cid)
        assert rows.count() == 30_000 == campaign.created_count == campaign.member_count
        assert rows.values("recipient_id").distinct().count() == 30_000
        assert rows.filter(status="suppressed", reason="opted_out_channel").count() == len(opted)
        assert rows.filter(status="scheduled").count() == 30_000 - len(opted)
        # Running fan-out again over the whole segment creates nothing new.
        from campaigns.fanout import fan_out_page

        CampaignShard.objects.filter(campaign_id=cid).update(done=False, cursor=None)
        Campaign.objects.filter(pk=cid).update(status="fanning_out")
        for shard in CampaignShard.objects.filter(campaign_id=cid).order_by("number"):
            CampaignShard.objects.filter(pk=shard.pk).update(cursor=shard.lower)
            while fan_out_page(cid, shard.number) == "page":
                pass
        assert Notification.objects.filter(campaign_id=cid).count() == 30_000
        assert sum(CampaignShard.objects.filter(campaign_id=cid).values_list("created", flat=True)) >= 30_000
    finally:
        Campaign.objects.filter(pk=cid).update(status="sending")
        _cancel_quietly(api, cid)
    # 25,714 unclaimed rows: the API cancels what it can in 2 s, the campaign reconciler the rest.
    wait_until(lambda: not Notification.objects.filter(campaign_id=cid, status="scheduled").exists(), 60,
               interval=0.5, message="every scheduled row cancelled")
    cancelled = Notification.objects.filter(campaign_id=cid, status="cancelled", reason="campaign_cancelled")
    assert cancelled.count() == 30_000 - len(opted)
    assert DeliveryEvent.objects.filter(notification__campaign_id=cid, kind="cancelled").count() == 30_000 - len(opted)


def upcoming(*candidates: date) -> date:
    """The first candidate at least two days ahead: a local_time must still be ahead in every zone
    (issue 10 #4), and dates must stay within 366 days, whenever the suite runs."""
    return next(d for d in sorted(candidates) if d > datetime.now(UTC).date() + timedelta(days=1))


def nth_sunday(year: int, month: int, n: int) -> date:
    first = date(year, month, 1)
    return first + timedelta(days=(6 - first.weekday()) % 7 + 7 * (n - 1))


def test_local_time_campaign_gives_each_zone_its_own_instant(api, emulator, stack):
    zones = ["Pacific/Auckland", "Europe/London", "America/Los_Angeles", "Not/AZone"]
    segment_id, _users, _ = make_segment(api, 8, channel="sms", zones=zones)
    year = datetime.now(UTC).year
    day = upcoming(date(year, 12, 15), date(year + 1, 1, 15), date(year + 1, 12, 15))  # NZDT, GMT, PST
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "sms", "content": {"body": "Good morning"},
                                "local_time": {"date": day.isoformat(), "time": "09:00"}})
    campaign = Campaign.objects.get(pk=cid)
    at = datetime.combine(day, datetime.min.time(), tzinfo=UTC)
    assert campaign.fanout_at == at - timedelta(hours=5)  # 09:00 at UTC+14
    stack.set_clock_offset((at - timedelta(hours=5) + timedelta(seconds=5) - datetime.now(UTC)).total_seconds())
    wait_campaign(api, cid, "sending", timeout=30)
    due = {n.recipient.timezone: n.due_at for n in
           Notification.objects.filter(campaign_id=cid).select_related("recipient")}
    assert due == {
        "Pacific/Auckland": at - timedelta(hours=4),  # NZDT, UTC+13
        "Europe/London": at + timedelta(hours=9),  # GMT
        "America/Los_Angeles": at + timedelta(hours=17),  # PST, UTC-8
        "Not/AZone": at + timedelta(hours=9),  # the default zone (UTC)
    }
    assert Campaign.objects.get(pk=cid).default_zone_count == 2
    stack.set_clock_offset((at + timedelta(hours=17, seconds=2) - datetime.now(UTC)).total_seconds())
    body = wait_campaign(api, cid, "completed", timeout=40)
    assert sent(body["counts"]) == 8
    ids = {str(i) for i in Notification.objects.filter(campaign_id=cid).values_list("id", flat=True)}
    assert Counter(m["notification_id"] for m in emulator.messages(channel="sms")
                   if m["notification_id"] in ids) == dict.fromkeys(ids, 1)


@pytest.mark.parametrize(("month", "sunday", "wall", "expected_utc_time"), [
    # Spring forward (second Sunday of March): 02:30 does not exist in Los Angeles → the end of the
    # gap, 03:00 PDT (10:00 UTC).
    (3, 2, "02:30", (10, 0)),
    # Fall back (first Sunday of November): 01:30 happens twice → its first occurrence, 01:30 PDT
    # (UTC-7, 08:30 UTC).
    (11, 1, "01:30", (8, 30)),
])
def test_local_time_on_dst_transitions_resolves_by_rule_and_sends_once(api, emulator, stack, month, sunday, wall,
                                                                       expected_utc_time):
    year = datetime.now(UTC).year
    day = upcoming(nth_sunday(year, month, sunday), nth_sunday(year + 1, month, sunday))
    expected_utc = datetime.combine(day, datetime.min.time(), tzinfo=UTC).replace(
        hour=expected_utc_time[0], minute=expected_utc_time[1])
    segment_id, _users, _ = make_segment(api, 2, channel="sms", zones=["America/Los_Angeles"])
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "sms", "content": {"body": "Hi"},
                                "local_time": {"date": day.isoformat(), "time": wall}})
    fanout_at = Campaign.objects.get(pk=cid).fanout_at
    stack.set_clock_offset((fanout_at - datetime.now(UTC)).total_seconds() + 2)
    wait_campaign(api, cid, "sending", timeout=30)
    assert set(Notification.objects.filter(campaign_id=cid).values_list("due_at", flat=True)) == {expected_utc}
    stack.set_clock_offset((expected_utc - datetime.now(UTC)).total_seconds() + 1)
    wait_campaign(api, cid, "completed", timeout=30)
    ids = {str(i) for i in Notification.objects.filter(campaign_id=cid).values_list("id", flat=True)}
    time.sleep(1)
    got = [m for m in emulator.messages(channel="sms") if m["notification_id"] in ids]
    assert Counter(m["notification_id"] for m in got) == dict.fromkeys(ids, 1)


def test_cancel_mid_send_leaves_nothing_sendable_and_counts_show_what_went(api, emulator):
    segment_id, _users, _ = make_segment(api, 3000, channel="sms")
    # 200 ms a call: the batched path would otherwise send all 3,000 in about a second, before the
    # cancel can land mid-send.
    emulator.add_fault(provider="twilio", latency_ms=200)
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "sms", "content": {"body": "Flash sale"}})
    wait_until(lambda: Notification.objects.filter(campaign_id=cid, status__in=SENT).count() >= 50, 60,
               interval=0.1, message="some sends")
    r = api.request("POST", f"/v1/campaigns/{cid}/cancel")
    assert r.status_code == 200
    assert r.json()["status"] == "cancelled"
    wait_until(lambda: not Notification.objects.filter(campaign_id=cid, status="sending").exists(), 20,
               message="in-flight sends to finish")
    time.sleep(2)
    all_counts = api.request("GET", f"/v1/campaigns/{cid}").json()["counts"]
    counts = all_counts["by_status"]
    assert counts["scheduled"] == counts["queued"] == counts["sending"] == 0
    # Fan-out stopped at the cancel: members not reached yet got no notification at all.
    assert sent(all_counts) + counts["cancelled"] == all_counts["total"] <= 3000
    time.sleep(2)
    assert Notification.objects.filter(campaign_id=cid).count() == all_counts["total"]
    assert sent(all_counts) >= 50 and counts["cancelled"] > 0
    ids = {str(i) for i in Notification.objects.filter(campaign_id=cid, status__in=SENT)
           .values_list("id", flat=True)}
    got = [m for m in emulator.messages(channel="sms") if m["notification_id"] in ids]
    assert len(got) == len(ids) == sent(all_counts)
    cancelled = {str(i) for i in Notification.objects.filter(campaign_id=cid, status="cancelled")
                 .values_list("id", flat=True)}
    assert not [m for m in emulator.messages(channel="sms") if m["notification_id"] in cancelled]
    assert api.request("POST", f"/v1/campaigns/{cid}/cancel").status_code == 409


def test_template_edit_after_launch_changes_what_still_queued_notifications_say(api, emulator, stack):
    segment_id, _users, _ = make_segment(api, 20, channel="sms")
    template_id = f"promo-edit-{uuid.uuid4().hex[:8]}"  # templates are owned by the client that made them
    r = api.request("PUT", f"/v1/templates/{template_id}", json={
        "name": "Promo", "default_locale": "en", "variants": [{"locale": "en", "body": "Sale: 10% off (typo)"}]})
    assert r.status_code == 201, r.text
    # Smeared over an hour: fan-out creates the rows now, they go out over the next hour.
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "sms", "template_id": template_id,
                                "spread_seconds": 3600})
    wait_campaign(api, cid, "sending", timeout=30)
    r = api.request("PUT", f"/v1/templates/{template_id}", json={
        "name": "Promo", "default_locale": "en", "variants": [{"locale": "en", "body": "Sale: 20% off"}]})
    assert r.status_code == 200, r.text
    stack.set_clock_offset(3601)
    wait_campaign(api, cid, "completed", timeout=40)
    ids = {str(i) for i in Notification.objects.filter(campaign_id=cid).values_list("id", flat=True)}
    bodies = Counter(m["body"] for m in emulator.messages(channel="sms") if m["notification_id"] in ids)
    assert bodies == {"Sale: 20% off": 20}
