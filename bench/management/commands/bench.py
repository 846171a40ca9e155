"""``manage.py bench``: the whole platform under a campaign blast and an OTP stream (docs/PERFORMANCE.md).

Starts its own stack on free ports against the database ``notify_bench`` and Redis database 3
(``BENCH_DATABASE``, ``BENCH_REDIS_DB``), never ``make run``'s data. A ``blast`` run: the ceilings
(bench/ceilings.py) → the tiered blast → the naive baseline (bench/naive.py), time-boxed;
``--channel``, ``--recipients``; ``--scenario brownout`` (a slow primary SMS provider) and
``--scenario events`` (bench/event_blast.py); ``--history-days D --history-per-day N``: on a database
with that much history behind it (bench/history.py), and every run EXPLAINs the hot queries after it
(bench/explain.py); ``--receipts`` (bench/receipts.py); ``--webhooks`` (bench/webhook_bench.py). Writes
``bench/results/<UTC timestamp>.json`` and ``.png`` (not in git), exits 1 when something was lost or an
OTP never reached the provider;
``--write-docs RESULTS.json`` rewrites the results block of docs/PERFORMANCE.md. The options in
full: ``manage.py bench --help`` and docs/PERFORMANCE.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

BENCH_DATABASE = os.environ.get("BENCH_DATABASE", "notify_bench")
BENCH_REDIS_DB = int(os.environ.get("BENCH_REDIS_DB", "3"))
INNER = "BENCH_INNER"


def with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


class Command(BaseCommand):
    help = ("Benchmark the whole platform: campaign blast + OTPs against the SDK/raw and durable ceilings and the "
            "naive baseline (docs/PERFORMANCE.md).")

    def add_arguments(self, parser):
        parser.add_argument("--recipients", type=int, default=1_000_000, help="campaign size (default 1,000,000)")
        parser.add_argument("--channel", choices=["email", "sms", "push"], default="email",
                            help="the campaign's channel and the OTPs' (events: the OTPs' only; default email)")
        parser.add_argument("--otp-rate", type=float, default=10.0,
                            help="high-priority sends per second through the API during the blast (default 10)")
        parser.add_argument("--provider-rate", type=float, default=None,
                            help="budget per provider per second: the platform's PROVIDER_RATE_PER_S and an "
                                 "emulator 429 rule per provider (default: the settings' budgets, no emulator limit)")
        parser.add_argument("--provider-latency-ms", type=int, default=None,
                            help="every provider answers after this many ms (emulator fault rule)")
        parser.add_argument("--scenario", choices=["blast", "brownout", "events"], default="blast")
        parser.add_argument("--events", type=int, default=100_000,
                            help="events: how many events, one user each (default 100,000)")
        parser.add_argument("--send-seconds", type=float, default=None,
                            help="events: stop sending new events this many seconds after launch (what was "
                                 "accepted still drains; default: send them all)")
        parser.add_argument("--event-concurrency", type=int, default=8,
                            help="events: client connections sending them (default 8: the API's 2 gunicorn "
                                 "workers × 4 threads)")
        parser.add_argument("--naive-recipients", type=int, default=None,
                            help="campaign size of the naive baseline (default min(recipients, 20,000))")
        parser.add_argument("--naive-max-seconds", type=float, default=180.0,
                            help="time box of the naive run: its rates are measured over this window if it has "
                                 "not drained by then (default 180)")
        parser.add_argument("--naive-pool", choices=["prefork", "threads"], default="prefork",
                            help="the naive workers: one prefork worker, or one threaded worker per core (default "
                                 "prefork)")
        parser.add_argument("--naive-concurrency", type=int, default=8,
                            help="prefork processes, or threads per threaded worker (default 8)")
        parser.add_argument("--receipts", action="store_true",
                            help="delivery receipts on (SendGrid processed + delivered, Twilio 2-3 callbacks): "
                                 "the blast without them, then with them; reports their cost (no ceilings, no "
                                 "naive baseline)")
        parser.add_argument("--webhooks", action="store_true",
                            help="status webhooks: the blast without them, then with the campaign's client "
                                 "subscribed to every event on a local receiver and the webhook worker running; "
                                 "reports what was received and lost, the cost (no ceilings, no naive baseline)")
        parser.add_argument("--webhooks-receiver-down", type=float, default=0.0, metavar="S",
                            help="with --webhooks: the receiver refuses connections for S seconds from when a "
                                 "third of the campaign is sent (default 0)")
        parser.add_argument("--skip-naive", action="store_true", help="no naive baseline")
        parser.add_argument("--skip-ceilings", "--skip-raw", dest="skip_ceilings", action="store_true",
                            help="no reference ceilings (raw/SDK, durable)")
        parser.add_argument("--ceiling-seconds", "--raw-seconds", dest="ceiling_seconds", type=float, default=15.0,
                            help="length of each ceiling's loop (default 15)")
        parser.add_argument("--drain-timeout", type=float, default=None,
                            help="seconds to wait for a campaign to drain (default max(300, recipients/100))")
        parser.add_argument("--history-days", type=int, default=0,
                            help="before the run, fill this many days of history (with --history-per-day; "
                                 "bench/history.py; filled once, reused while the request is the same)")
        parser.add_argument("--history-per-day", type=int, default=0,
                            help="notifications per day of the history fill (e.g. 1000000, the seed volume)")
        parser.add_argument("--out", default=str(settings.BASE_DIR / "bench" / "results"))
        parser.add_argument("--write-docs", metavar="RESULTS_JSON", nargs="+", default=None,
                            help="do not run: rewrite the results block of docs/PERFORMANCE.md from these files "
                                 "(several: side by side, e.g. the email, push and SMS runs)")

    def handle(self, *args, **options):
        if options["write_docs"]:
            return self.write_docs([Path(p) for p in options["write_docs"]])
        if (options["history_days"] > 0) != (options["history_per_day"] > 0):
            raise CommandError("--history-days and --history-per-day go together (both > 0)")
        if os.environ.get(INNER) != "1":
            return self.reexec()
        return self.run(options)

    # --- parent: database, then the same command against it ------------------------------------
    def reexec(self, database: str = BENCH_DATABASE, redis_db: int = BENCH_REDIS_DB):
        """Create ``database`` if missing and run this command again against it and Redis database
        ``redis_db``; never against the configured database itself (``make run``'s)."""
        import psycopg

        base = os.environ.get("DATABASE_URL") or settings.DATABASES["default"].get("NAME")
        redis_base = os.environ.get("REDIS_URL") or settings.REDIS_URL
        if not base or "://" not in base:
            raise CommandError("DATABASE_URL is not set (run `make bench`, which starts the project Postgres)")
        if database == urlsplit(base).path.lstrip("/"):
            raise CommandError(f"the bench database {database!r} is the configured one (make run's): choose another")
        database_url = with_path(base, f"/{database}")
        redis_url = with_path(redis_base, f"/{redis_db}")
        admin_url = with_path(base, "/postgres")
        try:
            with psycopg.connect(admin_url.replace("postgres://", "postgresql://", 1), autocommit=True) as conn:
                if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone():
                    conn.execute(f'CREATE DATABASE "{database}"')
                    self.stdout.write(f"created database {database}")
        except psycopg.Error as exc:
            raise CommandError(f"cannot reach Postgres at {admin_url} (is `scripts/devservices.py up` done?): "
                               f"{exc}") from None
        prometheus = settings.BASE_DIR / "test-artifacts" / "bench" / "prometheus"
        env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "CELERY_BROKER_URL": redis_url,
               INNER: "1", "PROMETHEUS_MULTIPROC_DIR": str(prometheus)}
        Path(env["PROMETHEUS_MULTIPROC_DIR"]).mkdir(parents=True, exist_ok=True)
        argv = sys.argv[1:] if len(sys.argv) > 1 and sys.argv[1].startswith("bench") else ["bench"]
        self.stdout.flush()
        child = subprocess.Popen([sys.executable, str(settings.BASE_DIR / "manage.py"), *argv], env=env)
        # SIGTERM/SIGINT reach the run, which stops its stack before exiting (never SIGKILL it).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
        returncode = child.wait()
        if returncode:
            sys.exit(returncode)

    # --- inner: the run -------------------------------------------------------------------------
    def run(self, o):
        # SIGTERM unwinds like Ctrl-C, so the stack this run started is stopped (finally blocks).
        signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
        from bench import plot, receipts, report, webhook_bench
        from bench.runner import PLATFORM_KINDS, RunConfig, run_blast, run_naive

        database_url, redis_url = os.environ["DATABASE_URL"], os.environ["REDIS_URL"]
        self.say(f"database {BENCH_DATABASE}: migrating…")
        call_command("migrate", interactive=False, verbosity=0)
        started = datetime.now(UTC)
        stamp = started.strftime("%Y%m%dT%H%M%SZ")
        out = Path(o["out"])
        out.mkdir(parents=True, exist_ok=True)
        work = settings.BASE_DIR / "test-artifacts" / "bench" / stamp
        argv = sys.argv[2:] if len(sys.argv) > 2 and sys.argv[1] == "bench" else []
        if o["scenario"] == "events":
            return self.run_events(o, started, stamp, out, work, argv)
        brownout = o["scenario"] == "brownout"
        history = self.history(o)
        result: dict = {
            "schema": 1, "scenario": o["scenario"], "started_at": started.isoformat(timespec="seconds"),
            "git": git_info(), "machine": machine_info(),
            "options": {k: o[k] for k in ("recipients", "channel", "otp_rate", "provider_rate", "provider_latency_ms",
                                          "scenario", "naive_recipients", "naive_max_seconds", "naive_pool",
                                          "naive_concurrency", "skip_naive", "skip_ceilings", "ceiling_seconds",
                                          "drain_timeout", "history_days", "history_per_day",
                                          "receipts", "webhooks", "webhooks_receiver_down")}
            | {"argv": " ".join(argv)},
            "history": history, "notes": [], "raw_ceiling": None, "sdk_ceiling": None, "durable_ceiling": None,
            "tiered": None, "naive": None,
        }
        common = {"channel": o["channel"], "otp_rate": o["otp_rate"], "provider_rate": o["provider_rate"],
                  "provider_latency_ms": o["provider_latency_ms"], "drain_timeout": o["drain_timeout"]}
        otp_channels = ["sms", "email", "push"] if brownout else [o["channel"]]
        error = None
        with_receipts = o["receipts"]
        with_webhooks = o["webhooks"]
        if o["webhooks_receiver_down"] and not with_webhooks:
            raise CommandError("--webhooks-receiver-down goes with --webhooks")
        try:
            if with_receipts:  # the same blast without receipts first: what they add is the difference
                result["tiered_without_receipts"] = run_blast(
                    RunConfig(pipeline="tiered", label="without-receipts", recipients=o["recipients"],
                              otp_channels=otp_channels, brownout=brownout, **common),
                    database_url, redis_url, work, self.say)
            tiered = run_blast(RunConfig(pipeline="tiered", recipients=o["recipients"], otp_channels=otp_channels,
                                         brownout=brownout, receipts=with_receipts, webhooks=with_webhooks,
                                         webhooks_receiver_down=o["webhooks_receiver_down"],
                                         ceiling_seconds=0 if (o["skip_ceilings"] or brownout or with_receipts
                                                               or with_webhooks) else o["ceiling_seconds"],
                                         **common),
                               database_url, redis_url, work, self.say)
            for key in ("raw_ceiling", "sdk_ceiling", "durable_ceiling", "raw_http_transport"):
                result[key] = tiered.pop(key, None)
            result["tiered"] = tiered
            if with_webhooks:  # then the same blast without them, over the same window (idle after its drain)
                result["tiered_without_webhooks"] = run_blast(
                    RunConfig(pipeline="tiered", label="without-webhooks", recipients=o["recipients"],
                              otp_channels=otp_channels, brownout=brownout, receipts=with_receipts,
                              min_window=tiered["machine_window"]["seconds"], **common),
                    database_url, redis_url, work, self.say)
            if with_receipts and tiered.get("receipts"):
                result["receipts"] = {**tiered["receipts"], "cost": receipts.cost(
                    tiered["run"], (result.get("tiered_without_receipts") or {}).get("run"), list(PLATFORM_KINDS))}
            if tiered.get("webhooks"):
                tiered["webhooks"]["cost"] = webhook_bench.cost(
                    tiered["run"], (result.get("tiered_without_webhooks") or {}).get("run"), list(PLATFORM_KINDS))
                result["webhooks"] = tiered["webhooks"]
            if not brownout and not o["skip_naive"] and not with_receipts and not with_webhooks:
                size = o["naive_recipients"] or min(o["recipients"], 20_000)
                naive_common = {**common, "drain_timeout": o["naive_max_seconds"]}
                result["naive"] = run_naive(
                    RunConfig(pipeline="naive", label="naive", recipients=size, otp_channels=[],
                              naive_pool=o["naive_pool"], naive_concurrency=o["naive_concurrency"], **naive_common),
                    database_url, redis_url, work, self.say)
        except Exception as exc:  # still write what was measured
            error = f"{type(exc).__name__}: {exc}"
            result["error"] = error
            result["traceback"] = traceback.format_exc()
            self.stderr.write(result["traceback"])
        if result["tiered"]:
            result["reference"] = report.reference_points(
                result["tiered"], result["naive"], {k: result.get(k) for k in report.CEILINGS}, o["channel"])
            result["targets"] = report.evaluate_targets(result["tiered"], result["naive"], result["reference"],
                                                        o["recipients"], o["channel"])
        problems = (report.sanity_problems(result["tiered"]) + receipts.problems(result.get("receipts"))
                    + webhook_bench.problems(result.get("webhooks"))
                    + ([f"bench error: {error}"] if error else []))
        if with_webhooks and not result.get("webhooks") and not error:
            problems.append("--webhooks: no webhook figures (the wait did not finish)")

        def summary(r: dict) -> str:
            text = report.summary_text(r)
            text += "\n\n" + receipts.summary_text(r["receipts"]) if r.get("receipts") else ""
            return text + "\n\n" + webhook_bench.summary_text(r["webhooks"]) if r.get("webhooks") else text

        result["explain"] = self.explain()
        self.finish(result, problems, out / stamp, plot.write_plot, summary, work)

    def history(self, o) -> dict | None:
        """``--history-days``: the fill (made or reused) for the JSON; without it, no fill is kept."""
        from bench import history
        from bench.runner import RESET_TABLES

        if o["history_days"]:
            return history.ensure_history(o["history_days"], o["history_per_day"], RESET_TABLES, self.say)
        if history.recorded():
            self.say("removing the history fill: a run without --history-days starts from empty tables")
            history.wipe(RESET_TABLES)
        return None

    def explain(self) -> dict:
        """EXPLAIN of the hot queries on the database as the run left it (bench/explain.py)."""
        from bench import explain

        try:
            plans = explain.hot_queries()
        except Exception as exc:  # the run's figures are still written
            self.stderr.write(f"EXPLAIN of the hot queries failed: {exc}")
            return {"error": f"{type(exc).__name__}: {exc}"}
        scans = {name: p.get("seq_scans") or p.get("error") for name, p in plans.items()
                 if p.get("seq_scan") or "error" in p}
        self.say(f"EXPLAIN of {len(plans)} hot queries: " + (f"sequential scans of big tables or errors: {scans}"
                                                              if scans else "no sequential scan of a big table"))
        return plans

    def run_events(self, o, started: datetime, stamp: str, out: Path, work: Path, argv: list[str]):
        """``--scenario events``: the event blast alone (bench/event_blast.py)."""
        from bench import event_report, plot
        from bench.event_blast import EventsConfig, run_events
        from bench.runner import PLATFORM_KINDS

        result: dict = {
            "schema": 1, "scenario": "events", "started_at": started.isoformat(timespec="seconds"),
            "git": git_info(), "machine": machine_info(),
            "options": {k: o[k] for k in ("scenario", "events", "event_concurrency", "send_seconds", "channel",
                                          "otp_rate", "provider_rate", "provider_latency_ms", "drain_timeout")}
            | {"argv": " ".join(argv)},
            "history": self.history(o), "events": None,
        }
        error = None
        try:
            result["events"] = run_events(
                EventsConfig(events=o["events"], concurrency=o["event_concurrency"], otp_rate=o["otp_rate"],
                             otp_channels=[o["channel"]], provider_rate=o["provider_rate"],
                             provider_latency_ms=o["provider_latency_ms"], send_seconds=o["send_seconds"],
                             drain_timeout=o["drain_timeout"]),
                os.environ["DATABASE_URL"], os.environ["REDIS_URL"], work, self.say)
        except Exception as exc:  # still write what was measured
            error = f"{type(exc).__name__}: {exc}"
            result["error"] = error
            result["traceback"] = traceback.format_exc()
            self.stderr.write(result["traceback"])
        problems = event_report.event_sanity_problems(result["events"]) + ([f"bench error: {error}"] if error else [])
        result["explain"] = self.explain()
        self.finish(result, problems, out / stamp, plot.write_events_plot,
                    lambda r: event_report.summary_text(r, PLATFORM_KINDS), work)

    def finish(self, result: dict, problems: list[str], base: Path, write_plot, summary_text, work: Path) -> None:
        """Write ``base``.json and .png, print the summary, exit 1 when a sanity check failed."""
        result["sanity"] = {"ok": not problems, "problems": problems}
        result["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        json_path, png_path = base.with_suffix(".json"), base.with_suffix(".png")
        json_path.write_text(json.dumps(result, indent=1, default=str))
        try:
            write_plot(result, png_path)
        except Exception as exc:
            self.stderr.write(f"plot not written: {exc}")
        self.stdout.write("\n" + summary_text(result))
        self.stdout.write(f"\nwritten: {json_path} and {png_path.name}; logs in {work}")
        if problems:
            self.stderr.write("bench sanity checks failed:\n  " + "\n  ".join(problems))
            sys.exit(1)

    def write_docs(self, paths: list[Path]):
        """Blast and brownout runs: the results block (several side by side); an events run: the
        "Event blast" block (one run)."""
        from bench import event_report, report
        from bench.runner import PLATFORM_KINDS

        docs = settings.BASE_DIR / "docs" / "PERFORMANCE.md"
        loaded = [(path, json.loads(path.read_text())) for path in paths]
        blasts = [(p, d) for p, d in loaded if d.get("scenario") != "events"]
        events = [(p, d) for p, d in loaded if d.get("scenario") == "events"]
        if len(events) > 1:
            raise CommandError("--write-docs takes one events run (the Event blast block shows one)")
        text = docs.read_text() if docs.exists() else ""
        if blasts:
            runs = []
            for path, data in blasts:
                name = "PERFORMANCE.png" if len(blasts) == 1 else f"PERFORMANCE-{report.channel_of(data)}.png"
                self.copy_plot(path, docs.parent / name)
                runs.append((data, path.name, name))
            text = report.replace_docs_section(text, report.docs_section_runs(runs))
        for path, data in events:
            self.copy_plot(path, docs.parent / "PERFORMANCE-events.png")
            text = report.replace_docs_section(
                text, event_report.docs_section(data, path.name, "PERFORMANCE-events.png", PLATFORM_KINDS),
                event_report.EVENTS_START, event_report.EVENTS_END)
        docs.write_text(text)
        self.stdout.write(f"rewrote {'the results block' if blasts else ''}{' and ' if blasts and events else ''}"
                          f"{'the Event blast block' if events else ''} of {docs} from "
                          f"{', '.join(str(p) for p in paths)}")

    @staticmethod
    def copy_plot(json_path: Path, dest: Path) -> None:
        png = json_path.with_suffix(".png")
        if png.exists():
            shutil.copyfile(png, dest)

    def say(self, message: str) -> None:
        self.stdout.write(f"{time.strftime('%H:%M:%S')} {message}")
        self.stdout.flush()


def git_info() -> dict:
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=settings.BASE_DIR, capture_output=True, text=True,
                                  timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}


def machine_info() -> dict:
    import psutil

    model = ""
    with contextlib.suppress(OSError):
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), "")
    return {"cores": os.cpu_count(), "cpu_model": model, "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "load_avg_at_start": [round(x, 2) for x in os.getloadavg()]}
