"""A launched campaign's pace (docs/CAMPAIGNS.md, "Pace"): what its page charts and how long it has left.

Beat's sampler (:func:`sample_due`, every ``CAMPAIGN_PACE_SAMPLE_SECONDS``) takes each campaign that
is fanning out or sending with the one counting rule, kept up to date from what changed
(:mod:`campaigns.tally`: a tick costs the rows that changed, not the campaign's size), and keeps one
:class:`~campaigns.models.CampaignMinute` per minute: the last counts in it, the due → sent latency
of the rows sent in it and when its last scheduled row is due. A finished campaign is sampled until
its rows settled. The page reads the newest row (its progress and sentences, while fresh) and at
most ``MINUTES_SHOWN`` rows (its chart, :mod:`campaigns.pace_chart`): index reads however large the
campaign. A sample older than three intervals is not trusted: the page counts itself and says
since when the pace is unknown. A sample dated after now (the platform clock moved back, a beat host's
clock ahead) is not read at all: the newest sample is the newest not after now (hadv34).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Max, Q
from django.db.models.fields.json import KeyTransform
from django.db.models.functions import Coalesce

from campaigns import tally
from campaigns.models import Campaign, CampaignMinute, CampaignStatus
from campaigns.pace_chart import MINUTES_SHOWN, chart, outcome_of
from campaigns.selectors import STATUSES, campaign_counts
from core import clock
from notifications.models import Notification, Priority
from providers.isolation import breaker_state, limits_for
from providers.registry import provider_names

log = logging.getLogger(__name__)

#: The window the recent rate is taken over.
RECENT_MINUTES = 5
#: A sample older than this many sampling intervals is not trusted (beat stopped).
STALE_INTERVALS = 3
SAMPLED = (CampaignStatus.FANNING_OUT, CampaignStatus.SENDING)
FINISHED = (CampaignStatus.COMPLETED, CampaignStatus.CANCELLED)

# The live table only: a row sent this minute is archived HOT_HOURS after its last change at the
# earliest. Through notification_campaign_sent_idx: the rows sent this minute, not all the campaign's.
_LATENCY_SQL = f"""
SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.95) WITHIN GROUP (ORDER BY ms)
  FROM (SELECT GREATEST(0, extract(epoch FROM sent_at - COALESCE(queued_at, created_at)) * 1000) AS ms
          FROM {Notification._meta.db_table}
         WHERE campaign_id = %s AND sent_at >= %s AND sent_at <= %s) AS sent
"""


def sample_seconds() -> float:
    return float(settings.CAMPAIGNS["PACE_SAMPLE_SECONDS"])


def _minute(at: datetime) -> datetime:
    return at.replace(second=0, microsecond=0)


def _samples(campaign_id: int, now: datetime):
    """The campaign's samples not dated after ``now``, newest first: one from the future would stay
    "the newest" until the clock reached it, freezing the page and the settling check (hadv34)."""
    return CampaignMinute.objects.filter(campaign_id=campaign_id, sampled_at__lte=now).order_by("-minute")


def stale(sampled_at: datetime, now: datetime) -> bool:
    """Whether a sample taken at ``sampled_at`` is too old to present as current (beat stopped)."""
    return (now - sampled_at).total_seconds() > STALE_INTERVALS * sample_seconds()


def last_scheduled(campaign: Campaign) -> datetime | None:
    """When the campaign's last scheduled row is due (a later local time, spread, quiet hours, a
    retry's backoff), or None: one descent of ``notification_campaign_due_idx`` (scheduled rows are
    live: only finished rows are archived)."""
    return (Notification.objects.filter(campaign_id=campaign.pk, status="scheduled", due_at__isnull=False)
            .order_by("-due_at").values_list("due_at", flat=True).first())


def sample(campaign: Campaign, now: datetime, counts: dict | None = None) -> CampaignMinute:
    """Record ``campaign``'s ``counts`` (default: counted now) into its minute's row (made, or
    replaced by this later sample), with the latency of the rows sent in that minute so far."""
    start = _minute(now)
    counts = campaign_counts(campaign) if counts is None else counts
    with connection.cursor() as cur:
        cur.execute(_LATENCY_SQL, [campaign.pk, start, now])
        sent_rows, p50, p95 = cur.fetchone()
    row, _ = CampaignMinute.objects.update_or_create(
        campaign=campaign, minute=start,
        defaults={"sampled_at": now, "counts": counts, "sent_rows": sent_rows,
                  "due_to_sent_p50_ms": None if p50 is None else round(p50),
                  "due_to_sent_p95_ms": None if p95 is None else round(p95),
                  "last_due_at": last_scheduled(campaign) if counts["by_status"].get("scheduled") else None})
    return row


def due(now: datetime) -> list[Campaign]:
    """The campaigns to sample: fanning out or sending, and those finished (within a day) until a
    sample taken after they finished shows none of their rows open: a cancel marks the campaign
    first and cancels its rows in chunks after, and rows in flight finish later (hadv27)."""
    finished = (Campaign.objects.filter(status__in=FINISHED)
                .annotate(finished_at=Coalesce("completed_at", "cancelled_at"),
                          last=Max("minutes__sampled_at", filter=Q(minutes__sampled_at__lte=now)))
                .filter(finished_at__gte=now - timedelta(days=1), last__isnull=False))
    settling = []
    for campaign_id, finished_at, last in finished.values_list("pk", "finished_at", "last"):
        newest = _samples(campaign_id, now).values_list("counts", flat=True).first() or {}
        if last < finished_at or newest.get("outcome", {}).get("pending", 0):
            settling.append(campaign_id)
    return list(Campaign.objects.filter(Q(status__in=SAMPLED) | Q(pk__in=settling)).order_by("pk"))


def sample_due(now: datetime | None = None) -> int:
    """Beat's tick: every due campaign's tally brought up to date (:mod:`campaigns.tally`) and
    sampled, each in a savepoint (one failing is logged and the others still recorded), all in one
    transaction under the tally's lock (a tick finding another running does nothing). Returns how
    many were sampled."""
    now = now or clock.now()
    done = 0
    with transaction.atomic():
        if not tally.lock():
            return 0
        campaigns = due(now)
        counted = tally.counts(campaigns, now)
        for campaign in campaigns:
            if campaign.pk not in counted:
                continue
            try:
                with transaction.atomic():
                    sample(campaign, now, counted[campaign.pk])
                done += 1
            except Exception:
                log.exception("campaign %s: pace sample failed", campaign.pk)
        tally.backfill(now)
    return done


def fresh_counts(campaign: Campaign, now: datetime) -> tuple[dict, datetime] | None:
    """The newest sample's counts and instant, while the campaign is sampled and the sample is not
    :func:`stale`; else ``None`` (the caller counts itself)."""
    if campaign.status not in SAMPLED:
        return None
    row = _samples(campaign.pk, now).values_list("counts", "sampled_at").first()
    if row is None or stale(row[1], now):
        return None
    counts = row[0]  # jsonb orders keys its own way: the statuses in the order a count gives them
    counts["by_status"] = {**dict.fromkeys(STATUSES, 0), **counts.get("by_status", {})}
    return counts, row[1]


@dataclass(frozen=True)
class Budget:
    """The provider budget that bounds the campaign's rate: its channel's first provider, its tier."""

    provider: str
    tier: str
    per_second: float


def budget(campaign: Campaign) -> Budget | None:
    names = provider_names(campaign.channel)
    if not names:
        return None  # the inbox: no provider
    limits = limits_for(names[0])
    high = campaign.priority == Priority.HIGH
    return Budget(names[0], campaign.priority, limits.rate_per_s if high else limits.standard_rate_per_s)


def _finished(row: dict) -> int:
    """How many of the campaign's rows a sample row counts as done, sent or not."""
    return outcome_of(row).get("sent", 0) + outcome_of(row).get("not_sent", 0)


def _stamp(value: datetime | str) -> str:
    text = value if isinstance(value, str) else value.isoformat()
    return f"{text[:10]} {text[11:19]} UTC"


def pace(campaign: Campaign, now: datetime | None = None, counts: dict | None = None) -> dict:
    """The chart and the ETA as the page shows and polls them (JSON-ready; docs/CAMPAIGNS.md, "Pace").

    While the campaign is sampled and its newest sample is missing or :func:`stale`, nothing is taken
    from that sample: what is due and scheduled comes from ``counts`` (the caller's own count of its
    rows, as its progress shows; counted here if not given) and the rate and ETA are unknown since
    that sample (``stale_since``)."""
    now = now or clock.now()
    minutes = _samples(campaign.pk, now)
    # Only the outcome counts of each minute (a few hundred bytes), the whole counts of the newest.
    rows = list(minutes.annotate(outcome=KeyTransform("outcome", "counts"))
                .values("minute", "sampled_at", "outcome", "due_to_sent_p50_ms", "due_to_sent_p95_ms", "last_due_at")
                [:MINUTES_SHOWN + 1])[::-1]
    sending = campaign.status in SAMPLED
    drawn = chart(rows, first_is_base=len(rows) > MINUTES_SHOWN, in_progress=sending)
    latest = rows[-1] if rows else None
    untrusted = sending and (latest is None or stale(latest["sampled_at"], now))
    rate, window, last_due = None, f"over the last {RECENT_MINUTES} min", None
    if untrusted:
        counts = campaign_counts(campaign) if counts is None else counts
        last_due = last_scheduled(campaign) if counts["by_status"].get("scheduled") else None
    elif latest:
        counts = minutes.values_list("counts", flat=True).first() or {}
        rate, last_due = _recent_rate(rows), latest["last_due_at"]
        age = latest["sampled_at"] - campaign.started_at if campaign.started_at else None
        if age and timedelta(0) < age < timedelta(minutes=RECENT_MINUTES):
            # Launched less than the window ago (one minute sampled so far, too: samples in a minute
            # replace each other): the rate since launch, said so (hadv34 #13: "over the last 5 min" at 70 s).
            rate, window = _finished(latest) / age.total_seconds(), "since launch"
    else:
        counts = {}
    by_status = counts.get("by_status", {})
    not_created = max(0, (campaign.member_count or 0) - counts.get("total", 0)) \
        if campaign.status == CampaignStatus.FANNING_OUT else 0
    due_left = by_status.get("queued", 0) + by_status.get("sending", 0) + not_created
    bound = budget(campaign)
    eta_seconds = round(due_left / rate) if rate and due_left and sending else None
    recent = [r for r in rows[-RECENT_MINUTES:] if r["due_to_sent_p95_ms"] is not None] if not untrusted else []
    finished_at = campaign.completed_at or campaign.cancelled_at if campaign.status in FINISHED else None
    found = {
        "chart": drawn, "sampled_at": latest["sampled_at"].isoformat() if latest else None,
        "stale_since": latest["sampled_at"].isoformat() if untrusted and latest else None,
        "counted": bool(counts) or untrusted,
        "rate_per_s": round(rate, 1) if rate is not None else None, "rate_window": window,
        "finished": {"status": campaign.get_status_display(), "at": finished_at.isoformat()} if finished_at else None,
        "breaker_open": bool(bound and breaker_state(bound.provider)["state"] == "open"),
        "due_left": due_left, "scheduled": by_status.get("scheduled", 0),
        "last_scheduled_at": last_due.isoformat() if last_due else None,
        "eta_seconds": eta_seconds,
        # From the sample it was computed on: the instant does not move between polls of one sample.
        "eta_at": (latest["sampled_at"] + timedelta(seconds=eta_seconds)).isoformat()
        if eta_seconds is not None and latest else None,
        "budget": {"provider": bound.provider, "tier": bound.tier, "per_second": bound.per_second} if bound else None,
        "at_budget": bool(bound and rate and rate >= 0.8 * bound.per_second),
        "due_to_sent_ms": {"p50": recent[-1]["due_to_sent_p50_ms"], "p95": recent[-1]["due_to_sent_p95_ms"],
                           "minute": recent[-1]["minute"].strftime("%H:%M")} if recent else None,
    }
    return {**found, **texts(found)}


def _duration(seconds: int) -> str:
    minutes, sec = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {sec:02d} s" if minutes else f"{sec} s"


def texts(p: dict) -> dict:
    """The page's sentences for :func:`pace`'s numbers (server-rendered, and sent with each poll)."""
    bound = p["budget"]
    budget_text = (f"{bound['provider']}'s {bound['tier']} budget, {bound['per_second']:,.0f}/s" if bound
                   else "no provider budget (the inbox)")
    latency = _latency_text(p["due_to_sent_ms"])
    if p["finished"]:
        when = p["finished"]["at"][11:19]
        return {"rate_text": f"— ({p['finished']['status'].lower()} at {when} UTC)",
                "eta_text": f"{p['finished']['status']} at {when} UTC: nothing left to send", "latency_text": latency}
    unknown = f"unknown since {_stamp(p['stale_since'])}, the last sample (is beat running?)" if p["stale_since"] \
        else None
    if unknown:
        rate = unknown
    elif p["rate_per_s"] is None:
        rate = "not measured yet (beat samples every few seconds)"
    else:
        rate = f"{p['rate_per_s']:,.1f}/s {p['rate_window']}"
        rate += f", at {budget_text}, which bounds it" if p["at_budget"] else f"; bound: {budget_text}"
    if p["breaker_open"]:
        rate += (f"; {p['budget']['provider']}'s circuit breaker is open: its calls fail fast and are tried "
                 "again later (provider health)")
    if not p["counted"]:
        eta = "not counted yet"
    elif p["eta_seconds"] is not None:
        eta = f"about {_duration(p['eta_seconds'])} for {p['due_left']:,} due (at {p['eta_at'][11:19]} UTC)"
    elif p["due_left"]:
        eta = f"{p['due_left']:,} due; " + (f"the rate is {unknown}" if unknown else "no rate yet")
    else:
        eta = "nothing due"
    if p["scheduled"]:
        eta += (f"; {p['scheduled']:,} scheduled for later (local time, spread, quiet hours or a retry's "
                "backoff) go when due")
        if p["last_scheduled_at"]:
            eta += f", the last scheduled send at {_stamp(p['last_scheduled_at'])}"
    if unknown and not p["due_to_sent_ms"]:
        latency = f"— (no sample since {_stamp(p['stale_since'])})"
    return {"rate_text": rate, "eta_text": eta, "latency_text": latency}


def _latency_text(latency: dict | None) -> str:
    return (f"p50 {latency['p50']:,} ms, p95 {latency['p95']:,} ms (rows sent in minute {latency['minute']} UTC)"
            if latency else "—")


def _recent_rate(rows: list[dict]) -> float | None:
    """Finished notifications per second over the last ``RECENT_MINUTES`` of samples (None: too few)."""
    if len(rows) < 2:
        return None
    last = rows[-1]
    first = next((r for r in rows if last["sampled_at"] - r["sampled_at"] <= timedelta(minutes=RECENT_MINUTES)),
                 rows[-2])
    if first is last:
        first = rows[-2]
    seconds = (last["sampled_at"] - first["sampled_at"]).total_seconds()
    if seconds <= 0:
        return None
    return max(0.0, (_finished(last) - _finished(first)) / seconds)
