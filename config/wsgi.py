"""WSGI entry point (gunicorn ``config.wsgi``): the Django application, with the OpenAPI schema
generated once before the first request, behind the provider webhooks' light path
(config/light_webhooks.py: their callbacks skip Django's middleware and handler).

drf-spectacular resolves its optional extensions by importing modules lazily; concurrent first
requests to ``/api/schema/`` in a threaded server race in that import and some answer 500 (upstream
tfranzel/drf-spectacular#1122). Generating the schema once here, single-threaded, settles it.
"""

import logging
import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

application = get_wsgi_application()


def _warm_schema() -> None:
    try:
        from drf_spectacular.generators import SchemaGenerator

        SchemaGenerator().get_schema(request=None, public=True)
    except Exception:  # the API works without it; /api/schema/ then builds it on demand
        logging.getLogger(__name__).warning("OpenAPI schema warm-up failed", exc_info=True)


_warm_schema()

from config.light_webhooks import with_light_webhooks  # noqa: E402 (its views need django.setup() first)

application = with_light_webhooks(application)
