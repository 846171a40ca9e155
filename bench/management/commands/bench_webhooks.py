"""``manage.py bench_webhooks``: CPU-µs per provider callback through each WSGI option, in-process
(bench/webhook_cost.py). The bench Redis (``BENCH_REDIS_DB``) takes the receipts; prints the result."""

from __future__ import annotations

import json
import os

from bench.management.commands.bench import INNER
from bench.management.commands.bench import Command as BenchCommand


class Command(BenchCommand):
    help = "CPU-µs per Twilio callback and per SendGrid POST of 100 events: Django's handler vs the light path."

    def add_arguments(self, parser):
        parser.add_argument("--requests", type=int, default=2000, help="requests per option (default 2,000)")

    def handle(self, *args, **options):
        if os.environ.get(INNER) != "1":
            return self.reexec()
        from bench.webhook_cost import run

        self.stdout.write(json.dumps(run(options["requests"]), indent=1))
