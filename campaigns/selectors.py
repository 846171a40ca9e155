"""Reads for campaigns: progress counts and content resolution at send time."""

from __future__ import annotations

import json
import time
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count, Max, Sum

from campaigns.models import Campaign, CampaignStatus, CampaignTally, CampaignTallyChange, Template
from core import clock
from notifications import records
from notifications.delivery.content import ContentError
from notifications.events.content import SendOptions, render_typed
from notifications.models import Notification, NotificationRecord
from notifications.rendering import Rendered, RenderError, check_parts, context_for, render_strings, render_variant
from notifications.rendering.checking import CheckBudgetSpent, check_budget
from preferences.models import Unsubscribe

STATUSES = ["scheduled", "queued", "sending", "sent", "delivered", "displayed", "dismissed", "opened", "failed",
            "suppressed", "expired", "cancelled"]
#: The statuses ``outcome()`` counts as sent.
SENT_STATUSES = ("sent", "delivered", "displayed", "dismissed", "opened")
#: The statuses counted by reason too (``suppressed_by_reason``, ``failed_by_reason``).
WITH_REASON = ("suppressed", "failed")


def campaign_counts(campaign: Campaign) -> dict:
    """``{"total": n, "outcome": outcome(by_status), "by_status": {status: n…},
    "suppressed_by_reason": {reason: n…}, "failed_by_reason": {…}, "history_expired": bool}`` over the
    campaign's notifications (every status key present), live and archived alike
    (:class:`~notifications.models.NotificationRecord`). ``history_expired``: the history's retention
    may have dropped some of them since its fan-out began, so the counts are of the rows left
    (:func:`notifications.records.history_expired`). Exact; how: :func:`counts_for`."""
    return counts_for([campaign])[campaign.pk]


def counts_for(campaigns) -> dict:
    """``{campaign pk: campaign_counts(campaign)}`` for several campaigns (the admin list, a series'
    runs): the one rule of a campaign's counts, which every reader calls. A campaign with a
    :class:`~campaigns.models.CampaignTally` (beat's pace sampler counted it once) is read from it plus
    its changes not folded yet (:func:`tallied`): the size of what changed, never its rows. The others
    (never sampled, or old enough that the history's retention may have dropped rows, which no
    trigger records) are counted in full, in one grouped query."""
    campaigns = list(campaigns)
    rows = tallied([c.pk for c in campaigns if not history_expired(c)])
    rest = [c.pk for c in campaigns if c.pk not in rows]
    if rest:
        for campaign_id, status, reason, n in (
                NotificationRecord.objects.filter(campaign_id__in=rest).values("campaign_id", "status", "reason")
                .annotate(n=Count("id")).order_by().values_list("campaign_id", "status", "reason", "n")):
            rows.setdefault(campaign_id, []).append((status, reason, n))
    return {c.pk: counts_of(rows.get(c.pk, []), c) for c in campaigns}


_TALLIED_SQL = f"""
SELECT t.campaign_id, t.counts::text,
       (SELECT COALESCE(json_agg(json_build_array(c.status, c.reason, c.n)), '[]')::text
          FROM (SELECT status, reason, sum(n) AS n FROM {CampaignTallyChange._meta.db_table}
                 WHERE campaign_id = t.campaign_id GROUP BY 1, 2) AS c)
  FROM {CampaignTally._meta.db_table} AS t WHERE t.campaign_id = ANY(%s)
"""


def tallied(campaign_ids) -> dict:
    """``{campaign id: [(status, reason, n)…]}`` of those of ``campaign_ids`` with a tally: the tally
    plus the changes beat's tick has not folded into it yet, read in one statement (one snapshot: the
    tick deletes the changes it folds and saves the tally in one transaction, so a change is read
    either in the tally or among the changes, never twice nor missed)."""
    if not campaign_ids:
        return {}
    with connection.cursor() as cur:
        cur.execute(_TALLIED_SQL, [list(campaign_ids)])
        found = cur.fetchall()
    result = {}
    for campaign_id, counts, changes in found:
        merged: dict[tuple[str, str], int] = {}
        for status, by_reason in json.loads(counts).items():
            for reason, n in by_reason.items():
                merged[status, reason] = merged.get((status, reason), 0) + n
        for status, reason, n in json.loads(changes):
            merged[status, reason] = merged.get((status, reason), 0) + int(n)
        result[campaign_id] = [(status, reason, n) for (status, reason), n in merged.items() if n]
    return result


def counted_rows(campaign_id):
    """The full count: ``(status, reason, n)`` of the campaign's rows, live and archived
    (``campaigns.tally`` starts a tally from it)."""
    return (NotificationRecord.objects.filter(campaign_id=campaign_id).values("status", "reason")
            .annotate(n=Count("id")).order_by().values_list("status", "reason", "n"))


def counts_of(rows, campaign: Campaign) -> dict:
    """:func:`campaign_counts`' shape from ``(status, reason, n)`` rows (a count's, or a tally's)."""
    by_status = dict.fromkeys(STATUSES, 0)
    by_reason: dict[str, dict[str, int]] = {status: {} for status in WITH_REASON}
    for status, reason, n in rows:
        by_status[status] = by_status.get(status, 0) + n
        if status in by_reason and n:
            by_reason[status][reason] = by_reason[status].get(reason, 0) + n
    return {"total": sum(by_status.values()), "outcome": outcome(by_status), "by_status": by_status,
            "suppressed_by_reason": by_reason["suppressed"], "failed_by_reason": by_reason["failed"],
            "history_expired": history_expired(campaign)}


def history_expired(campaign: Campaign) -> bool:
    """Whether the history's retention may have dropped some of ``campaign``'s notifications: from its
    fan-out's start (:func:`notifications.records.history_expired`, the rule)."""
    return records.history_expired(campaign.started_at)


def outcome(by_status: dict) -> dict:
    """Sent and not sent kept apart: ``{"sent": sent + delivered + displayed + dismissed + opened,
    "delivered": delivered + displayed + dismissed + opened, "displayed": displayed + dismissed + opened,
    "opened", "not_sent": suppressed + failed + expired + cancelled, "suppressed", "failed", "expired",
    "cancelled", "pending": scheduled + queued + sending}`` (counts of notifications). The app's
    receipts (notifications/app_receipts.py) climb a ladder, so each count is of the rows that got at
    least that far: an opened push was delivered and shown; a dismissed one was shown."""
    n = {s: by_status.get(s, 0) for s in STATUSES}
    shown = n["displayed"] + n["dismissed"] + n["opened"]
    return {"sent": sum(n[s] for s in SENT_STATUSES), "delivered": n["delivered"] + shown,
            "displayed": shown, "opened": n["opened"],
            "not_sent": n["suppressed"] + n["failed"] + n["expired"] + n["cancelled"],
            "suppressed": n["suppressed"], "failed": n["failed"], "expired": n["expired"],
            "cancelled": n["cancelled"], "pending": n["scheduled"] + n["queued"] + n["sending"]}


def unsubscribe_stats(campaign: Campaign, sent: int | None = None) -> dict:
    """``{"unsubscribes": n, "unsubscribe_rate": n / sent or None}``: the recipients who opted out
    through this campaign's emails' unsubscribe links (``preferences.Unsubscribe`` rows naming it;
    one who re-subscribed and clicked again counts once) and their share of its sent emails
    (``outcome.sent``; ``None`` while nothing was sent). ``sent``: as the caller already counted it
    (the page's progress, the API's counts); else the campaign's counts (:func:`campaign_counts`: its
    tally, not its rows)."""
    if sent is None:
        sent = campaign_counts(campaign)["outcome"]["sent"]
    n = Unsubscribe.objects.filter(campaign_id=campaign.pk).values("recipient_id").distinct().count()
    return {"unsubscribes": n, "unsubscribe_rate": (n / sent) if sent else None}


def render_template(template: Template, variants: list, recipient) -> Rendered:
    """Render a campaign ``template`` for ``recipient`` (its variants' locale fallback, the sandbox,
    escaping: :mod:`notifications.rendering`). Raises RenderError."""
    return render_variant(variants, template.default_locale, recipient, what=f"template {template.template_id}")


def content_check(parts: dict[str, str]) -> dict[str, RenderError]:
    """The save rule of a campaign's content (a template variant's or inline parts): what
    :func:`notifications.rendering.check_parts` refuses for a context without event ``data``
    (a campaign renders the recipient's attributes only; missing ones render empty). Saving (API and
    admin), the admin preview and launching all ask this, so they agree. Raises CheckBudgetSpent."""
    return check_parts(parts, event_data=False)


def template_problem(template: Template, variants: list | None = None) -> str:
    """Why ``template`` (``variants``: those to check, default all) will not render, as saving would
    refuse it (:func:`content_check`), naming the variant, the part and the line; ``""`` when it
    renders. A check that runs out of its CPU budget finds nothing (``""``): the send-time render
    bounds still hold."""
    try:
        with check_budget():
            for variant in template.variants.all() if variants is None else variants:
                parts = {"title": variant.title, "body": variant.body, "html": variant.html}
                for part, error in content_check(parts).items():
                    return f"template {template.template_id} [{variant.locale}] {part}: {error}"
    except CheckBudgetSpent:
        return ""
    return ""


def inline_problem(campaign: Campaign) -> str:
    """:func:`template_problem` for a campaign's inline content (title, body, html)."""
    try:
        errors = content_check({"title": campaign.title, "body": campaign.body, "html": campaign.html})
    except CheckBudgetSpent:
        return ""
    return next((f"{part}: {error}" for part, error in errors.items()), "")


def launch_problem(campaign: Campaign) -> str:
    """Why ``campaign``'s own content will not render for any recipient (its template's or its
    inline content, by the save rule), or ``""``. A typed campaign's templates are its type's,
    checked when the type is saved."""
    if campaign.notification_type_id:
        return ""
    if campaign.template_id:
        return template_problem(campaign.template)
    return inline_problem(campaign)


class ContentCache:
    """Resolves campaign content for notifications at send time, loading each campaign (and its
    template variants) once per batch: a template edit applies to everything not yet sent."""

    def __init__(self) -> None:
        self._campaigns: dict = {}
        self._loaded_at = time.monotonic()

    def _campaign(self, campaign_id):
        entry = self._campaigns.get(campaign_id)
        if entry is None:
            campaign = Campaign.objects.select_related("template", "notification_type").get(pk=campaign_id)
            if campaign.notification_type_id:
                variants = list(campaign.notification_type.templates.filter(channel=campaign.channel))
            else:
                variants = list(campaign.template.variants.all()) if campaign.template_id else []
            entry = self._campaigns[campaign_id] = (campaign, variants)
        return entry

    def render(self, notification: Notification) -> tuple[Rendered, SendOptions | None]:
        """Title/body/html for a campaign notification and its recipient, and a typed campaign's send
        options (its push data goes into the notification). Raises RenderError."""
        campaign, variants = self._campaign(notification.campaign_id)
        if campaign.notification_type_id:
            options = render_typed(notification, campaign.notification_type, variants, campaign.data or {})
            return Rendered(title=notification.title, body=notification.body, html=notification.html), options
        if campaign.template_id:
            template: Template = campaign.template
            return render_template(template, variants, notification.recipient), None
        return render_strings(campaign.title, campaign.body, campaign.html, context_for(notification.recipient)), None

    def data(self, notification: Notification) -> dict | None:
        """The push data payload / email custom args (a typed campaign's: rendered from its type)."""
        campaign = self._campaign(notification.campaign_id)[0]
        return notification.data if campaign.notification_type_id else campaign.data

    def cancelled(self, notification: Notification) -> bool:
        """Whether the notification's campaign was cancelled (as loaded for this batch)."""
        return self._campaign(notification.campaign_id)[0].status == CampaignStatus.CANCELLED


class SendTimeContent:
    """The delivery pipeline's content source for campaign notifications (registered in
    CampaignsConfig.ready(); notifications/delivery/content.py describes the hook): one per batch."""

    def __init__(self) -> None:
        self._cache = ContentCache()

    def render(self, notification: Notification) -> tuple:
        """``(title, body, html, data, send options)`` of a campaign notification. Raises ContentError
        (the RenderError's message) when its template cannot be rendered."""
        try:
            rendered, options = self._cache.render(notification)
        except RenderError as exc:
            raise ContentError(str(exc)) from exc
        return rendered.title, rendered.body, rendered.html, self._cache.data(notification), options

    def cancelled(self, notification: Notification) -> bool:
        return self._cache.cancelled(notification)


def stalled_campaigns(now=None) -> list[str]:
    """One line per campaign that made no progress for ``CAMPAIGN_STALL_MINUTES``: a ``scheduled`` one
    whose fan-out should have started that long ago, a recurring one whose next run should have been
    made that long ago (docs/RECURRING.md), or a ``fanning_out`` one whose last committed
    page (any shard; the start if none) is that old. Each line names the campaign, what it is stuck
    at, and its last fan-out error. Used by ``manage.py doctor`` (registered in CampaignsConfig.ready)."""
    now = now or clock.now()
    limit = settings.CAMPAIGNS["STALL_MINUTES"]
    before = now - timedelta(minutes=limit)
    lines = []
    for c in Campaign.objects.filter(status=CampaignStatus.SCHEDULED, fanout_at__lt=before).order_by("fanout_at")[:20]:
        minutes = int((now - c.fanout_at).total_seconds() // 60)
        lines.append(f"campaign {c.pk} ({c}): fan-out due at {c.fanout_at:%Y-%m-%d %H:%M:%S} UTC has not started "
                     f"for {minutes} min (limit {limit}): is beat or the maintenance worker down?")
    for c in (Campaign.objects.filter(status=CampaignStatus.SCHEDULED, next_run_at__lt=before)
              .exclude(schedule_rule="").order_by("next_run_at")[:20]):
        minutes = int((now - c.next_run_at).total_seconds() // 60)
        lines.append(f"campaign {c.pk} ({c}): recurring, its run due at {c.next_run_at:%Y-%m-%d %H:%M:%S} UTC has not "
                     f"been made for {minutes} min (limit {limit}): is beat or the maintenance worker down?")
    fanning = (Campaign.objects.filter(status=CampaignStatus.FANNING_OUT)
               .annotate(progressed=Max("shards__progressed_at"), created=Sum("shards__created"))
               .order_by("started_at"))
    for c in fanning[:100]:
        last = c.progressed or c.started_at
        if last is None or last >= before:
            continue
        minutes = int((now - last).total_seconds() // 60)
        error = (f"; {c.fanout_failures} failed page(s), last at {c.last_error_at:%Y-%m-%d %H:%M:%S} UTC: "
                 f"{c.last_error}") if c.last_error_at else "; no page error recorded (is the fan-out worker running?)"
        lines.append(f"campaign {c.pk} ({c}): fanning out, no progress for {minutes} min (limit {limit}), "
                     f"{c.created or 0} of {c.member_count} notifications created{error}")
    return lines
