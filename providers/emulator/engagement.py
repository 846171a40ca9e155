"""Simulated engagement: recipients who open what they get near their preferred local hour.

Off by default. Turned on with ``POST /_emulator/engagement`` (or ``EMULATOR_ENGAGEMENT``, the same
JSON) and off with ``DELETE``; the model is one JSON object (every key optional)::

    {
      "seed": "",                     # mixed into every draw: another seed, other opens
      "zone": "UTC",                  # zone of recipients without their own: IANA name or ±HH:MM
      "hours": [8, 21],               # preferred hours derived for unlisted recipients: first, last
      "recipients": {                 # explicit ones, by email address or push token
        "ada@example.com": {"hour": 9, "zone": "Asia/Tokyo"},
        "tok-1": {"hour": 20}         # zone: the model's
      },
      "peak": 0.9,                    # open probability at the preferred hour
      "floor": 0.05,                  # ... from ``spread`` hours away on
      "spread": 3,                    # hours over which it falls from peak to floor (>= 1)
      "delay_ms": 500,                # open posted this long after the delivery receipt
      "app_receipts_url": null,       # push: the platform's base URL; the app's ``opened`` is POSTed to
      "app_receipts_key": null        #   <url>/v1/notifications/<id>/receipts with this API key
    }

**The rule.** A recipient's preferred hour *p* is their explicit ``hour``, else ``first +
blake2b(address) mod (last - first + 1)`` (the seed plays no part: one address, one habit). A message
delivered at local hour *h* (the emulator's clock, which follows the test clock offset, in the
recipient's zone) is *d* = circular distance(h, p) hours away (0–12) and is opened with probability
``floor + (peak - floor) * max(0, 1 - d / spread)``. Whether it is opened is decided by ``u <
probability`` with ``u = blake2b(seed:message key)`` read as a fraction of 2^64: deterministic given
the seed and the message (key: the notification id, else the provider message id and the address).
With ``peak`` 1, ``floor`` 0 and ``spread`` 1 a message is opened exactly when it arrives in the
preferred hour (the end-to-end test's setting).

**What is posted.** Email (SendGrid, with an events URL configured and a ``delivered`` outcome): one
``open`` event (SendGrid's fields, ``timestamp`` = delivery + ``delay_ms`` on the emulator's clock),
after the message's own receipts. Push (FCM, with ``app_receipts_url``, a ``notification_id`` in the
message's data): ``{"event": "opened", "at": <that instant>}``. Both count for the platform's
``engaged_since("opened")``. ``GET /_emulator/engagement`` shows the model and how many messages were
opened and not.
"""

from __future__ import annotations

import hashlib
import re
import zoneinfo
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any

HOURS = 24
DEFAULT_DELAY_MS = 500
MAX_DELAY_MS = 3_600_000
_KEYS = {"seed", "zone", "hours", "recipients", "peak", "floor", "spread", "delay_ms", "app_receipts_url",
         "app_receipts_key"}
_OFFSET = re.compile(r"^([+-])(\d{2}):(\d{2})$")


class EngagementError(ValueError):
    """The engagement model's JSON is invalid (the message names the key)."""


def parse_zone(value: Any, key: str) -> tzinfo:
    """An IANA zone name or a fixed ``±HH:MM`` offset.

    Raises:
        EngagementError: neither.
    """
    if isinstance(value, str):
        match = _OFFSET.match(value)
        if match:
            sign, hh, mm = match.groups()
            minutes = int(hh) * 60 + int(mm)
            if minutes <= 14 * 60 and int(mm) < 60:
                return timezone((-1 if sign == "-" else 1) * timedelta(minutes=minutes))
        else:
            try:
                return zoneinfo.ZoneInfo(value)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError):
                pass
    raise EngagementError(f"{key} must be an IANA zone name or an offset ±HH:MM")


def derived_hour(address: str, first: int, last: int) -> int:
    """The preferred hour of an address not listed: a hash of it within ``first``…``last``."""
    digest = hashlib.blake2b(address.encode(), digest_size=8).digest()
    return first + int.from_bytes(digest, "big") % (last - first + 1)


def distance(hour: int, preferred: int) -> int:
    """Hours between two hours of the day, around the clock (23 and 0 are one apart)."""
    d = abs(hour - preferred) % HOURS
    return min(d, HOURS - d)


def draw(seed: str, message_key: str) -> float:
    """A fraction in [0, 1) fixed by the seed and the message."""
    digest = hashlib.blake2b(f"{seed}:{message_key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass
class Engagement:
    """The model (see the module docstring); ``opened``/``unopened`` count its decisions."""

    seed: str = ""
    zone: str = "UTC"
    hours: tuple[int, int] = (8, 21)
    recipients: dict[str, dict[str, Any]] = field(default_factory=dict)
    peak: float = 0.9
    floor: float = 0.05
    spread: int = 3
    delay_ms: int = DEFAULT_DELAY_MS
    app_receipts_url: str | None = None
    app_receipts_key: str | None = None
    opened: int = 0
    unopened: int = 0
    _zones: dict[str, tzinfo] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> Engagement:
        """Validate a decoded JSON object.

        Raises:
            EngagementError: not an object, an unknown key, or a value of the wrong type or range.
        """
        if not isinstance(data, dict):
            raise EngagementError("the engagement model must be a JSON object")
        unknown = set(data) - _KEYS
        if unknown:
            raise EngagementError(f"unknown key(s): {', '.join(sorted(unknown))}")
        model = cls()
        model.seed = _get(data, "seed", str, "")
        model.zone = _get(data, "zone", str, "UTC")
        model._zones[""] = parse_zone(model.zone, "zone")
        hours = data.get("hours", [8, 21])
        if (not isinstance(hours, list) or len(hours) != 2 or not all(_is_hour(h) for h in hours)
                or hours[0] > hours[1]):
            raise EngagementError("hours must be [first, last], whole hours 0-23, first <= last")
        model.hours = (hours[0], hours[1])
        recipients = data.get("recipients") or {}
        if not isinstance(recipients, dict):
            raise EngagementError("recipients must be an object of address -> {hour, zone}")
        for address, spec in recipients.items():
            key = f"recipients.{address}"
            if not isinstance(spec, dict) or set(spec) - {"hour", "zone"} or not _is_hour(spec.get("hour")):
                raise EngagementError(f"{key} must be {{\"hour\": 0-23, \"zone\"?: zone}}")
            if spec.get("zone") is not None:
                model._zones[address] = parse_zone(spec["zone"], f"{key}.zone")
            model.recipients[address] = {"hour": spec["hour"], "zone": spec.get("zone")}
        model.peak = _probability(data, "peak", 0.9)
        model.floor = _probability(data, "floor", 0.05)
        if model.floor > model.peak:
            raise EngagementError("floor must not be above peak")
        model.spread = _get(data, "spread", int, 3)
        if model.spread < 1:
            raise EngagementError("spread must be at least 1")
        model.delay_ms = _get(data, "delay_ms", int, DEFAULT_DELAY_MS)
        if not 0 <= model.delay_ms <= MAX_DELAY_MS:
            raise EngagementError(f"delay_ms must be between 0 and {MAX_DELAY_MS}")
        model.app_receipts_url = _get(data, "app_receipts_url", str, None)
        model.app_receipts_key = _get(data, "app_receipts_key", str, None)
        if (model.app_receipts_url is None) != (model.app_receipts_key is None):
            raise EngagementError("app_receipts_url and app_receipts_key go together")
        return model

    def as_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "zone": self.zone, "hours": list(self.hours), "recipients": self.recipients,
                "peak": self.peak, "floor": self.floor, "spread": self.spread, "delay_ms": self.delay_ms,
                "app_receipts_url": self.app_receipts_url,
                "app_receipts_key": None if self.app_receipts_key is None else "***",
                "opened": self.opened, "unopened": self.unopened}

    def preferred(self, address: str) -> tuple[int, tzinfo]:
        """``(preferred hour, zone)`` of a recipient."""
        spec = self.recipients.get(address)
        zone = self._zones.get(address) or self._zones.get("") or UTC
        if spec is not None:
            return spec["hour"], zone
        return derived_hour(address, *self.hours), zone

    def probability(self, address: str, at: float) -> float:
        """How likely a message delivered to ``address`` at unix time ``at`` is opened."""
        hour, zone = self.preferred(address)
        local = datetime.fromtimestamp(at, tz=zone).hour
        return self.floor + (self.peak - self.floor) * max(0.0, 1 - distance(local, hour) / self.spread)

    def opens(self, address: str, message_key: str, at: float) -> float | None:
        """The instant (unix s) the message delivered at ``at`` is opened, or ``None``; counted."""
        if draw(self.seed, message_key) < self.probability(address, at):
            self.opened += 1
            return at + self.delay_ms / 1000.0
        self.unopened += 1
        return None


def _is_hour(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < HOURS


def _probability(data: dict, key: str, default: float) -> float:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise EngagementError(f"{key} must be a number between 0 and 1")
    return float(value)


def _get(data: dict, key: str, kind: type, default: Any) -> Any:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, kind) and not isinstance(value, bool):
        return value
    raise EngagementError(f"{key} must be {'an integer' if kind is int else 'a string'} or null")
