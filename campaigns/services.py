"""Writes for segments, templates and campaigns."""

from __future__ import annotations

import uuid
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from time import monotonic

from django.db import IntegrityError, connection, transaction

from campaigns import ownership, recurrence, runs, send_time
from campaigns.models import (
    CAMPAIGN_ID_NAMESPACE,
    Campaign,
    CampaignMember,
    CampaignStatus,
    Segment,
    SegmentMember,
    Template,
    TemplateVariant,
)
from campaigns.selectors import launch_problem
from core import clock
from core.identifiers import user_id_problem
from notifications.models import APIClient
from notifications.services import cancel_campaign_notifications, same_request
from preferences.services import create_bare_recipients
from preferences.wallclock import MAX_UTC_OFFSET, earliest_instant


class CampaignKeyReused(Exception):
    """The idempotency key was already used by this client for a different campaign request."""


class LocalTimePassed(Exception):
    """A local-time campaign's wall time has already been reached in the earliest zone (UTC+14)."""


class ContentWontRender(Exception):
    """A campaign's content would fail to render for every recipient (the save rule,
    :func:`campaigns.selectors.launch_problem`): ``{{ data.code }}`` in a campaign's template."""


def local_time_problem(local_date: date | None, local_time: time | None, now: datetime) -> str | None:
    """The rule for a local-time campaign at creation and launch: its wall time must still be ahead in
    the earliest zone (UTC+14), i.e. ahead for every recipient. Returns ``None`` when it is (or for a
    campaign without a local time), else the message naming the rule."""
    if local_date is None or local_time is None:
        return None
    if datetime.combine(local_date, local_time, tzinfo=UTC) - now > MAX_UTC_OFFSET:
        return None
    return (f"{local_date.isoformat()} {local_time.strftime('%H:%M')} has already been reached in the earliest "
            f"zone (UTC+14, where it is now {now + MAX_UTC_OFFSET:%Y-%m-%d %H:%M}): a local_time must still be "
            "in the future in every zone")


class CampaignNotCancellable(Exception):
    def __init__(self, campaign: Campaign) -> None:
        super().__init__(f"campaign is {campaign.status}; it can no longer be cancelled")
        self.campaign = campaign


@dataclass(frozen=True)
class CampaignAccepted:
    campaign: Campaign
    replayed: bool


# --- segments ------------------------------------------------------------------------------------

class SegmentKindConflict(Exception):
    """Members written to a rule segment, or rules given to a segment that has list members: a
    segment is one or the other (docs/SEGMENTS.md). ``field`` names what the request gave."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def rules_problem(segment: Segment, rules) -> str:
    """Why ``segment`` cannot take ``rules`` (``""``: it can): a list segment with members is not
    turned into a rule segment (they would silently stop counting)."""
    if rules is not None and segment.pk and segment.members.exists():
        return ("this segment has members (a list segment); remove them first, or define the rule segment "
                "under another segment_id")
    return ""


RULE_SEGMENT_MEMBERS = ("this segment is defined by rules: its members are the recipients the rule matches when a "
                        "campaign starts (docs/SEGMENTS.md)")


def upsert_segment(segment_id: str, *, name: str, description: str = "", rules=None,
                   client: APIClient | None = None) -> tuple[Segment, bool]:
    """Create or rename a segment. Returns ``(segment, created)``.

    ``client`` is the API client writing it: a segment it creates is its own, an existing one must be
    (raises :class:`campaigns.ownership.NotOwner`, nothing changed). ``None`` is staff (the admin):
    no ownership check, and a new segment has no owner.
    """
    with transaction.atomic():
        segment = Segment.objects.select_for_update().filter(pk=segment_id).first()
        if segment is None:
            try:
                with transaction.atomic():
                    return Segment.objects.create(segment_id=segment_id, name=name, description=description,
                                                  rules=rules, client=client), True
            except IntegrityError:  # created meanwhile by a concurrent request: update that one
                segment = Segment.objects.select_for_update().get(pk=segment_id)
        if client is not None:
            ownership.check_change(segment, client)
            if rules != segment.rules:  # who gets an active high-priority campaign, as members do
                ownership.check_members_change(segment, client)
        problem = rules_problem(segment, rules)
        if problem:
            raise SegmentKindConflict("rules", problem)
        segment.name, segment.description, segment.rules = name, description, rules
        segment.save(update_fields=["name", "description", "rules", "updated_at"])
    return segment, False


def change_members(segment: Segment, *, add: list[str], remove: list[str],
                   client: APIClient | None = None) -> dict[str, int]:
    """Add and remove members (user ids). Unknown users are created as bare recipients (no contacts
    yet; their sends are suppressed with a reason until the upstream service fills them in), so the
    tool that writes segments need not run after the one that writes contacts.

    Returns ``{"added": n, "removed": m, "created_recipients": k}`` (already-members count as neither).
    Raises ValueError for an id to add that breaks the ``/v1/users/{user_id}`` rule
    (:func:`preferences.validation.user_id_problem`; the API and the CSV upload refuse those first).
    ``client`` is the API client writing them: with the segment's row locked, raises
    :class:`campaigns.ownership.NotOwner` unless it owns the segment and
    :class:`campaigns.ownership.NeedsHighScope` when an active high-priority campaign uses it and
    the key lacks ``notifications:send_high`` (nothing changed either way). ``None`` is staff (the
    admin, whose views apply their own rule: :func:`campaigns.ownership.locked_for_staff`).
    """
    if segment.is_rule:
        raise SegmentKindConflict("add" if add else "remove", RULE_SEGMENT_MEMBERS)
    bad = next((u for u in add if user_id_problem(u)), None)
    if bad is not None:
        raise ValueError(f"user id {bad!r} {user_id_problem(bad)}")
    add = sorted(set(add))  # one lock order for concurrent calls
    remove = list(dict.fromkeys(remove))
    with transaction.atomic():
        if client is not None:
            ownership.check_members_change(Segment.objects.select_for_update().get(pk=segment.pk), client)
        created = create_bare_recipients(add)
        added = _insert_members(segment, add)
        removed, _ = SegmentMember.objects.filter(segment=segment, recipient_id__in=remove).delete()
    return {"added": added, "removed": removed, "created_recipients": created}


def _insert_members(segment: Segment, user_ids: list[str]) -> int:
    """Make ``user_ids`` (existing recipients) members of ``segment``: one ``INSERT … SELECT FROM
    unnest(…) ON CONFLICT DO NOTHING``. Returns how many became members (those already members are
    not counted)."""
    if not user_ids:
        return 0
    table = SegmentMember._meta.db_table
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {table} (segment_id, recipient_id, added_at) "
                    "SELECT %s, u, %s FROM unnest(%s::text[]) AS u ON CONFLICT (segment_id, recipient_id) DO NOTHING",
                    [segment.pk, clock.now(), user_ids])
        return cur.rowcount


def remove_from_every_segment(recipient_id: str) -> int:
    """Personal-data erasure, this layer's part: the recipient leaves every segment. Returns how many
    memberships were removed. (Campaigns already fanning out keep the rows they created; those are
    cancelled or stripped of content by :func:`notifications.services.erase_notification_content`.)"""
    removed, _ = SegmentMember.objects.filter(recipient_id=recipient_id).delete()
    # And every rule segment's snapshot still being fanned out: its page has not reached them yet.
    snapshots, _ = CampaignMember.objects.filter(recipient_id=recipient_id).delete()
    return removed + snapshots


# --- templates -----------------------------------------------------------------------------------

def upsert_template(template_id: str, *, name: str, default_locale: str, variants: list[dict],
                    client: APIClient | None = None) -> Template:
    """Create or replace a template and all its variants (``[{locale, title, body, html}]``).

    ``client`` is the API client writing it: a template it creates is its own; changing an existing
    one raises :class:`campaigns.ownership.NotOwner` unless it owns it, and
    :class:`campaigns.ownership.NeedsHighScope` when an active high-priority campaign uses it and
    the key lacks ``notifications:send_high`` (nothing changed either way). ``None`` is staff (the
    admin): no check, and a new template has no owner.
    """
    with transaction.atomic():
        template = Template.objects.select_for_update().filter(pk=template_id).first()
        if template is None:
            try:
                with transaction.atomic():
                    template = Template.objects.create(template_id=template_id, name=name,
                                                       default_locale=default_locale, client=client)
            except IntegrityError:  # created meanwhile by a concurrent request: replace that one
                template = Template.objects.select_for_update().get(pk=template_id)
        if client is not None:
            ownership.check_template_change(template, client)
        template.name, template.default_locale = name, default_locale
        template.save(update_fields=["name", "default_locale", "updated_at"])
        template.variants.exclude(locale__in=[v["locale"] for v in variants]).delete()
        for v in variants:
            TemplateVariant.objects.update_or_create(
                template=template, locale=v["locale"],
                defaults={"title": v.get("title", ""), "body": v["body"], "html": v.get("html", "")})
    return template


# --- campaigns -----------------------------------------------------------------------------------

def fanout_instant(*, scheduled_at: datetime | None, local_date: date | None, local_time: time | None,
                   now: datetime) -> datetime:
    """When fan-out must start (UTC): the send instant, or for a local-time campaign the instant the
    earliest zone (UTC+14) reaches the wall time, so every member's row exists before it is due."""
    if local_date is not None and local_time is not None:
        return max(earliest_instant(local_date, local_time), now)
    return max(scheduled_at, now) if scheduled_at else now


def create_campaign(*, client: APIClient | None, idempotency_key: str | None, fingerprint: str = "",
                    status: str = CampaignStatus.SCHEDULED, **fields) -> CampaignAccepted:
    """Store a validated campaign. With a client and key, the id is ``uuid5(client, key)`` and a
    repeat with the same fingerprint replays (``replayed=True``); a different one raises
    :class:`CampaignKeyReused`. ``fields`` are Campaign model fields."""
    now = clock.now()
    campaign_id = (uuid.uuid5(CAMPAIGN_ID_NAMESPACE, f"{client.pk}:{idempotency_key}")
                   if client is not None and idempotency_key else uuid.uuid4())
    campaign = Campaign(id=campaign_id, client=client, idempotency_key=idempotency_key,
                        request_fingerprint=fingerprint, status=status, **fields)
    _set_start(campaign, now)
    try:
        with transaction.atomic():
            campaign.save(force_insert=True)
    except IntegrityError:
        existing = Campaign.objects.get(pk=campaign_id)
        if not same_request(existing.request_fingerprint, fingerprint):
            raise CampaignKeyReused() from None
        return CampaignAccepted(existing, replayed=True)
    return CampaignAccepted(campaign, replayed=False)


def _set_start(campaign: Campaign, now: datetime) -> None:
    """When a scheduled campaign starts: ``fanout_at`` (:func:`fanout_instant`); a recurring one never
    fans out itself: its ``next_run_at`` is its first occurrence at or after ``now``
    (docs/RECURRING.md)."""
    if campaign.is_recurring:
        campaign.fanout_at = None
        campaign.next_run_at = runs.first_run_at(recurrence.stored(campaign), now)
        return
    campaign.fanout_at = campaign_fanout_instant(campaign, now)


def campaign_fanout_instant(campaign: Campaign, now: datetime) -> datetime:
    """:func:`fanout_instant` of ``campaign``: with send-time optimisation, from the earliest wall time
    a member may be sent at (a best hour may come before the campaign's own time; docs/SEND_TIME.md)."""
    return fanout_instant(scheduled_at=campaign.scheduled_at, local_date=campaign.local_date,
                          local_time=send_time.campaign_earliest_wall_time(campaign), now=now)


def launch_campaign(campaign: Campaign) -> Campaign:
    """Admin: move a draft to ``scheduled`` (fan-out starts when due).

    Raises:
        LocalTimePassed: a local-time draft whose wall time the earliest zone has already reached
        (see :func:`local_time_problem`); nothing is changed.
        ContentWontRender: its template or inline content will not render, by the rule saving
        applies (one saved before the rule, or edited outside it); nothing is changed.
    """
    now = clock.now()
    problem = local_time_problem(campaign.local_date, send_time.campaign_earliest_wall_time(campaign), now)
    if problem:
        raise LocalTimePassed(problem)
    problem = launch_problem(campaign)
    if problem:
        raise ContentWontRender(problem)
    if campaign.is_recurring:
        try:  # the schedule's rule again, at launch: its occurrences may all have passed since the save
            recurrence.parse(campaign.schedule_rule, campaign.schedule_start, campaign.schedule_timezone, now=now)
        except recurrence.ScheduleError as exc:
            raise LocalTimePassed(f"{exc.field}: {exc}") from None
    _set_start(campaign, now)
    Campaign.objects.filter(pk=campaign.pk, status=CampaignStatus.DRAFT).update(
        status=CampaignStatus.SCHEDULED, fanout_at=campaign.fanout_at, next_run_at=campaign.next_run_at,
        updated_at=now)
    campaign.refresh_from_db()
    return campaign


def cancel_campaign(campaign_id, *, time_budget_seconds: float = 2.0) -> tuple[Campaign, int]:
    """Cancel a campaign: stop fan-out and cancel every notification not yet claimed.

    Takes the campaign row ``FOR UPDATE``, which waits for a fan-out page in flight (they hold it
    ``FOR SHARE``) and makes every later page see the cancel. Its notifications are then cancelled
    in chunks of 5,000 (notifications.services.cancel_campaign_notifications) for up to
    ``time_budget_seconds``; what is left (a large campaign) is cancelled by the campaign
    reconciler within seconds (:func:`campaigns.fanout.reconcile_campaigns`), and a row of a
    cancelled campaign that a worker claims first is cancelled at send time. Rows already claimed
    finish their send. Returns ``(campaign, notifications cancelled so far)``.

    A recurring campaign's cancel also ends its schedule (no more runs) and cancels each of its runs
    not finished, the same way. Cancelling one run leaves its series going.

    Raises:
        Campaign.DoesNotExist, CampaignNotCancellable (completed or already cancelled).
    """
    now = clock.now()
    with transaction.atomic():
        campaign = Campaign.objects.select_for_update().get(pk=campaign_id)
        if campaign.status in (CampaignStatus.COMPLETED, CampaignStatus.CANCELLED):
            raise CampaignNotCancellable(campaign)
        campaign.status = CampaignStatus.CANCELLED
        campaign.cancelled_at = now
        campaign.save(update_fields=["status", "cancelled_at", "updated_at"])
    cancelled = 0
    deadline = monotonic() + time_budget_seconds
    while monotonic() < deadline:
        n = cancel_campaign_notifications(campaign.pk, limit=CANCEL_CHUNK)
        cancelled += n
        if n < CANCEL_CHUNK:
            break
    if campaign.is_recurring:
        Campaign.objects.filter(pk=campaign.pk).update(next_run_at=None)
        campaign.next_run_at = None
        for run_id in runs.active_runs(campaign.pk):
            with suppress(CampaignNotCancellable):  # completed or cancelled meanwhile
                cancelled += cancel_campaign(run_id, time_budget_seconds=max(0.0, deadline - monotonic()))[1]
    return campaign, cancelled


#: Notifications cancelled per transaction when a campaign is cancelled.
CANCEL_CHUNK = 5000
