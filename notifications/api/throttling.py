"""Per-client rate limit: DRF's sliding log (``SimpleRateThrottle``), kept in a Redis sorted set.

The rate is the client's ``rate_limit`` (DRF syntax, ``"600/min"``) or
``settings.API_DEFAULT_RATE_LIMIT``. The rule is DRF's: a request is refused while the client's
requests accepted within the last ``duration`` number ``num_requests``; a refused request is not
counted; ``Retry-After`` is DRF's ``wait()``. DRF keeps that log as one pickled list in the cache,
read and written whole on every request (6,000 floats at the default rate: tens of KB each way, and
two processes' writes overwrite each other); here it is a sorted set changed by one Lua script, one
round trip of a few bytes. If Redis is unreachable the throttle lets the request through: losing
Redis may delay notifications, never refuse them (docs/ARCHITECTURE.md §2).
"""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

from core.redis_client import script

log = logging.getLogger(__name__)

#: KEYS[1] the client's log; ARGV now, duration (s), num_requests, a unique member.
#: Returns {1, 0} when the request is counted, {0, oldest score} when refused.
_SLIDING_LOG = """
local key, now, duration, limit = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - duration)
local count = redis.call('ZCARD', key)
if count >= limit then
  local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return {0, count, oldest[2]}
end
redis.call('ZADD', key, now, ARGV[4])
redis.call('PEXPIRE', key, math.ceil(duration * 1000))
return {1, count + 1, '0'}
"""


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
        self.now = self.timer()
        try:
            allowed, self.count, oldest = script(_SLIDING_LOG)(
                keys=[f"throttle:{client.pk}"],
                args=[repr(self.now), self.duration, self.num_requests, f"{self.now!r}:{uuid.uuid4().hex[:8]}"])
        except Exception as exc:  # redis.exceptions.*
            log.warning("rate limit not enforced, Redis unavailable: %s", exc)
            return True
        self.oldest = float(oldest)
        return bool(allowed)

    def wait(self) -> float | None:
        """DRF's: the rest of the oldest request's window, shared among the requests still available."""
        available = self.num_requests - self.count + 1
        if available <= 0:
            return None
        return (self.duration - (self.now - self.oldest)) / available

    def get_cache_key(self, request, view) -> str | None:
        client = request.auth
        return None if client is None else f"throttle:{client.pk}"
