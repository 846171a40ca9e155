"""The Redis clients of a process (one per URL) and the Lua-script helper.

Every Redis user (sent markers, provider isolation's buckets and breakers, health checks, queue
depths) takes its client from here, so a process holds one connection pool per Redis URL: the
application's ``settings.REDIS_URL`` (:func:`get_redis`) and, for queue depths, the broker's
(:func:`client_for`). Celery's own broker connection is kombu's, not one of these.
"""

from __future__ import annotations

import threading

import redis
from django.conf import settings
from redis.commands.core import Script

_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()
_scripts: dict[str, Script] = {}


def client_for(url: str) -> redis.Redis:
    """The process's client for ``url`` (1 s socket and connect timeouts, health check every 30 s),
    made on first use. Its commands raise ``redis.RedisError`` when Redis is unreachable."""
    with _clients_lock:
        client = _clients.get(url)
        if client is None:
            client = _clients[url] = redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1,
                                                          health_check_interval=30)
        return client


def get_redis() -> redis.Redis:
    """The client for ``settings.REDIS_URL`` (:func:`client_for`)."""
    return client_for(settings.REDIS_URL)


def script(source: str) -> Script:
    """A redis-py ``Script`` for the Lua ``source`` on :func:`get_redis`'s client, registered once
    per process (it runs as EVALSHA, loading the script again after a Redis restart or flush)."""
    client = get_redis()
    found = _scripts.get(source)
    if found is None or found.registered_client is not client:
        found = _scripts[source] = client.register_script(source)
    return found
