"""Delivery receipts: which status callbacks / events follow an accepted message (docs/PROVIDERS.md §1(d), §2(d)).

Without a rule every accepted Twilio message that carried a ``StatusCallback`` gets ``sent`` then
``delivered``, and every accepted SendGrid recipient (when ``EMULATOR_SENDGRID_EVENTS_URL`` is set)
gets ``processed`` then ``delivered``, 50 ms after acceptance. A rule (``POST /_emulator/receipts``)::

    {
      "provider": "twilio" | "sendgrid" | "*",   # default "*" (then only "delivered"/"none" are valid)
      "to": "+15551234567",                       # optional exact destination (number or email)
      "outcome": "delivered",                     # see OUTCOMES; default "delivered"
      "error_code": 30006,                        # twilio undelivered/failed (default 30003 / 30008)
      "bounce_type": "bounce" | "blocked",        # sendgrid bounce (default "bounce")
      "reason": "Bounced Address",                # sendgrid dropped (default "Bounced Address") or
                                                  #   bounce (default: an SMTP 550 text per type)
      "delay_ms": 50,                             # before the first receipt
      "duplicates": 0,                            # extra identical copies of each receipt
      "reorder": false,                           # send a message's receipts in reverse order
      "queued_share": 0.0,                        # twilio: this share of the rule's messages gets
                                                  #   a ``queued`` callback first (every 1/share-th)
      "times": null                               # messages (SendGrid: recipients) it applies to
    }

Receipt sequences per outcome (before ``reorder``/``duplicates``):

* twilio: delivered → sent, delivered; undelivered → sent, undelivered; failed → sent, failed;
  none → nothing; ``queued`` first for a ``queued_share`` of the messages (as Twilio does when a
  message waits in its queue).
* sendgrid: delivered → processed, delivered; bounce/dropped/deferred → processed, <outcome>;
  spamreport/unsubscribe → processed, delivered, <outcome>; none → nothing.

Rules are tried in creation order; the first one whose provider, ``to`` and remaining ``times`` match
decides (and counts in ``fired``). A rule is consulted only for a message that can get receipts
(Twilio: has a ``StatusCallback``; SendGrid: an events URL is configured; receipts enabled).
"""

from __future__ import annotations

import base64
import re
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any

from providers.emulator.faults import RuleBook

TWILIO_OUTCOMES = ("delivered", "undelivered", "failed", "none")
SENDGRID_OUTCOMES = ("delivered", "bounce", "dropped", "deferred", "spamreport", "unsubscribe", "none")
OUTCOMES = {"twilio": TWILIO_OUTCOMES, "sendgrid": SENDGRID_OUTCOMES, "*": ("delivered", "none")}
DEFAULT_DELAY_MS = 50
MAX_DELAY_MS = 3_600_000
MAX_DUPLICATES = 100
DEFAULT_ERROR_CODE = {"undelivered": 30003, "failed": 30008}
DEFAULT_DROP_REASON = "Bounced Address"
BOUNCE = {
    "bounce": ("550 5.1.1 The email account that you tried to reach does not exist. Please try "
               "double-checking the recipient's email address for typos or unnecessary spaces.", "5.1.1"),
    "blocked": ("550 5.7.1 Message rejected due to local policy: sender reputation", "5.7.1"),
}
DELIVERED_RESPONSE = "250 2.0.0 OK"
DEFERRED_RESPONSE = "421 4.7.0 Try again later, closing connection."
API_VERSION = "2010-04-01"
OPEN_USER_AGENT = "Mozilla/5.0 (emulated engagement)"
OPEN_IP = "127.0.0.1"
_ENHANCED_STATUS = re.compile(r"\b([245]\.\d{1,3}\.\d{1,3})\b")
_FIELDS = {"provider", "to", "outcome", "error_code", "bounce_type", "reason", "delay_ms", "duplicates",
           "reorder", "times", "queued_share"}


class ReceiptRuleError(ValueError):
    """A receipts rule JSON object is invalid (message says which key)."""


@dataclass
class ReceiptRule:
    """One rule; see the module docstring. ``fired`` counts the messages/recipients it decided."""

    id: int
    provider: str = "*"
    to: str | None = None
    outcome: str = "delivered"
    error_code: int | None = None
    bounce_type: str | None = None
    reason: str | None = None
    delay_ms: int = DEFAULT_DELAY_MS
    duplicates: int = 0
    reorder: bool = False
    times: int | None = None
    queued_share: float = 0.0
    fired: int = 0

    @classmethod
    def from_json(cls, rule_id: int, data: Any) -> ReceiptRule:
        """Validate a decoded JSON object.

        Raises:
            ReceiptRuleError: not an object, unknown key, wrong type/range, or a key that does not
                apply to the outcome.
        """
        if not isinstance(data, dict):
            raise ReceiptRuleError("a receipts rule must be a JSON object")
        unknown = set(data) - _FIELDS - {"id", "fired"}
        if unknown:
            raise ReceiptRuleError(f"unknown key(s): {', '.join(sorted(unknown))}")
        rule = cls(id=rule_id)
        rule.provider = _get(data, "provider", str) or "*"
        if rule.provider not in OUTCOMES:
            raise ReceiptRuleError('provider must be "twilio", "sendgrid" or "*"')
        rule.to = _get(data, "to", str)
        rule.outcome = _get(data, "outcome", str) or "delivered"
        if rule.outcome not in OUTCOMES[rule.provider]:
            raise ReceiptRuleError(f"outcome for provider {rule.provider!r} must be one of "
                                   f"{', '.join(OUTCOMES[rule.provider])}")
        rule.error_code = _get(data, "error_code", int)
        if rule.error_code is not None and rule.outcome not in DEFAULT_ERROR_CODE:
            raise ReceiptRuleError('error_code applies only to twilio "undelivered" and "failed"')
        rule.bounce_type = _get(data, "bounce_type", str)
        if rule.bounce_type is not None and (rule.outcome != "bounce" or rule.bounce_type not in BOUNCE):
            raise ReceiptRuleError('bounce_type must be "bounce" or "blocked", with outcome "bounce"')
        rule.reason = _get(data, "reason", str)
        if rule.reason is not None and rule.outcome not in ("dropped", "bounce"):
            raise ReceiptRuleError('reason applies only to sendgrid "dropped" and "bounce"')
        delay = _get(data, "delay_ms", int)
        rule.delay_ms = DEFAULT_DELAY_MS if delay is None else delay
        rule.duplicates = _get(data, "duplicates", int) or 0
        reorder = data.get("reorder")
        if reorder is not None and not isinstance(reorder, bool):
            raise ReceiptRuleError("reorder must be true, false or null")
        rule.reorder = bool(reorder)
        rule.times = _get(data, "times", int)
        if not 0 <= rule.delay_ms <= MAX_DELAY_MS:
            raise ReceiptRuleError(f"delay_ms must be between 0 and {MAX_DELAY_MS}")
        if not 0 <= rule.duplicates <= MAX_DUPLICATES:
            raise ReceiptRuleError(f"duplicates must be between 0 and {MAX_DUPLICATES}")
        if rule.times is not None and rule.times < 0:
            raise ReceiptRuleError("times must not be negative")
        share = data.get("queued_share")
        if share is not None:
            if isinstance(share, bool) or not isinstance(share, int | float) or not 0 <= share <= 1:
                raise ReceiptRuleError("queued_share must be a number between 0 and 1")
            if share and rule.provider != "twilio":
                raise ReceiptRuleError('queued_share applies only to provider "twilio"')
            rule.queued_share = float(share)
        return rule

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


#: What applies when no rule matches.
DEFAULT_RULE = ReceiptRule(id=0)


class ReceiptBook(RuleBook):
    """The active receipt rules, in creation order."""

    rule_class = ReceiptRule

    def match(self, provider: str, to: str) -> ReceiptRule:
        """The rule deciding the receipts of one message to ``to`` (consumes one of its ``times``)."""
        for rule in self._rules:
            if rule.provider not in ("*", provider):
                continue
            if rule.to is not None and rule.to != to:
                continue
            if rule.times is not None and rule.fired >= rule.times:
                continue
            rule.fired += 1
            return rule
        return DEFAULT_RULE


def arrange(receipts: list, rule: ReceiptRule) -> list:
    """Apply ``reorder`` (reverse) and ``duplicates`` (each receipt followed by its copies)."""
    ordered = list(reversed(receipts)) if rule.reorder else receipts
    return [r for r in ordered for _ in range(1 + rule.duplicates)]


def twilio_callbacks(rule: ReceiptRule, base: dict[str, str]) -> list[tuple[str, dict[str, str]]]:
    """``(kind, form params)`` of the status callbacks of one message, in sending order.

    ``base`` holds MessageSid, SmsSid, AccountSid, From, To, ApiVersion (and MessagingServiceSid).
    """
    if rule.outcome == "none":
        return []
    statuses = ["sent", rule.outcome]
    # ``fired`` already counts this message: it is queued when it crosses the next multiple of 1/share.
    if int(rule.fired * rule.queued_share) > int((rule.fired - 1) * rule.queued_share):
        statuses.insert(0, "queued")
    result = []
    for status in statuses:
        params = {**base, "MessageStatus": status, "SmsStatus": status}
        if status in DEFAULT_ERROR_CODE:
            params["ErrorCode"] = str(rule.error_code or DEFAULT_ERROR_CODE[status])
        result.append((status, params))
    return arrange(result, rule)


def twilio_base(message_sid: str, account_sid: str, to: str, from_: str | None,
                service_sid: str | None) -> dict[str, str]:
    params = {"MessageSid": message_sid, "SmsSid": message_sid, "AccountSid": account_sid, "To": to,
              "ApiVersion": API_VERSION}
    if from_:
        params["From"] = from_
    if service_sid:
        params["MessagingServiceSid"] = service_sid
    return params


def sendgrid_events(
    rule: ReceiptRule,
    email: str,
    message_id: str,
    index: int,
    categories: list[str],
    custom_args: dict[str, str],
    at: float | None = None,
) -> list[dict[str, Any]]:
    """The Event Webhook events for one recipient (index ``index`` of the request), in sending order.

    Each event: ``email``, ``event``, ``timestamp`` (unix s), ``sg_event_id``, ``sg_message_id``
    (``<X-Message-Id>.filter0001.<n>.<hex>.<index>``), ``smtp-id`` (not on spamreport/unsubscribe),
    ``category`` (a string for one category, else the list) when the request had any, event extras
    (delivered: ``response``; deferred: ``response``, ``attempt``; bounce: ``reason``, ``status``,
    ``type``; dropped: ``reason``), then every custom arg that does not collide with those keys.
    """
    if rule.outcome == "none":
        return []
    kinds = {"delivered": ["processed", "delivered"],
             "spamreport": ["processed", "delivered", "spamreport"],
             "unsubscribe": ["processed", "delivered", "unsubscribe"]}.get(rule.outcome,
                                                                           ["processed", rule.outcome])
    timestamp = int(time.time() if at is None else at)
    sg_message_id = f"{message_id}.filter0001.{secrets.randbelow(90000) + 10000}.{secrets.token_hex(5).upper()}.{index}"
    events = []
    for kind in kinds:
        event: dict[str, Any] = {
            "email": email,
            "event": kind,
            "timestamp": timestamp,
            "sg_event_id": base64.urlsafe_b64encode(secrets.token_bytes(24)).decode("ascii"),
            "sg_message_id": sg_message_id,
        }
        if kind not in ("spamreport", "unsubscribe"):
            event["smtp-id"] = f"<{message_id}@ismtpd0001p1lon1.sendgrid.net>"
        if categories:
            event["category"] = categories[0] if len(categories) == 1 else list(categories)
        event.update(_extras(kind, rule))
        for key, value in custom_args.items():
            event.setdefault(key, value)
        events.append(event)
    return arrange(events, rule)


def sendgrid_open(delivered: dict[str, Any], at: float) -> dict[str, Any]:
    """The ``open`` event of the recipient whose ``delivered`` event is given, at unix time ``at``
    (the engagement model's, ``engagement.py``): the same message, email, categories and custom args;
    SendGrid's open fields ``useragent`` and ``ip``; no ``smtp-id`` or ``response``."""
    event = {k: v for k, v in delivered.items() if k not in ("smtp-id", "response")}
    event.update({"event": "open", "timestamp": int(at), "useragent": OPEN_USER_AGENT, "ip": OPEN_IP,
                  "sg_event_id": base64.urlsafe_b64encode(secrets.token_bytes(24)).decode("ascii")})
    return event


def _extras(kind: str, rule: ReceiptRule) -> dict[str, str]:
    if kind == "delivered":
        return {"response": DELIVERED_RESPONSE}
    if kind == "deferred":
        return {"response": DEFERRED_RESPONSE, "attempt": "1"}
    if kind == "bounce":
        bounce_type = rule.bounce_type or "bounce"
        reason, status = BOUNCE[bounce_type]
        if rule.reason:
            reason = rule.reason
            found = _ENHANCED_STATUS.search(reason)
            status = found.group(1) if found else status
        return {"reason": reason, "status": status, "type": bounce_type}
    if kind == "dropped":
        return {"reason": rule.reason or DEFAULT_DROP_REASON}
    return {}


def _get(data: dict, key: str, kind: type) -> Any:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    raise ReceiptRuleError(f"{key} must be {'an integer' if kind is int else 'a string'} or null")
