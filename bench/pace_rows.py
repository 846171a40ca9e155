"""A large campaign halfway through a local-time send, for measuring what the pace sampler's tick
costs (``manage.py bench_pace``; docs/PERFORMANCE.md, "The pace sampler").

The campaign's rows as they are ten hours into a twenty-hour local-time send: 45 % scheduled for
the zones still ahead, 1 % queued, the rest sent (a fifth of them delivered), suppressed or failed;
the rows finished more than ``HOT_HOURS`` ago archived to the history by the real archiver, and
``per_minute`` rows sent in the current minute (the sampler's latency reads those)."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta

from django.db import connection

from campaigns import services
from campaigns.models import Campaign, CampaignStatus
from core import partitions
from notifications.lifecycle import archive
from notifications.models import Notification
from preferences.models import Recipient

BATCH = 20_000
#: Out of every 100 rows: (status, reason, how many).
MIX = [("scheduled", "", 45), ("queued", "", 1), ("sent", "", 28), ("delivered", "", 16),
       ("suppressed", "opted_out_channel", 8), ("failed", "provider_rejected", 2)]


def _statuses() -> list[tuple[str, str]]:
    return [(status, reason) for status, reason, n in MIX for _ in range(n)]


def make_campaign(n: int, now: datetime, *, per_minute: int = 1_000, log=print) -> Campaign:
    """A sending local-time campaign of ``n`` rows at ``now`` (recipients ``pr1…prN``, made once and
    reused); its finished rows older than ``HOT_HOURS`` archived."""
    segment, _ = services.upsert_segment("pace-rows", name="Pace rows")
    started = now - timedelta(hours=10)
    c = Campaign.objects.create(segment=segment, channel="email", title="T", body="b", status=CampaignStatus.SENDING,
                                member_count=n, started_at=started, snapshot_at=started)
    t0 = time.perf_counter()
    for lo in range(0, n, BATCH):
        Recipient.objects.bulk_create([Recipient(user_id=f"pr{k}", email=f"pr{k}@example.com")
                                       for k in range(lo + 1, min(n, lo + BATCH) + 1)], ignore_conflicts=True)
    statuses = _statuses()
    sent_k = 0
    rows = []
    for k in range(n):
        status, reason = statuses[k % len(statuses)]
        sent = status in ("sent", "delivered")
        if sent and sent_k < per_minute:  # the current minute's sends
            sent_at = now.replace(second=0, microsecond=0) + timedelta(seconds=sent_k * 59 / per_minute)
        elif sent:  # spread over the ten hours before
            sent_at = started + timedelta(seconds=(k * 7919) % (10 * 3600))
        else:
            sent_at = None
        sent_k += sent
        changed = sent_at or (started + timedelta(seconds=(k * 104729) % (10 * 3600)))
        rows.append(Notification(
            id=uuid.uuid4(), campaign_id=c.pk, recipient_id=f"pr{k + 1}", channel="email", status=status,
            reason=reason, body="", sent_at=sent_at, queued_at=(sent_at - timedelta(seconds=2)) if sent_at else None,
            due_at=now + timedelta(seconds=(k * 31) % (10 * 3600)) if status == "scheduled" else None,
            created_at=started, updated_at=min(changed, now)))
        if len(rows) == BATCH:
            Notification.objects.bulk_create(rows)
            rows = []
    if rows:
        Notification.objects.bulk_create(rows)
    log(f"{n:,} rows made in {time.perf_counter() - t0:.0f} s")
    partitions.maintain(now)
    t0 = time.perf_counter()
    moved = archive.archive(now, limit=n)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE notifications_notification")
        cur.execute(f"ANALYZE {archive.HISTORY}")
    log(f"{moved:,} archived in {time.perf_counter() - t0:.0f} s")
    return c
