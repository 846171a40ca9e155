"""Who is in a segment: the one place that decides it (docs/SEGMENTS.md).

A list segment's members are its ``SegmentMember`` rows added up to an instant. A rule segment's are
the recipients its rule matches (:mod:`campaigns.rules`, compiled to SQL), never erased ones (unless
re-created since: :data:`PRESENT`): before
launch (reach, preview, the admin) the rule is evaluated afresh; when fan-out starts,
:func:`snapshot` writes the matches once into ``CampaignMember`` and every page reads those, so a
campaign's members are fixed at its snapshot like a list segment's.

Fan-out, the reach and the local-time check read members through :func:`member_source`: a subquery
yielding ``recipient_id``, joined as ``m`` by their own SQL.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F, Q, QuerySet

from campaigns.models import Campaign, CampaignMember, Segment
from campaigns.rules import Context, compile_rules
from preferences.models import Recipient

T = TypeVar("T")


def context_of(campaign: Campaign, now: datetime) -> Context:
    """A campaign's rule context: its channel, category and type, evaluated at ``now``."""
    return Context(now=now, channel=campaign.channel, category=campaign.category or "",
                   type_key=campaign.notification_type_id or "")


#: Who may match a rule at all: never a recipient whose data was erased (a rule's ``not`` would
#: otherwise match the bare row), unless the upstream service wrote it again after its erasure
#: (``written_at``: a re-created user, matched on what was written since; its engagement counts from
#: the erasure on, :func:`campaigns.rules.compile_rules`).
PRESENT = Q(erased_at__isnull=True) | Q(written_at__gt=F("erased_at"))


def matching(rules, context: Context) -> QuerySet[Recipient]:
    """The recipients ``rules`` (valid: :func:`campaigns.rules.validate`) matches, of those
    :data:`PRESENT`."""
    return Recipient.objects.filter(compile_rules(rules, context), PRESENT)


_PLACEHOLDER = re.compile(r"%%|%s")


def _named(sql: str, params, prefix: str) -> tuple[str, dict]:
    """The ORM's ``%s`` SQL as ``%(prefix_n)s`` SQL, to be embedded in the pyformat SQL of fan-out
    and the reach (psycopg takes one style per query)."""
    named: dict = {}
    values = iter(params)

    def swap(match: re.Match) -> str:
        if match.group(0) == "%%":
            return "%%"
        key = f"{prefix}_{len(named)}"
        named[key] = next(values)
        return f"%({key})s"

    return _PLACEHOLDER.sub(swap, sql), named


def member_source(campaign: Campaign, at: datetime) -> tuple[str, dict]:
    """``(sql, params)``: a subquery of the campaign's members' ``recipient_id`` at ``at``. After the
    snapshot, what it took (:func:`snapshot`: its kind is the campaign's, not the segment's now);
    before it, a list segment's members added up to ``at`` or a rule segment's rule evaluated now."""
    segment = campaign.segment
    kind = campaign.snapshot_kind if campaign.snapshot_at is not None else ("rule" if segment.is_rule else "list")
    if kind == "list":
        return ("SELECT recipient_id FROM campaigns_segmentmember "
                "WHERE segment_id = %(m_segment)s AND added_at <= %(m_at)s", {"m_segment": segment.pk, "m_at": at})
    if campaign.snapshot_at is not None:
        return ("SELECT recipient_id FROM campaigns_campaignmember WHERE campaign_id = %(m_campaign)s",
                {"m_campaign": campaign.pk})
    query = matching(segment.rules, context_of(campaign, at)).values(recipient_id=F("user_id")).query
    sql, params = query.sql_with_params()
    return _named(sql, params, "m_rule")


def snapshot(campaign: Campaign, at: datetime) -> int:
    """Fix the members of ``campaign`` at ``at`` (call in fan-out's start transaction, which stores
    ``snapshot_at`` and ``snapshot_kind``): a rule segment's matches are written into
    ``CampaignMember`` in one ``INSERT … SELECT``, a list segment's are its members added up to
    ``at``. Sets ``campaign.snapshot_kind``, which every page reads from then on: a segment turned
    from rule to list (or back) meanwhile changes nothing. Returns the member count."""
    segment = campaign.segment
    campaign.snapshot_kind = "rule" if segment.is_rule else "list"
    if not segment.is_rule:
        return segment.members.filter(added_at__lte=at).count()
    query = matching(segment.rules, context_of(campaign, at)).values("user_id").query
    sql, params = query.sql_with_params()
    with connection.cursor() as cur:
        cur.execute(f"INSERT INTO {CampaignMember._meta.db_table} (campaign_id, recipient_id) "
                    f"SELECT %s, matched.user_id FROM ({sql}) AS matched ON CONFLICT DO NOTHING",
                    [campaign.pk, *params])
        return cur.rowcount


def snapshot_members(campaign: Campaign) -> QuerySet:
    """The ``recipient_id`` values of a campaign's snapshot (after :func:`snapshot`) as fan-out pages
    them (shard bounds)."""
    if campaign.snapshot_kind == "rule":
        return CampaignMember.objects.filter(campaign=campaign).values_list("recipient_id", flat=True)
    return (campaign.segment.members.filter(added_at__lte=campaign.snapshot_at)
            .values_list("recipient_id", flat=True))


def release_snapshot(campaign: Campaign) -> None:
    """Fan-out is complete: the snapshot rows are no longer read (one DELETE by the unique index)."""
    CampaignMember.objects.filter(campaign=campaign).delete()  # no signals, no cascades: a single DELETE


@dataclass(frozen=True)
class Preview:
    """A rule's count: ``exact`` unless counting took longer than ``SEGMENT_PREVIEW_TIMEOUT_MS``,
    then the planner's estimate (``exact: false``)."""

    count: int
    exact: bool

    def as_dict(self) -> dict:
        return {"count": self.count, "exact": self.exact}


def preview_timeout_ms() -> int:
    return int(settings.CAMPAIGNS["PREVIEW_TIMEOUT_MS"])


def bounded(exact: Callable[[], T], estimate: Callable[[], T]) -> tuple[T, bool]:
    """``(exact(), True)`` when its queries finish within ``SEGMENT_PREVIEW_TIMEOUT_MS``, else
    ``(estimate(), False)``: the rule for every count taken before launch (the preview, a campaign's
    reach), which may read every recipient and must not hold a request or a connection for that.
    ``estimate`` reads no rows (:func:`planned_rows`)."""
    try:
        with transaction.atomic(), connection.cursor() as cur:
            # Local to the transaction; put back at once, as a request may run on in an outer one.
            cur.execute("SELECT current_setting('statement_timeout'), "
                        "set_config('statement_timeout', %s, true)", [str(preview_timeout_ms())])
            before = cur.fetchone()[0]
            result = exact()
            cur.execute("SELECT set_config('statement_timeout', %s, true)", [before])
            return result, True
    except DatabaseError as exc:
        if getattr(getattr(exc, "__cause__", None), "sqlstate", "") != "57014":  # query_canceled
            raise
    return estimate(), False


def planned_rows(sql: str, params) -> int:
    """The planner's row estimate for ``sql`` (``EXPLAIN``: nothing read)."""
    with connection.cursor() as cur:
        cur.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cur.fetchone()[0]
    plan = json.loads(plan) if isinstance(plan, str | bytes) else plan
    return int(plan[0]["Plan"]["Plan Rows"])


def preview(rules, context: Context) -> Preview:
    """How many recipients ``rules`` matches now, :func:`bounded`: past the timeout the planner's
    row estimate, marked ``exact: false``."""
    qs = matching(rules, context)
    count, exact = bounded(qs.count, lambda: planned_rows(*qs.values("user_id").query.sql_with_params()))
    return Preview(count, exact)


def segment_preview(segment: Segment, context: Context) -> Preview:
    """A segment's count now: a rule segment's :func:`preview`, a list segment's members."""
    if segment.is_rule:
        return preview(segment.rules, context)
    return Preview(segment.members.count(), True)
