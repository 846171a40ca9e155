"""API key scopes: what an API client may do (least privilege, like Stripe's restricted keys).

Every operation needs one scope (``notifications.api.auth.HasRequiredScope`` checks the one the
view declares); some need a second (:attr:`Scope.SEND_HIGH`, :attr:`Scope.TYPES_OVERRIDE`; see
:mod:`campaigns.ownership`). :attr:`Scope.INBOX` is the one cross-client read and
:attr:`Scope.RECEIPTS` belongs to the app's backend, not the sender (docs/SECURITY.md). Stored on
:class:`notifications.models.APIClient` as a JSON list; the table: docs/API.md, "Authentication
and scopes".
"""

from __future__ import annotations

from collections.abc import Iterable

from django.core.exceptions import ValidationError
from django.db import models


class Scope(models.TextChoices):
    SEND = "notifications:send", "notifications:send — send notifications and cancel its own"
    SEND_HIGH = "notifications:send_high", ("notifications:send_high — priority high (OTPs, alerts); change "
                                            "templates and segment members that active high-priority campaigns "
                                            "use; cancel high-priority campaigns")
    RECEIPTS = "notifications:receipts", ("notifications:receipts — report what the app saw (displayed, opened, "
                                          "dismissed): the product backend its app reports to")
    RECIPIENTS_WRITE = "recipients:write", ("recipients:write — contacts (email, phone, zone, locale, attributes) "
                                            "and erasure: the user service only")
    PREFERENCES_WRITE = "preferences:write", "preferences:write — opt-outs and quiet hours"
    DEVICES_WRITE = "devices:write", "devices:write — register and remove push tokens"
    SEGMENTS_WRITE = "segments:write", "segments:write — create its segments, change their members"
    TEMPLATES_WRITE = "templates:write", "templates:write — create and change its templates"
    CAMPAIGNS_WRITE = "campaigns:write", "campaigns:write — create and cancel its campaigns"
    TYPES_WRITE = "types:write", "types:write — create and change its notification types and their templates"
    TYPES_OVERRIDE = "types:override", ("types:override — types that override users' choices: required (opt-outs "
                                        "do not apply) or quiet_hours bypass")
    INBOX = "inbox", ("inbox — read a user's inbox across services and mark its items: the product backend that "
                      "shows the inbox to the user")
    WEBHOOKS = "webhooks", ("webhooks — register, list, test and delete its status webhook endpoints "
                            "(docs/WEBHOOKS.md)")
    READ = "read", "read — every GET but the inbox's"


#: What ``manage.py create_api_client`` (and ``APIClient`` created without scopes) gets: a service that
#: sends notifications and reads their outcome. Everything else is asked for by name.
DEFAULT_SCOPES: tuple[str, ...] = (Scope.SEND.value, Scope.READ.value)


def default_scopes() -> list[str]:
    """The model field's default (a fresh list each time)."""
    return list(DEFAULT_SCOPES)


def canonical(scopes: Iterable[str]) -> list[str]:
    """The scopes without duplicates, in the order of :class:`Scope` (unknown ones dropped)."""
    held = set(scopes)
    return [s for s in Scope.values if s in held]


def parse_scopes(text: str) -> list[str]:
    """``"read,notifications:send"`` → the canonical list. Raises ValueError naming every unknown
    scope and listing the known ones."""
    given = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [s for s in given if s not in Scope.values]
    if unknown:
        raise ValueError(f"unknown scope{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                         f"known: {', '.join(Scope.values)}")
    return canonical(given)


def validate_scopes(value) -> None:
    """Model validator: a list of known scope strings. Raises ValidationError naming the first problem."""
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ValidationError("scopes must be a list of scope names", code="invalid")
    unknown = [s for s in value if s not in Scope.values]
    if unknown:
        raise ValidationError("unknown scopes: %(unknown)s (known: %(known)s)", code="unknown_scope",
                              params={"unknown": ", ".join(unknown), "known": ", ".join(Scope.values)})
