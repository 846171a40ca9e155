"""The per-minute chart of a campaign's pace (docs/CAMPAIGNS.md, "Pace"), from its samples
(:class:`~campaigns.models.CampaignMinute` rows, oldest first): what the page draws and polls."""

from __future__ import annotations

from datetime import datetime, timedelta

#: What the chart draws per minute: changes of these outcome counts (campaigns.selectors.outcome).
SERIES = ("sent", "delivered", "failed", "suppressed")
#: At most this many points (a day of minutes), whatever the span the samples cover.
MINUTES_SHOWN = 1440
MINUTE = timedelta(minutes=1)


def outcome_of(row: dict) -> dict:
    """A sample row's outcome counts (``campaigns.selectors.outcome``), empty for none."""
    return row.get("outcome") or {}


def chart(rows: list[dict], *, first_is_base: bool, in_progress: bool) -> dict:
    """Per minute, the change of each series since the previous sample (the first minute of the
    campaign against zero; the oldest row only as the base when the day is cut); at most
    ``MINUTES_SHOWN`` points, the newest kept.

    - ``in_progress``: the newest row is the minute still being sampled (the campaign sends): it is not
      drawn, as its change covers only the seconds sampled so far and would dip at the right edge
      every poll; it is drawn once the next minute is sampled (the rate sentence is the live figure).
    - A minute without a sample (beat was down) is a gap (null), and the next sample's change covers
      it. A gap longer than ``MINUTES_SHOWN`` minutes collapses into one null point labelled with its
      span (``11:34 … 08:05``): a weekend without beat costs one point, not thousands.
    - Labels are ``HH:MM`` (UTC), ``MM-DD HH:MM`` when the points drawn span more than one day.
    """
    drawn = rows[:-1] if in_progress else rows
    start = 1 if first_is_base else 0
    points: list[tuple[datetime, datetime | None, dict | None, int | None]] = []  # newest first
    for i in range(len(drawn) - 1, start - 1, -1):
        row = drawn[i]
        before, after = (outcome_of(drawn[i - 1]) if i > 0 else {}), outcome_of(row)
        points.append((row["minute"], None, {name: max(0, after.get(name, 0) - before.get(name, 0)) for name in SERIES},
                       row["due_to_sent_p95_ms"]))
        if i == start or len(points) >= MINUTES_SHOWN:
            break
        first, last = drawn[i - 1]["minute"] + MINUTE, row["minute"] - MINUTE
        missing = int((last - first) / MINUTE) + 1
        if missing > MINUTES_SHOWN:
            points.append((first, last, None, None))
        else:
            for k in range(min(missing, MINUTES_SHOWN - len(points))):
                points.append((last - k * MINUTE, None, None, None))
    points = points[:MINUTES_SHOWN][::-1]
    days = {p[0].date() for p in points} | {p[1].date() for p in points if p[1] is not None}
    form = "%m-%d %H:%M" if len(days) > 1 else "%H:%M"
    labels = [at.strftime(form) if until is None else f"{at.strftime(form)} … {until.strftime(form)}"
              for at, until, _, _ in points]
    series = {name: [None if changes is None else changes[name] for _, _, changes, _ in points] for name in SERIES}
    return {"labels": labels, **series, "due_to_sent_p95_ms": [p95 for _, _, _, p95 in points]}
