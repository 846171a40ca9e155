"""Fault rules of the provider emulator: injected errors, latency and rate limits.

A rule is a JSON object (``POST /_emulator/faults``)::

    {
      "provider": "twilio" | "sendgrid" | "fcm" | "smtp" | "*",  # default "*"
      "to": "+15551234567",          # optional exact destination (number, email or push token)
      "account": null,               # optional account the request is for: Twilio AccountSid of the
                                     #   URL path, FCM project id; a rule with an account never
                                     #   matches SendGrid or SMTP (they have no account in the request)
      "status": 503,                 # HTTP status to answer (SMTP: reply code, see below)
      "code": 21211,                 # provider error code (Twilio int, FCM errorCode, SendGrid text,
                                     #   SMTP reply text)
      "latency_ms": 0,               # delay before answering; without status = slow success
      "times": null,                 # matching requests it applies to; null = until removed
      "retry_after": null,           # seconds: Retry-After header (SendGrid: + X-RateLimit-Reset)
      "rate_limit_per_s": null,      # requests beyond this rate per second get 429
      "probability": 1.0,            # extension: fraction of matching requests affected (brownouts)
      "field": null,                 # extension, FCM INVALID_ARGUMENT: fieldViolations[].field;
                                     #   default "message.token" when the rule has "to"
      "smtp_phase": "rcpt"           # extension, SMTP: answer at "rcpt" or "data"
    }

Rules are tried in creation order; the first that fires decides the answer (one rule per request).
A rule with ``rate_limit_per_s`` fires only when its token bucket (capacity = rate, refilled at rate
per second) is empty. ``times`` counts the requests a rule fired on. A slow success is recorded even
if the client gave up waiting, as a real provider would have accepted it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from dataclasses import field as dataclass_field
from typing import Any

PROVIDERS = ("twilio", "sendgrid", "fcm", "smtp", "*")
_FIELDS = {"provider", "to", "account", "status", "code", "latency_ms", "times", "retry_after",
           "rate_limit_per_s", "probability", "field", "smtp_phase"}


class FaultRuleError(ValueError):
    """A fault rule JSON object is invalid (message says which key)."""


@dataclass
class FaultRule:
    """One rule; see the module docstring for the JSON shape. ``fired`` counts applications."""

    id: int
    provider: str = "*"
    to: str | None = None
    account: str | None = None
    status: int | None = None
    code: int | str | None = None
    latency_ms: int = 0
    times: int | None = None
    retry_after: float | None = None
    rate_limit_per_s: float | None = None
    probability: float = 1.0
    field: str | None = None
    smtp_phase: str = "rcpt"
    fired: int = 0
    _tokens: float = dataclass_field(default=0.0, repr=False)
    _refilled_at: float = dataclass_field(default=0.0, repr=False)

    @classmethod
    def from_json(cls, rule_id: int, data: Any) -> FaultRule:
        """Validate a decoded JSON object.

        Raises:
            FaultRuleError: not an object, unknown key, or a value of the wrong type/range.
        """
        if not isinstance(data, dict):
            raise FaultRuleError("a fault rule must be a JSON object")
        unknown = set(data) - _FIELDS - {"id", "fired"}
        if unknown:
            raise FaultRuleError(f"unknown key(s): {', '.join(sorted(unknown))}")
        rule = cls(id=rule_id)
        rule.provider = data.get("provider") or "*"
        if rule.provider not in PROVIDERS:
            raise FaultRuleError(f"provider must be one of {', '.join(PROVIDERS)}")
        rule.to = _opt(data, "to", str)
        rule.account = _opt(data, "account", str)
        rule.status = _opt(data, "status", int)
        if rule.status is not None and not 100 <= rule.status <= 599:
            raise FaultRuleError("status must be between 100 and 599")
        rule.code = data.get("code")
        if rule.code is not None and not isinstance(rule.code, (int, str)):
            raise FaultRuleError("code must be an integer or a string")
        rule.latency_ms = _opt(data, "latency_ms", int) or 0
        rule.times = _opt(data, "times", int)
        rule.retry_after = _opt(data, "retry_after", float)
        rule.rate_limit_per_s = _opt(data, "rate_limit_per_s", float)
        probability = _opt(data, "probability", float)
        rule.probability = 1.0 if probability is None else probability
        rule.field = _opt(data, "field", str)
        rule.smtp_phase = _opt(data, "smtp_phase", str) or "rcpt"
        if rule.latency_ms < 0 or (rule.times is not None and rule.times < 0):
            raise FaultRuleError("latency_ms and times must not be negative")
        if rule.retry_after is not None and rule.retry_after < 0:
            raise FaultRuleError("retry_after must not be negative")
        if rule.rate_limit_per_s is not None and rule.rate_limit_per_s <= 0:
            raise FaultRuleError("rate_limit_per_s must be positive")
        if not 0.0 <= rule.probability <= 1.0:
            raise FaultRuleError("probability must be between 0 and 1")
        if rule.smtp_phase not in ("rcpt", "data"):
            raise FaultRuleError('smtp_phase must be "rcpt" or "data"')
        if rule.rate_limit_per_s is not None:
            rule._tokens = rule.rate_limit_per_s
            rule._refilled_at = time.monotonic()
        return rule

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


@dataclass(frozen=True)
class Fault:
    """What a fired rule asks for. ``status`` ``None`` = answer normally after ``latency_s``."""

    rule_id: int
    status: int | None
    code: int | str | None
    latency_s: float
    retry_after: float | None
    field: str | None
    to: str | None


class RuleBook:
    """Active rules of one kind (``rule_class``, which has ``from_json(id, data)``, ``as_json()``
    and ``id``), in creation order: the inspection API's add / list / remove / clear."""

    rule_class: Any = None

    def __init__(self) -> None:
        self._rules: list = []
        self._next_id = 1

    def add(self, data: Any):
        """Validate and append a rule; raises the rule class's validation error."""
        rule = self.rule_class.from_json(self._next_id, data)
        self._next_id += 1
        self._rules.append(rule)
        return rule

    def list(self) -> list[dict[str, Any]]:
        return [rule.as_json() for rule in self._rules]

    def remove(self, rule_id: int) -> bool:
        before = len(self._rules)
        self._rules = [r for r in self._rules if r.id != rule_id]
        return len(self._rules) != before

    def clear(self) -> None:
        self._rules.clear()


class FaultBook(RuleBook):
    """The active fault rules, in creation order."""

    rule_class = FaultRule

    def match(
        self, provider: str, destinations: Iterable[str], smtp_phase: str | None = None, account: str | None = None,
    ) -> Fault | None:
        """The fault for one request to ``provider`` addressed to ``destinations``, or ``None``.

        Consumes one of the rule's ``times``. ``smtp_phase`` (SMTP only) restricts matching to rules
        of that phase; every rule's phase defaults to ``"rcpt"``. ``account`` is the request's
        account (Twilio AccountSid, FCM project id; ``None`` for SendGrid and SMTP): a rule with an
        ``account`` only matches requests for that account. ``destinations`` may be a lazy iterable:
        it is only consumed when there are rules.
        """
        if not self._rules:
            return None
        destinations = tuple(destinations)
        for rule in self._rules:
            if rule.provider not in ("*", provider):
                continue
            if rule.times is not None and rule.fired >= rule.times:
                continue
            if rule.account is not None and rule.account != account:
                continue
            if rule.to is not None and rule.to not in destinations:
                continue
            if smtp_phase is not None and rule.smtp_phase != smtp_phase:
                continue
            if rule.rate_limit_per_s is not None:
                if _take_token(rule):
                    continue
                status = 429
                retry_after = rule.retry_after if rule.retry_after is not None else _refill_wait(rule)
            else:
                if rule.probability < 1.0 and random.random() >= rule.probability:
                    continue
                status, retry_after = rule.status, rule.retry_after
            rule.fired += 1
            return Fault(rule.id, status, rule.code, rule.latency_ms / 1000.0, retry_after,
                         rule.field, rule.to)
        return None


def _take_token(rule: FaultRule) -> bool:
    now = time.monotonic()
    rate = rule.rate_limit_per_s
    rule._tokens = min(rate, rule._tokens + (now - rule._refilled_at) * rate)
    rule._refilled_at = now
    if rule._tokens >= 1.0:
        rule._tokens -= 1.0
        return True
    return False


def _refill_wait(rule: FaultRule) -> float:
    """Whole seconds until the bucket holds one token again (at least 1)."""
    return float(max(1, math.ceil((1.0 - rule._tokens) / rule.rate_limit_per_s)))


def _opt(data: dict, key: str, kind: type) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is str and isinstance(value, str):
        return value
    raise FaultRuleError(f"{key} must be {'a number' if kind is float else kind.__name__} or null")
