"""End to end, the workers' heartbeats (config/celery.py, ``WorkerHeartbeat``): every kind of worker
the Procfile starts writes its own as it starts and then every ``WORKER_HEARTBEAT_SECONDS``, the
series the ``WorkerHeartbeatMissing`` alert reads (docs/OPERATIONS.md, "Dashboards and alerts")."""

from __future__ import annotations

import pytest

from bench.stack import wait_until
from core.queues import WORKERS
from core.redis_client import get_redis
from notifications import health

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_every_kind_of_worker_beats_from_its_start(stack):
    assert WORKERS == ("high", "standard", "fanout", "maintenance", "receipts", "webhooks")
    get_redis().delete(*(health.WORKER_HEARTBEAT_PREFIX + kind for kind in WORKERS))
    # The keys are gone; only a beat of the running workers writes them again.

    def every_kind_beat():
        ages = health.worker_heartbeat_ages()
        return ages if set(ages) == set(WORKERS) else None

    ages = wait_until(every_kind_beat, timeout=3 * health.WORKER_HEARTBEAT_SECONDS,
                      message="a heartbeat of every kind of worker")
    assert all(age < 2 * health.WORKER_HEARTBEAT_SECONDS for age in ages.values()), ages
