"""What send-time optimisation costs (``manage.py bench_send_time``; docs/SEND_TIME.md, "What it costs").

Seeds, once per size, the segment ``bench-seg-<N>`` (bench/seed.py) and ``days`` of email history for
its members: ``per_recipient`` delivered notifications each, spread evenly over the days, with a
``receipt:delivered`` each and a ``receipt:open`` for ``open_share`` of them, at an hour near the
member's own habit (a hash of the user id picks it; ±1 hour of noise). Then measures:

* the recompute (``notifications/send_time/compute.py``): wall seconds, and the CPU of this process
  and of its Postgres backend (``/proc``, when the server runs on this machine), per recipient;
* fan-out of one local-time email campaign to the segment, pages run in this process, without and
  with ``send_time`` (nearly every member has a profile here): CPU-µs per member of this process and
  of its backend.

Run it on a database of its own (``DATABASE_URL``): the fill stays (reused by the next run of the
same size); the campaigns and their rows are deleted.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from datetime import time as wall_time

from django.db import connection, transaction
from django.db.models import Count

from bench import seed
from bench.db_cpu import backend_cpu
from bench.history_rows import _Table, table_exists
from campaigns import fanout, services
from campaigns.models import Campaign, CampaignShard, SendTimeMember
from core import clock, partitions
from notifications.models import DeliveryEvent, Notification
from notifications.send_time.compute import recompute

OPTION = {"window": {"start": "08:00", "end": "22:00"}, "holdout_percent": 10}
BLOCK = 20_000  # notifications per COPY round


def habit(user_id: str) -> int:
    """A member's usual local hour (Europe/Berlin, the bench recipients' zone): 07–21."""
    return 7 + int.from_bytes(hashlib.blake2b(user_id.encode(), digest_size=4).digest(), "big") % 15


def history_rows() -> int:
    return Notification.objects.filter(reason="bench_send_time").count()


def fill(members: int, days: int, per_recipient: int, open_share: float, now: datetime,
         progress: Callable[[str], None]) -> dict[str, int]:
    """The segment and its history (skipped when the history of this size is there)."""
    seed.ensure_segment(members, progress)
    want = members * per_recipient
    if history_rows() == want:
        return {"notifications": want, "reused": 1}
    with connection.cursor() as cur:  # another size's fill: in SQL (the ORM would load every row to cascade)
        cur.execute("""DELETE FROM notifications_deliveryevent WHERE notification_id IN
                       (SELECT id FROM notifications_notification WHERE reason = 'bench_send_time')""")
        cur.execute("DELETE FROM notifications_notification WHERE reason = 'bench_send_time'")
    _partitions(now, days)
    rnd = random.Random(f"{members}x{per_recipient}")
    notes, events = _Table(Notification), _Table(DeliveryEvent)
    users = seed.member_ids(members)
    zone_offset = 1  # Berlin in winter is enough for a cost figure: the hour only shapes the histogram
    rows: list[list] = []
    ev: list[list] = []
    opened = 0
    span = timedelta(days=days) - timedelta(hours=1)
    for k in range(want):
        user = users[k % members]
        created = now - span + span * ((k // members + rnd.random()) / per_recipient)
        nid = f"{rnd.getrandbits(128):032x}"
        nid = f"{nid[:8]}-{nid[8:12]}-4{nid[13:16]}-8{nid[17:20]}-{nid[20:]}"
        delivered = created + timedelta(seconds=rnd.uniform(1, 30))
        rows.append(notes.row(id=nid, recipient_id=user, channel="email", status="delivered",
                              reason="bench_send_time", provider="sendgrid", queued_at=created, sent_at=created,
                              delivered_at=delivered, attempts=1, claims=1, created_at=created,
                              updated_at=delivered))
        ev.append(events.row(notification_id=nid, kind="receipt:delivered", created_at=delivered,
                             dedup_key=f"sendgrid:{nid}:delivered"))
        if rnd.random() < open_share:
            hour = (habit(user) + rnd.choice((-1, 0, 0, 0, 1)) - zone_offset) % 24
            day = delivered.replace(hour=0, minute=0, second=0, microsecond=0)
            at = day + timedelta(hours=hour, minutes=rnd.uniform(0, 59))
            if at < delivered:
                at += timedelta(days=1)
            if at < now:
                ev.append(events.row(notification_id=nid, kind="receipt:open", created_at=at,
                                     dedup_key=f"sendgrid:{nid}:open"))
                opened += 1
        if len(rows) >= BLOCK or k == want - 1:
            with transaction.atomic():
                notes.copy(rows)
                events.copy(ev)
            rows, ev = [], []
            progress(f"history: {notes.count:,}/{want:,} notifications")
    with connection.cursor() as cur:
        cur.execute("ANALYZE notifications_notification; ANALYZE notifications_deliveryevent")
    return {"notifications": notes.count, "events": events.count, "opened": opened, "reused": 0}


def _partitions(now: datetime, days: int) -> None:
    """The day partitions over the fill's days, made before the COPY (never through DEFAULT)."""
    first = (now - timedelta(days=days)).date()
    wanted = [first + timedelta(days=k) for k in range((now.date() - first).days + 1)]
    for table in partitions.registry():
        if table_exists(table):
            column, have = partitions.key_column(table), set(partitions.days(table))
            for day in wanted:
                if day not in have:
                    partitions.create_day(table, column, day)


def measure_recompute(members: int) -> dict:
    cpu0, db0, t0 = time.process_time(), backend_cpu(), time.perf_counter()
    run = recompute()
    wall, cpu, db = time.perf_counter() - t0, time.process_time() - cpu0, backend_cpu()
    return {"profiles": run.profiles, "dropped": run.dropped, "wall_seconds": round(wall, 2),
            "wall_us_per_recipient": round(wall / members * 1e6, 1),
            "process_cpu_seconds": round(cpu, 3),
            "db_backend_cpu_seconds": None if db is None or db0 is None else round(db - db0, 2),
            "db_backend_cpu_us_per_recipient": None if db is None or db0 is None
            else round((db - db0) / members * 1e6, 1)}


def measure_fanout(members: int, send_time: dict | None) -> dict:
    """One local-time email campaign to ``bench-seg-<members>``, fanned out in this process."""
    segment = seed.ensure_segment(members)[0]
    day = (clock.now() + timedelta(days=2)).date()
    campaign = services.create_campaign(
        client=None, idempotency_key=None, name=f"bench send-time {members}", segment=segment, channel="email",
        title="Bench", body="Hello {{ first_name }}", local_date=day, local_time=wall_time(18),
        send_time=send_time).campaign
    Campaign.objects.filter(pk=campaign.pk).update(fanout_at=clock.now())
    cpu0, db0, t0 = time.process_time(), backend_cpu(), time.perf_counter()
    if str(campaign.pk) not in fanout.start_due_campaigns():
        raise RuntimeError("the bench campaign did not start (another campaign due ahead of it?)")
    for shard in CampaignShard.objects.filter(campaign=campaign).order_by("number"):
        while fanout.fan_out_page(str(campaign.pk), shard.number) == "page":
            pass
    wall, cpu, db = time.perf_counter() - t0, time.process_time() - cpu0, backend_cpu()
    created = Notification.objects.filter(campaign_id=campaign.pk).count()
    groups = dict(SendTimeMember.objects.filter(campaign=campaign).values_list("group").annotate(n=Count("id"))
                  .order_by())
    Notification.objects.filter(campaign_id=campaign.pk).delete()
    Campaign.objects.filter(pk=campaign.pk).delete()
    return {"send_time": send_time is not None, "created": created, "groups": groups,
            "wall_seconds": round(wall, 2), "cpu_us_per_member": round(cpu / members * 1e6, 1),
            "db_backend_cpu_us_per_member": None if db is None or db0 is None
            else round((db - db0) / members * 1e6, 1)}


def database_size() -> dict[str, str]:
    with connection.cursor() as cur:
        cur.execute("""SELECT pg_size_pretty(pg_database_size(current_database())),
                              (SELECT count(*) FROM notifications_notificationrecord),
                              (SELECT count(*) FROM notifications_deliveryevent)""")
        size, notes, events = cur.fetchone()
    return {"database": size, "notifications": f"{notes:,}", "delivery_events": f"{events:,}"}
