"""A campaign's send-time option (docs/SEND_TIME.md, "The campaign option"): its validation, each
member's group and hour at fan-out (one profile read per page), their set-based record, and the
comparison of the groups' open rates read from that record."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import time

from django.db import connection
from django.db.models import Count, OuterRef, Subquery

from campaigns.models import Campaign, SendTimeMember
from notifications.records import engaged_since
from notifications.send_time.models import SendTimeProfile
from notifications.send_time.rule import best_hour, in_holdout, window_hours

MAX_HOLDOUT_PERCENT = 50
Group = SendTimeMember.Group


@dataclass(frozen=True)
class Option:
    start: time
    end: time
    holdout_percent: int

    @property
    def hours(self) -> list[int]:
        return window_hours(self.start, self.end)

    def as_stored(self) -> dict:
        return {"window": {"start": self.start.strftime("%H:%M"), "end": self.end.strftime("%H:%M")},
                "holdout_percent": self.holdout_percent}


def option_of(campaign: Campaign) -> Option | None:
    """The stored option of ``campaign`` (``None``: off)."""
    raw = campaign.send_time
    if not raw:
        return None
    w = raw["window"]
    return Option(time.fromisoformat(w["start"]), time.fromisoformat(w["end"]), int(raw.get("holdout_percent", 0)))


def option_problems(start: time, end: time, holdout_percent: int) -> dict[str, str]:
    """``{field: problem}`` of a window and holdout share (field names under ``send_time.``)."""
    problems = {}
    if start == end:
        problems["window.end"] = "must differ from window.start (an end before the start wraps past midnight)"
    elif not window_hours(start, end):
        problems["window.end"] = "the window holds no whole hour (h:00) to send at"
    if not 0 <= holdout_percent <= MAX_HOLDOUT_PERCENT:
        problems["holdout_percent"] = f"must be between 0 and {MAX_HOLDOUT_PERCENT}"
    return problems


def earliest_wall_time(local_time: time, option: Option | None) -> time:
    """The earliest wall time any member may be sent at on the campaign's date: fan-out starts when the
    earliest zone reaches it, so an optimised member's row exists before its hour."""
    if option is None or not option.hours:
        return local_time
    return min(local_time, time(min(option.hours)))


def campaign_earliest_wall_time(campaign: Campaign) -> time | None:
    """:func:`earliest_wall_time` of a local-time campaign as stored (``None``: not local time)."""
    if campaign.local_time is None:
        return None
    return earliest_wall_time(campaign.local_time, option_of(campaign))


class PagePlanner:
    """One fan-out page's groups: ``choose(user_id)`` → ``(group, hour or None)``; one profile query."""

    def __init__(self, campaign: Campaign, option: Option, user_ids: list[str]) -> None:
        self.campaign, self.option, self.hours = campaign, option, option.hours
        self.profiles = dict(SendTimeProfile.objects.filter(recipient_id__in=user_ids)
                             .values_list("recipient_id", "counts"))

    def choose(self, user_id: str) -> tuple[str, int | None]:
        if in_holdout(self.campaign.pk, user_id, self.option.holdout_percent):
            return Group.HOLDOUT, None
        counts = self.profiles.get(user_id)
        if counts is None:
            return Group.NO_HISTORY, None
        return Group.OPTIMISED, best_hour(counts, self.hours)


def record(campaign_id: uuid.UUID, rows: list[tuple[str, str, str, int | None]]) -> None:
    """Record ``[(user_id, notification id, group, hour)]`` in one statement; a page run twice adds nothing."""
    if not rows:
        return
    users, ids, groups, hours = (list(col) for col in zip(*rows, strict=True))
    with connection.cursor() as cur:
        cur.execute("""INSERT INTO campaigns_sendtimemember (campaign_id, recipient_id, notification_id, "group", hour)
                       SELECT %s, u, n, g, h FROM unnest(%s::text[], %s::uuid[], %s::text[], %s::int[]) AS x(u, n, g, h)
                       ON CONFLICT (campaign_id, recipient_id) DO NOTHING""",
                    [campaign_id, users, [str(i) for i in ids], groups, hours])


def comparison(campaign: Campaign) -> list[dict] | None:
    """Per group: members, sent, opened (``engaged_since``'s definitions) and open rate (opened ÷ sent,
    ``None`` while nothing was sent); three grouped queries over this campaign's rows. ``None``: the
    option is off."""
    if not campaign.send_time:
        return None
    members = dict(SendTimeMember.objects.filter(campaign=campaign).values("group").annotate(n=Count("id"))
                   .values_list("group", "n").order_by())
    group_of = SendTimeMember.objects.filter(campaign=campaign, notification_id=OuterRef("id")).values("group")[:1]
    since = campaign.started_at or campaign.created_at
    counted = {}
    for engagement in ("sent", "opened"):
        counted[engagement] = dict(
            engaged_since(engagement, since).filter(campaign_id=campaign.pk)
            .annotate(g=Subquery(group_of)).values("g").annotate(n=Count("id")).values_list("g", "n").order_by())
    out = []
    for group in Group.values:
        sent, opened = counted["sent"].get(group, 0), counted["opened"].get(group, 0)
        out.append({"group": group, "members": members.get(group, 0), "sent": sent, "opened": opened,
                    "open_rate": round(opened / sent, 4) if sent else None})
    return out


def comparison_html(campaign: Campaign) -> str:
    """The comparison as the admin's campaign page shows it: a small table, or "-" when the option is off."""
    from django.utils.html import format_html, format_html_join

    groups = comparison(campaign)
    if groups is None:
        return "-"
    rows = format_html_join("", "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                            ((g["group"], g["members"], g["sent"], g["opened"],
                              "–" if g["open_rate"] is None else f"{g['open_rate']:.1%}") for g in groups))
    return format_html("<table><tr><th>group</th><th>members</th><th>sent</th><th>opened</th><th>open rate</th>"
                       "</tr>{}</table>", rows)
