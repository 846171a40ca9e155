"""The bulk recompute of every recipient's send-time profile (beat, daily; ``manage.py
compute_send_times``): one INSERT … SELECT over the engagement receipts of the last
``SEND_TIME["HISTORY_DAYS"]`` days, then one DELETE of the profiles it did not renew. Why one
engagement per notification, the recipient's current zone and what it costs: docs/SEND_TIME.md."""

from __future__ import annotations

import zoneinfo
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction

from core import clock
from notifications.app_receipts import KIND_PREFIX
from notifications.records import EMAIL_OPENED_KINDS
from notifications.send_time.rule import HOURS
from preferences.validation import stored_zone

#: The receipts that count as an engagement: the app's ``opened`` and an email's open or click.
ENGAGEMENT_KINDS = (f"{KIND_PREFIX}opened", *EMAIL_OPENED_KINDS)

_COUNTS = ", ".join(f"count(*) FILTER (WHERE hour = {h})::int" for h in range(HOURS))
# The smoothed score of hour h (1-based array c): c[h] + (c[h-1] + c[h+1]) / 2 around the clock (rule.smooth).
_SCORE = "c[s.h] + (c[mod(s.h + 22, 24) + 1] + c[mod(s.h, 24) + 1]) / 2.0"
BEST_HOUR_SQL = f"""(SELECT s.h - 1 FROM generate_series(1, 24) AS s(h)
                    ORDER BY {_SCORE} DESC, s.h LIMIT 1)"""

_RECOMPUTE = f"""
WITH valid(name) AS (SELECT unnest(%(zones)s::text[]) INTERSECT SELECT name FROM pg_timezone_names),
first_engagement AS (
    SELECT n.recipient_id, min(e.created_at) AS at
      FROM notifications_deliveryevent e
      JOIN notifications_notificationrecord n ON n.id = e.notification_id
     WHERE e.created_at >= %(since)s AND e.kind = ANY(%(kinds)s)
       AND n.created_at >= %(since)s AND (n.archived_at IS NULL OR n.archived_at >= %(since)s)
     GROUP BY e.notification_id, n.recipient_id),
local AS (
    SELECT f.recipient_id,
           extract(hour FROM f.at AT TIME ZONE coalesce(v.name, %(default)s))::int AS hour
      FROM first_engagement f
      JOIN preferences_recipient r ON r.user_id = f.recipient_id
      LEFT JOIN valid v ON v.name = r.timezone
     WHERE r.erased_at IS NULL OR f.at > r.erased_at),
profile AS (
    SELECT recipient_id, ARRAY[{_COUNTS}] AS c, count(*)::int AS events
      FROM local GROUP BY recipient_id HAVING count(*) >= %(min_events)s)
INSERT INTO notifications_sendtimeprofile (recipient_id, counts, events, best_hour, computed_at)
SELECT recipient_id, c, events, {BEST_HOUR_SQL}, %(now)s FROM profile
ON CONFLICT (recipient_id) DO UPDATE
   SET counts = EXCLUDED.counts, events = EXCLUDED.events, best_hour = EXCLUDED.best_hour,
       computed_at = EXCLUDED.computed_at
"""


@dataclass(frozen=True)
class Recomputed:
    profiles: int  # recipients with history now
    dropped: int   # profiles of recipients whose history fell under the minimum


def _valid_zones() -> list[str]:
    """Every zone name the one zone rule accepts (``stored_zone``); others read as the default zone."""
    return sorted(z for z in zoneinfo.available_timezones() if not stored_zone(z)[1])


def recompute() -> Recomputed:
    """Renew every profile from the engagements since ``HISTORY_DAYS`` ago; drop the rest."""
    conf = settings.SEND_TIME
    now = clock.now()
    params = {"zones": _valid_zones(), "since": now - timedelta(days=conf["HISTORY_DAYS"]),
              "kinds": list(ENGAGEMENT_KINDS), "default": settings.CAMPAIGNS["DEFAULT_TIMEZONE"],
              "min_events": conf["MIN_EVENTS"], "now": now}
    with transaction.atomic(), connection.cursor() as cur:
        # Its two hash aggregates spilled to disk at 100 k members with the default 4 MB (16 s of
        # Postgres CPU; 12.5 s with this): for this statement only, on the maintenance worker.
        cur.execute("SET LOCAL work_mem = '64MB'")
        cur.execute(_RECOMPUTE, params)
        profiles = cur.rowcount
        cur.execute("DELETE FROM notifications_sendtimeprofile WHERE computed_at <> %s", [now])
        return Recomputed(profiles=profiles, dropped=cur.rowcount)
