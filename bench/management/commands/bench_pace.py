"""``manage.py bench_pace``: what a campaign's pace costs (bench/pace_cost.py): beat's tick on a campaign
of ``--rows`` rows before and after (a full count then, the changes since the last tick now), and
what the tally's triggers and the pace's indexes add to the send path, and what reading its counts costs
(the admin list, the API detail: bench/pace_reads.py). Run it on a database of its
own (its name must contain ``bench`` or ``scratch``): the write part drops and rebuilds two indexes.
Writes ``bench/results/pace-<UTC timestamp>.json`` (not in git)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError
from django.db import connection

from bench import pace_cost, pace_reads
from bench.output import write_json
from bench.pace_rows import make_campaign
from campaigns.models import Campaign
from core import clock


class Command(BaseCommand):
    help = "Measure the pace sampler's tick and its cost on the send path (on a database of its own)."

    def add_arguments(self, parser):
        parser.add_argument("--rows", type=int, default=1_000_000, help="the sampled campaign's rows")
        parser.add_argument("--ticks", type=int, default=10)
        parser.add_argument("--per-tick", type=int, default=250, help="rows released, sent (and half delivered) "
                                                                        "between two ticks")
        parser.add_argument("--members", type=int, default=20_000, help="the write part's campaign")
        parser.add_argument("--rounds", type=int, default=3)
        parser.add_argument("--singles", type=int, default=1_000, help="high-tier sends (batches of one)")
        parser.add_argument("--no-tick", action="store_true")
        parser.add_argument("--no-writes", action="store_true")
        parser.add_argument("--reads", type=int, default=20, help="reads of the campaign's counts (the admin list, "
                                                                  "the API detail) per measure; 0: none")

    def handle(self, *args, rows, ticks, per_tick, members, rounds, singles, no_tick, no_writes, reads, **options):
        name = connection.settings_dict["NAME"]
        if "bench" not in name and "scratch" not in name:
            raise CommandError(f"database {name!r}: run on a database of its own (a name with bench or scratch)")
        report: dict = {"measured_at": datetime.now(UTC).isoformat(), "database": name}
        campaign = Campaign.objects.filter(segment__segment_id="pace-rows", member_count=rows).first()
        if not no_tick:
            if campaign is None:
                self.stdout.write(f"making a campaign of {rows:,} rows…")
                campaign = make_campaign(rows, clock.now(), log=self.stdout.write)
            report["tick"] = pace_cost.tick_cost(campaign, ticks=ticks, per_tick=per_tick, log=self.stdout.write)
        if reads and campaign is not None:
            report["reads"] = pace_reads.read_cost(campaign, reads=reads, per_tick=per_tick, log=self.stdout.write)
        if not no_writes:
            report["writes_us"] = pace_cost.write_cost(members, rounds=rounds, singles=singles, log=self.stdout.write)
        report["size"] = pace_cost.sizes(campaign)
        path = write_json("pace", report)
        self.stdout.write(json.dumps(report, indent=2))
        self.stdout.write(f"written to {path}")
