"""The database ``manage.py bench_pages`` measures (docs/PERFORMANCE.md, "Admin pages at scale"): the
history of bench/history.py, then one local-time campaign of ``campaign_recipients`` members that has
been sending for ``campaign_hours`` up to the fill's instant (its *anchor*), the provider health
page's last hour, and one recipient with a few thousand notifications over 40 days.

The campaign is made and fanned out by the platform's own code (``campaigns.services``,
``campaigns.fanout``) with the platform clock moved to its launch. Its members live in six zones
(:data:`ZONES`), each due at the campaign's wall time in their zone, smeared over ``campaign_hours``
(``spread_seconds``): at the anchor the European members' rows were released as they fell due and
sent first in, first out at a little under the rate they fell due (with the breaker's pause, a
backlog of minutes still ``queued``), the American ones are still ``scheduled``. Those moves
(release, send, receipt) are one SQL statement per minute from a plan table, with the rows'
attempts and timeline events; the send path itself is ``manage.py bench``'s subject. After each
minute's moves the clock is moved to that minute's sample instant and beat's own tasks run:
``campaigns.sample_pace`` (the pace chart's rows) and ``notifications.sample_provider_minutes``
(the provider health rows, beside a background of API single sends through bench/history_rows.py).
The last minute's attempts are left for the measured tick. The breaker's spells are written into
the sampler's rows as it would have written them: the breaker keeps its instants in Redis's own
time, which a replay of hours in minutes cannot move.

Recorded in ``bench_pages_fill``: the same request reuses the database; another one empties it and
fills anew. The pages are then measured with the clock pinned to the anchor (bench/pages.py).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from bench import history, seed
from bench.history_rows import HISTORY_TABLE, Filler, table_exists
from bench.runner import RESET_TABLES
from campaigns import fanout, services
from campaigns import tasks as campaign_tasks
from campaigns.models import Campaign, CampaignMinute, CampaignShard, Segment, SegmentMember
from core import clock
from core.redis_client import get_redis
from notifications import tasks as notification_tasks
from notifications.models import DeliveryAttempt, DeliveryEvent, Notification
from notifications.provider_minutes.models import ProviderMinute, RollupMark
from preferences.models import Preferences, Recipient
from providers.registry import provider_names

RECORD_TABLE = "bench_pages_fill"
SEGMENT = "bench-pages"
PLAN = "bench_pages_plan"
#: Members' zones, per cent: each wave is due at the campaign's wall time in its zone.
#: Berlin and Paris share their wall instant; America's come 6-9 hours later (still scheduled at the anchor).
ZONES = (("Europe/Berlin", 35), ("Europe/Paris", 25), ("America/New_York", 15), ("America/Chicago", 10),
         ("America/Denver", 5), ("America/Los_Angeles", 10))
#: Seconds into each minute the replay samples at: beat's last of its 15-s samples in the minute.
SAMPLE_SECOND = 45
#: The anchor is this many seconds into its minute: the newest pace sample 5 s old when measured.
ANCHOR_SECOND = 50
RECIPIENT_DAYS = 40
#: Breaker spells (channel whose first provider it is, minutes before the anchor, seconds open).
SPELLS = (("campaign", 40, 152), ("sms", 15, 40))
#: Campaign channels (those with delivery receipts): receipt kinds processed, delivered, bounce; the reason.
RECEIPTS = {"email": ("processed", "delivered", "bounce", "provider_bounced"),
            "sms": ("sent", "delivered", "undelivered", "provider_undelivered")}
_ATTEMPTS, _EVENTS, _LIVE = (DeliveryAttempt._meta.db_table, DeliveryEvent._meta.db_table,
                             Notification._meta.db_table)


@dataclass(frozen=True)
class Request:
    """What ``manage.py bench_pages`` fills (its options)."""

    days: int = 2
    per_day: int = 2_000_000
    campaign_recipients: int = 1_000_000
    campaign_hours: float = 3.0
    channel: str = "email"
    recipient_notifications: int = 3_000
    background_per_minute: int = 300


class PinnedClock:
    """The platform clock (``core.clock``) of this process moved by an offset file of its own, so
    ``pin(at)`` makes ``clock.now()`` read ``at`` now (and run on from it); ``close()`` restores."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="bench-pages-clock-")) / "offset"
        self.saved = settings.NOTIFY
        settings.NOTIFY = {**settings.NOTIFY, "CLOCK_OFFSET_FILE": str(self.path)}
        self.stamp = time.time_ns()

    def pin(self, at: datetime) -> None:
        self.path.write_text(repr((at - timezone.now()).total_seconds()))
        self.stamp += 1_000_000  # the clock re-reads the file when its mtime changes: make sure it does
        os.utime(self.path, ns=(self.stamp, self.stamp))

    def close(self) -> None:
        settings.NOTIFY = self.saved
        self.path.unlink(missing_ok=True)
        self.path.parent.rmdir()


# --- the record ----------------------------------------------------------------------------------
def recorded() -> dict | None:
    """The fill this database holds (request, anchor, campaign, recipient, rows, seconds), or None."""
    if not table_exists(RECORD_TABLE):
        return None
    with connection.cursor() as cur:
        cur.execute(f"SELECT request, anchor, campaign_id, recipient_id, rows, seconds FROM {RECORD_TABLE}")
        row = cur.fetchone()
    if row is None:
        return None
    request, rows = (v if isinstance(v, dict) else json.loads(v) for v in (row[0], row[4]))
    return {"request": request, "anchor": row[1], "campaign_id": str(row[2]), "recipient_id": row[3],
            "rows": rows, "seconds": row[5]}


def _write_record(request: Request, anchor: datetime, campaign_id, recipient_id: str, rows: dict,
                  seconds: float) -> None:
    with connection.cursor() as cur:
        cur.execute(f"CREATE TABLE IF NOT EXISTS {RECORD_TABLE} (request jsonb NOT NULL, anchor timestamptz NOT "
                    "NULL, campaign_id uuid NOT NULL, recipient_id text NOT NULL, rows jsonb NOT NULL, "
                    "seconds double precision NOT NULL)")
        cur.execute(f"DELETE FROM {RECORD_TABLE}")
        cur.execute(f"INSERT INTO {RECORD_TABLE} VALUES (%s, %s, %s, %s, %s, %s)",
                    [json.dumps(asdict(request)), anchor, campaign_id, recipient_id, json.dumps(rows), seconds])


def wipe() -> None:
    """Empty what a fill wrote (the history with it): the next fill starts from empty tables."""
    with connection.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {RECORD_TABLE}")
        cur.execute(f"DROP TABLE IF EXISTS {PLAN}")
        cur.execute(f"TRUNCATE {ProviderMinute._meta.db_table}, {RollupMark._meta.db_table}")
    history.wipe(RESET_TABLES)  # notifications, campaigns (their minutes), events, attempts, history, audit


# --- the fill ------------------------------------------------------------------------------------
def ensure(request: Request, progress: Callable[[str], None], refill: bool = False) -> dict:
    """The database of ``request``: reused when the record says so, else emptied and filled."""
    record = recorded()
    if record and record["request"] == asdict(request) and not refill:
        progress(f"pages: reusing the fill anchored at {record['anchor']:%Y-%m-%d %H:%M:%S} UTC")
        return {**record, "reused": True}
    if record or history.recorded():
        progress(f"pages: emptying the earlier fill ({'--refill' if refill else 'another request'})")
    wipe()
    started = time.perf_counter()
    history.ensure_history(request.days, request.per_day, RESET_TABLES, progress)
    fill_at = max(timezone.now(), history.recorded()["filled_at"])
    anchor = fill_at.replace(second=ANCHOR_SECOND, microsecond=0) + timedelta(minutes=1)
    pinned = PinnedClock()
    try:
        rows, campaign_id, recipient_id = Fill(request, anchor, pinned, progress).run()
    finally:
        pinned.close()
    seconds = time.perf_counter() - started
    _write_record(request, anchor, campaign_id, recipient_id, rows, seconds)
    progress(f"pages: filled in {seconds:.0f} s")
    return {**recorded(), "reused": False}


class Fill:
    """One fill of the campaign, its replay, the provider minutes and the recipient (see the module)."""

    def __init__(self, request: Request, anchor: datetime, pinned: PinnedClock,
                 progress: Callable[[str], None]) -> None:
        self.r, self.anchor, self.pinned, self.progress = request, anchor, pinned, progress
        self.launch = anchor - timedelta(hours=request.campaign_hours)
        self.provider = provider_names(request.channel)[0]
        self.rows: dict[str, int] = {}

    def run(self) -> tuple[dict[str, int], str, str]:
        get_redis().flushdb()  # this bench's own Redis database: breakers closed, no tasks
        members = self.members()
        recipient = members[0]  # a campaign member too
        self.rows["recipient_notifications"] = self.recipient(recipient)
        campaign = self.campaign()
        self.plan(campaign)
        self.replay(campaign)
        self.spells()
        with connection.cursor() as cur:
            cur.execute(f"DROP TABLE {PLAN}")
            for table in (_LIVE, HISTORY_TABLE, _ATTEMPTS, _EVENTS, CampaignMinute._meta.db_table,
                          ProviderMinute._meta.db_table, Recipient._meta.db_table, Preferences._meta.db_table,
                          SegmentMember._meta.db_table):
                if table_exists(table):
                    cur.execute(f"VACUUM (ANALYZE) {table}")
        get_redis().flushdb()  # the send tasks fan-out and the scheduler's stand-in published
        self.rows["campaign_notifications"] = Notification.objects.filter(campaign_id=campaign.pk).count()
        self.rows["campaign_minutes"] = CampaignMinute.objects.filter(campaign=campaign).count()
        self.rows["provider_minutes"] = ProviderMinute.objects.count()
        return self.rows, str(campaign.pk), recipient

    # --- members -------------------------------------------------------------------------------
    def members(self) -> list[str]:
        """``bp-…`` recipients in :data:`ZONES` (every 100th with a bounced address, every 50th opted out
        of email) and the segment of them; kept across fills while its description (what they are) and
        their count are the same, else written again (an existing recipient's zone updated)."""
        n = self.r.campaign_recipients
        ids = [f"bp-{i:07d}" for i in range(n)]
        what = (f"{n:,} members; zones {', '.join(f'{zone} {share} %' for zone, share in ZONES)}; every 100th "
                "bounced, every 50th opted out of email")
        segment, _ = Segment.objects.get_or_create(segment_id=SEGMENT, defaults={"name": "Bench pages members"})
        now = timezone.now()
        joined = now - timedelta(days=60)  # members before any launch: a list segment's snapshot is of added_at
        if segment.description == what and SegmentMember.objects.filter(
                segment=segment, added_at__lte=now - timedelta(days=30)).count() == n:
            return ids
        self.progress(f"pages: {n:,} members in {len(ZONES)} zones…")
        zones = [zone for zone, share in ZONES for _ in range(share)]
        with transaction.atomic():
            SegmentMember.objects.filter(segment=segment).delete()
            for start in range(0, n, seed.CHUNK):
                chunk = range(start, min(n, start + seed.CHUNK))
                rows = [{**seed.recipient_row(ids[i], i), "timezone": zones[i % 100],
                         "email_invalid_reason": "hard_bounce" if i % 100 == 99 else "",
                         "created_at": now, "updated_at": now} for i in chunk]
                seed.copy_rows(Recipient, rows)
                with connection.cursor() as cur:  # those of an earlier fill: their zone and address as now
                    cur.execute("UPDATE preferences_recipient r SET timezone = u.zone, email_invalid_reason = u.bad "
                                "FROM unnest(%s::text[], %s::text[], %s::text[]) AS u(id, zone, bad) WHERE "
                                "r.user_id = u.id AND (r.timezone <> u.zone OR r.email_invalid_reason <> u.bad)",
                                [[r["user_id"] for r in rows], [r["timezone"] for r in rows],
                                 [r["email_invalid_reason"] for r in rows]])
                seed.copy_rows(Preferences, ({"recipient_id": ids[i], "opt_outs": ["email"], "updated_at": now}
                                             for i in chunk if i % 50 == 7))
                seed.copy_rows(SegmentMember, ({"segment_id": SEGMENT, "recipient_id": ids[i], "added_at": joined}
                                               for i in chunk), conflict_free=True)
            Segment.objects.filter(pk=SEGMENT).update(description=what)
        with connection.cursor() as cur:
            cur.execute("ANALYZE preferences_recipient; ANALYZE preferences_preferences; "
                        "ANALYZE campaigns_segmentmember")
        return ids

    def recipient(self, user_id: str) -> int:
        """``recipient_notifications`` API and typed sends to ``user_id`` over :data:`RECIPIENT_DAYS`
        days before the anchor (history or live as the archiver leaves them); returns how many."""
        total = self.r.recipient_notifications
        filler = Filler(RECIPIENT_DAYS + 1, max(1, total // RECIPIENT_DAYS), self.anchor, self.progress)
        filler.prepare([user_id])
        filler.make_partitions()
        for day in range(RECIPIENT_DAYS):
            count = total // RECIPIENT_DAYS + (total % RECIPIENT_DAYS if day == RECIPIENT_DAYS - 1 else 0)
            events = (count * 3 // 10) // 2
            with transaction.atomic():
                filler.singles(self.anchor - timedelta(days=RECIPIENT_DAYS - day), count - 2 * events)
                filler.typed(self.anchor - timedelta(days=RECIPIENT_DAYS - day), events)
        written = filler.written()
        return written[_LIVE] + written.get(HISTORY_TABLE, 0)

    # --- the campaign --------------------------------------------------------------------------
    def campaign(self) -> Campaign:
        """Made and fanned out by the platform's code at the launch instant (clock moved there)."""
        self.pinned.pin(self.launch)
        wall = self.launch.astimezone(ZoneInfo(ZONES[0][0])).replace(second=0, microsecond=0)
        n = self.r.campaign_recipients
        campaign = services.create_campaign(
            client=None, idempotency_key=None, name=f"bench pages: {n:,} members at local time",
            segment=Segment.objects.get(pk=SEGMENT), channel=self.r.channel, title="Autumn sale",
            body="Hello {{ first_name }}, 20% off today", local_date=wall.date(), local_time=wall.time(),
            spread_seconds=round(self.r.campaign_hours * 3600)).campaign
        self.progress(f"pages: fanning out {n:,} members (launch {self.launch:%H:%M} UTC, clock moved)…")
        if str(campaign.pk) not in fanout.start_due_campaigns():
            raise RuntimeError(f"campaign {campaign.pk} did not start")
        for shard in CampaignShard.objects.filter(campaign=campaign).order_by("number"):
            while fanout.fan_out_page(str(campaign.pk), shard.number) == "page":
                pass
        campaign.refresh_from_db()
        self.fanned_out = clock.now()
        self.progress(f"pages: fanned out, {campaign.created_count:,} notifications ({campaign.status})")
        return campaign

    def plan(self, campaign: Campaign) -> None:
        """Each open row's due instant, send instant (first in, first out at 98 % of the rate rows fell
        due, paused by the breaker's spell: a backlog of minutes at the anchor) and outcome, by a hash
        of its id."""
        with connection.cursor() as cur:
            cur.execute(f"ANALYZE {_LIVE}")
            cur.execute(f"SELECT count(*) FROM {_LIVE} WHERE campaign_id = %s AND status IN ('scheduled', 'queued') "
                        "AND COALESCE(due_at, queued_at) <= %s", [campaign.pk, self.anchor])
            due = cur.fetchone()[0]
            rate = max(1.0, 0.98 * due / (self.anchor - self.launch).total_seconds())
            cur.execute(f"""
                CREATE TABLE {PLAN} AS
                WITH q AS (SELECT id, COALESCE(due_at, queued_at) AS due, abs(hashtext(id::text)) %% 1000 AS h,
                                  row_number() OVER (ORDER BY COALESCE(due_at, queued_at), id) AS i
                             FROM {_LIVE} WHERE campaign_id = %(c)s AND status IN ('scheduled', 'queued')),
                     k AS (SELECT *, extract(epoch FROM due) - i / %(rate)s AS k FROM q)
                SELECT id, due, h, i, false AS retried,
                       to_timestamp(i / %(rate)s + max(k) OVER (ORDER BY i)) + interval '1 second' AS send_at,
                       CASE WHEN h < 20 THEN 'suppressed' WHEN h < 25 THEN 'invalid' WHEN h < 35 THEN 'bounce'
                            WHEN h < 110 THEN 'sent' ELSE 'delivered' END AS outcome
                  FROM k""", {"c": campaign.pk, "rate": rate})
            cur.execute(f"ALTER TABLE {PLAN} ADD COLUMN final_at timestamptz")
            cur.execute(f"UPDATE {PLAN} SET final_at = send_at + make_interval(secs => 2 + h % 28)")
            start, seconds = self.spell(SPELLS[0])
            if start > self.fanned_out:  # the campaign provider's spell: sending pauses, 25 calls failed first
                cur.execute(f"UPDATE {PLAN} SET send_at = send_at + %(d)s, final_at = final_at + %(d)s "
                            "WHERE send_at >= %(s)s", {"s": start, "d": timedelta(seconds=seconds)})
                cur.execute(f"UPDATE {PLAN} SET retried = true WHERE id IN (SELECT id FROM {PLAN} WHERE send_at "
                            ">= %s AND outcome <> 'suppressed' ORDER BY send_at LIMIT 25)", [start])
            for column in ("due", "send_at", "final_at"):
                cur.execute(f"CREATE INDEX ON {PLAN} ({column})")
            cur.execute(f"ANALYZE {PLAN}")
        self.rate = rate
        self.progress(f"pages: {due:,} rows due by the anchor, sent at {rate:,.1f}/s")

    def spell(self, spell: tuple[str, int, int]) -> tuple[datetime, int]:
        return self.anchor - timedelta(minutes=spell[1], seconds=-7), spell[2]

    # --- the replay ----------------------------------------------------------------------------
    def replay(self, campaign: Campaign) -> None:
        """Minute by minute from the fan-out to the anchor: the rows' moves, the background sends,
        then beat's two samplers at the minute's sample instant (the provider one not in the last)."""
        first = self.fanned_out.replace(second=SAMPLE_SECOND, microsecond=0)
        first += timedelta(minutes=1) if first <= self.fanned_out else timedelta(0)
        last = self.anchor.replace(second=SAMPLE_SECOND)
        steps = [first + timedelta(minutes=k) for k in range(int((last - first).total_seconds() // 60) + 1)]
        background = Filler(1, 1, self.anchor, self.progress)
        background.prepare([f"bp-{i:07d}" for i in range(min(50_000, self.r.campaign_recipients))])
        lower = self.launch - timedelta(days=1)
        self.pinned.pin(self.fanned_out)
        notification_tasks.sample_provider_minutes()  # its first sample sets the mark: the replay's calls count
        self.progress(f"pages: replaying {len(steps)} minutes of sending and sampling…")
        for number, at in enumerate(steps, start=1):
            with transaction.atomic():
                self.moves(campaign, lower, at)
                background.now = at
                background.singles(at - timedelta(minutes=1), self.r.background_per_minute, 60)
            if number < len(steps):  # the last minute's attempts wait for the measured tick
                self.pinned.pin(at)
                notification_tasks.sample_provider_minutes()
            self.pinned.pin(at)
            campaign_tasks.sample_pace()
            lower = at
            if number % 30 == 0:
                self.progress(f"pages: replayed {number}/{len(steps)} minutes")
        written = background.written()
        self.rows["background_notifications"] = written[_LIVE] + written.get(HISTORY_TABLE, 0)

    def moves(self, campaign: Campaign, lower: datetime, upper: datetime) -> None:
        """The rows' moves with an instant in (lower, upper]: release (scheduled → queued), the
        provider call (queued → sent, or failed / suppressed), the final receipt (→ delivered / failed)."""
        processed, delivered, bounce, bounced = RECEIPTS[self.r.channel]
        # SendGrid: one message id per request of 500; Twilio: one per message (docs/PROVIDERS.md).
        message_id = ("substr(md5(%(c)s::text || ':' || (p.i / 500)::text), 1, 22)" if self.r.channel == "email"
                      else "'SM' || md5(p.id::text)")
        params = {"c": str(campaign.pk), "lo": lower, "hi": upper, "provider": self.provider,
                  "processed": f"receipt:{processed}", "delivered": f"receipt:{delivered}",
                  "bounce": f"receipt:{bounce}", "bounced": bounced}
        with connection.cursor() as cur:
            cur.execute(f"""
                WITH r AS (UPDATE {_LIVE} n SET status = 'queued', queued_at = p.due, due_at = NULL, updated_at = p.due
                             FROM {PLAN} p
                            WHERE n.id = p.id AND p.due > %(lo)s AND p.due <= %(hi)s AND n.status = 'scheduled'
                        RETURNING n.id, p.due)
                INSERT INTO {_EVENTS} (notification_id, kind, status, reason, detail, created_at)
                SELECT id, 'released', 'queued', '', '', due FROM r""", params)
            cur.execute(f"""
                WITH s AS (
                    UPDATE {_LIVE} n SET
                           status = CASE p.outcome WHEN 'suppressed' THEN 'suppressed' WHEN 'invalid' THEN 'failed'
                                    ELSE 'sent' END,
                           reason = CASE p.outcome WHEN 'suppressed' THEN 'opted_out_category'
                                    WHEN 'invalid' THEN 'contact_invalid' ELSE '' END,
                           attempts = CASE WHEN p.outcome = 'suppressed' THEN 0 ELSE 1 + p.retried::int END,
                           claims = CASE WHEN p.outcome = 'suppressed' THEN 0 ELSE 1 + p.retried::int END,
                           first_attempt_at = CASE WHEN p.outcome = 'suppressed' THEN NULL ELSE p.send_at END,
                           provider = CASE WHEN p.outcome = 'suppressed' THEN '' ELSE %(provider)s END,
                           provider_message_id = CASE WHEN p.outcome IN ('suppressed', 'invalid') THEN ''
                                                 ELSE {message_id} END,
                           sent_at = CASE WHEN p.outcome IN ('suppressed', 'invalid') THEN NULL ELSE p.send_at END,
                           updated_at = p.send_at
                      FROM {PLAN} p
                     WHERE n.id = p.id AND p.send_at > %(lo)s AND p.send_at <= %(hi)s AND n.status = 'queued'
                 RETURNING n.id, p.outcome, p.send_at, p.retried, p.h, n.provider_message_id),
                tries AS (
                    INSERT INTO {_ATTEMPTS} (notification_id, number, provider, outcome, error_code, error_message,
                                             http_status, latency_ms, provider_message_id, created_at)
                    SELECT id, 1 + retried::int, %(provider)s,
                           CASE outcome WHEN 'invalid' THEN 'contact_invalid' ELSE 'accepted' END,
                           CASE outcome WHEN 'invalid' THEN 'invalid_contact' ELSE '' END, '',
                           CASE outcome WHEN 'invalid' THEN 400 ELSE 202 END, 20 + h %% 380, provider_message_id,
                           send_at
                      FROM s WHERE outcome <> 'suppressed'
                    UNION ALL
                    SELECT id, 1, %(provider)s, 'transient', '503', 'bench: the provider failed', 503, 30000, '',
                           send_at - interval '150 seconds'
                      FROM s WHERE retried)
                INSERT INTO {_EVENTS} (notification_id, kind, status, reason, detail, dedup_key, created_at)
                SELECT id, 'suppressed', 'suppressed', 'opted_out_category', '', NULL, send_at
                  FROM s WHERE outcome = 'suppressed'
                UNION ALL
                SELECT id, %(processed)s, '', '', '', %(provider)s || ':' || md5(id::text || 'p'),
                       send_at + interval '1 second'
                  FROM s WHERE outcome IN ('sent', 'delivered', 'bounce')""", params)
            cur.execute(f"""
                WITH f AS (
                    UPDATE {_LIVE} n SET status = CASE p.outcome WHEN 'bounce' THEN 'failed' ELSE 'delivered' END,
                           reason = CASE p.outcome WHEN 'bounce' THEN %(bounced)s ELSE '' END,
                           delivered_at = CASE p.outcome WHEN 'bounce' THEN NULL ELSE p.final_at END,
                           receipt_at = p.final_at, updated_at = p.final_at
                      FROM {PLAN} p
                     WHERE n.id = p.id AND p.final_at > %(lo)s AND p.final_at <= %(hi)s AND n.status = 'sent'
                       AND p.outcome IN ('delivered', 'bounce')
                 RETURNING n.id, p.outcome, p.final_at)
                INSERT INTO {_EVENTS} (notification_id, kind, status, reason, detail, dedup_key, created_at)
                SELECT id, CASE outcome WHEN 'bounce' THEN %(bounce)s ELSE %(delivered)s END, '', '', '',
                       %(provider)s || ':' || md5(id::text || 'f'), final_at
                  FROM f""", params)

    def spells(self) -> None:
        """Each breaker spell of :data:`SPELLS` into its provider's sampled rows, as ``sample_breaker``
        writes it: open in the samples inside it (the first counting the opening), then began and
        ended in the first sample after it."""
        for spell in SPELLS:
            channel = self.r.channel if spell[0] == "campaign" else spell[0]
            provider = provider_names(channel)[0]
            began, seconds = self.spell(spell)
            ended = began + timedelta(seconds=seconds)
            minute = began.replace(second=0, microsecond=0)
            opened = False
            while True:
                sample = minute.replace(second=SAMPLE_SECOND)
                if sample >= began:
                    still_open = sample < ended
                    ProviderMinute.objects.filter(provider=provider, minute=minute).update(
                        breaker_state="open" if still_open else "closed", breaker_opened=0 if opened else 1,
                        spell_began=began, spell_ended=None if still_open else ended)
                    opened = True
                    if not still_open:
                        break
                minute += timedelta(minutes=1)
