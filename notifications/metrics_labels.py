"""Label values of the platform's Prometheus series, bounded (notifications/metrics.py).

Channels, tiers, statuses and reasons come from fixed sets; provider names from
``settings.PROVIDERS`` (else ``other``); provider error codes from an allow-list (else the HTTP
status class ``4xx``/``5xx``, else ``other``); task names must be ours. A label never carries an id,
an address or free text, so the number of series stays bounded whatever the traffic.
"""

from __future__ import annotations

import functools
import re

from django.conf import settings

#: A provider call's outcomes (``DeliveryAttempt.Outcome``): the ``outcome`` label of the call series,
#: and the provider health page's columns (notifications/health.py).
OUTCOMES = ("accepted", "transient", "permanent", "contact_invalid", "configuration")

#: Provider error codes kept as they are; any other code becomes its HTTP status class or "other".
KNOWN_PROVIDER_CODES = frozenset({
    # Twilio (providers/twilio/backend.py tables)
    "21211", "21610", "21614", "20003", "21606", "21659", "21408", "20429",
    # FCM v1 ErrorCode and Google API canonical codes (firebase_admin.exceptions)
    "UNREGISTERED", "SENDER_ID_MISMATCH", "QUOTA_EXCEEDED", "THIRD_PARTY_AUTH_ERROR", "UNSPECIFIED_ERROR",
    "INVALID_ARGUMENT", "FAILED_PRECONDITION", "OUT_OF_RANGE", "UNAUTHENTICATED", "PERMISSION_DENIED",
    "NOT_FOUND", "CONFLICT", "ABORTED", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED", "CANCELLED", "DATA_LOSS",
    "UNKNOWN", "INTERNAL", "UNAVAILABLE", "DEADLINE_EXCEEDED",
})
_OUR_CODE = re.compile(r"^[a-z][a-z_]{0,31}$")  # ours: timeout, connection_error, missing_option, …
_STATUS_CODE = re.compile(r"^[1-5][0-9][0-9]$")  # HTTP (SendGrid, FCM) and SMTP reply codes


@functools.lru_cache(maxsize=1)
def _known_providers(_providers_id: int) -> frozenset[str]:
    providers = getattr(settings, "PROVIDERS", None) or {}
    return frozenset(e.get("NAME", "") for entries in providers.values() for e in entries or [])


def provider_label(name: str | None) -> str:
    """A configured provider name, else ``other``."""
    name = name or ""
    return name if name in _known_providers(id(getattr(settings, "PROVIDERS", None))) else "other"


def code_label(code: str | None, http_status: int | None = None) -> str:
    """Bounded error-code label: a known provider code, one of our own words, an HTTP/SMTP status,
    else the HTTP status class (``4xx``), else ``other``; ``""`` when there is no error."""
    code = str(code or "").strip()
    if not code:
        return ""
    if code in KNOWN_PROVIDER_CODES or _OUR_CODE.match(code) or _STATUS_CODE.match(code):
        return code
    if http_status and 100 <= int(http_status) <= 599:
        return f"{int(http_status) // 100}xx"
    return "other"


def one_of(value: str | None, allowed, default: str = "other") -> str:
    """``value`` if it is one of ``allowed``, else ``default``."""
    return value if value is not None and value in allowed else default


def reason_label(reason: str | None) -> str:
    """A :class:`~notifications.models.Reason` value (or ``""``), else ``other``."""
    from notifications.models import Reason

    if not reason:
        return ""  # None too: a label is a string
    return reason if reason in Reason.values else "other"


_TASK_NAME = re.compile(r"^(notifications|campaigns)\.[a-z_]{1,40}$")  # our own tasks (notification_task)


def task_label(name: str | None) -> str:
    """A task name of ours (``campaigns.fan_out_page``, ``notifications.reconcile``…), else ``other``."""
    return name if name and _TASK_NAME.match(name) else "other"
