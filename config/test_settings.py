"""Settings for the pytest process: the project settings, with Redis on its own database number
(``TEST_REDIS_DB``, default 1) so tests never touch the keys of a `make run` stack sharing the same
project-local Redis server. Two test sessions at once on one machine need different
``TEST_REDIS_DB`` and ``TEST_DATABASE_NAME`` values. Under pytest-xdist (``make test`` runs two
workers) each worker takes the next number after the base: worker ``gwN`` uses ``TEST_REDIS_DB + N``
(pytest-django gives it its own database, ``<name>_gwN``), and its own Prometheus directory."""

import os
import tempfile

# Read before config.settings defaults it to .run/prometheus.
_GIVEN_PROM_DIR = os.environ.get("PROMETHEUS_MULTIPROC_DIR")

from config.settings import *  # noqa: E402, F403
from config.settings import REDIS_URL as _BASE_REDIS_URL  # noqa: E402

#: The xdist worker's index (``gw1`` → 1); 0 without xdist.
XDIST_WORKER_INDEX = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
TEST_REDIS_DB = int(os.environ.get("TEST_REDIS_DB", "1")) + XDIST_WORKER_INDEX
REDIS_URL = _BASE_REDIS_URL.rsplit("/", 1)[0] + f"/{TEST_REDIS_DB}"
#: A Redis database no process of this session uses, for a test starting its own stack (docs/TESTING.md).
SPARE_REDIS_DB = int(os.environ.get("TEST_REDIS_DB", "1")) + int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
CELERY_BROKER_URL = REDIS_URL
CACHES["default"]["LOCATION"] = REDIS_URL  # noqa: F405

# Metric files apart from a `make run` stack's; an xdist worker takes a subdirectory of its controller's.
_PROM_DIR = _GIVEN_PROM_DIR or tempfile.mkdtemp(prefix="notify-prom-")
if _GIVEN_PROM_DIR is None:
    os.environ["NOTIFY_TEST_PROM_DIR"] = _PROM_DIR
elif os.environ.get("NOTIFY_TEST_PROM_DIR") == _GIVEN_PROM_DIR and "PYTEST_XDIST_WORKER" in os.environ:
    _PROM_DIR = os.path.join(_PROM_DIR, os.environ["PYTEST_XDIST_WORKER"])
    os.makedirs(_PROM_DIR, exist_ok=True)
PROMETHEUS_MULTIPROC_DIR = os.environ["PROMETHEUS_MULTIPROC_DIR"] = _PROM_DIR

# In-process tests render pages without collected static files (docs/TESTING.md).
STATIC_ROOT = None
STORAGES = {"default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
            "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}

# The send path runs inside the test's transaction: no heartbeat thread, receipts inline (docs/TESTING.md).
NOTIFY = {**NOTIFY, "LEASE_HEARTBEAT": False, "RECEIPTS_INLINE": True, "RECEIPTS_DRAIN_LINGER": 0}  # noqa: F405
