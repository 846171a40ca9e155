"""Reads for campaigns: progress counts and content resolution at send time."""

from __future__ import annotations

import time

from django.db.models import Count

from campaigns.models import Campaign, Template
from campaigns.rendering import Rendered, render_strings, render_template
from notifications.models import Notification

STATUSES = ["scheduled", "queued", "sending", "sent", "delivered", "failed", "suppressed", "expired", "cancelled"]


def campaign_counts(campaign: Campaign) -> dict:
    """``{"total": n, "by_status": {status: n…}, "suppressed_by_reason": {reason: n…},
    "failed_by_reason": {…}}`` over the campaign's notifications (every status key present)."""
    rows = (Notification.objects.filter(campaign_id=campaign.pk).values("status", "reason")
            .annotate(n=Count("id")).order_by())
    by_status = dict.fromkeys(STATUSES, 0)
    suppressed: dict[str, int] = {}
    failed: dict[str, int] = {}
    for row in rows:
        by_status[row["status"]] = by_status.get(row["status"], 0) + row["n"]
        if row["status"] == "suppressed":
            suppressed[row["reason"]] = suppressed.get(row["reason"], 0) + row["n"]
        elif row["status"] == "failed":
            failed[row["reason"]] = failed.get(row["reason"], 0) + row["n"]
    return {"total": sum(by_status.values()), "by_status": by_status, "suppressed_by_reason": suppressed,
            "failed_by_reason": failed}


class ContentCache:
    """Resolves campaign content for notifications at send time, loading each campaign (and its
    template variants) once per batch: a template edit applies to everything not yet sent."""

    def __init__(self) -> None:
        self._campaigns: dict = {}
        self._loaded_at = time.monotonic()

    def _campaign(self, campaign_id):
        entry = self._campaigns.get(campaign_id)
        if entry is None:
            campaign = Campaign.objects.select_related("template").get(pk=campaign_id)
            variants = list(campaign.template.variants.all()) if campaign.template_id else []
            entry = self._campaigns[campaign_id] = (campaign, variants)
        return entry

    def render(self, notification: Notification) -> Rendered:
        """Title/body/html for a campaign notification and its recipient. Raises RenderError."""
        campaign, variants = self._campaign(notification.campaign_id)
        if campaign.template_id:
            template: Template = campaign.template
            return render_template(template, variants, notification.recipient)
        from campaigns.rendering import context_for

        return render_strings(campaign.title, campaign.body, campaign.html, context_for(notification.recipient))

    def data(self, notification: Notification) -> dict | None:
        return self._campaign(notification.campaign_id)[0].data
