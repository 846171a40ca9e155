"""Recurring campaigns' runs (docs/RECURRING.md): beat turns each due occurrence of a series into a
*run*, a campaign of its own that the ordinary fan-out (:mod:`campaigns.fanout`) starts, so every
rule of a campaign (the admission road ``campaign``, opt-outs, quiet hours, caps, erasure, cancel)
applies to each run unchanged. Also pause, resume and a series' cancel.

A run's id is :func:`notifications.ids.campaign_run_id` (series + occurrence instant) and
``(series, occurrence_at)`` is unique, so a doubled or restarted beat never makes two.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import F

from campaigns import recurrence, send_time
from campaigns.models import Campaign, CampaignStatus
from core import clock
from notifications.campaign_rows import campaign_has_backlog
from notifications.ids import campaign_run_id
from notifications.webhooks import outbox as webhook_outbox
from preferences.wallclock import earliest_instant

log = logging.getLogger(__name__)

#: What a run copies from its series: the definition (content, audience, channel, pace).
COPIED_FIELDS = ("name", "client", "created_by", "segment", "channel", "priority", "category", "template",
                 "notification_type", "title", "body", "html", "data", "missed_policy", "spread_seconds",
                 "ttl_seconds", "metadata", "send_time")
#: Due occurrences one series turns into runs per beat tick (a beat that was down catches up in steps).
CATCH_UP = 100
PREVIOUS_ACTIVE = "previous run still active"
SUPERSEDED = "a later occurrence was already due (beat was late)"
#: Statuses of a run not finished: a series' cancel cancels them, and the series is not completed before.
ACTIVE_STATUSES = (CampaignStatus.SCHEDULED, CampaignStatus.FANNING_OUT, CampaignStatus.SENDING)


def too_late_reason(occurrence_at: datetime, now: datetime) -> str:
    """Why an IANA-zone occurrence reached this late is not sent: the local-time campaigns' missed rule
    (``CAMPAIGN_MISSED_GRACE_SECONDS``), "" within it."""
    grace = recurrence.conf("MISSED_GRACE_SECONDS")
    if now - occurrence_at <= timedelta(seconds=grace):
        return ""
    return (f"too late: made {int((now - occurrence_at).total_seconds())} s after its time, more than "
            f"CAMPAIGN_MISSED_GRACE_SECONDS ({grace})")


def too_close_reason(series: Campaign, occurrence_at: datetime) -> str:
    """Why an occurrence closer than ``CAMPAIGN_SCHEDULE_MIN_INTERVAL_SECONDS`` to the series' previous
    one (a run, made or skipped) is not sent: the check at creation expands a rule only so far."""
    minimum = recurrence.conf("SCHEDULE_MIN_INTERVAL_SECONDS")
    previous = (series.runs.filter(occurrence_at__lt=occurrence_at).order_by("-occurrence_at")
                .values_list("occurrence_at", flat=True).first())
    if previous is None or (occurrence_at - previous).total_seconds() >= minimum:
        return ""
    return (f"too close: {int((occurrence_at - previous).total_seconds())} s after the previous occurrence, less "
            f"than CAMPAIGN_SCHEDULE_MIN_INTERVAL_SECONDS ({minimum})")


class NotRecurring(Exception):
    """Pause and resume are for recurring campaigns."""


class WrongStatus(Exception):
    """The series is not in a status the action applies to."""


def first_run_at(schedule: recurrence.Schedule, now: datetime) -> datetime | None:
    """The first occurrence at or after ``now`` (a new or resumed series' ``next_run_at``)."""
    found = next(schedule.occurrences(from_instant=now), None)
    return found.at if found else None


def create_due_runs() -> dict[str, int]:
    """Beat: for every active series whose ``next_run_at`` has come, make its due occurrences' runs
    (:func:`advance_series`). Series are locked ``FOR UPDATE SKIP LOCKED``: two beats never work on
    one series at once. Then completes each series whose last run was made and has finished
    (:func:`ended_updates`). Returns counts of runs ``created`` and ``skipped``."""
    now = clock.now()
    totals = {"created": 0, "skipped": 0}
    with transaction.atomic():
        due = list(Campaign.objects.select_for_update(skip_locked=True)
                   .filter(status=CampaignStatus.SCHEDULED, next_run_at__lte=now).exclude(schedule_rule="")
                   .order_by("next_run_at")[:20])
        for series in due:
            try:
                with transaction.atomic():  # one series that cannot advance never holds back the others
                    made = advance_series(series, now)
            except Exception as exc:
                log.exception("series %s: its runs could not be made", series.pk)
                Campaign.objects.filter(pk=series.pk).update(
                    last_error=f"runs could not be made: {type(exc).__name__}: {exc}"[:2000], last_error_at=now,
                    fanout_failures=F("fanout_failures") + 1)
                continue
            for key, n in made.items():
                totals[key] += n
        # A series whose last run was made completes once that run has finished (ended_updates).
        for series_id, client_id in (Campaign.objects.filter(status=CampaignStatus.SCHEDULED, next_run_at__isnull=True)
                                     .exclude(schedule_rule="").exclude(runs__status__in=ACTIVE_STATUSES)
                                     .values_list("pk", "client_id")):
            _store(Campaign.objects.filter(pk=series_id, status=CampaignStatus.SCHEDULED, next_run_at__isnull=True),
                   series_id, client_id, {"status": CampaignStatus.COMPLETED, "completed_at": now, "updated_at": now},
                   now)
    return totals


def _store(locked, series_id, client_id: str | None, updates: dict, now: datetime) -> None:
    """``updates`` to the series (``locked``: its queryset); a series they complete tells its client,
    ``campaign.completed`` with ``series: true``, in the same transaction (docs/RECURRING.md)."""
    if locked.update(**updates) and updates.get("status") == CampaignStatus.COMPLETED:
        webhook_outbox.emit_campaign_completed(series_id, client_id, now, series=True)


def ended_updates(series_id, now: datetime) -> dict:
    """A series whose rule has no occurrence left: ``completed`` if none of its runs is still active;
    else it stays ``scheduled`` (``next_run_at`` null, cancellable, its runs with it) and beat completes
    it once they have finished (:func:`create_due_runs`)."""
    if Campaign.objects.filter(series_id=series_id, status__in=ACTIVE_STATUSES).exists():
        return {}
    return {"status": CampaignStatus.COMPLETED, "completed_at": now}


def advance_series(series: Campaign, now: datetime) -> dict[str, int]:
    """Make the runs of ``series``' occurrences due at ``now`` (in the caller's transaction, the series
    locked) and move ``next_run_at`` on. The latest due occurrence becomes a run, unless the previous
    run is still active (:func:`previous_run_active`): then it is recorded ``skipped`` with that reason;
    earlier due ones (beat was down) are recorded ``skipped`` as superseded, never sent in a burst; so is
    an IANA-zone occurrence made too late (:func:`too_late_reason`) or too close to the previous one
    (:func:`too_close_reason`). A rule with no occurrence left ends the series (:func:`ended_updates`)."""
    schedule = recurrence.stored(series)
    due, following = [], None
    for occurrence in schedule.occurrences(from_instant=series.next_run_at):
        if occurrence.at > now or len(due) == CATCH_UP:
            following = occurrence
            break
        due.append(occurrence)
    counts = {"created": 0, "skipped": 0}
    caught_up = following is None or following.at > now
    for i, occurrence in enumerate(due):
        if i < len(due) - 1 or not caught_up:
            reason = SUPERSEDED
        else:
            reason = ((too_late_reason(occurrence.at, now) if not schedule.per_recipient else "")
                      or too_close_reason(series, occurrence.at)
                      or (PREVIOUS_ACTIVE if previous_run_active(series, now) else ""))
        _run, created = create_run(series, schedule, occurrence, skip_reason=reason)
        if created:
            counts["skipped" if reason else "created"] += 1
    updates = {"next_run_at": following.at if following else None, "updated_at": now}
    if following is None:
        updates.update(ended_updates(series.pk, now))
    _store(Campaign.objects.filter(pk=series.pk), series.pk, series.client_id, updates, now)
    if counts["created"] or counts["skipped"]:
        log.info("campaign %s: %d run(s) created, %d skipped", series.pk, counts["created"], counts["skipped"])
    return counts


def previous_run_active(series: Campaign, now: datetime) -> bool:
    """The rule for overlapping runs: the series' latest run not skipped is still active when it has
    not finished fanning out (``scheduled``, ``fanning_out``) or, while ``sending``, has notifications
    due and not yet sent (:func:`notifications.campaign_rows.campaign_has_backlog`); rows scheduled
    for later (recipients' local times, spread, quiet hours) do not hold the next run back."""
    last = (series.runs.exclude(status=CampaignStatus.SKIPPED).order_by("-occurrence_at")
            .values_list("pk", "status").first())
    if last is None:
        return False
    run_id, status = last
    if status in (CampaignStatus.SCHEDULED, CampaignStatus.FANNING_OUT):
        return True
    return status == CampaignStatus.SENDING and campaign_has_backlog(run_id, now)


def create_run(series: Campaign, schedule: recurrence.Schedule, occurrence: recurrence.Occurrence, *,
               skip_reason: str = "") -> tuple[Campaign, bool]:
    """The run of one occurrence: created ``scheduled`` (fan-out starts at its instant, or for a
    recipient-zone schedule when the earliest zone reaches its wall time, as a local-time campaign)
    or ``skipped`` with ``skip_reason``. Idempotent: the id is derived and ``(series, occurrence_at)``
    unique, so a second creator (a doubled beat) gets the existing run. Returns ``(run, created)``."""
    run = Campaign(id=campaign_run_id(series.pk, occurrence.at), series=series, occurrence_at=occurrence.at,
                   fanout_at=occurrence.at, **{name: getattr(series, name) for name in COPIED_FIELDS})
    if schedule.per_recipient:
        run.local_date, run.local_time = occurrence.wall.date(), occurrence.wall.time()
        if run.send_time:  # an optimised member's hour may come before the occurrence's wall time
            run.fanout_at = min(occurrence.at, earliest_instant(run.local_date,
                                                                send_time.campaign_earliest_wall_time(run)))
    else:
        run.scheduled_at = occurrence.at
    if skip_reason:
        run.status, run.skip_reason = CampaignStatus.SKIPPED, skip_reason
    else:
        run.status = CampaignStatus.SCHEDULED
    try:
        with transaction.atomic():
            run.save(force_insert=True)
    except IntegrityError:
        return Campaign.objects.get(series=series, occurrence_at=occurrence.at), False
    return run, True


def pause(campaign_id) -> Campaign:
    """Stop making runs (a run already made goes on). Raises NotRecurring, WrongStatus, DoesNotExist."""
    now = clock.now()
    with transaction.atomic():
        series = _locked_series(campaign_id)
        if series.status != CampaignStatus.SCHEDULED:
            raise WrongStatus(f"campaign is {series.status}; only a scheduled recurring campaign can be paused")
        Campaign.objects.filter(pk=series.pk).update(status=CampaignStatus.PAUSED, paused_at=now, updated_at=now)
    return Campaign.objects.get(pk=campaign_id)


def resume(campaign_id) -> Campaign:
    """Make runs again from the first occurrence at or after now: occurrences that passed while paused
    are skipped (no run, nothing sent late or in a burst). A rule with none left completes the series.
    Raises NotRecurring, WrongStatus, DoesNotExist."""
    now = clock.now()
    with transaction.atomic():
        series = _locked_series(campaign_id)
        if series.status != CampaignStatus.PAUSED:
            raise WrongStatus(f"campaign is {series.status}; only a paused recurring campaign can be resumed")
        following = first_run_at(recurrence.stored(series), now)
        updates = {"status": CampaignStatus.SCHEDULED, "paused_at": None, "next_run_at": following,
                   "updated_at": now}
        if following is None:
            updates.update(ended_updates(series.pk, now))
        _store(Campaign.objects.filter(pk=series.pk), series.pk, series.client_id, updates, now)
    return Campaign.objects.get(pk=campaign_id)


def _locked_series(campaign_id) -> Campaign:
    series = Campaign.objects.select_for_update().get(pk=campaign_id)
    if not series.is_recurring:
        raise NotRecurring("not a recurring campaign (it has no schedule)")
    return series


def active_runs(series_id) -> list:
    """Ids of a series' runs not finished (a series' cancel cancels them too)."""
    return list(Campaign.objects.filter(series_id=series_id, status__in=ACTIVE_STATUSES).values_list("pk", flat=True))
