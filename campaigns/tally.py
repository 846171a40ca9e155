"""A sampled campaign's counts kept from what changed, not counted afresh (docs/CAMPAIGNS.md, "Pace").

Counting all of a campaign's rows every 15 s costs the campaign's size per tick: a 1 M-row local-time
campaign sending for 20 h is read 4,800 times. Instead, database triggers (migration 0021) append to
:class:`~campaigns.models.CampaignTallyChange`, in each writer's own transaction, what its statement
changed in each campaign's counts, whoever the writer is (fan-out, scheduler, workers, receipts,
cancels, erasure). Beat's tick (:func:`counts`, under one lock) consumes every change in one
statement and adds it to the :class:`~campaigns.models.CampaignTally` of each campaign it samples:
its cost is the rows that changed since the last tick. A campaign sampled for the first time is
counted in full once (:func:`_start`), in one statement that also deletes the changes that count
already holds (one snapshot: a change is committed with the row it describes). Changes of campaigns
without a tally are dropped: a later first count includes them. A campaign no longer sampled keeps
its tally, still brought up to date (late receipts): every reader of a campaign's counts reads the
tally plus the changes not folded yet (:func:`campaigns.selectors.counts_for`), not its rows.
Figures: docs/PERFORMANCE.md, "The pace sampler".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

from django.db import connection, transaction

from campaigns.models import Campaign, CampaignTally, CampaignTallyChange
from campaigns.selectors import WITH_REASON, counted_rows, counts_of, history_expired

log = logging.getLogger(__name__)

CHANGES = CampaignTallyChange._meta.db_table

_CONSUME_SQL = f"""
WITH consumed AS (DELETE FROM {CHANGES} RETURNING campaign_id, status, reason, n)
SELECT campaign_id, status, reason, sum(n) FROM consumed GROUP BY 1, 2, 3
"""


def lock() -> bool:
    """Take the tick's lock for the current transaction (False: another tick holds it)."""
    with connection.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_xact_lock(hashtext('campaigns-pace-tally'))")
        return bool(cur.fetchone()[0])


def _add(tally: dict, status: str, reason: str, n: int) -> None:
    by_reason = tally.setdefault(status, {})
    reason = reason if status in WITH_REASON else ""
    by_reason[reason] = by_reason.get(reason, 0) + n
    if not by_reason[reason]:
        del by_reason[reason]
        if not by_reason:
            del tally[status]


def _rows(tally: dict) -> Iterable[tuple[str, str, int]]:
    return ((status, reason, n) for status, by_reason in tally.items() for reason, n in by_reason.items())


def _start(campaign: Campaign, now: datetime) -> CampaignTally:
    """The campaign counted in full, and the changes that count holds deleted, in one snapshot."""
    sql, params = counted_rows(campaign.pk).query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute(f"WITH held AS (DELETE FROM {CHANGES} WHERE campaign_id = %s) {sql}", [campaign.pk, *params])
        found = cur.fetchall()
    tally: dict = {}
    for status, reason, n in found:
        _add(tally, status, reason, n)
    return CampaignTally.objects.create(campaign=campaign, counts=tally, counted_at=now)


def counts(campaigns: list[Campaign], now: datetime) -> dict:
    """``{campaign pk: campaign_counts()-shaped counts}`` for ``campaigns`` (the tick's), every tally
    brought up to date (those of campaigns no longer sampled too). Call inside the transaction
    holding :func:`lock`. A campaign whose first count fails is logged and left out."""
    with connection.cursor() as cur:
        cur.execute(_CONSUME_SQL)
        changes = cur.fetchall()
    wanted = {c.pk: c for c in campaigns}
    ids = set(wanted) | {change[0] for change in changes}
    tallies = {t.campaign_id: t for t in CampaignTally.objects.filter(campaign_id__in=list(ids))}
    changed = set()
    for campaign_id, status, reason, n in changes:
        if campaign_id in tallies:
            _add(tallies[campaign_id].counts, status, reason, int(n))
            changed.add(campaign_id)
    for campaign_id in changed:
        tallies[campaign_id].save(update_fields=["counts"])
    found = {}
    for pk, campaign in wanted.items():
        if pk not in tallies:
            try:
                with transaction.atomic():
                    tallies[pk] = _start(campaign, now)
            except Exception:
                log.exception("campaign %s: its first pace count failed", pk)
                continue
        found[pk] = counts_of(_rows(tallies[pk].counts), campaign)
    return found


#: How many campaigns without a tally :func:`backfill` looks at per tick (newest first).
BACKFILL_CANDIDATES = 20


def backfill(now: datetime) -> Campaign | None:
    """One campaign that has no tally (finished before the sampler existed, or never sampled) counted
    in full and given one, per tick, so every reader of it reads the tally from then on instead of
    its rows (the admin list reloads every 5 s). Skips those the history's retention may have cut
    (their readers count in full: no trigger records a dropped partition). Call under :func:`lock`.
    Returns the campaign tallied, if any."""
    candidates = Campaign.objects.filter(tally__isnull=True, started_at__isnull=False).order_by("-started_at")
    for campaign in candidates[:BACKFILL_CANDIDATES]:
        if history_expired(campaign):
            continue
        try:
            with transaction.atomic():
                _start(campaign, now)
        except Exception:
            log.exception("campaign %s: its backfill count failed", campaign.pk)
            return None
        return campaign
    return None
