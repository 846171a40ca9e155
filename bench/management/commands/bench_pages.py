"""``manage.py bench_pages``: issue 27's admin pages and beat's samplers on a database with a 1 M-member
campaign sending and days of history (bench/pages.py, bench/pages_fill.py; docs/PERFORMANCE.md,
"Admin pages at scale").

Its own database ``notify_bench_pages`` and Redis database 12 (``BENCH_PAGES_DATABASE``,
``BENCH_PAGES_REDIS_DB``), created and migrated here, never ``make run``'s; filled once and reused
while the options are the same. Prints a table and writes ``bench/results/pages-<UTC stamp>.json``.
"""

from __future__ import annotations

import os
import signal
import sys

from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.management import call_command

from bench.management.commands.bench import INNER, git_info, machine_info
from bench.management.commands.bench import Command as BenchCommand
from bench.output import results_dir, stamp, write_json

PAGES_DATABASE = os.environ.get("BENCH_PAGES_DATABASE", "notify_bench_pages")
PAGES_REDIS_DB = int(os.environ.get("BENCH_PAGES_REDIS_DB", "12"))


class Command(BenchCommand):
    help = ("Admin pages (campaign, pace poll, campaign list, provider health, recipient timeline) and beat's "
            "samplers on a database with a 1 M-member campaign sending: queries, ms, CPU, EXPLAIN.")

    def add_arguments(self, parser):
        parser.add_argument("--days", type=int, default=2, help="days of history behind it (default 2)")
        parser.add_argument("--per-day", type=int, default=2_000_000,
                            help="notifications a day of history (default 2,000,000)")
        parser.add_argument("--campaign-recipients", type=int, default=1_000_000,
                            help="members of the sending campaign (default 1,000,000)")
        parser.add_argument("--campaign-hours", type=float, default=3.0,
                            help="how long it has been sending at the fill's instant (default 3)")
        parser.add_argument("--campaign-channel", choices=["email", "sms"], default="email")
        parser.add_argument("--recipient-notifications", type=int, default=3_000,
                            help="notifications of the recipient whose page is measured, over 40 days (default 3,000)")
        parser.add_argument("--background-per-minute", type=int, default=300,
                            help="API single sends a minute beside the campaign while it sends (default 300)")
        parser.add_argument("--repeat", type=int, default=5, help="measured runs per target; the median (default 5)")
        parser.add_argument("--refill", action="store_true", help="fill anew even when the request is the same")
        parser.add_argument("--out", default=str(results_dir()))

    def handle(self, *args, **o):
        if os.environ.get(INNER) != "1":
            return self.reexec(PAGES_DATABASE, PAGES_REDIS_DB)
        signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
        from bench import pages
        from bench.pages_fill import Request

        self.say(f"database {PAGES_DATABASE}: migrating…")
        call_command("migrate", interactive=False, verbosity=0)
        if hasattr(staticfiles_storage, "manifest_name"):  # the pages' hashed static names, as `make run`
            call_command("collectstatic", interactive=False, verbosity=0)
        request = Request(days=o["days"], per_day=o["per_day"], campaign_recipients=o["campaign_recipients"],
                          campaign_hours=o["campaign_hours"], channel=o["campaign_channel"],
                          recipient_notifications=o["recipient_notifications"],
                          background_per_minute=o["background_per_minute"])
        when = stamp()
        result = pages.run(request, self.say, repeat=o["repeat"], refill=o["refill"])
        result |= {"git": git_info(), "machine": machine_info(), "database_name": PAGES_DATABASE,
                   "argv": " ".join(sys.argv[2:])}
        path = write_json("pages", result, o["out"], when=when, indent=1, default=str)
        self.stdout.write("\n" + pages.table(result))
        self.stdout.write(f"\nwritten: {path}")
