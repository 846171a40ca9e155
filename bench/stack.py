"""The whole platform as real processes, for the end-to-end tests and the benchmark.

:class:`Stack` starts, on free ports on 127.0.0.1, the provider emulator, the API (gunicorn), the
high-tier, standard-tier and maintenance workers and beat, against the test database and the tests'
Redis database. Nothing is mocked. Timings are shortened through the environment so recovery is
seen within a test, and a shared clock-offset file moves every process's clock (docs/TESTING.md).
Here, not under ``tests/``, because the bench subclasses it (:class:`bench.production_stack.BenchStack`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
#: Process logs; an xdist worker's under its own name (``logs/gw0/``), so two sessions' never mix.
LOG_DIR = ROOT / "test-artifacts" / "logs" / os.environ.get("PYTEST_XDIST_WORKER", "")
CELERY = [sys.executable, "-m", "celery", "-A", "config"]
WORKER_FLAGS = ["--without-gossip", "--without-mingle", "-l", "info"]
#: Pool processes of the standard worker, as in the Procfile (the benchmark's A/B overrides it).
STANDARD_CONCURRENCY = os.environ.get("STANDARD_WORKER_CONCURRENCY", "4")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def collect_static(dest: Path) -> Path:
    """``manage.py collectstatic --noinput`` into ``dest`` with the production settings (hashed
    manifest, compressed copies), as the Makefile's ``static`` target does into ``.run/static``.
    Servers started with ``STATIC_ROOT=dest`` then serve static files exactly as ``make run``'s do."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", "STATIC_ROOT": str(dest)}
    subprocess.run([sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"], cwd=ROOT, env=env,
                   check=True)
    return dest


def procfile_command(name: str, port: int, env: Mapping[str, str] | None = None) -> list[str]:
    """The ``Procfile``'s command for process ``name`` (as honcho runs it for ``make run``), split into
    arguments, with ``$PORT`` replaced by ``port`` and ``${NAME:-default}`` by ``env``'s value
    (default: this process's environment) or the default, as the shell does. Relative paths
    (``.venv/bin/...``) are relative to the repository root."""
    env = os.environ if env is None else env

    def expand(arg: str) -> str:
        arg = re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), arg)
        return arg.replace("$PORT", str(port))

    for line in (ROOT / "Procfile").read_text().splitlines():
        key, sep, command = line.partition(":")
        if sep and key.strip() == name:
            return [expand(arg) for arg in shlex.split(command)]
    raise KeyError(f"no process {name!r} in the Procfile")


def wait_until(predicate, timeout: float = 20.0, interval: float = 0.1, message: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; return it. Raises AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message} (last value: {last!r})")


def _webhook_key_pair(tmp_dir: Path) -> tuple[Path, str]:
    """An ECDSA P-256 key pair: PEM file for the emulator to sign SendGrid events, base64 DER public
    key for the platform to verify them."""
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    path = tmp_dir / "sendgrid-signing-key.pem"
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return path, base64.b64encode(der).decode()


class Stack:
    def __init__(self, database_url: str, redis_url: str, tmp_dir: Path, static_root: Path | None = None) -> None:
        self.database_url = database_url
        #: Collected static files the API server serves (None: the settings' default, .run/static).
        self.static_root = static_root
        self.redis_url = redis_url
        self.tmp_dir = tmp_dir
        self.api_port = free_port()
        self.emulator_port = free_port()
        self.smtp_port = free_port()
        self.clock_file = tmp_dir / "clock-offset"
        self.clock_file.write_text("0")
        self.sendgrid_key_file, self.sendgrid_public_key = _webhook_key_pair(tmp_dir)
        self.procs: dict[str, subprocess.Popen] = {}
        self.extra_env: dict[str, str] = {}
        LOG_DIR.mkdir(parents=True, exist_ok=True)

    @property
    def api(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def emulator(self) -> str:
        return f"http://127.0.0.1:{self.emulator_port}"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TWILIO_", "SENDGRID_", "FCM_", "SMTP_"))}
        env.update({
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "DATABASE_URL": self.database_url,
            "REDIS_URL": self.redis_url,
            "CELERY_BROKER_URL": self.redis_url,
            "EMULATOR_PORT": str(self.emulator_port),
            "EMULATOR_SMTP_PORT": str(self.smtp_port),
            "EMULATOR_URL": self.emulator,
            "LEASE_SECONDS": "10",
            "QUEUED_STALE_SECONDS": "5",
            "QUEUED_STALE_SECONDS_HIGH": "5",
            "RECONCILER_INTERVAL_SECONDS": "1",
            "SCHEDULER_INTERVAL_SECONDS": "1",
            "PROVIDER_TIMEOUT_SECONDS": "3",
            "BACKOFF_BASE_HIGH": "0.5",
            "BACKOFF_CAP_HIGH": "2",
            "BACKOFF_BASE_STANDARD": "0.5",
            "BACKOFF_CAP_STANDARD": "2",
            "MIN_RETRY_WINDOW_HIGH": "0",
            "MIN_RETRY_WINDOW_STANDARD": "0",
            # After a lost lease or a timed-out call, standard rows wait this long before a re-send
            # (120 s in production): long enough for a late record or receipt in a test.
            "OUTCOME_UNKNOWN_WAIT_STANDARD": "3",
            "CLOCK_OFFSET_FILE": str(self.clock_file),
            "CAMPAIGN_SHARD_STALE_SECONDS": "3",
            # Tests move the platform clock hours ahead and read the live table: the archiver moves
            # nothing under them (a year); a test or run of the archiver sets its own (extra_env).
            "HOT_HOURS": "8760",
            # Delivery receipts: the emulator calls back the stack's API, signed with these keys.
            "PUBLIC_BASE_URL": self.api,
            "EMULATOR_SENDGRID_EVENTS_URL": f"{self.api}/webhooks/sendgrid/events",
            "EMULATOR_SENDGRID_SIGNING_KEY_FILE": str(self.sendgrid_key_file),
            "SENDGRID_WEBHOOK_PUBLIC_KEY": self.sendgrid_public_key,
            "API_DEFAULT_RATE_LIMIT": "100000/min",
            # Circuit breakers trip and recover within a test: 5 failing calls, open 3 s.
            "BREAKER_MIN_CALLS": "5",
            "BREAKER_OPEN_SECONDS": "3",
            # Status webhooks: the tests' receivers listen on 127.0.0.1 over http; a new endpoint is seen
            # by every worker within a second (docs/WEBHOOKS.md).
            "WEBHOOKS_ALLOW_INSECURE": "1",
            "WEBHOOKS_CACHE_SECONDS": "1",
            "PYTHONUNBUFFERED": "1",
        })
        if self.static_root is not None:
            env["STATIC_ROOT"] = str(self.static_root)
        env.update(self.extra_env)
        return env

    def commands(self) -> dict[str, list[str]]:
        return {
            "emulator": [sys.executable, "-m", "providers.emulator", "--port", str(self.emulator_port),
                         "--smtp-port", str(self.smtp_port)],
            # The Procfile's own command, as `make run` starts it (workers, threads, access log).
            "web": procfile_command("web", self.api_port, self.env()),
            "worker_high": [*CELERY, "worker", "-n", "high@%h", "-Q", "high.sms,high.email,high.push,high.in_app",
                            "--pool", "threads", "--concurrency", "8", "--prefetch-multiplier", "1", "-O", "fair",
                            *WORKER_FLAGS],
            "worker_standard": [*CELERY, "worker", "-n", "standard@%h", "-Q",
                                "standard.sms,standard.email,standard.push,standard.in_app",
                                "--concurrency", STANDARD_CONCURRENCY,
                                "--prefetch-multiplier", "1", "-O", "fair", *WORKER_FLAGS],
            "worker_fanout": [*CELERY, "worker", "-n", "fanout@%h", "-Q", "fanout", "--concurrency", "2",
                              "--prefetch-multiplier", "1", "-O", "fair", *WORKER_FLAGS],
            "worker_maintenance": [*CELERY, "worker", "-n", "maintenance@%h", "-Q", "maintenance",
                                   "--concurrency", "1", *WORKER_FLAGS],
            "worker_receipts": [*CELERY, "worker", "-n", "receipts@%h", "-Q", "receipts", "--concurrency", "2",
                                "--prefetch-multiplier", "4", "-O", "fair", *WORKER_FLAGS],
            # Status webhooks to the calling services (docs/WEBHOOKS.md): its own queue and worker.
            "worker_webhooks": [*CELERY, "worker", "-n", "webhooks@%h", "-Q", "webhooks", "--pool", "threads",
                                "--concurrency", "8", "--prefetch-multiplier", "1", "-O", "fair", *WORKER_FLAGS],
            "beat": [*CELERY, "beat", "-l", "info"],
            # A second beat: only ever started by the chaos scenario for that operator mistake.
            "beat2": [*CELERY, "beat", "-l", "info"],
        }

    def log_path(self, name: str) -> Path:
        return LOG_DIR / f"{name}.log"

    def start(self, name: str) -> None:
        log = open(self.log_path(name), "ab")  # noqa: SIM115 - closed with the process
        log.write(f"\n==== start {time.strftime('%H:%M:%S')} ====\n".encode())
        log.flush()
        self.procs[name] = subprocess.Popen(self.commands()[name], cwd=ROOT, env=self.env(), stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def start_all(self) -> None:
        for name in self.commands():
            if name != "beat2":
                self.start(name)
        wait_until(lambda: self._get(f"{self.emulator}/_emulator/health"), 30, message="emulator")
        wait_until(lambda: self._get(f"{self.api}/api/schema/"), 60, message="API server")
        self.wait_for_workers()

    def restart_all(self, extra_env: dict[str, str] | None = None) -> None:
        """Stop every process and start them again with ``extra_env`` on top of the test env."""
        self.stop_all()
        self.extra_env = dict(extra_env or {})
        self.procs = {}
        self.start_all()

    def use_env(self, extra_env: dict[str, str] | None = None) -> None:
        """Make every process run with ``extra_env`` on top of the test env: a restart, unless they
        already do (restarts are an end-to-end session's longest waits); a start after :meth:`stop_all`."""
        if dict(extra_env or {}) != self.extra_env or not self.procs:
            self.restart_all(extra_env)

    def wait_for_workers(self, names=("high@", "standard@", "fanout@", "maintenance@", "receipts@", "webhooks@"),
                         timeout: float = 60) -> None:
        from config.celery import app

        def ready():
            replies = app.control.ping(timeout=0.5) or []
            seen = {next(iter(r)).split("@")[0] + "@" for r in replies}
            return all(n in seen for n in names)

        wait_until(ready, timeout, interval=0.5, message=f"workers {names}")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the process group of ``name`` (a Celery worker's pool children too)."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=30)

    def stop_all(self) -> None:
        # SIGTERM to each main process only: a Celery worker then does a warm shutdown, finishing
        # its current tasks; signalling the whole group would kill pool children mid-task.
        for name in list(self.procs):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # leftovers (pool children) of any process
            proc.wait()
        self.procs = {}

    @staticmethod
    def _get(url: str):
        try:
            return requests.get(url, timeout=2).status_code == 200
        except requests.RequestException:
            return False

    # --- clock ---------------------------------------------------------------------------------
    def set_clock_offset(self, seconds: float) -> None:
        tmp = self.clock_file.with_suffix(".tmp")
        tmp.write_text(str(seconds))
        tmp.replace(self.clock_file)
        # Make sure the mtime changes even within one filesystem timestamp tick.
        now = time.time()
        os.utime(self.clock_file, (now, now + seconds % 1 + 0.001))

    # --- emulator ------------------------------------------------------------------------------
    def messages(self, **filters) -> list[dict]:
        # Listing 15,000 messages is a few MB of JSON from one asyncio process: under a busy machine
        # it took over 5 s (a flaky e2e read timeout); the list is bounded, so a longer wait is safe.
        r = requests.get(f"{self.emulator}/_emulator/messages", params=filters, timeout=(5, 60))
        r.raise_for_status()
        return r.json()

    def add_fault(self, **rule) -> dict:
        r = requests.post(f"{self.emulator}/_emulator/faults", data=json.dumps(rule),
                          headers={"Content-Type": "application/json"}, timeout=5)
        r.raise_for_status()
        return r.json()

    def clear_faults(self) -> None:
        """Remove fault rules and receipt rules (back to default receipts); no simulated engagement."""
        requests.delete(f"{self.emulator}/_emulator/faults", timeout=5).raise_for_status()
        requests.delete(f"{self.emulator}/_emulator/receipts", timeout=5).raise_for_status()
        requests.delete(f"{self.emulator}/_emulator/engagement", timeout=5).raise_for_status()

    def add_receipt_rule(self, **rule) -> dict:
        r = requests.post(f"{self.emulator}/_emulator/receipts", json=rule, timeout=5)
        r.raise_for_status()
        return r.json()
