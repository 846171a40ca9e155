"""``make run`` as a new user runs it: on a fresh database, on free ports, then a first look at the
API docs and the admin. Its whole start-up log must be free of warnings and errors (an avoidable
warning on every start teaches people to ignore the log).

Isolated from the rest of the suite: its own Postgres database (created and dropped here, migrated
by ``make run`` itself), its own Redis database number, its own emulator ports and static files.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time

import psycopg
import pytest
import redis
import requests
from django.conf import settings

from bench.stack import LOG_DIR, ROOT, free_port, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")]

NOISE = re.compile(r"warn|error|traceback|exception|deprecat", re.IGNORECASE)
WORKERS = ("high@", "standard@", "fanout@", "maintenance@")


@pytest.fixture
def fresh_database(django_db_setup):
    """A new, empty database on the tests' Postgres server; dropped afterwards. Yields its URL."""
    db = settings.DATABASES["default"]
    name = f"{db['NAME']}_make_run"
    admin_url = f"postgresql://{db['USER']}@{db['HOST']}:{db['PORT']}/postgres"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{name}"
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_make_run_starts_without_warnings_and_serves_docs_and_admin(fresh_database, tmp_path):
    # A Redis database no process of this session uses (tests use TEST_REDIS_DB and up, make run uses 0).
    redis_url = settings.REDIS_URL.rsplit("/", 1)[0] + f"/{settings.SPARE_REDIS_DB}"
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TWILIO_", "SENDGRID_", "FCM_", "SMTP_", "CELERY_", "PUBLIC_BASE_URL"))}
    env.update({"DJANGO_SETTINGS_MODULE": "config.settings", "DATABASE_URL": fresh_database, "REDIS_URL": redis_url,
                "PORT": str(port), "EMULATOR_PORT": str(free_port()), "EMULATOR_SMTP_PORT": str(free_port()),
                "STATIC_ROOT": str(tmp_path / "static"), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prometheus")})
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    log_path = LOG_DIR / "make-run.log"
    base = f"http://127.0.0.1:{port}"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(["make", "run"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        def up():
            assert proc.poll() is None, f"make run exited with {proc.returncode}: see {log_path}"
            with contextlib.suppress(requests.RequestException):
                return requests.get(f"{base}/admin/login/", timeout=2).status_code == 200
            return False

        wait_until(up, 150, interval=0.5, message="make run's web process")
        wait_until(lambda: all(w in log_path.read_text() for w in WORKERS) and "beat v" in log_path.read_text(),
                   60, interval=0.5, message="the workers' and beat's start-up")

        # A first look, as in a browser: / leads to the docs; the admin login page and its styles.
        docs = requests.get(f"{base}/", timeout=10)
        assert (docs.status_code, docs.url) == (200, f"{base}/api/docs/")
        login = requests.get(f"{base}/admin/login/", timeout=10)
        css = re.search(r'href="(/static/admin/css/base\.[0-9a-f]+\.css)"', login.text)
        assert css, login.text[:2000]
        assert requests.get(base + css.group(1), timeout=10).status_code == 200
        assert requests.get(f"{base}/favicon.ico", timeout=10).status_code == 200
        time.sleep(5)  # late start-up output (beat's first ticks, workers' first tasks)
        assert proc.poll() is None, f"make run exited with {proc.returncode}: see {log_path}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a person stops it
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        redis.Redis.from_url(redis_url).flushdb()

    lines = log_path.read_text(errors="replace").splitlines()
    assert [line for line in lines if NOISE.search(line)] == [], f"see {log_path}"
