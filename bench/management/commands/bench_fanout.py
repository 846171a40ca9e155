"""``manage.py bench_fanout``: fan-out throughput (members/s) for a segment of ``--members``.

Creates (once) a segment ``bench-<N>`` of N recipients, then a campaign to it whose sends are due
a day later, so what is measured is fan-out alone: snapshot, shard planning, keyset pages, suppression
pre-filter, bulk insert with deterministic ids. By default the pages run on the workers of a running
stack (``make run``: the standard worker consumes ``fanout``); ``--inline`` runs the same pages
in this process, one shard after another. The campaign is cancelled and its rows deleted afterwards
unless ``--keep``. Writes ``bench/results/fanout-<UTC timestamp>.json``.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from bench.db_cpu import backend_cpu
from bench.output import write_json
from campaigns import fanout, services
from campaigns.models import Campaign, CampaignShard, Segment, SegmentMember
from core import clock
from notifications.models import Notification
from preferences.models import Preferences, Recipient


class Command(BaseCommand):
    help = "Measure campaign fan-out throughput (members/s)."

    def add_arguments(self, parser):
        parser.add_argument("--members", type=int, default=100_000)
        parser.add_argument("--channel", choices=["sms", "email", "push"], default="email")
        parser.add_argument("--inline", action="store_true", help="run the pages in this process")
        parser.add_argument("--keep", action="store_true", help="keep the campaign's notifications")
        parser.add_argument("--timeout", type=float, default=600)

    def handle(self, *args, members, channel, inline, keep, timeout, **options):
        segment = self._segment(members)
        t0 = time.perf_counter()
        result = services.create_campaign(
            client=None, idempotency_key=None, name=f"bench fan-out {members}", segment=segment, channel=channel,
            title="Bench", body="Hello {{ first_name }}", scheduled_at=clock.now() + timedelta(days=1))
        campaign = result.campaign
        Campaign.objects.filter(pk=campaign.pk).update(fanout_at=clock.now())  # fan out now, send tomorrow
        cpu0, db_cpu0 = time.process_time(), backend_cpu()
        if inline:
            started = fanout.start_due_campaigns()
            if str(campaign.pk) not in started:
                raise CommandError("campaign did not start (another scheduled campaign ahead of it?)")
            for shard in CampaignShard.objects.filter(campaign=campaign).order_by("number"):
                while fanout.fan_out_page(str(campaign.pk), shard.number) == "page":
                    pass
        deadline = time.monotonic() + timeout
        while Campaign.objects.get(pk=campaign.pk).status not in ("sending", "completed"):
            if time.monotonic() > deadline:
                raise CommandError("fan-out did not finish in time (is `make run` running its workers?)")
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        cpu, db_cpu = time.process_time() - cpu0, backend_cpu()
        campaign.refresh_from_db()
        fanout_seconds = (campaign.fanned_out_at - campaign.started_at).total_seconds()
        report = {
            "measured_at": datetime.now(UTC).isoformat(), "members": members, "channel": channel,
            "mode": "inline" if inline else "workers", "shards": campaign.shards.count(),
            "page_size": settings.CAMPAIGNS["PAGE_SIZE"], "created": campaign.created_count,
            "fanout_seconds": round(fanout_seconds, 2),
            "members_per_second": round(members / fanout_seconds) if fanout_seconds else None,
            "wall_seconds_including_scheduler_pickup": round(elapsed, 2),
            # --inline: this process's CPU and its Postgres backend's (when on this machine) over the fan-out.
            "inline_cpu_seconds": round(cpu, 2) if inline else None,
            "inline_db_backend_cpu_seconds": round(db_cpu - db_cpu0, 2) if inline and db_cpu is not None else None,
        }
        if not keep:
            services.cancel_campaign(campaign.pk)
            Notification.objects.filter(campaign_id=campaign.pk).delete()
        path = write_json("fanout", report)
        self.stdout.write(json.dumps(report, indent=2))
        self.stdout.write(f"written to {path}")

    def _segment(self, members: int) -> Segment:
        segment_id = f"bench-{members}"
        segment, created = Segment.objects.get_or_create(segment_id=segment_id, defaults={"name": segment_id})
        if created or segment.members.count() != members:
            self.stdout.write(f"creating {members} recipients for {segment_id}…")
            prefix = uuid.uuid4().hex[:6]
            ids = [f"bench-{prefix}-{i:07d}" for i in range(members)]
            Recipient.objects.bulk_create(
                [Recipient(user_id=u, email=f"{u}@example.com", phone=f"+49151{i % 10**8:08d}",
                           timezone="Europe/Berlin", attributes={"first_name": f"U{i}"})
                 for i, u in enumerate(ids)], batch_size=5000)
            Preferences.objects.bulk_create([Preferences(recipient_id=u, opt_outs=["email"]) for u in ids[::20]],
                                            batch_size=5000)
            SegmentMember.objects.filter(segment=segment).delete()
            SegmentMember.objects.bulk_create([SegmentMember(segment=segment, recipient_id=u) for u in ids],
                                              batch_size=5000)
        return segment
