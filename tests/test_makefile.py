"""The Makefile's targets that start the web process collect the static files first (WhiteNoise
serves them from STATIC_ROOT under gunicorn; without them the admin and /api/docs/ are blank)."""

from __future__ import annotations

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
