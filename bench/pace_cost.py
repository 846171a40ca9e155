"""What the pace sampler costs (``manage.py bench_pace``; docs/PERFORMANCE.md, "The pace sampler").

- :func:`tick_cost`: beat's tick on a campaign of many rows (:func:`bench.pace_rows.make_campaign`),
  as it was (a full count of the campaign's rows and the latency query over all of them by
  ``campaign_id``) and as it is (:func:`campaigns.pace.sample_due`: the changes since the last tick,
  the rows sent this minute, the last scheduled row), with ``per_tick`` rows moved between ticks.
- :func:`write_cost`: what the tally's triggers and the pace's two indexes add to the send path:
  Postgres backend CPU per notification of a local-time campaign's real fan-out pages, the
  scheduler's release, the claim and the record (``notifications.lifecycle.send``) and a receipt's
  UPDATE, in batches as the standard tier runs them, and per statement of a high-tier send's claim
  and record (batches of one, no campaign), with them and without them in alternation.

CPU is the Postgres backend's (``bench.db_cpu``: this connection's, so the tick's figures are taken
with parallel query off, where one backend does all the work; wall times with the server's defaults).
Run it on a database of its own: the write part drops and rebuilds the two indexes.
"""

from __future__ import annotations

import statistics
import time
import uuid
from collections.abc import Callable
from datetime import timedelta

from django.db import connection, transaction

from bench import seed
from bench.db_cpu import backend_cpu
from bench.send_time import wall_time
from campaigns import fanout, pace, services
from campaigns.models import Campaign, CampaignShard, CampaignTally
from campaigns.selectors import counted_rows, counts_of
from core import clock
from notifications.lifecycle import send
from notifications.models import Notification, NotificationRecord

TRIGGERS = [("notifications_notification", "campaigns_tally_inserted"),
            ("notifications_notification", "campaigns_tally_updated"),
            ("notifications_notificationhistory", "campaigns_tally_updated")]
INDEXES = ("notification_campaign_sent_idx", "notification_campaign_due_idx")
BATCH = 500

#: The tick's latency query before: every row of the campaign by campaign_id, live and archived.
OLD_LATENCY_SQL = f"""
SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.95) WITHIN GROUP (ORDER BY ms)
  FROM (SELECT GREATEST(0, extract(epoch FROM sent_at - COALESCE(queued_at, created_at)) * 1000) AS ms
          FROM {NotificationRecord._meta.db_table}
         WHERE campaign_id = %s AND sent_at >= %s AND sent_at <= %s) AS sent
"""


def _measure(step: Callable[[], None]) -> tuple[float, float]:
    """``(wall ms, Postgres backend CPU ms)`` of ``step``."""
    t0, c0 = time.perf_counter(), backend_cpu() or 0.0
    step()
    return (time.perf_counter() - t0) * 1000, ((backend_cpu() or 0.0) - c0) * 1000


def _median(values) -> float:
    return round(statistics.median(values), 1)


def _mean(values) -> float:
    return round(statistics.mean(values), 1)


def _set_parallel(on: bool) -> None:
    with connection.cursor() as cur:
        cur.execute("RESET max_parallel_workers_per_gather" if on else "SET max_parallel_workers_per_gather = 0")


def _old_tick(campaign: Campaign) -> None:
    now = clock.now()
    counts_of(counted_rows(campaign.pk), campaign)  # the full count
    with connection.cursor() as cur:
        cur.execute(OLD_LATENCY_SQL, [campaign.pk, now.replace(second=0, microsecond=0), now])


def _move(campaign: Campaign, n: int) -> None:
    """What a tick of a long send sees change: ``n`` rows released, ``n`` sent, ``n // 2`` delivered."""
    now = clock.now()
    with connection.cursor() as cur:
        for old, new, extra in (("sent", "delivered", "delivered_at = %(now)s"),
                                ("queued", "sent", "sent_at = %(now)s, queued_at = %(now)s - interval '2 s'"),
                                ("scheduled", "queued", "queued_at = %(now)s, due_at = NULL")):
            cur.execute(f"""UPDATE notifications_notification SET status = %(new)s, updated_at = %(now)s, {extra}
                             WHERE id IN (SELECT id FROM notifications_notification
                                           WHERE campaign_id = %(c)s AND status = %(old)s LIMIT %(n)s)""",
                        {"new": new, "old": old, "now": now, "c": campaign.pk,
                         "n": n // 2 if new == "delivered" else n})


def tick_cost(campaign: Campaign, *, ticks: int, per_tick: int, log: Callable[[str], None]) -> dict:
    """Before and after, each ``ticks`` times: wall ms (server defaults; the median) and Postgres CPU ms
    (serial plans; the mean)."""
    out: dict = {"rows": NotificationRecord.objects.filter(campaign_id=campaign.pk).count(), "per_tick": per_tick}
    for parallel in (True, False):
        _set_parallel(parallel)
        key = "wall_ms" if parallel else "cpu_ms"
        before = [_measure(lambda: _old_tick(campaign)) for _ in range(ticks)]
        CampaignTally.objects.filter(campaign=campaign).delete()
        first = _measure(pace.sample_due)
        after = []
        for _ in range(ticks):
            _move(campaign, per_tick)
            after.append(_measure(pace.sample_due))
        # Wall: the median; CPU: the mean (the kernel counts it in 10 ms ticks).
        pick, mid = (0, _median) if parallel else (1, _mean)
        out.setdefault("before", {})[key] = mid(m[pick] for m in before)
        out.setdefault("first_tick", {})[key] = round(first[pick], 1)
        out.setdefault("after", {})[key] = mid(m[pick] for m in after)
        log(f"tick ({key}): before {out['before'][key]}, first {out['first_tick'][key]}, after {out['after'][key]}")
    _set_parallel(True)
    return out


def _set_mode(on: bool) -> None:
    """The tally's triggers and the pace's indexes present (``on``) or absent."""
    with connection.cursor() as cur, connection.schema_editor() as editor:
        for table, trigger in TRIGGERS:
            cur.execute(f"ALTER TABLE {table} {'ENABLE' if on else 'DISABLE'} TRIGGER {trigger}")
        for index in Notification._meta.indexes:
            if index.name in INDEXES:
                cur.execute(f"DROP INDEX IF EXISTS {index.name}")
                if on:
                    cur.execute(str(index.create_sql(Notification, editor)))


def _fan_out(segment, day) -> Campaign:
    campaign = services.create_campaign(
        client=None, idempotency_key=None, name="bench pace writes", segment=segment, channel="email",
        title="Bench", body="Hello {{ first_name }}", local_date=day, local_time=wall_time(18)).campaign
    Campaign.objects.filter(pk=campaign.pk).update(fanout_at=clock.now())
    if str(campaign.pk) not in fanout.start_due_campaigns():
        raise RuntimeError("the bench campaign did not start (another campaign due ahead of it?)")
    for shard in CampaignShard.objects.filter(campaign=campaign).order_by("number"):
        while fanout.fan_out_page(str(campaign.pk), shard.number) == "page":
            pass
    return campaign


def _send_path(campaign: Campaign, stages: dict) -> int:
    """Release, claim, record and deliver ``campaign``'s scheduled rows in batches; CPU ms per stage."""
    with connection.cursor() as cur:  # due long ago: the scheduler takes them before any other row
        cur.execute("UPDATE notifications_notification SET due_at = '2000-01-01' WHERE campaign_id = %s "
                    "AND status = 'scheduled'", [campaign.pk])
    left = Notification.objects.filter(campaign_id=campaign.pk, status="scheduled").count()
    now = clock.now()

    def release():
        nonlocal left
        while left > 0:
            with transaction.atomic():
                left -= len(send.release_due(now, min(BATCH, left)))

    stages["release"].append(_measure(release)[1])
    ids = list(Notification.objects.filter(campaign_id=campaign.pk, status="queued").values_list("id", flat=True))
    claimed: list = []

    def claim():
        for k in range(0, len(ids), BATCH):
            with transaction.atomic():
                claimed.extend(send.claim(ids[k:k + BATCH], now + timedelta(minutes=5), now))

    def record():
        for k in range(0, len(claimed), BATCH):
            batch = claimed[k:k + BATCH]
            with transaction.atomic():
                send.sent(now, "sendgrid", [r[0] for r in batch], [r[1] for r in batch],
                          [f"m-{r[0]}" for r in batch], ["" for _ in batch])

    def deliver():
        with connection.cursor() as cur:
            for k in range(0, len(ids), BATCH):
                cur.execute("UPDATE notifications_notification SET status = 'delivered', delivered_at = %s, "
                            "updated_at = %s WHERE id = ANY(%s) AND status = 'sent'", [now, now, ids[k:k + BATCH]])

    for name, step in (("claim", claim), ("record", record), ("receipt", deliver)):
        stages[name].append(_measure(step)[1])
    return len(ids)


def _high_tier(recipient_id: str, n: int) -> float:
    """CPU ms of ``n`` sends of one (no campaign): the claim and the record, each a statement of one row."""
    rows = Notification.objects.bulk_create([Notification(id=uuid.uuid4(), recipient_id=recipient_id, channel="sms",
                                                          priority="high", body="b", status="queued")
                                             for _ in range(n)])
    now = clock.now()

    def sends():
        for row in rows:
            with transaction.atomic():
                (claim,) = send.claim([row.pk], now + timedelta(minutes=1), now)
                send.sent(now, "twilio", [row.pk], [claim[1]], [f"m-{row.pk}"], [""])

    cpu = _measure(sends)[1]
    Notification.objects.filter(pk__in=[r.pk for r in rows]).delete()
    return cpu


def write_cost(members: int, *, rounds: int, singles: int, log: Callable[[str], None]) -> dict:
    """Postgres CPU µs per notification (per statement for the high tier's), without and with."""
    segment = seed.ensure_segment(members, log)[0]
    recipient_id = segment.members.values_list("recipient_id", flat=True).first()
    day = (clock.now() + timedelta(days=2)).date()
    found: dict = {mode: {s: [] for s in ("fanout", "release", "claim", "record", "receipt", "high_tier")}
                   for mode in ("without", "with")}
    try:
        for r in range(rounds):
            for mode in ("without", "with"):
                _set_mode(mode == "with")
                stages = found[mode]
                campaign: Campaign | None = None

                def fan():
                    nonlocal campaign
                    campaign = _fan_out(segment, day)

                stages["fanout"].append(_measure(fan)[1])
                assert campaign is not None
                _send_path(campaign, stages)
                stages["high_tier"].append(_high_tier(recipient_id, singles))
                Notification.objects.filter(campaign_id=campaign.pk).delete()
                Campaign.objects.filter(pk=campaign.pk).delete()
                with connection.cursor() as cur:
                    cur.execute("VACUUM ANALYZE notifications_notification")
                log(f"round {r + 1} {mode}: " + ", ".join(f"{k} {v[-1]:.0f} ms" for k, v in stages.items()))
    finally:
        _set_mode(True)
    per = {"members": members, "rounds": rounds, "high_tier_sends": singles}
    for mode, stages in found.items():
        per[mode] = {k: _mean(ms * 1000 / (singles * 2 if k == "high_tier" else members) for ms in v)
                     for k, v in stages.items()}
        per[mode]["send_path_total"] = round(sum(v for k, v in per[mode].items() if k != "high_tier"), 1)
    return per


def sizes(campaign: Campaign | None) -> dict:
    """The database, the notification table and what the pace added, pretty-printed."""
    with connection.cursor() as cur:
        cur.execute("""SELECT pg_size_pretty(pg_database_size(current_database())),
                              pg_size_pretty(pg_total_relation_size('notifications_notification')),
                              pg_size_pretty(pg_relation_size('notification_campaign_sent_idx')),
                              pg_size_pretty(pg_relation_size('notification_campaign_due_idx')),
                              pg_size_pretty(pg_relation_size('notification_campaign_open_idx')),
                              pg_size_pretty(pg_total_relation_size('campaigns_campaigntally')
                                             + pg_total_relation_size('campaigns_campaigntallychange'))""")
        names = ("database", "notifications_live_with_indexes", "campaign_sent_idx", "campaign_due_idx",
                 "campaign_open_idx (for scale)", "tally_tables")
        return dict(zip(names, cur.fetchone(), strict=True))
