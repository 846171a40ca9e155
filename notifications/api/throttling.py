"""Per-client rate limit, DRF throttling with its counters in Redis (Django's cache).

The rate is the client's ``rate_limit`` (DRF syntax, ``"600/min"``) or
``settings.API_DEFAULT_RATE_LIMIT``. If Redis is unreachable the throttle lets the request through:
losing Redis may delay notifications, never refuse them (docs/ARCHITECTURE.md §2).
"""

from __future__ import annotations

import logging

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

log = logging.getLogger(__name__)


class ApiClientRateThrottle(SimpleRateThrottle):
    scope = "api_client"

    def get_rate(self):  # the rate depends on the client, resolved in allow_request
        return settings.API_DEFAULT_RATE_LIMIT

    def allow_request(self, request, view) -> bool:
        client = request.auth
        if client is None:
            return True
        self.rate = client.rate_limit or settings.API_DEFAULT_RATE_LIMIT
        try:
            self.num_requests, self.duration = self.parse_rate(self.rate)
        except (ValueError, KeyError):
            log.error("API client %s has an invalid rate_limit %r; using the default", client.pk, self.rate)
            self.rate = settings.API_DEFAULT_RATE_LIMIT
            self.num_requests, self.duration = self.parse_rate(self.rate)
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # redis.exceptions.* through the cache backend
            log.warning("rate limit not enforced, cache unavailable: %s", exc)
            return True

    def get_cache_key(self, request, view) -> str | None:
        client = request.auth
        return None if client is None else f"throttle:{client.pk}"
