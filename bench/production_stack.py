"""The bench's own platform: ``bench.stack.Stack`` with production timings.

Unlike the test stack: no clock-offset file, the settings' default timings, no delivery receipts
(``EMULATOR_RECEIPTS=0``; ``receipts=True`` keeps them, for ``--receipts``: bench/receipts.py), the
webhook worker only with ``webhooks=True`` (``--webhooks``: bench/webhook_bench.py; loopback allowed),
an unlimited emulator message list, WARNING logs, a high API rate limit, the standard worker under
``nice 10``, its own Prometheus directory, logs in ``test-artifacts/bench/``. ``pipeline="naive"`` runs
the emulator and the naive baseline's workers only (:mod:`bench.naive`), ``naive_pool`` ``"prefork"``
or ``"threads"``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from bench.stack import Stack, wait_until

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / "test-artifacts" / "bench"

#: Test-only timings of bench.stack.Stack that the bench drops (the settings' defaults apply).
#: Where the emulator sends SendGrid events and the key it signs them with (kept with receipts on).
RECEIPT_ENV = ("EMULATOR_SENDGRID_EVENTS_URL", "EMULATOR_SENDGRID_SIGNING_KEY_FILE")
TEST_TIMINGS = (
    "LEASE_SECONDS", "QUEUED_STALE_SECONDS", "QUEUED_STALE_SECONDS_HIGH", "RECONCILER_INTERVAL_SECONDS",
    "SCHEDULER_INTERVAL_SECONDS", "PROVIDER_TIMEOUT_SECONDS", "BACKOFF_BASE_HIGH", "BACKOFF_CAP_HIGH",
    "BACKOFF_BASE_STANDARD", "BACKOFF_CAP_STANDARD", "MIN_RETRY_WINDOW_HIGH", "MIN_RETRY_WINDOW_STANDARD",
    "CLOCK_OFFSET_FILE", "CAMPAIGN_SHARD_STALE_SECONDS", "HOT_HOURS", "WEBHOOKS_CACHE_SECONDS", *RECEIPT_ENV,
)
WORKER_FLAGS = ["--without-gossip", "--without-mingle", "-l", "warning"]
TIERED = ("emulator", "web", "worker_high", "worker_standard", "worker_fanout", "worker_maintenance",
          "worker_receipts", "beat")
TIERED_WORKERS = ("high@", "standard@", "fanout@", "maintenance@", "receipts@")
NAIVE_CELERY = [sys.executable, "-m", "celery", "-A", "bench.naive"]


class BenchStack(Stack):
    def __init__(self, database_url: str, redis_url: str, tmp_dir: Path, *, pipeline: str = "tiered",
                 env: dict[str, str] | None = None, log_dir: Path = LOG_DIR, naive_pool: str = "prefork",
                 naive_concurrency: int = 8, receipts: bool = False, webhooks: bool = False) -> None:
        tmp_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(database_url, redis_url, tmp_dir)
        self.pipeline = pipeline
        self.receipts = receipts
        self.webhooks = webhooks
        self.naive_pool = naive_pool
        self.naive_concurrency = naive_concurrency
        self.bench_env = dict(env or {})
        self.log_dir = log_dir
        self.prometheus_dir = tmp_dir / "prometheus"
        shutil.rmtree(self.prometheus_dir, ignore_errors=True)
        self.prometheus_dir.mkdir(parents=True)
        log_dir.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        env = super().env()
        for key in TEST_TIMINGS:
            if not (self.receipts and key in RECEIPT_ENV):
                env.pop(key, None)
        env.update({
            "EMULATOR_RECEIPTS": "0",
            "EMULATOR_MAX_MESSAGES": "0",
            "EMULATOR_LOG_LEVEL": "WARNING",
            "LOG_LEVEL": "WARNING",
            "API_DEFAULT_RATE_LIMIT": "1000000/min",
            "PROMETHEUS_MULTIPROC_DIR": str(self.prometheus_dir),
        })
        if self.receipts:
            from bench.receipts import ENV

            env.update(ENV)
        env.update(self.bench_env)
        env.update(self.extra_env)
        return env

    def commands(self) -> dict[str, list[str]]:
        commands = {name: _quiet(cmd) for name, cmd in super().commands().items() if name != "beat2"}
        if self.pipeline == "naive":
            return {"emulator": commands["emulator"], **self.naive_workers()}
        commands["worker_standard"] = ["nice", "-n", "10", *commands["worker_standard"]]
        return {name: commands[name] for name in TIERED + (("worker_webhooks",) if self.webhooks else ())}

    def naive_workers(self) -> dict[str, list[str]]:
        """``{kind: command}`` of the naive baseline's workers (kinds ``worker_naive…``)."""
        from bench.naive import QUEUE

        def worker(name: str, pool: str) -> list[str]:
            return [*NAIVE_CELERY, "worker", "-n", f"{name}@%h", "-Q", QUEUE, "--pool", pool,
                    "--concurrency", str(self.naive_concurrency), "--prefetch-multiplier", "4", *WORKER_FLAGS]

        if self.naive_pool == "prefork":
            return {"worker_naive": worker("naive", "prefork")}
        return {f"worker_naive{i or ''}": worker(f"naive{i or ''}", "threads") for i in range(os.cpu_count() or 1)}

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{self.pipeline}-{name}.log"

    def start_all(self) -> None:
        """Start every process and wait until each answers; if any cannot start, stop those that
        did before raising (a first run without ``.venv/bin/gunicorn`` left its emulator running)."""
        try:
            self._start_and_wait()
        except BaseException:
            self.stop_all()
            raise

    def _start_and_wait(self) -> None:
        for name in self.commands():
            self.start(name)
        try:
            wait_until(lambda: self._get(f"{self.emulator}/_emulator/health"), 30, message="emulator")
            if self.pipeline == "naive":
                self.wait_for_workers(tuple(f"{k.removeprefix('worker_')}@" for k in self.naive_workers()),
                                      timeout=90)
            else:
                wait_until(lambda: self._get(f"{self.api}/api/schema/"), 90, message="API server")
                self.wait_for_workers(TIERED_WORKERS + (("webhooks@",) if self.webhooks else ()), timeout=90)
        except AssertionError as exc:
            dead = {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}
            raise RuntimeError(f"{self.pipeline} stack did not start ({exc}); exited: {dead}; "
                               f"logs in {self.log_dir}") from None

    def pids(self, name: str) -> list[int]:
        proc = self.procs.get(name)
        return [proc.pid] if proc is not None and proc.poll() is None else []

    def dead(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}


def _quiet(cmd: list[str]) -> list[str]:
    """The command with ``-l info`` turned into ``-l warning``."""
    out = list(cmd)
    for i, arg in enumerate(out[:-1]):
        if arg == "-l" and out[i + 1] == "info":
            out[i + 1] = "warning"
    return out
