"""Caps stage of the delivery pipeline: frequency caps, taken at send time (docs/POLICIES.md,
"Frequency caps").

Right after the checks verdict says "send" (``pipeline.prepare``), for a batch at once: a row subject
to a rule takes a slot in its user's sliding window in Redis (one Lua script decides the batch
atomically; a re-driven row reuses its own slot), or is ``suppressed`` with ``frequency_capped``. A
window without its "built" sentinel is rebuilt from Postgres first (rows mid-call are not read:
``_MAY_HOLD``) unless the tracking marker says Redis saw the whole window. A Redis error sends
nothing uncapped: those rows wait as a transient error. The why: docs/POLICIES.md, "Redis flushed or down".
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Q

from core.compiled import Compiled
from core.redis_client import get_redis, script
from notifications import metrics
from notifications.delivery import record
from notifications.delivery.outcomes import backoff_seconds
from notifications.delivery.types import Row
from notifications.events.models import NotificationType
from notifications.models import FrequencyCap, Notification, Reason, Status

log = logging.getLogger(__name__)

#: KEYS: (window, sentinel, tracking marker) per key. ARGV[1]: now (ms); ARGV[2]: JSON ``[{w: longest window ms,
#: seed: null | [[id, ms], …], rows: [{id, rules: [[limit, window ms], …]}, …]}, …]``.
#: Returns JSON: per key ``0`` (not built and no seed given: rebuild first) or per row
#: ``[admitted 0/1, rule index (1-based) that fired, count in its window, oldest instant ms]``.
_TAKE = """
local now = tonumber(ARGV[1])
local spec = cjson.decode(ARGV[2])
local out = {}
for i, k in ipairs(spec) do
  local zkey, skey, mkey = KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]
  local built = tonumber(redis.call('GET', skey) or '0')
  -- The marker says since when every slot of this category and channel (at this window) has been
  -- taken here; once that is a whole window ago, a key without a sentinel has nothing elsewhere
  -- (no rebuild: a user with no slot in the window, the common case of a campaign).
  redis.call('SET', mkey, now, 'NX')
  if built < k.w and tonumber(redis.call('GET', mkey)) <= now - k.w then
    built = k.w
  end
  if built < k.w and k.seed == cjson.null then
    out[i] = 0
  else
    if k.seed ~= cjson.null then
      for _, m in ipairs(k.seed) do redis.call('ZADD', zkey, 'NX', m[2], m[1]) end
    end
    redis.call('ZREMRANGEBYSCORE', zkey, '-inf', now - k.w)
    local res = {}
    for j, row in ipairs(k.rows) do
      local s = redis.call('ZSCORE', zkey, row.id)
      if s then s = tonumber(s) else s = nil end
      local admitted, fired, count, oldest, take, held = 1, 0, 0, 0, (s == nil), false
      for r, rule in ipairs(row.rules) do
        local lo = now - rule[2]
        local c
        held = s ~= nil and s > lo
        if held then
          c = redis.call('ZCOUNT', zkey, '(' .. lo, '(' .. s)  -- its own slot: the ones before it
        else
          if s then take = true end  -- its slot left this rule's window: it needs a new one
          c = redis.call('ZCOUNT', zkey, '(' .. lo, '+inf')
        end
        if c >= rule[1] then
          local first = redis.call('ZRANGEBYSCORE', zkey, '(' .. lo, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
          admitted, fired, count, oldest = 0, r, c, tonumber(first[2] or now)
          break
        end
      end
      if admitted == 1 and take then
        redis.call('ZADD', zkey, now, row.id)
      elseif admitted == 0 and held then
        -- past the limit within its own slot's window: a slot it never had (seeded by a rebuild
        -- while it was in flight, or the limit was lowered): it holds none
        redis.call('ZREM', zkey, row.id)
      end
      res[j] = {admitted, fired, count, oldest}
    end
    redis.call('PEXPIRE', zkey, k.w)
    redis.call('SET', skey, k.w, 'PX', k.w)
    out[i] = res
  end
end
return cjson.encode(out)
"""


@dataclass(frozen=True)
class Rule:
    """One effective rule: at most ``limit`` of ``category`` on ``channel`` per user in any rolling
    ``window_seconds``; ``source`` is ``settings`` or ``admin``."""

    name: str
    category: str
    channel: str
    limit: int
    window_seconds: int
    active: bool = True
    include_high: bool = False
    include_required: bool = False
    source: str = "settings"

    def applies(self, n: Notification, kind: NotificationType | None) -> bool:
        return (self.active and n.category == self.category and n.channel == self.channel
                and (self.include_high or n.priority != "high")
                and (self.include_required or not (kind is not None and kind.required)))

    def describe(self) -> str:
        """``marketing push: at most 3 per 24 h``."""
        w = self.window_seconds
        span = f"{w // 3600} h" if w % 3600 == 0 else f"{w // 60} min" if w % 60 == 0 else f"{w} s"
        return f"{self.category} {self.channel}: at most {self.limit} per {span}"


_FIELDS = ("name", "category", "channel", "limit", "window_seconds")
#: The admin's rules, read per batch (compiled once per thread: core/compiled.py).
_ADMIN_RULES = Compiled(lambda: FrequencyCap.objects.all())


def rules() -> list[Rule]:
    """Every rule, active or not: ``settings.NOTIFY["FREQUENCY_CAPS"]`` with the admin's rows added
    and overriding by name (what the admin lists). Raises ``ImproperlyConfigured`` for a settings
    rule without one of name, category, channel, limit, window_seconds."""
    found: dict[str, Rule] = {}
    for entry in settings.NOTIFY.get("FREQUENCY_CAPS", []):
        missing = [f for f in _FIELDS if f not in entry]
        if missing:
            raise ImproperlyConfigured(f"NOTIFY['FREQUENCY_CAPS']: rule {entry!r} lacks {', '.join(missing)}")
        fields = {k: entry[k] for k in _FIELDS}
        fields.update({k: bool(entry[k]) for k in ("active", "include_high", "include_required") if k in entry})
        found[entry["name"]] = Rule(**fields)
    for row in _ADMIN_RULES.models():
        found[row.name] = Rule(row.name, row.category, row.channel, row.limit, row.window_seconds, row.active,
                               row.include_high, row.include_required, source="admin")
    return sorted(found.values(), key=lambda r: (r.category, r.channel, r.name))


def _key(n: Notification) -> tuple[str, str, str]:
    return n.category, n.channel, n.recipient_id


def _redis_keys(key: tuple[str, str, str], window_ms: int = 0) -> list[str]:
    """The window, its "built" sentinel and the tracking marker of (category, channel, user)."""
    zkey = "fcap:{}:{}:{}".format(*key)  # the user id last: categories and channels hold no ':'
    return [zkey, zkey + ":built", f"fcap-tracking:{key[0]}:{key[1]}:{window_ms}"]


def _ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


@dataclass
class Taken:
    """The caps stage's answer for a batch: ``capped`` maps a row id to the detail naming the rule;
    ``unchecked`` are the rows subject to a rule that could not be decided (Redis error)."""

    capped: dict
    unchecked: list
    categories: frozenset = frozenset()  # of the active rules (the metric's label values)


def take(rows: list[Notification], kind_of: Callable[[Notification], NotificationType | None],
         now: datetime) -> Taken:
    """Take a slot for each row subject to an active rule, at ``now`` (UTC), in one script call
    (two when a key must be rebuilt from Postgres first). Rows subject to no rule are admitted
    without Redis. Raises nothing for Redis errors (the rows are ``unchecked``)."""
    active = [r for r in rules() if r.active]
    subject: dict[tuple, list] = defaultdict(list)  # key -> [(row, its rules)]
    longest: dict[tuple, int] = {}
    for n in rows:
        mine = [r for r in active if r.applies(n, kind_of(n))]
        if mine:
            subject[_key(n)].append((n, mine))
    categories = frozenset(r.category for r in active)
    if not subject:
        return Taken({}, [], categories)
    counted: dict[tuple, Rule] = {}  # key -> a stand-in rule that counts what any rule of the key counts
    for key in subject:
        of_key = [r for r in active if (r.category, r.channel) == key[:2]]
        longest[key] = max(r.window_seconds for r in of_key)
        counted[key] = Rule("", key[0], key[1], 0, 0, include_high=any(r.include_high for r in of_key),
                            include_required=any(r.include_required for r in of_key))
    keys = list(subject)
    try:
        answers = _run(keys, subject, longest, now, seeds=None)
        unbuilt = [key for key, answer in zip(keys, answers, strict=True) if answer == 0]
        if unbuilt:
            seeds = rebuilt(unbuilt, longest, counted, now, exclude={n.pk for n in rows})
            rebuilt_answers = iter(_run(unbuilt, subject, longest, now, seeds=seeds))
            answers = [next(rebuilt_answers) if answer == 0 else answer for answer in answers]
    except redis.RedisError as exc:
        log.warning("frequency caps not checked, Redis error (%s): %d row(s) wait as a transient error",
                    exc, sum(len(v) for v in subject.values()))
        return Taken({}, [n for entries in subject.values() for n, _mine in entries], categories)
    capped = {}
    for key, answer in zip(keys, answers, strict=True):
        for (n, mine), (admitted, fired, count, oldest) in zip(subject[key], answer, strict=True):
            if not admitted:
                rule = mine[fired - 1]
                if rule.limit == 0:  # nothing is ever admitted: no "sent since" to tell
                    capped[n.pk] = f"{rule.category} {rule.channel}: none allowed (rule {rule.name}, limit 0)"
                    continue
                since = datetime.fromtimestamp(oldest / 1000, UTC)
                capped[n.pk] = f"{rule.describe()}; {count} sent since {since:%Y-%m-%d %H:%M} UTC (rule {rule.name})"
    return Taken(capped, [], categories)


def _run(keys: list[tuple], subject: dict, longest: dict, now: datetime, seeds: dict | None) -> list:
    spec = [{"w": longest[key] * 1000, "seed": None if seeds is None else seeds.get(key, []),
             "rows": [{"id": str(n.pk), "rules": [[r.limit, r.window_seconds * 1000] for r in mine]}
                      for n, mine in subject[key]]} for key in keys]
    redis_keys = [k for key in keys for k in _redis_keys(key, longest[key] * 1000)]
    return json.loads(script(_TAKE)(keys=redis_keys, args=[_ms(now), json.dumps(spec)]))


#: Rows that may hold a slot without a ``sent_at``: waiting after a call in doubt (they are decided
#: again when re-driven, and then keep the slot only if it is among the first ``limit``). Not rows
#: ``sending``: reading them races with their own batch's decision (a row capped a moment after the
#: rebuild read it would be seeded as a slot nobody holds, and the user would get fewer than the
#: limit all window long); a flush while a row is mid-call can let that many more through instead.
_MAY_HOLD = Q(status__in=[Status.SCHEDULED, Status.QUEUED], reason__in=[Reason.LEASE_EXPIRED, Reason.OUTCOME_UNKNOWN])


def rebuilt(keys: list[tuple], longest: dict, counted: dict, now: datetime, exclude=()) -> dict[tuple, list]:
    """The slots of ``keys`` (category, channel, user) as Postgres knows them, ``{key: [[id, ms], …]}``:
    rows sent within the key's longest window (at ``sent_at``; not those a receipt made ``failed``),
    and rows that may hold a slot (back after a lost lease / unknown outcome: at ``updated_at``); not the exempt
    ones (high priority, ``required`` types) unless ``counted[key]`` includes them. ``exclude``:
    the ids being decided (they compete for a slot of their own). One query."""
    since = now - timedelta(seconds=max(longest[k] for k in keys))
    wanted = set(keys)
    found: dict[tuple, list] = {key: [] for key in keys}
    query = (Notification.objects
             .filter(recipient_id__in={k[2] for k in keys}, channel__in={k[1] for k in keys},
                     category__in={k[0] for k in keys})
             .filter((Q(sent_at__gt=since) & ~Q(status=Status.FAILED)) | _MAY_HOLD)  # bounced: slot given back
             .exclude(pk__in=list(exclude))
             .values_list("pk", "category", "channel", "recipient_id", "sent_at", "updated_at", "priority",
                          "notification_type__required"))
    for pk, category, channel, user, sent_at, updated_at, priority, required in query:
        key = (category, channel, user)
        at = sent_at or updated_at
        if (key in wanted and at > now - timedelta(seconds=longest[key])
                and (priority != "high" or counted[key].include_high)
                and (not required or counted[key].include_required)):
            found[key].append([str(pk), _ms(at)])
    return found


def admit(ready: list[Row], kind_of: Callable[[Notification], NotificationType | None],
          now: datetime) -> list[Row]:
    """The caps stage for the rows that passed their checks: records the capped rows
    (``suppressed``, ``frequency_capped``, in bulk) and the unchecked ones (``retry_scheduled``) and
    returns the rows admitted."""
    if not ready:
        return ready
    taken = take([row.n for row in ready], kind_of, now)
    if taken.capped:
        capped = [(row.n, taken.capped[row.n.pk]) for row in ready if row.n.pk in taken.capped]
        for n in record.suppress(capped, Reason.FREQUENCY_CAPPED):
            metrics.frequency_capped(n.category, n.channel, taken.categories)
    if taken.unchecked:
        slowest = max(n.attempts for n in taken.unchecked)
        delay = backoff_seconds(slowest, taken.unchecked[0].priority)
        record.reschedule(taken.unchecked, now + timedelta(seconds=delay),
                          f"frequency cap not checked (Redis error); retry in {delay:.1f}s",
                          kind="retry", give_back_attempt=True)
    held = set(taken.capped) | {n.pk for n in taken.unchecked}
    return [row for row in ready if row.n.pk not in held]


def give_back(rows: list[Notification]) -> None:
    """Free the slots of rows that ended without reaching the recipient (failed permanently after
    their call, dead-lettered): one ZREM per key in one pipeline. Errors are logged, not raised
    (the slot then runs out with its window)."""
    keyed = defaultdict(list)
    for n in rows:
        keyed[_key(n)].append(str(n.pk))
    if not keyed:
        return
    try:
        with get_redis().pipeline(transaction=False) as pipe:
            for key, ids in keyed.items():
                pipe.zrem(_redis_keys(key)[0], *ids)
            pipe.execute()
    except redis.RedisError as exc:
        log.warning("frequency-cap slots not given back, Redis unavailable: %s", exc)
