"""Sent markers: ``sent:{notification_id}`` keys in Redis (docs/ARCHITECTURE.md, "The send path", record).

Written *after* the provider accepted, by the calls stage before the row is recorded (so a worker
killed or cut off from Postgres before its record leaves the marker behind): within a few
milliseconds of each accepted call of a standard window, in the one pipeline after a high-tier call
(:func:`queue_mark_sent`); by the record stage once the row says ``sent`` when not written yet.
Read before every provider call.
A marker only ever prevents a duplicate; its absence never prevents a send. When Redis is down the
pipeline falls back to the row's status (which the claim already checked), so losing Redis can
cause a rare duplicate, never a loss.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis
from django.conf import settings

from core.redis_client import Round, get_redis, script

log = logging.getLogger(__name__)
_MARK_SENT = "for _, key in ipairs(KEYS) do redis.call('SET', key, '1', 'EX', ARGV[1]) end"


def _key(notification_id) -> str:
    return f"sent:{notification_id}"


def find_sent(ids: Iterable) -> set[str]:
    """The subset of ``ids`` (as strings) that have a sent marker. Empty set if Redis is down."""
    ids = [str(i) for i in ids]
    if not ids:
        return set()
    try:
        values = get_redis().mget([_key(i) for i in ids])
    except redis.RedisError as exc:
        log.warning("sent-marker lookup skipped, Redis unavailable: %s", exc)
        return set()
    return {i for i, v in zip(ids, values, strict=True) if v is not None}


def mark_sent(ids: Iterable) -> None:
    """Set ``sent:{id}`` with the configured TTL (48 h) for each id. Errors are logged, not raised."""
    ids = [str(i) for i in ids]
    if not ids:
        return
    ttl = settings.NOTIFY["SENT_MARKER_TTL_SECONDS"]
    try:
        # One script call sets them all: a pipeline of SET EX costs ~60 µs a key in redis-py.
        mark = script(_MARK_SENT)
        for start in range(0, len(ids), 1000):
            mark(keys=[_key(i) for i in ids[start:start + 1000]], args=[ttl])
    except redis.RedisError as exc:
        log.warning("sent marker not written, Redis unavailable: %s", exc)


def queue_mark_sent(batch: Round, ids: Iterable) -> None:
    """:func:`mark_sent` of a few ids (one call's) as a command of the caller's ``batch`` (reading:
    ``None``)."""
    ids = [str(i) for i in ids]
    if not ids:
        batch.known(None)
    else:
        batch.script(_not_marked, _MARK_SENT, [_key(i) for i in ids], [settings.NOTIFY["SENT_MARKER_TTL_SECONDS"]])


def _not_marked(answer) -> None:
    if isinstance(answer, redis.RedisError):
        log.warning("sent marker not written, Redis unavailable: %s", answer)
