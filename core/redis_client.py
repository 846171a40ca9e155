"""The Redis clients of a process (one per URL) and the Lua-script helper.

Every Redis user (sent markers, provider isolation's buckets and breakers, health checks, queue
depths) takes its client from here, so a process holds one connection pool per Redis URL: the
application's ``settings.REDIS_URL`` (:func:`get_redis`) and, for queue depths, the broker's
(:func:`client_for`). Celery's own broker connection is kombu's, not one of these.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

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


class Round:
    """Commands of several owners sent to Redis in one round trip (a pipeline without MULTI; each
    command stays atomic on its own, as when sent alone). An owner queues its command with
    :meth:`call` or :meth:`script` and passes ``read``: its own reading of the answer, or of the
    ``redis.RedisError`` in its place (Redis unreachable: every command gets the error), so each
    rule keeps its failure policy. :meth:`send` returns the readings in the order queued."""

    def __init__(self) -> None:
        self._pipe = get_redis().pipeline(transaction=False)
        self._reads: list[tuple[Callable[[Any], Any], bool]] = []

    def known(self, value: Any) -> None:
        """An owner's reading known without asking Redis (nothing to send): ``value`` in its place."""
        self._reads.append((lambda _none: value, False))

    def call(self, read: Callable[[Any], Any], *command: Any) -> None:
        """Queue ``command`` (``"ZREM", key, member, …``)."""
        self._pipe.execute_command(*command)
        self._reads.append((read, True))

    def script(self, read: Callable[[Any], Any], source: str, keys: list, args: list) -> None:
        """Queue the Lua ``source`` as EVALSHA; a Redis that lost it (restarted, flushed) runs it
        again alone (:func:`script` loads it), so ``read`` never sees NOSCRIPT."""
        runner = script(source)
        self._pipe.evalsha(runner.sha, len(keys), *keys, *args)

        def again(answer: Any) -> Any:
            if isinstance(answer, redis.exceptions.NoScriptError):
                try:
                    answer = runner(keys=keys, args=args)
                except redis.RedisError as exc:
                    answer = exc
            return read(answer)

        self._reads.append((again, True))

    def send(self) -> list:
        """Send what was queued (nothing: no round trip); each owner's reading, in order."""
        queued = sum(1 for _read, sent in self._reads if sent)
        answers: list = []
        if queued:
            try:
                answers = self._pipe.execute(raise_on_error=False)
            except redis.RedisError as exc:
                answers = [exc] * queued
            finally:
                self._pipe.reset()
        found = iter(answers)
        return [read(next(found) if sent else None) for read, sent in self._reads]


def first_found_missing(client: redis.Redis, key: str, field: str, now: float) -> float:
    """The unix time a reader first found ``field`` of hash ``key`` (a last-success record) missing:
    ``now`` is kept there (HSETNX, under ``field``'s own name plus ``:missing_since``) unless an earlier
    reader kept one. In the record's own hash, so a flush or a new Redis forgets both and restarts the
    clock. The rule of notifications/housekeeping.py and core/partitions.py (the why is there)."""
    pipe = client.pipeline(transaction=False)
    pipe.hsetnx(key, f"{field}:missing_since", f"{now:.3f}")
    pipe.hget(key, f"{field}:missing_since")
    return float(pipe.execute()[1])
