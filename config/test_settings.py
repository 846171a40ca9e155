"""Settings for the pytest process: the project settings, with Redis on its own database number
(``TEST_REDIS_DB``, default 1) so tests never touch the keys of a `make run` stack sharing the same
project-local Redis server. Two test sessions at once on one machine need different
``TEST_REDIS_DB`` and ``TEST_DATABASE_NAME`` values."""

import os

from config.settings import *  # noqa: F403
from config.settings import REDIS_URL as _BASE_REDIS_URL

REDIS_URL = _BASE_REDIS_URL.rsplit("/", 1)[0] + "/" + os.environ.get("TEST_REDIS_DB", "1")
CELERY_BROKER_URL = REDIS_URL
CACHES["default"]["LOCATION"] = REDIS_URL  # noqa: F405
