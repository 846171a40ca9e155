"""The Makefile's targets that start the web process collect the static files first (WhiteNoise
serves them from STATIC_ROOT under gunicorn; without them the admin and /api/docs/ are blank)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from bench.stack import ROOT

STARTS_WEB = {"run": "honcho start -f Procfile", "test": "-m pytest", "bench": "manage.py bench",
              "bench-smoke": "manage.py bench", "test-chaos": "-m pytest tests/chaos"}


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", sorted(STARTS_WEB))
def test_targets_that_start_the_web_process_collect_static_files_first(target):
    dry_run = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True)
    lines = dry_run.stdout.splitlines()
    collect = [i for i, line in enumerate(lines) if "manage.py collectstatic --noinput" in line]
    start = [i for i, line in enumerate(lines) if STARTS_WEB[target] in line]
    assert collect and start, dry_run.stdout
    assert collect[0] < start[0], dry_run.stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["test", "test-fast"])
def test_the_suite_runs_in_two_workers_with_the_stack_tests_kept_together(target):
    """``--dist loadgroup`` keeps each xdist group on one worker and hands the biggest out first
    (tests/conftest.py): without it the end-to-end tests would start one stack per worker. (The
    defaults: not the TEST_WORKERS of a `make test TEST_WORKERS=4` this may run under.)"""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "TEST_WORKERS")}
    dry_run = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True, env=env)
    runs = [line for line in dry_run.stdout.splitlines() if "-m pytest" in line]
    assert "-m pytest -n 2 --dist loadgroup" in runs[0], runs
    if target == "test":  # every test: the parallel run, then the `serial` ones alone
        assert [run.split("-m pytest", 1)[1].split("||")[0].strip() for run in runs] == [
            '-n 2 --dist loadgroup -m "not serial"', "-m serial"], runs


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_the_suite_checks_and_unit_tests_the_alert_rules_first():
    """`make test` runs `make alert-rules` (promtool, installed when missing) before the suite."""
    dry_run = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, check=True)
    text = dry_run.stdout
    assert "$tool check rules deploy/prometheus/alerts.yml" in text, text
    assert text.index("$tool test rules deploy/prometheus/alerts_test.yml") < text.index("-m pytest"), text
    assert "install -y --no-install-recommends prometheus" not in text  # promtool alone, never the server
    assert "apt-get download -qq prometheus" in text and "dpkg-deb -x" in text
