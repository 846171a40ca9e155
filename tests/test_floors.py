"""The registrations that keep every import pointing down (docs/ARCHITECTURE.md §3): a lower floor
offers a hook, the floor above registers itself in its ``AppConfig.ready``."""

from __future__ import annotations

import pytest

from providers import receipts as provider_receipts


def test_the_pipeline_subscribes_to_provider_receipts_once():
    from notifications.receipts import accept_receipts

    assert provider_receipts._subscribers.count(accept_receipts) == 1
    provider_receipts.subscribe(accept_receipts)  # a second registration changes nothing
    assert provider_receipts._subscribers.count(accept_receipts) == 1


def test_receipts_published_without_a_subscriber_are_refused_not_dropped(monkeypatch):
    monkeypatch.setattr(provider_receipts, "_subscribers", [])
    event = provider_receipts.Receipt(provider="twilio", dedup_key="twilio:SM1:delivered:", kind="delivered",
                                      raw="delivered")
    with pytest.raises(RuntimeError, match="no receipt subscriber"):
        provider_receipts.publish([event])
    provider_receipts.publish([])  # nothing to hand over: nothing raised


def test_every_subscriber_gets_the_batch_in_order(monkeypatch):
    got: list[tuple[str, list]] = []
    monkeypatch.setattr(provider_receipts, "_subscribers", [])
    provider_receipts.subscribe(lambda batch: got.append(("first", batch)))
    provider_receipts.subscribe(lambda batch: got.append(("second", batch)))
    events = [provider_receipts.Receipt(provider="sendgrid", dedup_key=f"sendgrid:m{i}:delivered:1", kind="delivered",
                                        raw="delivered") for i in range(3)]
    provider_receipts.publish(tuple(events))
    assert got == [("first", events), ("second", events)]


def test_the_apps_above_register_their_erasers_and_read_rules():
    from campaigns.apps import erase_memberships
    from campaigns.ownership import readable_campaign_sends
    from notifications import readers
    from notifications.apps import erase_notifications
    from preferences.api import erasure

    assert erasure._erasers == [erase_notifications, erase_memberships]  # INSTALLED_APPS order
    assert readers._rules == [readable_campaign_sends]


def test_the_recipient_page_lists_notifications_added_from_the_pipeline_floor():
    from notifications.admin import RecipientEventInline, RecipientNotificationInline, RecipientTimelineInline
    from notifications.admin.inbox import RecipientInboxCountsInline, RecipientInboxInline
    from preferences.admin import DeviceInline, PreferencesInline, RecipientAdmin

    assert RecipientAdmin.inlines == [RecipientTimelineInline, PreferencesInline, DeviceInline,
                                      RecipientNotificationInline, RecipientEventInline, RecipientInboxCountsInline,
                                      RecipientInboxInline]
