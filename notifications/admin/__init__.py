"""The pipeline's admin (Django's autodiscovery imports this package): each part registers its
models; this module imports the parts and adds the pipeline's inlines to the recipient's page.
The parts import :mod:`notifications.admin.base`, never this module, so the package has no cycle.

Parts: notifications (:mod:`.notification`: find one, its timeline, dead letters), API clients and
their audit log (:mod:`.clients`), events with their per-channel outcomes (:mod:`.events`), digests
(:mod:`.digests`), notification types with templates, matrix and preview (:mod:`.types`), allowed
senders (:mod:`.senders`), frequency caps (:mod:`.caps`), the in-app inbox (:mod:`.inbox`), abuse
limits at acceptance (:mod:`notifications.acceptance.admin`), status webhooks (:mod:`.webhooks`).
"""

from __future__ import annotations

from notifications.acceptance.admin import AcceptanceLimitAdmin
from notifications.admin.base import HIDDEN
from notifications.admin.caps import FrequencyCapAdmin
from notifications.admin.clients import APIClientAdmin
from notifications.admin.digests import DigestAdmin
from notifications.admin.events import EventAdmin, RecipientEventInline
from notifications.admin.inbox import InboxItemAdmin, RecipientInboxCountsInline, RecipientInboxInline
from notifications.admin.notification import NotificationAdmin, RecipientNotificationInline, dead_letter_depth
from notifications.admin.senders import AllowedSenderAdmin
from notifications.admin.timeline import RecipientTimelineInline
from notifications.admin.types import NotificationTypeAdmin
from notifications.admin.webhooks import WebhookDeliveryAdmin, WebhookEndpointAdmin
from preferences.admin import RecipientAdmin

# The recipient's page (preferences/admin.py) lists its notifications and its events: added from this
# floor, so preferences imports nothing of the pipeline. The 30-day timeline first, right after the
# contact fields: support's question is answered before the preferences form.
RecipientAdmin.inlines = [RecipientTimelineInline, *RecipientAdmin.inlines, RecipientNotificationInline,
                          RecipientEventInline, RecipientInboxCountsInline, RecipientInboxInline]

__all__ = ["HIDDEN", "APIClientAdmin", "AcceptanceLimitAdmin", "AllowedSenderAdmin", "DigestAdmin", "EventAdmin",
           "FrequencyCapAdmin", "InboxItemAdmin", "NotificationAdmin", "NotificationTypeAdmin",
           "RecipientEventInline", "RecipientInboxCountsInline", "RecipientInboxInline",
           "RecipientNotificationInline", "RecipientTimelineInline", "WebhookDeliveryAdmin", "WebhookEndpointAdmin",
           "dead_letter_depth"]
