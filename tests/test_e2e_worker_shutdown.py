"""End to end: a worker stopped as `make run` or a deployment stops it (SIGTERM: Celery's warm
shutdown) closes its providers' aiohttp sessions first (issue 23 #5: aiohttp logged ``ERROR Unclosed
client session`` at every stop). The threaded high worker is the one whose interpreter collects what
is left at exit (a prefork pool process ends with ``os._exit``)."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from tests.e2e import SENT, make_user, send, wait_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_the_high_worker_stops_without_an_unclosed_client_session(api, emulator, uid, stack):
    make_user(api, uid)
    for channel in ("sms", "push"):  # the two providers with a pooled aiohttp session
        wait_status(send(api, uid, channel, priority="high"), SENT)
    log = stack.log_path("worker_high")
    start = log.stat().st_size
    worker = stack.procs["worker_high"]

    worker.terminate()
    try:
        assert worker.wait(timeout=30) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        stack.start("worker_high")
        stack.wait_for_workers()

    stopped = log.read_bytes()[start:].decode(errors="replace")
    assert "Warm shutdown" in stopped  # this section is the stop's
    assert [line for line in stopped.splitlines() if "Unclosed" in line] == []
