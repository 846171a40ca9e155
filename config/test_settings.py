"""Settings for the pytest process: the project settings, with Redis on its own database number
(``TEST_REDIS_DB``, default 1) so tests never touch the keys of a `make run` stack sharing the same
project-local Redis server. Two test sessions at once on one machine need different
``TEST_REDIS_DB`` and ``TEST_DATABASE_NAME`` values."""

import os
import tempfile

# Read before config.settings defaults it to .run/prometheus.
_GIVEN_PROM_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR")

from config.settings import *  # noqa: E402, F403
from config.settings import REDIS_URL as _BASE_REDIS_URL  # noqa: E402

REDIS_URL = _BASE_REDIS_URL.rsplit("/", 1)[0] + "/" + os.environ.get("TEST_REDIS_DB", "1")
CELERY_BROKER_URL = REDIS_URL
CACHES["default"]["LOCATION"] = REDIS_URL  # noqa: F405

# Metric files of test processes (and of the e2e stack, which inherits the environment) never mix
# with those of a `make run` stack.
PROMETHEUS_MULTIPROC_DIR = os.environ["PROMETHEUS_MULTIPROC_DIR"] = (
    _GIVEN_PROM_DIR or tempfile.mkdtemp(prefix="notify-prom-"))

# In-process tests (Django's test client) render pages without a collected STATIC_ROOT: plain
# storage, and no STATIC_ROOT for WhiteNoise to scan. Pages served as in production (gunicorn,
# WhiteNoise, the hashed manifest) are tested by the browser tests and the end-to-end stack, which
# run `collectstatic` first (bench/stack.py: collect_static).
STATIC_ROOT = None
STORAGES = {"default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}

# In-process tests run the send path inside the test's transaction, which a heartbeat thread (its
# own connection) cannot see: leases are renewed in the caller's thread only (notifications/leases.py).
# The end-to-end stack's workers use config.settings, heartbeat on.
# They run no receipts worker either: webhooks apply receipts in the request (RECEIPTS_INLINE); the
# queue path is tested on its own (tests/test_webhooks.py) and end to end.
NOTIFY = {**NOTIFY, "LEASE_HEARTBEAT": False, "RECEIPTS_INLINE": True}  # noqa: F405
