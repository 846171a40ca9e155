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

A taken batch is never lost (:func:`drain`): the take moves it, in one step, from the buffer into a
processing list of its own, leased in :data:`PROCESSING` until :data:`FLAG_SECONDS` from the
platform clock, and the list is removed only after the batch was applied (its transactions
committed). A drain that died mid-batch (worker killed) leaves its list leased; once the lease ran
out the next drain, or the reconciler's tick (:func:`stranded`), puts it back at the head of the
buffer (:func:`reclaim`) and it is applied again. Applying a batch twice is harmless: each receipt
is stored once by its ``dedup_key`` and the second time counts as a duplicate. The drain flag
expires after :data:`FLAG_SECONDS` too; a drain that died leaves the waiting receipts to the next
webhook's drain or to the reconciler's tick, which queues one when receipts wait and none is pending.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime

from core import clock
from core.redis_client import get_redis, script

BUFFER_KEY = "receipts:buffer"
DRAIN_FLAG = "receipts:drain-queued"
#: Batches being applied: a sorted set of their processing lists, scored by their lease's end (unix s).
PROCESSING = "receipts:processing"
#: A drain's processing list is this prefix plus the drain's id.
BATCH_PREFIX = "receipts:batch:"
#: Webhook requests' receipts taken per batch (a SendGrid request holds up to hundreds of events).
TAKE = 200
#: A drain that stopped renewing its flag (and its batch's lease) this long ago is presumed dead.
FLAG_SECONDS = 30

#: Release the drain's previous batch (applied), then move up to ARGV[1] entries from the buffer's
#: head to the batch's list and lease it until ARGV[2]: one round trip per batch.
_TAKE_SCRIPT = """
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], KEYS[2])
local items = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
if #items == 0 then return items end
redis.call('LTRIM', KEYS[1], #items, -1)
redis.call('RPUSH', KEYS[2], unpack(items))
redis.call('ZADD', KEYS[3], ARGV[2], KEYS[2])
return items
"""

#: Put every batch whose lease ended by ARGV[1] back at the buffer's head, in its order; returns
#: how many entries went back.
_RECLAIM_SCRIPT = """
local moved = 0
for _, batch in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])) do
  local items = redis.call('LRANGE', batch, 0, -1)
  for i = #items, 1, -1 do redis.call('LPUSH', KEYS[2], items[i]) end
  moved = moved + #items
  redis.call('DEL', batch)
  redis.call('ZREM', KEYS[1], batch)
end
return moved
"""


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


def reclaim() -> int:
    """Put the batches of drains that died (lease ended) back at the head of the buffer; returns
    how many webhook requests' receipts went back."""
    return int(script(_RECLAIM_SCRIPT)(keys=[PROCESSING, BUFFER_KEY], args=[clock.now().timestamp()]))


def stranded() -> bool:
    """Whether receipts wait with no drain pending (its task lost, or the drain died and its flag
    expired; a dead drain's batch counts once its lease ended); if so the flag is taken and the
    caller queues a drain."""
    reclaim()
    client = get_redis()
    return bool(client.llen(BUFFER_KEY)) and bool(client.set(DRAIN_FLAG, "1", nx=True, ex=FLAG_SECONDS))


def drain(apply: Callable[[list[dict]], dict[str, int]], linger: float = 0.0) -> dict[str, int]:
    """Take the waiting receipts batch by batch and ``apply`` each provider's run of them (in the
    order they came) until none is left; then clear the flag. Returns the summed counts. A batch
    leaves Redis only after ``apply`` returned for all of it (module docstring). After a batch that
    was not full the drain waits ``linger`` seconds, so that the next one gathers more receipts: a
    batch's statements cost about the same for 5 receipts as for 500."""
    client = get_redis()
    batch = f"{BATCH_PREFIX}{uuid.uuid4().hex}"
    total = {"applied": 0, "duplicate": 0, "unknown": 0}
    reclaim()
    while True:
        lease_end = clock.now().timestamp() + FLAG_SECONDS
        raw = script(_TAKE_SCRIPT)(keys=[BUFFER_KEY, batch, PROCESSING], args=[TAKE, lease_end])
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
        # Applied: the next take releases the batch.
        if linger and len(raw) < TAKE:
            time.sleep(linger)


def backlog() -> dict:
    """What waits for the receipts worker (``/metrics``): ``requests``, the webhook requests whose
    receipts are in the buffer, and ``oldest_age``, seconds since the oldest of them was received
    (platform clock; ``0`` when none waits, ``None`` when it cannot be read). One round trip.

    Raises:
        redis.RedisError: Redis is unreachable.
    """
    pipe = get_redis().pipeline(transaction=False)
    pipe.llen(BUFFER_KEY)
    pipe.lindex(BUFFER_KEY, 0)
    requests, head = pipe.execute()
    oldest_age = 0.0 if head is None else None
    if head is not None:
        try:
            received = datetime.fromisoformat(json.loads(head)[0]["received_at"])
            oldest_age = max(0.0, (clock.now() - received).total_seconds())
        except (ValueError, TypeError, KeyError, IndexError):
            pass
    return {"requests": int(requests), "oldest_age": oldest_age}


def _runs_by_provider(items: list[dict]) -> list[list[dict]]:
    """``items`` split by provider, each provider's in the order they came (a message's receipts all
    come from its one provider, so nothing orders them across providers)."""
    runs: dict[str, list[dict]] = {}
    for item in items:
        runs.setdefault(str(item.get("provider")), []).append(item)
    return list(runs.values())
