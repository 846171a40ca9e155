"""The bench's own platform: ``bench.stack.Stack`` with production timings.

Differences from the test stack: no clock-offset file and none of the shortened test timings (lease,
backoff, stale-queued and reconciler intervals are the settings' defaults), no delivery receipts
(``EMULATOR_RECEIPTS=0``: the bench measures sends, not webhook traffic), an unlimited emulator
message list, WARNING logs, a high API rate limit, the standard worker under ``nice 10`` as in the
Procfile, its own Prometheus directory, and logs under ``test-artifacts/bench/``. With
``pipeline="naive"`` one worker consumes the single ``naive`` queue instead of the two tier workers.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from bench.stack import CELERY, Stack, wait_until

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = ROOT / "test-artifacts" / "bench"

#: Test-only timings of bench.stack.Stack that the bench drops (the settings' defaults apply).
TEST_TIMINGS = (
    "LEASE_SECONDS", "QUEUED_STALE_SECONDS", "QUEUED_STALE_SECONDS_HIGH", "RECONCILER_INTERVAL_SECONDS",
    "SCHEDULER_INTERVAL_SECONDS", "PROVIDER_TIMEOUT_SECONDS", "BACKOFF_BASE_HIGH", "BACKOFF_CAP_HIGH",
    "BACKOFF_BASE_STANDARD", "BACKOFF_CAP_STANDARD", "MIN_RETRY_WINDOW_HIGH", "MIN_RETRY_WINDOW_STANDARD",
    "CLOCK_OFFSET_FILE", "CAMPAIGN_SHARD_STALE_SECONDS", "EMULATOR_SENDGRID_EVENTS_URL",
    "EMULATOR_SENDGRID_SIGNING_KEY_FILE",
)
WORKER_FLAGS = ["--without-gossip", "--without-mingle", "-l", "warning"]
PROCESSES = {
    "tiered": ("emulator", "web", "worker_high", "worker_standard", "worker_fanout", "worker_maintenance",
               "worker_receipts", "beat"),
    "naive": ("emulator", "web", "worker_naive", "worker_maintenance", "worker_receipts", "beat"),
}
WORKER_NAMES = {"tiered": ("high@", "standard@", "fanout@", "maintenance@", "receipts@"),
                "naive": ("naive@", "maintenance@", "receipts@")}


class BenchStack(Stack):
    def __init__(self, database_url: str, redis_url: str, tmp_dir: Path, *, pipeline: str = "tiered",
                 env: dict[str, str] | None = None, log_dir: Path = LOG_DIR) -> None:
        tmp_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(database_url, redis_url, tmp_dir)
        self.pipeline = pipeline
        self.bench_env = dict(env or {})
        self.log_dir = log_dir
        self.prometheus_dir = tmp_dir / "prometheus"
        shutil.rmtree(self.prometheus_dir, ignore_errors=True)
        self.prometheus_dir.mkdir(parents=True)
        log_dir.mkdir(parents=True, exist_ok=True)

    def env(self) -> dict[str, str]:
        env = super().env()
        for key in TEST_TIMINGS:
            env.pop(key, None)
        env.update({
            "EMULATOR_RECEIPTS": "0",
            "EMULATOR_MAX_MESSAGES": "0",
            "EMULATOR_LOG_LEVEL": "WARNING",
            "LOG_LEVEL": "WARNING",
            "API_DEFAULT_RATE_LIMIT": "1000000/min",
            "NOTIFY_PIPELINE": self.pipeline,
            "PROMETHEUS_MULTIPROC_DIR": str(self.prometheus_dir),
        })
        env.update(self.bench_env)
        env.update(self.extra_env)
        return env

    def commands(self) -> dict[str, list[str]]:
        commands = {name: _quiet(cmd) for name, cmd in super().commands().items() if name != "beat2"}
        commands["worker_standard"] = ["nice", "-n", "10", *commands["worker_standard"]]
        commands["worker_naive"] = [*CELERY, "worker", "-n", "naive@%h", "-Q", "naive", "--concurrency", "2",
                                    "--prefetch-multiplier", "1", "-O", "fair", *WORKER_FLAGS]
        return {name: commands[name] for name in PROCESSES[self.pipeline]}

    def log_path(self, name: str) -> Path:
        return self.log_dir / f"{self.pipeline}-{name}.log"

    def start_all(self) -> None:
        for name in self.commands():
            self.start(name)
        try:
            wait_until(lambda: self._get(f"{self.emulator}/_emulator/health"), 30, message="emulator")
            wait_until(lambda: self._get(f"{self.api}/api/schema/"), 90, message="API server")
            self.wait_for_workers(WORKER_NAMES[self.pipeline], timeout=90)
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


def naive_pipeline_available(env: dict[str, str]) -> bool:
    """Whether this checkout's Celery app defines the ``naive`` queue when ``NOTIFY_PIPELINE=naive``."""
    code = ("from config.celery import app; "
            "import sys; sys.exit(0 if any(q.name == 'naive' for q in app.conf.task_queues) else 3)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, "NOTIFY_PIPELINE": "naive"},
                            capture_output=True, timeout=60)
    return result.returncode == 0
