"""End to end, the partition maintenance at beat start (docs/OPERATIONS.md, "Retention and
partitions"): django_celery_beat dates a never-run entry at its creation, so without the
``beat_init`` hook the hourly run came an hour after a fresh start. A restart runs it again."""

from __future__ import annotations

import pytest

from bench.stack import wait_until
from core import partitions
from core.redis_client import get_redis

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_beat_runs_the_partition_maintenance_as_it_starts_and_restarts(stack, live_db):
    for _start in range(2):  # the session's beat, then a restart
        stack.kill("beat")
        get_redis().delete(partitions.LAST_RUN_KEY)
        stack.start("beat")
        last = wait_until(lambda: partitions.last_run()["success_at"], timeout=45,
                          message="a successful partition maintenance after beat started")
        assert partitions.last_run()["outcome"] == "ok", last
    assert all(state.partitions >= 8 for state in partitions.states())  # today and seven days ahead
