"""``manage.py bench_send_time``: what send-time optimisation costs (bench/send_time.py): the daily
recompute over ``--members`` recipients' ``--days`` of email history, and fan-out CPU per member
without and with the option. Writes ``bench/results/send-time-<UTC timestamp>.json`` (not in git)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from django.core.management.base import BaseCommand

from bench import send_time
from bench.output import write_json
from core import clock


class Command(BaseCommand):
    help = "Measure the send-time recompute and the option's fan-out cost (run on a database of its own)."

    def add_arguments(self, parser):
        parser.add_argument("--members", type=int, default=20_000)
        parser.add_argument("--days", type=int, default=90)
        parser.add_argument("--per-recipient", type=int, default=30, help="emails per member over --days")
        parser.add_argument("--open-share", type=float, default=0.3)
        parser.add_argument("--no-fanout", action="store_true", help="measure the recompute only")

    def handle(self, *args, members, days, per_recipient, open_share, no_fanout, **options):
        fill = send_time.fill(members, days, per_recipient, open_share, clock.now(), self.stdout.write)
        report = {"measured_at": datetime.now(UTC).isoformat(), "members": members, "days": days,
                  "per_recipient": per_recipient, "open_share": open_share, "fill": fill,
                  "size": send_time.database_size(),
                  "recompute": [send_time.measure_recompute(members) for _ in range(2)]}
        if not no_fanout:
            report["fanout"] = [send_time.measure_fanout(members, None),
                                send_time.measure_fanout(members, send_time.OPTION)]
        path = write_json("send-time", report)
        self.stdout.write(json.dumps(report, indent=2))
        self.stdout.write(f"written to {path}")
