"""``manage.py bench_status_webhooks``: the cost of status webhooks (bench/webhooks.py), on the benchmark's
database (``BENCH_DATABASE``), never ``make run``'s data. Prints the figures as JSON."""

from __future__ import annotations

import json
import os

from django.core.management import call_command

from bench.management.commands.bench import INNER
from bench.management.commands.bench import Command as BenchCommand


class Command(BenchCommand):
    help = "CPU per notification of the webhook outbox, and per webhook of its delivery (docs/PERFORMANCE.md)."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=10_000, help="campaign rows per case (default 10,000)")

    def handle(self, *args, **options):
        if os.environ.get(INNER) != "1":
            return self.reexec()
        from bench.webhooks import run

        call_command("migrate", interactive=False, verbosity=0)
        self.stdout.write(json.dumps(run(options["count"]), indent=2))
