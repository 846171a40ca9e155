"""A campaign's audience in SQL: per member, the facts the suppression rule needs.

Fan-out's member query and the pre-launch reach select the same columns (:func:`fact_columns`) and
apply the same rule, :func:`preferences.suppression.suppression_reason`, in Python: fan-out once per
member row, the reach once per distinct combination of facts (``GROUP BY``; a handful of groups
whatever the segment's size). SQL only reads inputs; it never restates the rule, so the reach shown
before launch is what fan-out will create as not suppressed (send time re-checks the same rule).

The ``jsonb`` preference columns are selected as text and parsed here: raw SQL on psycopg 3 returns
``jsonb`` as text (Django registers a text loader; the ORM parses in ``JSONField.from_db_value``).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field

from django.db import connection

from campaigns.membership import bounded, member_source, planned_rows
from preferences.suppression import RecipientFacts, channels, suppression_reason

_FACT_COLUMNS = """r.phone <> '' AS has_phone, r.phone_invalid_reason <> '' AS phone_invalid,
       r.email <> '' AS has_email, r.email_invalid_reason <> '' AS email_invalid,
       p.opt_outs::text AS opt_outs, (p.category_opt_outs -> %(category)s::text)::text AS category_channels,
       (p.type_opt_outs -> %(type_key)s::text)::text AS type_channels,
       {device} AS has_active_device, {stopped} AS sms_stopped"""
_HAS_ACTIVE_DEVICE = ("EXISTS (SELECT 1 FROM preferences_device d "
                      "WHERE d.recipient_id = m.recipient_id AND d.active)")
_SMS_STOPPED = ("EXISTS (SELECT 1 FROM preferences_smsstop s "
                "WHERE s.phone = r.phone AND r.phone <> '' AND s.sender = %(sms_sender)s)")
FACT_NAMES = ("has_phone", "phone_invalid", "has_email", "email_invalid", "opt_outs", "category_channels",
              "type_channels", "has_active_device", "sms_stopped")


def fact_columns(channel: str) -> str:
    """The SELECT list (9 columns, :data:`FACT_NAMES`) over ``campaigns_segmentmember m``,
    ``preferences_recipient r`` and ``LEFT JOIN preferences_preferences p``. Devices are looked up
    for push only, STOPs for SMS only (``NULL`` otherwise: the rule skips them). Parameters:
    :func:`fact_params`."""
    return _FACT_COLUMNS.format(device=_HAS_ACTIVE_DEVICE if channel == "push" else "NULL::boolean",
                                stopped=_SMS_STOPPED if channel == "sms" else "NULL::boolean")


def fact_params(campaign) -> dict:
    """The query parameters :func:`fact_columns` needs: the campaign's category, its type's key (a
    typed campaign: users' opt-outs of the type apply as on every road of a type) and SMS sender."""
    sender = ""
    if campaign.channel == "sms":
        from notifications.delivery.routing import sms_sender

        sender = sms_sender()
    return {"category": campaign.category or "", "type_key": campaign.notification_type_id or "",
            "sms_sender": sender}


def facts_from_row(row: dict, category: str, type_key: str = "") -> RecipientFacts:
    """:class:`RecipientFacts` from one row of :func:`fact_columns` (keys :data:`FACT_NAMES`)."""
    return RecipientFacts(
        has_phone=bool(row["has_phone"]), phone_invalid=bool(row["phone_invalid"]),
        has_email=bool(row["has_email"]), email_invalid=bool(row["email_invalid"]),
        has_active_device=row["has_active_device"], sms_stopped=row["sms_stopped"],
        opt_outs=channels(_parsed(row["opt_outs"])),
        category_opt_outs={category: channels(_parsed(row["category_channels"]))} if category else {},
        type_opt_outs={type_key: channels(_parsed(row["type_channels"]))} if type_key else {})


def _parsed(text):
    return json.loads(text) if isinstance(text, str | bytes) else text


def reason_for(row: dict, campaign) -> str:
    """The suppression reason for one member row of ``campaign`` (``""``: send)."""
    type_key = campaign.notification_type_id or ""
    return suppression_reason(facts_from_row(row, campaign.category, type_key), campaign.channel, campaign.category,
                              type_key=type_key)


_REACH_SQL = """
SELECT {facts}, count(*) AS members
  FROM ({members}) m
  JOIN preferences_recipient r ON r.user_id = m.recipient_id
  LEFT JOIN preferences_preferences p ON p.recipient_id = m.recipient_id
 GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9
"""


@dataclass
class Reach:
    """How many members a campaign reaches: ``members`` in the segment, ``eligible`` (not
    suppressed by the rule) and the rest by reason code. ``exact: False``: counting took longer
    than ``SEGMENT_PREVIEW_TIMEOUT_MS`` and ``members`` is the planner's estimate; ``eligible`` is
    then ``None`` and there are no reasons (the suppression rule runs on counted rows only)."""

    members: int = 0
    eligible: int | None = 0
    suppressed_by_reason: dict[str, int] = field(default_factory=dict)
    exact: bool = True

    def as_dict(self) -> dict:
        return {"members": self.members, "eligible": self.eligible,
                "suppressed_by_reason": dict(sorted(self.suppressed_by_reason.items())), "exact": self.exact}


def reach(campaign, at) -> Reach:
    """The campaign's reach if it fanned out at ``at`` (members added up to then, or a rule
    segment's matches then: :func:`campaigns.membership.member_source`): one grouped query over the
    segment (a sequential pass: ~1 s per million members), bounded as the segment preview is
    (:func:`campaigns.membership.bounded`): past its timeout, the planner's estimate of the members."""
    members_sql, members_params = member_source(campaign, at)
    sql = _REACH_SQL.format(facts=fact_columns(campaign.channel), members=members_sql)
    params = {**members_params, **fact_params(campaign)}

    def exact() -> Reach:
        with connection.cursor() as cur:
            cur.execute(sql, params)
            names = [c.name for c in cur.description]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
        result = Reach()
        for row in rows:
            reason = reason_for(row, campaign)
            result.members += row["members"]
            if reason:
                result.suppressed_by_reason[reason] = result.suppressed_by_reason.get(reason, 0) + row["members"]
            else:
                result.eligible = (result.eligible or 0) + row["members"]
        return result

    def estimate() -> Reach:
        return Reach(members=planned_rows(members_sql, members_params), eligible=None, exact=False)

    return bounded(exact, estimate)[0]


#: How long the API may serve a computed reach (seconds): a client polling a scheduled campaign
#: must not run the grouped query over a million members on every GET.
REACH_CACHE_SECONDS = 30


def cached_reach(campaign, at) -> Reach:
    """:func:`reach` (bounded: an estimate past its timeout), served from the cache for up to
    :data:`REACH_CACHE_SECONDS` (computed anew when the cache is unreachable)."""
    from django.core.cache import cache

    key = f"campaign-reach:{campaign.pk}"
    try:
        hit = cache.get(key)
    except Exception:  # Redis down: compute, as without a cache
        hit = None
    if hit is not None:
        return Reach(**hit)
    result = reach(campaign, at)
    with contextlib.suppress(Exception):  # the cache is an optimisation only
        cache.set(key, {"members": result.members, "eligible": result.eligible,
                        "suppressed_by_reason": result.suppressed_by_reason, "exact": result.exact},
                  REACH_CACHE_SECONDS)
    return result
