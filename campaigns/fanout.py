"""Campaign fan-out (docs/ARCHITECTURE.md §7, docs/CAMPAIGNS.md "Fan-out"): from a segment snapshot
to one notification per member.

:func:`start_due_campaigns` (beat) starts due campaigns and splits the members into shards by
``recipient_id`` range, so several workers fan out one campaign; :func:`fan_out_page` (one task per
keyset page) pre-filters opt-outs, plans each member's due instant (:meth:`_Planner.plan`), inserts
the page with derived ids and ``ON CONFLICT DO NOTHING``, advances the cursor, then enqueues what is
due and the next page; :func:`reconcile_campaigns` (beat) re-drives broken page chains and completes
campaigns. Nothing holds the whole segment in memory; a page run twice creates nothing new.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import datetime, time, timedelta
from typing import NamedTuple
from zoneinfo import ZoneInfo

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from campaigns import audience, membership
from campaigns import send_time as send_times
from campaigns.models import Campaign, CampaignShard, CampaignStatus, MissedPolicy
from core import clock
from core.queues import FAN_OUT_PAGE_TASK, fanout_queue
from notifications import metrics
from notifications.admission import Admission, Road, admit, high_tier_reason
from notifications.campaign_rows import CampaignRow, campaign_has_open_notifications, insert_campaign_page
from notifications.enqueue import enqueue_on_commit
from notifications.ids import campaign_notification_ids
from notifications.models import Priority, Reason, Status
from notifications.services import cancel_campaign_notifications
from notifications.webhooks import outbox as webhook_outbox
from preferences.validation import stored_zone
from preferences.wallclock import wall_time_to_utc

log = logging.getLogger(__name__)

_MEMBERS_SQL = """
SELECT m.recipient_id, r.timezone, {facts}
  FROM ({members}) m
  JOIN preferences_recipient r ON r.user_id = m.recipient_id
  LEFT JOIN preferences_preferences p ON p.recipient_id = m.recipient_id
 WHERE (%(after)s::text IS NULL OR m.recipient_id > %(after)s)
   AND (%(upper)s::text IS NULL OR m.recipient_id <= %(upper)s)
   -- The same keyset on the joined tables: without it the planner may merge-join a recipient index
   -- scan from the first row, making each page cost O(cursor) (430 ms a page at 290,000 members).
   AND (%(after)s::text IS NULL OR r.user_id > %(after)s)
   AND (%(upper)s::text IS NULL OR r.user_id <= %(upper)s)
 ORDER BY m.recipient_id
 LIMIT %(limit)s
"""

def conf(name: str):
    return settings.CAMPAIGNS[name]


def spread_offset(campaign_id, user_id: str, spread_seconds: int) -> timedelta:
    """A member's offset in ``[0, spread_seconds)``: uniform over members and the same on every run."""
    if not spread_seconds:
        return timedelta(0)
    digest = hashlib.blake2b(f"{campaign_id}:{user_id}".encode(), digest_size=8).digest()
    millis = int.from_bytes(digest, "big") % (spread_seconds * 1000)
    return timedelta(milliseconds=millis)


# --- start -------------------------------------------------------------------------------------

def start_due_campaigns() -> list[str]:
    """Start fan-out of every due scheduled campaign. Returns the ids started."""
    now = clock.now()
    started = []
    with transaction.atomic():
        due = list(Campaign.objects.select_for_update(skip_locked=True)
                   .filter(status=CampaignStatus.SCHEDULED, fanout_at__lte=now).order_by("fanout_at")[:20])
        for campaign in due:
            _plan_shards(campaign, now)
            started.append(str(campaign.pk))
    return started


def _plan_shards(campaign: Campaign, now: datetime) -> None:
    if campaign.priority != Priority.HIGH and high_tier_reason(campaign.priority, campaign.notification_type):
        # A type made high after the campaign (or its series) was created: the gate asks for the high
        # tier at every page, so the rows go out on it too (docs/RECURRING.md). Never lowered here.
        campaign.priority = Priority.HIGH
    count = membership.snapshot(campaign, now)
    campaign.snapshot_at = now
    page = conf("PAGE_SIZE")
    wanted = max(1, min(conf("SHARDS"), count // (page * 2)))
    bounds: list[str] = []
    if wanted > 1:
        ordered = membership.snapshot_members(campaign).order_by("recipient_id")
        bounds = [ordered[count * k // wanted] for k in range(1, wanted)]
        bounds = sorted(set(bounds))
    edges = [None, *bounds, None]
    shards = [CampaignShard(campaign=campaign, number=i, lower=edges[i], upper=edges[i + 1], cursor=edges[i],
                            heartbeat_at=now) for i in range(len(edges) - 1)]
    CampaignShard.objects.bulk_create(shards)
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.FANNING_OUT, snapshot_at=now,
                                                   snapshot_kind=campaign.snapshot_kind, started_at=now,
                                                   member_count=count, updated_at=now, priority=campaign.priority)
    for shard in shards:
        _enqueue_page_on_commit(campaign.pk, shard.number)
    log.info("campaign %s: fanning out %d members in %d shard(s)", campaign.pk, count, len(shards))


def _enqueue_page_on_commit(campaign_id, shard_number: int) -> None:
    def publish():  # by name (core.queues): campaigns.tasks imports this module
        try:
            queue = fanout_queue()
            current_app.send_task(FAN_OUT_PAGE_TASK, args=[str(campaign_id), shard_number], queue=queue,
                                  routing_key=queue, exchange="")
        except Exception as exc:  # the shard reconciler re-drives it
            log.warning("fan-out page of %s/%d not published: %s", campaign_id, shard_number, exc)

    transaction.on_commit(publish)


# --- one page ----------------------------------------------------------------------------------

class Plan(NamedTuple):
    """One member's row as fan-out inserts it; ``missed`` = its local wall time had already passed."""

    status: str
    reason: str
    due: datetime
    missed: bool


class _Planner:
    """Per-page helper: due instants (cached per zone) and suppression reasons."""

    def __init__(self, campaign: Campaign, now: datetime) -> None:
        self.campaign = campaign
        self.now = now
        self.zone_cache: dict[tuple[str, time | None], tuple[datetime, bool]] = {}
        self.default_zone = ZoneInfo(conf("DEFAULT_TIMEZONE"))
        self.defaulted = 0
        self.zones: dict[str, tuple[ZoneInfo, bool]] = {}
        self.invalid_zones: set[str] = set()
        self.reasons: dict[tuple, str] = {}

    def base_instant(self, zone_name: str, wall: time | None = None) -> datetime:
        """The instant of the campaign's wall time (or ``wall``: a member's own hour) on its date in
        the member's zone, cached per zone and wall time."""
        c = self.campaign
        if not c.is_local_time:
            return c.scheduled_at or c.fanout_at or self.now
        cached = self.zone_cache.get((zone_name, wall))
        if cached is None:
            zone, fallback = self.zone_and_fallback(zone_name)
            cached = (wall_time_to_utc(c.local_date, wall or c.local_time, zone), fallback)
            self.zone_cache[(zone_name, wall)] = cached
        if cached[1]:
            self.defaulted += 1
        return cached[0]

    def zone(self, zone_name: str) -> ZoneInfo:
        """The member's zone, or the default zone for a missing or unusable name (never raises)."""
        return self.zone_and_fallback(zone_name)[0]

    def zone_and_fallback(self, zone_name: str) -> tuple[ZoneInfo, bool]:
        """A member's stored zone, or the default zone (``True``: fell back) when it is empty or not
        an IANA zone by the one zone rule (``America``, ``+03:00``: never raises); invalid names are
        remembered for the metric."""
        resolved = self.zones.get(zone_name)
        if resolved is None:
            resolved = self.zones[zone_name] = stored_zone(zone_name, conf("DEFAULT_TIMEZONE"))
            if resolved[1] and zone_name:
                self.invalid_zones.add(zone_name)
                log.warning("campaign %s: stored zone %r is not an IANA zone; using %s", self.campaign.pk,
                            zone_name, resolved[0].key)
        return resolved

    def plan(self, zone_name: str, due: datetime, offset: timedelta, reason: str,
             wall: time | None = None) -> Plan:
        """Status, reason and due instant of one member's row, given its pre-filter ``reason`` and its
        ``due`` instant (wall time in its zone + spread ``offset``).

        A local-time member whose ``due`` is more than ``CAMPAIGN_MISSED_GRACE_SECONDS`` before this
        page's ``now`` is *missed* and handled by the campaign's ``missed_policy``: ``skip`` →
        ``suppressed`` / ``local_time_passed`` (due kept: the instant it was meant for); ``send_now``
        → ``queued``, due now; ``next_day`` → the same wall time on the first later day whose instant
        is not missed, in their zone (DST rule of :func:`wall_time_to_utc`), plus the same offset.
        ``wall``: the member's own wall time (send-time optimised), else the campaign's.
        """
        if reason:
            return Plan(Status.SUPPRESSED, reason, due, False)
        c = self.campaign
        missed = c.is_local_time and due < self.now - timedelta(seconds=conf("MISSED_GRACE_SECONDS"))
        if missed:
            if c.missed_policy == MissedPolicy.SEND_NOW:
                return Plan(Status.QUEUED, "", self.now, True)
            if c.missed_policy != MissedPolicy.NEXT_DAY:
                return Plan(Status.SUPPRESSED, Reason.LOCAL_TIME_PASSED, due, True)
            due = self.next_day_instant(zone_name, offset, wall)
        return Plan(Status.SCHEDULED if due > self.now else Status.QUEUED, "", due, missed)

    def next_day_instant(self, zone_name: str, offset: timedelta, wall: time | None = None) -> datetime:
        """The wall time (the campaign's, or ``wall``) + ``offset`` on the first day after the campaign's
        date not already missed."""
        c, zone = self.campaign, self.zone(zone_name)
        floor = self.now - timedelta(seconds=conf("MISSED_GRACE_SECONDS"))
        day = c.local_date + timedelta(days=1)
        while (instant := wall_time_to_utc(day, wall or c.local_time, zone) + offset) < floor:
            day += timedelta(days=1)
        return instant

    def suppression(self, row: dict) -> str:
        """The one suppression rule (preferences.suppression) over the member row's facts, worked
        out once per distinct combination of facts in the page (a handful)."""
        key = tuple(row[name] for name in audience.FACT_NAMES)
        reason = self.reasons.get(key)
        if reason is None:
            reason = self.reasons[key] = audience.reason_for(row, self.campaign)
        return reason


def fan_out_page(campaign_id: str, shard_number: int) -> str:
    """Fan out the next page of one shard. Returns what happened: ``"page"``, ``"done"``,
    ``"busy"`` (another task holds the shard), ``"stopped"`` (campaign no longer fanning out)."""
    page_size = conf("PAGE_SIZE")
    with transaction.atomic():
        with connection.cursor() as cur:
            # FOR SHARE: pages of different shards run in parallel; a cancel (FOR UPDATE) waits for
            # the page in flight and every later page sees the cancel.
            cur.execute("SELECT status FROM campaigns_campaign WHERE id = %s FOR SHARE", [campaign_id])
            row = cur.fetchone()
        if row is None or row[0] != CampaignStatus.FANNING_OUT:
            return "stopped"
        shard = (CampaignShard.objects.select_for_update(skip_locked=True)
                 .filter(campaign_id=campaign_id, number=shard_number, done=False).first())
        if shard is None:
            return "busy"
        campaign = Campaign.objects.get(pk=campaign_id)
        now = clock.now()
        members_sql, members_params = membership.member_source(campaign, campaign.snapshot_at)
        sql = _MEMBERS_SQL.format(facts=audience.fact_columns(campaign.channel), members=members_sql)
        with connection.cursor() as cur:
            cur.execute(sql, {**members_params, "after": shard.cursor, "upper": shard.upper, "limit": page_size,
                              **audience.fact_params(campaign)})
            columns = [c.name for c in cur.description]
            members = [dict(zip(columns, r, strict=True)) for r in cur.fetchall()]
        inserted = _insert_page(campaign, members, now) if members else []
        shard.cursor = members[-1]["recipient_id"] if members else shard.cursor
        shard.pages += 1
        shard.created += len(inserted)
        shard.heartbeat_at = shard.progressed_at = now
        shard.done = len(members) < page_size
        shard.save(update_fields=["cursor", "pages", "created", "heartbeat_at", "progressed_at", "done"])
        queued = [(nid, campaign.priority, campaign.channel) for nid, status in inserted if status == Status.QUEUED]
        enqueue_on_commit(queued)
        if shard.done:
            _finish_fan_out_if_complete(campaign, now)
        else:
            _enqueue_page_on_commit(campaign.pk, shard.number)
    return "done" if shard.done else "page"


def _insert_page(campaign: Campaign, members: list[dict], now: datetime) -> list[tuple[str, str]]:
    """Plan each member's row and insert the page (:func:`notifications.campaign_rows.insert_campaign_page`).
    Returns ``[(notification id as text, status)]`` of the rows created."""
    planner = _Planner(campaign, now)
    ttl = timedelta(seconds=campaign.ttl_seconds) if campaign.ttl_seconds else None
    id_for = campaign_notification_ids(campaign.pk, campaign.channel)
    rows: list[CampaignRow] = []
    missed = set()
    option = send_times.option_of(campaign) if campaign.is_local_time else None
    groups = send_times.PagePlanner(campaign, option, [m["recipient_id"] for m in members]) if option else None
    chosen: list[tuple[str, str, str, int | None]] = []
    for m in members:
        user_id = m["recipient_id"]
        offset = spread_offset(campaign.pk, user_id, campaign.spread_seconds)
        nid = id_for(user_id)
        hour = None
        if groups is not None:
            group, hour = groups.choose(user_id)
            chosen.append((user_id, str(nid), group, hour))
        wall = None if hour is None else time(hour)  # their best hour on the campaign's date, in their zone
        base = planner.base_instant(m["timezone"], wall) + offset
        status, reason, base, was_missed = planner.plan(m["timezone"], base, offset, planner.suppression(m), wall)
        if was_missed:
            missed.add(nid)
        rows.append(CampaignRow(nid, user_id, status, reason, base, base + ttl if ttl else None))
    kind = campaign.notification_type
    rows = _admitted(campaign, kind, rows, now)
    inserted = insert_campaign_page(campaign_id=campaign.pk, channel=campaign.channel, priority=campaign.priority,
                                    category=campaign.category, now=now, rows=rows,
                                    notification_type=campaign.notification_type_id,
                                    sensitive=bool(kind is not None and kind.sensitive), metadata=campaign.metadata)
    send_times.record(campaign.pk, chosen)
    reasons = {r.id: r.reason for r in rows if r.reason}
    metrics.fanout_page_inserted(channel=campaign.channel, tier=campaign.priority, inserted=inserted,
                                 reasons=reasons)
    if planner.invalid_zones:
        metrics.invalid_zone_fell_back("fanout", sum(m["timezone"] in planner.invalid_zones for m in members))
    if planner.defaulted:
        Campaign.objects.filter(pk=campaign.pk).update(
            default_zone_count=F("default_zone_count") + planner.defaulted)
    missed_inserted = sum(1 for nid, _ in inserted if nid in missed)  # rows that existed are not counted again
    if missed_inserted:
        Campaign.objects.filter(pk=campaign.pk).update(missed_count=F("missed_count") + missed_inserted)
        log.warning("campaign %s: %d member(s) whose local time had passed, missed_policy %s", campaign.pk,
                    missed_inserted, campaign.missed_policy)
    return inserted


def _admitted(campaign: Campaign, kind, rows: list[CampaignRow], now: datetime) -> list[CampaignRow]:
    """The road ``campaign`` of the gate (:func:`notifications.admission.admit`), member by member:
    the campaign's client must still hold ``notifications:send_high`` for a high-priority type or
    campaign (a type made high after the campaign was accepted), and each member not already
    suppressed takes a slot in every abuse limit that counts the campaign (one added since, or a
    campaign made in the admin; docs/POLICIES.md, "Abuse limits"). A refused member's row is
    ``suppressed`` with the gate's reason. Slots are taken per member ``{campaign}:{user}``, so a
    page run twice counts each member once."""
    decision = admit(Admission(road=Road.CAMPAIGN, now=now, client=campaign.client, priority=campaign.priority,
                               category=campaign.category, channels=[campaign.channel], kind=kind,
                               recipients=[r.recipient_id for r in rows if r.status != Status.SUPPRESSED],
                               per_member=True, window_id=str(campaign.pk)))
    if not decision.refused:
        return rows
    log.warning("campaign %s: %d member(s) refused at fan-out: %s", campaign.pk, len(decision.refused),
                sorted({detail for _reason, detail in decision.refused.values()}))
    return [r._replace(status=Status.SUPPRESSED, reason=decision.refused[r.recipient_id][0])
            if r.recipient_id in decision.refused else r for r in rows]


def _finish_fan_out_if_complete(campaign: Campaign, now: datetime) -> None:
    """Mark the campaign fanned out once every shard is done (inside the page's transaction).

    A transaction-scoped advisory lock per campaign serializes this check: two shards finishing at
    once in two processes would otherwise each see the other still running (neither committed) and
    neither would finish the campaign. With the lock the second waits for the first to commit, then
    sees its shard done. (Not a row lock: each page already holds the campaign row FOR SHARE, and two
    pages upgrading to FOR UPDATE at once deadlock.)
    """
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"campaign-finish:{campaign.pk}"])
    if CampaignShard.objects.filter(campaign=campaign, done=False).exists():
        return
    created = sum(CampaignShard.objects.filter(campaign=campaign).values_list("created", flat=True))
    Campaign.objects.filter(pk=campaign.pk, status=CampaignStatus.FANNING_OUT).update(
        status=CampaignStatus.SENDING, fanned_out_at=now, created_count=created, updated_at=now)
    membership.release_snapshot(campaign)
    log.info("campaign %s: fan-out complete, %d notifications", campaign.pk, created)


def record_page_failure(campaign_id: str, shard_number: int, exc: BaseException) -> None:
    """A fan-out page raised (its transaction rolled back; the reconciler re-drives the shard after
    ``CAMPAIGN_SHARD_STALE_SECONDS``): store ``"<ExceptionType>: <message>"`` (≤ 2,000 characters)
    and the time on the shard and the campaign, and count the failure on both. Never raises."""
    now = clock.now()
    text = f"{type(exc).__name__}: {exc}"[:2000]
    try:
        with transaction.atomic():
            CampaignShard.objects.filter(campaign_id=campaign_id, number=shard_number).update(
                failures=F("failures") + 1, last_error=text, last_error_at=now)
            Campaign.objects.filter(pk=campaign_id).update(
                fanout_failures=F("fanout_failures") + 1, last_error=f"shard {shard_number}: {text}",
                last_error_at=now)
    except Exception:
        log.exception("campaign %s: fan-out error of shard %s not recorded", campaign_id, shard_number)
    log.error("campaign %s: fan-out page of shard %s failed: %s", campaign_id, shard_number, text)


def local_time_passed(campaign: Campaign, now: datetime) -> tuple[int, int]:
    """``(passed, members)`` for a local-time campaign: how many current segment members' zones have
    already passed its wall time at ``now`` (each zone resolved as fan-out does; spread ignored).
    ``(0, members)`` for other campaigns. One grouped query over the members' zones."""
    members_sql, params = membership.member_source(campaign, now)
    with connection.cursor() as cur:
        cur.execute(f"SELECT r.timezone, count(*) FROM ({members_sql}) m "
                    "JOIN preferences_recipient r ON r.user_id = m.recipient_id GROUP BY 1", params)
        zones = cur.fetchall()
    if not campaign.is_local_time:
        return 0, sum(n for _zone, n in zones)
    planner = _Planner(campaign, now)
    passed = total = 0
    for zone_name, n in zones:
        total += n
        zone = planner.zone(zone_name or "")
        if wall_time_to_utc(campaign.local_date, campaign.local_time, zone) <= now:
            passed += n
    return passed, total


# --- reconcile ---------------------------------------------------------------------------------

def reconcile_campaigns() -> dict[str, int]:
    """Re-drive stalled shards; complete campaigns with nothing left to send."""
    now = clock.now()
    stale_before = now - timedelta(seconds=conf("SHARD_STALE_SECONDS"))
    redriven = 0
    with transaction.atomic():
        stalled = list(CampaignShard.objects.select_for_update(skip_locked=True)
                       .filter(done=False, heartbeat_at__lt=stale_before,
                               campaign__status=CampaignStatus.FANNING_OUT)[:100])
        for shard in stalled:
            shard.heartbeat_at = now
            shard.save(update_fields=["heartbeat_at"])
            _enqueue_page_on_commit(shard.campaign_id, shard.number)
            redriven += 1
    if redriven:
        log.warning("re-drove %d stalled fan-out shard(s)", redriven)
    # Belt and braces for the lock in _finish_fan_out_if_complete: a campaign whose shards are all
    # done but which still says fanning_out is finished here.
    for campaign in (Campaign.objects.filter(status=CampaignStatus.FANNING_OUT, shards__isnull=False)
                     .exclude(shards__done=False).distinct()):
        with transaction.atomic():
            _finish_fan_out_if_complete(campaign, now)
    # A cancelled campaign's notifications that cancel_campaign's time budget did not reach.
    recent = now - timedelta(days=2)
    for campaign_id in (Campaign.objects.filter(status=CampaignStatus.CANCELLED, cancelled_at__gte=recent)
                        .values_list("pk", flat=True)):
        membership.release_snapshot(Campaign(pk=campaign_id))
        for _ in range(20):  # up to 100,000 rows per campaign per run
            if cancel_campaign_notifications(campaign_id) < 5000:
                break
    completed = 0
    for campaign_id, client_id, series_id in Campaign.objects.filter(status=CampaignStatus.SENDING).values_list(
            "pk", "client_id", "series_id"):
        if not campaign_has_open_notifications(campaign_id):
            with transaction.atomic():  # the move and its webhook (docs/WEBHOOKS.md) commit together
                done = Campaign.objects.filter(pk=campaign_id, status=CampaignStatus.SENDING).update(
                    status=CampaignStatus.COMPLETED, completed_at=now, updated_at=now)
                if done:
                    webhook_outbox.emit_campaign_completed(campaign_id, client_id, now, series_id=series_id)
            completed += done
    return {"redriven_shards": redriven, "completed": completed}
