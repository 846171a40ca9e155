"""Helpers for fan-out tests that run in the test's own transaction (no stack): build recipients
and campaigns in the database, run the fan-out pages inline, run the send-time checks."""

from __future__ import annotations

import uuid
from datetime import date, time

from campaigns.fanout import fan_out_page, start_due_campaigns
from campaigns.models import Campaign, CampaignShard, CampaignStatus, Segment, SegmentMember
from core import clock
from notifications.models import Notification
from preferences.models import Device, Preferences, Recipient


def make_recipient(user_id: str, *, phone: str = "+4915112345678", email: str = "", timezone: str = "",
                   phone_invalid: bool = False, email_invalid: bool = False,
                   devices: tuple[bool, ...] = (), prefs: dict | None = None) -> Recipient:
    """A recipient; ``devices`` lists each push device's ``active`` flag; ``prefs`` the fields of a
    Preferences row (``None``: no row at all)."""
    r = Recipient.objects.create(
        user_id=user_id, phone=phone, email=email, timezone=timezone,
        phone_invalid_reason="twilio 21211" if phone_invalid else "",
        email_invalid_reason="hard_bounce" if email_invalid else "")
    for i, active in enumerate(devices):
        Device.objects.create(recipient=r, platform="android", push_token=f"tok-{user_id}-{i}", active=active)
    if prefs is not None:
        Preferences.objects.create(recipient=r, **prefs)
    return r


def make_segment_of(user_ids: list[str]) -> Segment:
    """A new segment whose members are ``user_ids`` (existing recipients)."""
    segment = Segment.objects.create(segment_id=f"s-{uuid.uuid4().hex[:12]}", name="generated")
    SegmentMember.objects.bulk_create([SegmentMember(segment=segment, recipient_id=u) for u in user_ids])
    return segment


def make_campaign(user_ids: list[str], *, channel: str, category: str = "marketing",
                  local: tuple[date, time] | None = None, status: str = CampaignStatus.SCHEDULED) -> Campaign:
    """A campaign over a new segment of ``user_ids``, due now (or at a local wall time)."""
    segment = make_segment_of(user_ids)
    now = clock.now()
    return Campaign.objects.create(
        segment=segment, channel=channel, category=category, title="Sale", body="20% off today",
        local_date=local[0] if local else None, local_time=local[1] if local else None,
        status=status, fanout_at=now)


def run_fan_out(campaign: Campaign) -> list[Notification]:
    """Start the campaign and run every page of every shard inline; returns its notifications."""
    assert str(campaign.pk) in start_due_campaigns()
    for shard in CampaignShard.objects.filter(campaign=campaign):
        for _ in range(10_000):
            if fan_out_page(str(campaign.pk), shard.number) != "page":
                break
    return list(Notification.objects.filter(campaign_id=campaign.pk).select_related(
        "recipient", "recipient__preferences").order_by("recipient_id"))


def send_time_outcome(notification_id) -> tuple[str, str]:
    """Claim a ``queued`` row and run the send path's checks (``prepare``) without calling a
    provider. Returns ``("ready", "")`` when the row would go to the provider, else the row's new
    ``(status, reason)`` (suppressed, deferred to ``scheduled`` for quiet hours…)."""
    from notifications.sending import _CampaignContent, claim, prepare

    assert claim([str(notification_id)], clock.now()) == [uuid.UUID(str(notification_id))]
    n = Notification.objects.select_related("recipient", "recipient__preferences").get(pk=notification_id)
    if prepare(n, set(), _CampaignContent()) is not None:
        return "ready", ""
    n.refresh_from_db()
    return n.status, n.reason
