"""``manage.py bench_otp``: CPU per OTP by process kind, with nothing else running (bench/otp_cpu.py).

The same database and Redis as ``manage.py bench`` (``BENCH_DATABASE``, ``BENCH_REDIS_DB``); prints
the result and writes ``bench/results/otp-<UTC timestamp>.json``.
"""

from __future__ import annotations

import json
import os
import signal
import sys

from django.conf import settings
from django.core.management import call_command

from bench.management.commands.bench import INNER, git_info
from bench.management.commands.bench import Command as BenchCommand
from bench.output import results_dir, stamp, write_json


class Command(BenchCommand):
    help = "CPU per OTP (API + high worker + Postgres + Redis) through the real API, nothing else running."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=2000, help="OTPs measured (default 2,000)")
        parser.add_argument("--rate", type=float, default=50.0, help="OTPs per second (default 50)")
        parser.add_argument("--channel", choices=["sms", "email", "push"], default="sms")
        parser.add_argument("--out", default=str(results_dir()))

    def handle(self, *args, **options):
        if os.environ.get(INNER) != "1":
            return self.reexec()
        signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
        from bench.otp_cpu import run_otp_cpu

        call_command("migrate", interactive=False, verbosity=0)
        when = stamp()
        work = settings.BASE_DIR / "test-artifacts" / "bench" / f"otp-{when}"
        result = run_otp_cpu(options["count"], options["rate"], options["channel"], os.environ["DATABASE_URL"],
                             os.environ["REDIS_URL"], work, self.say)
        result["git"] = git_info()
        write_json("otp", result, options["out"], when=when, indent=1)
        self.stdout.write(json.dumps(result, indent=1))
        if result["delivered"] < options["count"]:
            sys.exit(1)
