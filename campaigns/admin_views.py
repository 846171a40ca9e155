"""The campaign admin's own views and what its pages compute: CSV member uploads in chunks, template
previews, a draft's before-launch estimates, a launched campaign's progress, and the launch /
cancel / progress views (mixins for the ModelAdmins in :mod:`campaigns.admin`, which route them in
``get_urls`` through ``admin_site.admin_view``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC

from django.contrib import admin, messages
from django.contrib.admin.utils import quote, unquote
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.http import Http404, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse

from campaigns import fanout, ownership, pace, services
from campaigns.forms import MemberUploadForm, can_send_high
from campaigns.models import Campaign, CampaignStatus, Segment, Template
from campaigns.selectors import campaign_counts, render_template, template_problem
from core import clock
from notifications.admission import high_tier_reason
from notifications.rendering import Rendered, RenderError, pick_variant
from notifications.rendering.sms_encoding import SmsInfo, sms_info
from preferences.models import Channel, Recipient

UPLOAD_CHUNK = 10_000
DONE_STATUSES = ("sent", "delivered", "displayed", "dismissed", "opened", "failed", "suppressed", "expired",
                 "cancelled")
OPEN_STATUSES = ("scheduled", "queued", "sending")
ACTIVE_CAMPAIGN_STATUSES = (CampaignStatus.SCHEDULED, CampaignStatus.FANNING_OUT, CampaignStatus.SENDING,
                            CampaignStatus.PAUSED)


def utc(value) -> str:
    """An instant as ``YYYY-MM-DD HH:MM:SS UTC`` (``—`` for none), whatever the admin's time zone."""
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if value else "—"


def add_members(segment: Segment, user_ids: list[str]) -> dict[str, int]:
    """Add ``user_ids`` to ``segment`` in chunks of UPLOAD_CHUNK, all or nothing.

    Returns ``{"ids": distinct ids, "added": n, "already_members": m, "created_recipients": k}``.
    """
    user_ids = list(dict.fromkeys(user_ids))
    added = created = 0
    with transaction.atomic():
        for start in range(0, len(user_ids), UPLOAD_CHUNK):
            result = services.change_members(segment, add=user_ids[start:start + UPLOAD_CHUNK], remove=[])
            added += result["added"]
            created += result["created_recipients"]
    return {"ids": len(user_ids), "added": added, "already_members": len(user_ids) - added,
            "created_recipients": created}


def high_priority_lock(request, obj: Template | Segment) -> str:
    """Why the staff user of ``request`` may not change ``obj`` (a template, or a segment's members):
    the message naming the active high-priority campaign that uses it, or ``""`` when they may (they
    hold ``campaigns.send_high_priority``, or no such campaign uses it). The admin's side of the rule
    in :mod:`campaigns.ownership` ("High tier"); remembered for the request (pages ask several times)."""
    cache = request.__dict__.setdefault("_high_priority_locks", {})
    key = (type(obj).__name__, obj.pk)
    if key not in cache:
        campaign = ownership.locked_for_staff(obj, can_send_high(request.user))
        if campaign is None:
            cache[key] = ""
        else:
            kind, action = (("template", "changing it") if isinstance(obj, Template)
                            else ("segment", "changing its members"))
            cache[key] = (f"This {kind} is used by the active high-priority campaign “{campaign}” "
                          f"({campaign.get_status_display()}): {action} needs the permission "
                          "campaigns.send_high_priority.")
    return cache[key]


def may_change_high(request, campaign: Campaign) -> bool:
    """Launching, cancelling, pausing, resuming, editing or deleting a high-tier campaign (priority
    ``high`` or a high-priority type: :func:`notifications.admission.high_tier_reason`) needs the
    permission ``campaigns.send_high_priority`` (:func:`campaigns.forms.can_send_high`), as choosing it does."""
    return not high_tier_reason(campaign.priority, campaign.notification_type) or can_send_high(request.user)


@dataclass(frozen=True)
class Preview:
    """A template rendered for one recipient, or why it could not be."""

    user_id: str
    error: str = ""
    locale: str = ""
    rendered: Rendered | None = None


def template_preview(template: Template, user_id: str) -> Preview:
    """Render the saved ``template`` for the recipient ``user_id`` as a send would."""
    recipient = Recipient.objects.filter(pk=user_id).first()
    if recipient is None:
        return Preview(user_id, error=f"No recipient with user id {user_id!r}.")
    variants = list(template.variants.all())
    variant = pick_variant(variants, recipient.locale, template.default_locale)
    problem = template_problem(template, [variant]) if variant is not None else ""
    if problem:  # what saving refuses and launching refuses, in the same words
        return Preview(user_id, error=problem, locale=variant.locale if variant else "")
    try:
        rendered = render_template(template, variants, recipient)
    except RenderError as exc:
        return Preview(user_id, error=str(exc))
    return Preview(user_id, locale=variant.locale if variant else "", rendered=rendered)


def sms_estimates(campaign: Campaign) -> list[tuple[str, SmsInfo]]:
    """``(label, SmsInfo)`` for an SMS campaign's body, or for each variant of its template.

    Computed on the source: variables rendered per recipient can change length and encoding.
    """
    if campaign.channel != Channel.SMS:
        return []
    if campaign.template_id:
        return [(f"Variant {v.locale}", sms_info(v.body)) for v in campaign.template.variants.order_by("locale")]
    return [("Body", sms_info(campaign.body))]


def progress(campaign: Campaign) -> dict:
    """Progress of a campaign as the admin shows and polls it (JSON-ready).

    ``done`` counts notifications that reached an end state (sent counts: it left our hands) over the
    snapshot's ``member_count``, or the notifications created so far before the snapshot is taken.
    """
    now = clock.now()
    sampled = pace.fresh_counts(campaign, now)  # while sending: the sampler's, not a count per refresh
    counts, counted_at = sampled if sampled else (campaign_counts(campaign), now)
    by_status = counts["by_status"]
    done = sum(by_status.get(s, 0) for s in DONE_STATUSES)
    open_ = sum(by_status.get(s, 0) for s in OPEN_STATUSES)
    denominator = max(campaign.member_count or 0, counts["total"])
    if denominator:
        percent = round(100 * done / denominator, 1)
    else:
        percent = 100.0 if campaign.status == CampaignStatus.COMPLETED else 0.0
    outcome = counts["outcome"]
    return {
        "id": str(campaign.pk), "status": campaign.status, "status_label": campaign.get_status_display(),
        "member_count": campaign.member_count, "created_count": counts["total"], "done": done,
        "denominator": denominator, "percent": percent, "by_status": by_status,
        # Sent and not sent apart: "done" alone counts a suppressed row like a sent one.
        **outcome,
        "sent_percent": round(100 * outcome["sent"] / denominator, 1) if denominator else 0.0,
        "suppressed_by_reason": counts["suppressed_by_reason"], "failed_by_reason": counts["failed_by_reason"],
        "history_expired": counts["history_expired"],
        "missed_count": campaign.missed_count, "missed_policy": campaign.missed_policy,
        "fanout_failures": campaign.fanout_failures, "last_error": campaign.last_error or None,
        "last_error_at": utc(campaign.last_error_at) if campaign.last_error_at else None,
        "active": campaign.status in ACTIVE_CAMPAIGN_STATUSES or open_ > 0,
        # Its sentences from the same counts when the sample was not trusted (pace.pace, "stale").
        "counted_at": utc(counted_at), "pace": pace.pace(campaign, now, counts=None if sampled else counts),
    }


def outcome_summary(outcome: dict) -> str:
    """One line for the campaign list: ``sent 3 (delivered 1) · not sent 2: suppressed 2, failed 0,
    expired 0 · pending 1`` (cancelled named only when there are some; ``(delivered 2, opened 1)``
    when the app reported opens)."""
    cancelled = f", cancelled {outcome['cancelled']:,}" if outcome["cancelled"] else ""
    opened = f", opened {outcome['opened']:,}" if outcome.get("opened") else ""
    return (f"sent {outcome['sent']:,} (delivered {outcome['delivered']:,}{opened}) · "
            f"not sent {outcome['not_sent']:,}: "
            f"suppressed {outcome['suppressed']:,}, failed {outcome['failed']:,}, expired {outcome['expired']:,}"
            f"{cancelled} · pending {outcome['pending']:,}")


def local_time_check(campaign: Campaign) -> dict | None:
    """A local-time draft's before-launch check at the platform's now: ``{"passed": members whose zone
    already passed the wall time, "members": n, "problem": the launch refusal or None, "now": str}``;
    ``None`` for a campaign without a local time."""
    if not campaign.is_local_time:
        return None
    now = clock.now()
    passed, total = fanout.local_time_passed(campaign, now)
    return {"passed": passed, "members": total, "now": utc(now), "policy": campaign.get_missed_policy_display(),
            "problem": services.local_time_problem(campaign.local_date, campaign.local_time, now)}


# --- views (ModelAdmin mixins) ---------------------------------------------------------------------

class SegmentUploadViews:
    """SegmentAdmin view: add the user ids of an uploaded CSV file to the segment."""

    def upload_members_view(self, request, object_id):
        """POST a CSV of user ids: validated whole before anything is written, then added in chunks."""
        segment = self.get_object(request, unquote(object_id))
        if segment is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_change_permission(request, segment):
            raise PermissionDenied
        change_url = reverse("admin:campaigns_segment_change", args=[quote(segment.pk)])
        if request.method != "POST":
            return redirect(change_url)
        locked = high_priority_lock(request, segment)
        if locked:
            messages.error(request, f"Upload rejected; nothing was added. {locked}")
            return redirect(change_url)
        form = MemberUploadForm(request.POST, request.FILES)
        if not form.is_valid():
            problems = " ".join(e for errors in form.errors.values() for e in errors)
            messages.error(request, f"Upload rejected; nothing was added. {problems}")
            return redirect(change_url)
        try:
            result = add_members(segment, form.cleaned_data["user_ids"])
        except services.SegmentKindConflict as exc:
            messages.error(request, f"Upload rejected; nothing was added: {exc}.")
            return redirect(change_url)
        summary = (f"{result['ids']:,} user ids uploaded: {result['added']:,} added, "
                   f"{result['already_members']:,} already members, "
                   f"{result['created_recipients']:,} new recipients created (without contacts yet).")
        self.log_change(request, segment, summary)
        messages.success(request, summary)
        return redirect(change_url)


class CampaignLifecycleViews:
    """CampaignAdmin views: launch (drafts), cancel (scheduled / fanning out / sending), progress JSON.
    Launches and cancels are recorded in the admin log (``log_change``)."""

    def _campaign(self, object_id) -> Campaign | None:
        try:
            return Campaign.objects.select_related("segment", "template").filter(pk=object_id).first()
        except ValidationError:
            return None

    def _may_send(self, request, campaign) -> bool:
        return may_change_high(request, campaign)

    def _post_target(self, request, object_id):
        campaign = self._campaign(object_id)
        if campaign is None:
            raise Http404("No such campaign.")
        if not self.has_change_permission(request, campaign):
            raise PermissionDenied
        return campaign

    def launch_view(self, request, object_id):
        """POST: move a draft to ``scheduled``; fan-out starts at ``fanout_at``."""
        campaign = self._post_target(request, object_id)
        if not self._may_send(request, campaign):
            raise PermissionDenied
        change_url = reverse("admin:campaigns_campaign_change", args=[campaign.pk])
        if campaign.status != CampaignStatus.DRAFT:
            messages.warning(request, f"Not launched: the campaign is already {campaign.get_status_display()}.")
            return redirect(change_url)
        try:
            campaign = services.launch_campaign(campaign)
        except services.LocalTimePassed as exc:
            messages.error(request, f"Not launched: {exc}. Change the local date or time.")
            return redirect(change_url)
        except services.ContentWontRender as exc:
            messages.error(request, f"Not launched: {exc}. Fix the template (or the content) first.")
            return redirect(change_url)
        if campaign.status != CampaignStatus.SCHEDULED:
            messages.warning(request, f"Not launched: the campaign is {campaign.get_status_display()}.")
            return redirect(change_url)
        self.log_change(request, campaign, f"Launched; fan-out at {utc(campaign.fanout_at)}.")
        messages.success(request, f"Launched. Fan-out starts at {utc(campaign.fanout_at)}.")
        return redirect(change_url)

    def cancel_view(self, request, object_id):
        """POST: cancel a scheduled / fanning-out / sending campaign and its unclaimed notifications
        (a high-priority one only with ``campaigns.send_high_priority``, as its launch)."""
        campaign = self._post_target(request, object_id)
        if not self._may_send(request, campaign):
            raise PermissionDenied
        level, text = self._cancel(request, campaign)
        messages.add_message(request, level, text)
        return redirect(reverse("admin:campaigns_campaign_change", args=[campaign.pk]))

    def _cancel(self, request, campaign) -> tuple[int, str]:
        if not self._may_send(request, campaign):
            return messages.ERROR, (f"{campaign}: not cancelled: cancelling a high-priority campaign needs the "
                                    "permission campaigns.send_high_priority.")
        if campaign.status not in ACTIVE_CAMPAIGN_STATUSES:
            return messages.WARNING, f"{campaign}: not cancelled, it is {campaign.get_status_display()}."
        try:
            campaign, n = services.cancel_campaign(campaign.pk)
        except services.CampaignNotCancellable as exc:
            return messages.WARNING, f"{campaign}: not cancelled, {exc}."
        self.log_change(request, campaign, f"Cancelled; {n} unclaimed notifications cancelled.")
        return messages.SUCCESS, f"{campaign}: cancelled; {n:,} notifications not yet sent were cancelled."

    @admin.action(description="Cancel selected campaigns", permissions=["change"])
    def cancel_selected(self, request, queryset):
        for campaign in queryset:
            level, text = self._cancel(request, campaign)
            messages.add_message(request, level, text)

    def progress_view(self, request, object_id):
        """GET: progress counts as JSON, polled by the change page."""
        campaign = self._campaign(object_id)
        if campaign is None:
            raise Http404("No such campaign.")
        if not self.has_view_permission(request, campaign):
            raise PermissionDenied
        return JsonResponse(progress(campaign))
