"""The receipts waiting for the receipts worker: a Redis list the webhooks append to and one drain
task at a time empties in batches.

One Celery task per webhook request cost ~2 ms of worker CPU per request before any receipt was
applied, and Twilio posts one request per status (2–3 per SMS): ``bench --receipts`` measured the
worker at ~3 ms per callback. Now a request appends its receipts (:func:`push`, one round trip) and
only the request that finds no drain pending queues one (:data:`DRAIN_FLAG`, ``SET NX``); the drain
(:func:`drain`) takes up to :data:`TAKE` requests' receipts at a time, in the order they came, and
applies each provider's in one :func:`notifications.receipts.apply_receipts` call (one lookup, one
INSERT, one UPDATE per batch) until the list is empty. Under load batches grow by themselves; a
lone callback is applied as soon as before.

Durability is the queue's: a receipt in the list is as safe as one in a queued task (both in Redis;
tasks are acked on receipt, so a worker dying mid-batch loses its batch either way: receipts
inform, the delivery is recorded already). The flag expires after :data:`FLAG_SECONDS`; a drain
that died leaves its receipts to the next webhook's drain, or to the reconciler's tick
(:func:`stranded`), which queues one when receipts wait and no drain is pending.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from core.redis_client import get_redis

BUFFER_KEY = "receipts:buffer"
DRAIN_FLAG = "receipts:drain-queued"
#: Webhook requests' receipts taken per batch (a SendGrid request holds up to hundreds of events).
TAKE = 200
#: A drain that stopped renewing its flag this long ago is presumed dead.
FLAG_SECONDS = 30


def push(items: list[dict]) -> bool:
    """Append one webhook request's receipts (as ``notifications.receipts.to_wire`` wrote them).
    Returns True when no drain was pending: the caller queues one.

    Raises:
        redis.RedisError: Redis is unreachable (the caller applies the receipts itself).
    """
    pipe = get_redis().pipeline(transaction=False)
    pipe.rpush(BUFFER_KEY, json.dumps(items))
    pipe.set(DRAIN_FLAG, "1", nx=True, ex=FLAG_SECONDS)
    return bool(pipe.execute()[1])


def stranded() -> bool:
    """Whether receipts wait with no drain pending (its task lost, or the drain died and its flag
    expired); if so the flag is taken and the caller queues a drain."""
    client = get_redis()
    return bool(client.llen(BUFFER_KEY)) and bool(client.set(DRAIN_FLAG, "1", nx=True, ex=FLAG_SECONDS))


def drain(apply: Callable[[list[dict]], dict[str, int]]) -> dict[str, int]:
    """Take the waiting receipts batch by batch and ``apply`` each provider's run of them (in the
    order they came) until none is left; then clear the flag. Returns the summed counts."""
    client = get_redis()
    total = {"applied": 0, "duplicate": 0, "unknown": 0}
    while True:
        raw: list[bytes] | None = client.lpop(BUFFER_KEY, TAKE)  # type: ignore[assignment]
        if not raw:
            client.delete(DRAIN_FLAG)
            # A webhook that appended after the empty read saw the flag and queued nothing: go on.
            if client.llen(BUFFER_KEY) and client.set(DRAIN_FLAG, "1", nx=True, ex=FLAG_SECONDS):
                continue
            return total
        client.expire(DRAIN_FLAG, FLAG_SECONDS)
        for run in _runs_by_provider([item for entry in raw for item in json.loads(entry)]):
            for key, value in apply(run).items():
                total[key] = total.get(key, 0) + value


def _runs_by_provider(items: list[dict]) -> list[list[dict]]:
    """``items`` split by provider, each provider's in the order they came (a message's receipts all
    come from its one provider, so nothing orders them across providers)."""
    runs: dict[str, list[dict]] = {}
    for item in items:
        runs.setdefault(str(item.get("provider")), []).append(item)
    return list(runs.values())
