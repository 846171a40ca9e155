"""The abuse limits in force and their sliding windows in Redis (docs/POLICIES.md, "Abuse limits").

A rule counts the accepted requests that match it (a type key and/or a category) per subject: the
recipient (``user``), its phone number (``phone``: requests that would send an SMS) or its email
address (``email``: requests that would send an email). A window is a Redis sorted set
``acceptance:{rule}:{per}:{subject}`` of ``{request id}:{user_id}`` members scored by the accept
instant (ms, the platform clock); phone numbers and addresses are hashed into the key. One Lua
script checks every window a request touches and adds it to all of them, or to none, atomically:
two concurrent requests can never both take the last slot, and a concurrent duplicate of the same
request (same id) counts once.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import redis
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError
from django.utils.crypto import salted_hmac

from core.api.refusals import AcceptanceLimited, AcceptanceLimitsUnavailable
from core.compiled import Compiled
from core.redis_client import get_redis, script
from notifications import metrics
from notifications.acceptance.models import MAX_WINDOW_SECONDS, AcceptanceLimit, Per

log = logging.getLogger(__name__)

KEY_PREFIX = "acceptance:"

# KEYS: the windows. ARGV[1]: now (ms); then per key three values: member, limit, window (ms).
# Returns {0, 0} when every window had room (the member is then in all of them), or
# {i, ms} for the first full window KEYS[i] and the ms until its next slot frees (nothing added).
_CHECK_AND_ADD = """
local now = tonumber(ARGV[1])
local adding, seen = {}, {}
for i, key in ipairs(KEYS) do
  local member, limit, window = ARGV[3 * i - 1], tonumber(ARGV[3 * i]), tonumber(ARGV[3 * i + 1])
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local tag = key .. '|' .. member
  if not seen[tag] and not redis.call('ZSCORE', key, member) then
    seen[tag] = true
    local stored = redis.call('ZCARD', key)
    local count = stored + (adding[key] or 0)
    if count >= limit then
      local frees = window
      local index = count - limit
      if index < stored then
        local oldest = redis.call('ZRANGE', key, index, index, 'WITHSCORES')
        frees = tonumber(oldest[2]) + window - now
      end
      return {i, frees}
    end
    adding[key] = (adding[key] or 0) + 1
  end
end
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, 'NX', now, ARGV[3 * i - 1])
  redis.call('PEXPIRE', key, tonumber(ARGV[3 * i + 1]))
end
return {0, 0}
"""


@dataclass(frozen=True)
class Rule:
    """One abuse limit: at most ``limit`` matching requests per ``per`` in any ``window_seconds``.
    ``type_key`` / ``category``: what it counts ("" = any; never both empty). ``source``:
    ``settings`` or ``admin`` (a row of :class:`AcceptanceLimit`)."""

    name: str
    type_key: str
    category: str
    per: str
    limit: int
    window_seconds: int
    source: str = "settings"

    def matches(self, type_key: str, category: str, channels: Iterable[str]) -> bool:
        if self.type_key and self.type_key != type_key:
            return False
        if self.category and self.category != category:
            return False
        if self.per == Per.PHONE:
            return "sms" in channels
        if self.per == Per.EMAIL:
            return "email" in channels
        return True

    def describe(self) -> str:
        what = " and ".join(f"{k} {v}" for k, v in (("type", self.type_key), ("category", self.category)) if v)
        return f"at most {self.limit} of {what} per {self.per} in {self.window_seconds} s"


def settings_rules() -> list[Rule]:
    """``settings.NOTIFY["ACCEPTANCE_LIMITS"]`` as rules: a list of ``{name, match: {type?, category?},
    per: user|phone|email, limit, window_seconds}``. Raises ImproperlyConfigured naming a bad entry."""
    rules = []
    for index, entry in enumerate(settings.NOTIFY.get("ACCEPTANCE_LIMITS", [])):
        try:
            match = entry.get("match") or {}
            rule = Rule(name=str(entry["name"]), type_key=str(match.get("type", "")),
                        category=str(match.get("category", "")), per=str(entry["per"]), limit=int(entry["limit"]),
                        window_seconds=int(entry["window_seconds"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ImproperlyConfigured(f"NOTIFY['ACCEPTANCE_LIMITS'][{index}]: {exc!r}") from None
        problem = ("per must be user, phone or email" if rule.per not in Per.values
                   else "match needs a type, a category or both" if not (rule.type_key or rule.category)
                   else "limit must be at least 1" if rule.limit < 1
                   else f"window_seconds must be 1-{MAX_WINDOW_SECONDS}"
                   if not 1 <= rule.window_seconds <= MAX_WINDOW_SECONDS else "")
        if problem:
            raise ImproperlyConfigured(f"NOTIFY['ACCEPTANCE_LIMITS'][{index}] ({rule.name}): {problem}")
        rules.append(rule)
    return rules


#: The admin's rows, read on every send (compiled once per thread: core/compiled.py).
_ADMIN_ROWS = Compiled(lambda: AcceptanceLimit.objects.all())


def effective_rules() -> list[Rule]:
    """The rules in force: the settings' rules, each replaced by the admin's row of the same name
    (dropped when that row is disabled), then the admin's other enabled rows, by name."""
    rows = {row.name: row for row in _ADMIN_ROWS.models()}
    out = []
    for rule in settings_rules():
        row = rows.pop(rule.name, None)
        out.append(rule if row is None else _from_row(row))
    out.extend(_from_row(row) for row in rows.values())
    return [rule for rule in out if rule is not None]


def _from_row(row: AcceptanceLimit) -> Rule | None:
    if not row.enabled:
        return None
    return Rule(name=row.name, type_key=row.type_key, category=row.category, per=row.per, limit=row.limit,
                window_seconds=row.window_seconds, source="admin")


def rules_for(*, type_key: str, category: str, channels: Sequence[str]) -> list[Rule]:
    """The rules in force that count a request of this type (``""`` for an untyped send), category
    and channels."""
    return [rule for rule in effective_rules() if rule.matches(type_key, category, channels)]


def _contact(per: str, recipient) -> str:
    return (recipient.phone or "") if per == Per.PHONE else (recipient.email or "").strip().lower()


def _subject(rule: Rule, recipient) -> str:
    if rule.per == Per.USER:
        return f"user:{recipient.user_id}"
    contact = _contact(rule.per, recipient)
    if not contact:
        return ""
    return f"{rule.per}:{hashlib.sha256(contact.encode()).hexdigest()[:32]}"


#: The per-contact rule that counts a row of each channel at send time.
CONTACT_PER = {"sms": Per.PHONE, "email": Per.EMAIL}
CONTACT_MARK_SALT = "notifications.acceptance.contact_mark"


def contact_mark(recipient, channel: str) -> str:
    """A keyed digest (16 hex) of the contact a ``channel`` row goes to (``sms``: the phone,
    ``email``: the address), ``""`` without one or for another channel. Stored on the row at
    acceptance, so the send tells without Redis whether the contact is still the one counted."""
    per = CONTACT_PER.get(channel)
    contact = _contact(per, recipient) if per else ""
    return salted_hmac(CONTACT_MARK_SALT, contact, algorithm="sha256").hexdigest()[:16] if contact else ""


def send_rules(rules: Sequence[Rule], *, type_key: str, category: str, channel: str) -> list[Rule]:
    """Of ``rules``, those that count a ``channel`` row of this type and category per its contact
    (phone rules for SMS, address rules for email): what the send counts again when the contact is
    not the one counted at acceptance (docs/POLICIES.md, "Abuse limits")."""
    per = CONTACT_PER.get(channel)
    return [r for r in rules if r.per == per and r.matches(type_key, category, [channel])]


@dataclass
class Reservation:
    """The slots a request took (window key, member): :meth:`release` gives them back when the
    transaction that writes its rows fails."""

    slots: list[tuple[str, str]]

    def __enter__(self) -> Reservation:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # An IntegrityError is a concurrent duplicate of this request that committed first: its
        # members are this request's, so the slots stay (they count that one).
        if exc_type is not None and not issubclass(exc_type, IntegrityError):
            self.release()

    def release(self) -> None:
        if not self.slots:
            return
        try:
            pipe = get_redis().pipeline(transaction=False)
            for key, member in self.slots:
                pipe.zrem(key, member)
            pipe.execute()
        except redis.RedisError as exc:  # the slots then run out with their window
            log.warning("acceptance limits: slots of a failed request not released: %s", exc)


def reserve(rules: Sequence[Rule], *, request_id: str, recipients: Sequence, client, now: datetime) -> Reservation:
    """Take one slot in every window of ``rules`` for each of ``recipients`` (member
    ``{request_id}:{user_id}``), all or none. The gate (:func:`notifications.admission.admit`) calls
    it after the request is validated and known not to replay an accepted one, before writing it.

    Raises:
        AcceptanceLimited: a window is full; names the rule and the first limited recipient (in
            ``recipients`` order) and the seconds until a slot frees. Counted in
            ``notify_acceptance_limited_total{limit}`` and logged (user id, limit, client; no content).
        AcceptanceLimitsUnavailable: Redis cannot be reached (nothing is accepted unlimited).
    """
    slots: list[tuple[str, str]] = []
    args: list[str | int] = []  # per slot: member, limit, window (ms)
    owners = []
    for recipient in recipients:
        for rule in rules:
            subject = _subject(rule, recipient)
            if not subject:
                continue
            member = f"{request_id}:{recipient.user_id}"
            slots.append((f"{KEY_PREFIX}{rule.name}:{subject}", member))
            args += [member, rule.limit, rule.window_seconds * 1000]
            owners.append((rule, recipient.user_id))
    if not slots:
        return Reservation([])
    try:
        full, frees_ms = script(_CHECK_AND_ADD)(keys=[k for k, _ in slots], args=[int(now.timestamp() * 1000), *args])
    except redis.RedisError as exc:
        log.error("acceptance limits unavailable (Redis): %s; request refused with 503", exc)
        raise AcceptanceLimitsUnavailable() from None
    if full:
        rule, user_id = owners[int(full) - 1]
        wait = math.ceil(int(frees_ms) / 1000)
        metrics.acceptance_limited(rule.name)
        log.warning("acceptance limited: user_id=%s limit=%s client=%s retry_after=%ss", user_id, rule.name,
                    getattr(client, "name", client), wait)
        raise AcceptanceLimited(rule.name, user_id, wait,
                                f"user {user_id!r} is over the limit {rule.name} ({rule.describe()}); "
                                f"a slot frees in {wait} s")
    return Reservation(slots)


def bulk_send_problem(*, type_key: str, category: str, channels: Sequence[str]) -> str:
    """Why a campaign of this type (``""``: none) and category may not be sent, or ``""``: a limit
    counts requests one subject asks for (a code, a reset), and a campaign would send to every member at
    once, past it; such messages go one request each (docs/POLICIES.md, "Abuse limits")."""
    rules = rules_for(type_key=type_key, category=category, channels=channels)
    if not rules:
        return ""
    what = f"type {type_key}" if type_key and any(r.type_key for r in rules) else f"category {category}"
    return (f"{what} is under the abuse limit {rules[0].name} ({rules[0].describe()}): a campaign would send it "
            "to every member at once, past the limit; send it one request per user (POST /v1/events)")

