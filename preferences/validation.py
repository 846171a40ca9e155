"""Field rules shared by the API and the admin: user ids and push tokens, E.164 phones, IANA zones.

Phones are parsed with ``phonenumbers`` (Google's libphonenumber port); zones are checked against
the IANA database shipped by ``tzdata``/the system via ``zoneinfo``. UTC offsets (``+03:00``) and
legacy abbreviations (``EST``, ``CET``) are rejected even where zoneinfo happens to know them: a
zone must be an ``Area/Location`` name (or ``UTC``) so DST rules follow the recipient.
"""

from __future__ import annotations

import re
import zoneinfo

import phonenumbers
from django.core.exceptions import ValidationError

_ALLOWED_BARE_ZONES = {"UTC"}

_NOT_A_NUMBER = "not a phone number: write it in international format, + and country code, e.g. +4915123456789"
_PARSE_ERRORS = {
    phonenumbers.NumberParseException.INVALID_COUNTRY_CODE:
        "must start with + and a valid country code (international format, e.g. +4915123456789)",
    phonenumbers.NumberParseException.NOT_A_NUMBER: _NOT_A_NUMBER,
    phonenumbers.NumberParseException.TOO_SHORT_AFTER_IDD: "too short after the country code",
    phonenumbers.NumberParseException.TOO_SHORT_NSN: "too short after the country code",
    phonenumbers.NumberParseException.TOO_LONG: "too long: an E.164 number has at most 15 digits",
}


MAX_USER_ID_LENGTH = 255
MAX_PUSH_TOKEN_LENGTH = 1024

#: The control characters no id, token or name may hold, as the body of a regular-expression
#: character class that Python's ``re`` and JSON Schema (ECMA 262) read alike: C0 (U+0000–U+001F,
#: NUL cannot even be stored), DEL (U+007F) and C1 (U+0080–U+009F, e.g. U+0085 NEXT LINE). Every
#: OpenAPI pattern of such a value is built from it (:func:`no_control_pattern`), so they keep in step.
CONTROL_CHARACTERS = r"\u0000-\u001f\u007f-\u009f"
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")


def no_control_pattern(max_length: int, min_length: int = 1) -> str:
    """The OpenAPI (and Python) pattern of ``min_length``–``max_length`` characters without a control
    character: ``^[^\\u0000-\\u001f\\u007f-\\u009f]{1,255}$``."""
    return f"^[^{CONTROL_CHARACTERS}]{{{min_length},{max_length}}}$"


def control_character_problem(value: str) -> str:
    """``"contains a control character (U+0085)"`` naming the first one in ``value``, or ``''``."""
    found = _CONTROL.search(value)
    return f"contains a control character (U+{ord(found.group()):04X})" if found else ""


def user_id_problem(value: str) -> str:
    """Why ``value`` cannot be a user id, or ``''`` when it can.

    The rule of the ``/v1/users/{user_id}`` path (``notifications.api.parameters.USER_ID``): 1 to
    MAX_USER_ID_LENGTH characters, none of them a control character (:data:`CONTROL_CHARACTERS`:
    C0, DEL, C1). Every way of creating a recipient applies it (segment members by API and CSV
    upload, the admin), so no recipient exists that ``/v1/users/{user_id}`` cannot reach. Ids are
    taken as given: never trimmed, and case-sensitive (``Alice`` and ``alice`` are two users).
    Returns ``"must not be empty"``, ``"is 300 characters; at most 255"`` or ``"contains a control
    character"``.
    """
    if not isinstance(value, str) or not value:
        return "must not be empty"
    if len(value) > MAX_USER_ID_LENGTH:
        return f"is {len(value)} characters; at most {MAX_USER_ID_LENGTH}"
    if _CONTROL.search(value):
        return "contains a control character"
    return ""


def push_token_problem(value: str) -> str:
    """Why ``value`` cannot be a push token, or ``''``: the one token rule of ``PUT
    /v1/users/{id}/devices`` (the body's ``push_token``) and of ``DELETE …/devices/{push_token}``, so
    every token that can be registered can be removed. 1 to MAX_PUSH_TOKEN_LENGTH characters (FCM
    tokens are ~160, APNs 64 hex digits), no control character; taken as given, never trimmed.
    Returns ``"must not be empty"``, ``"is 2000 characters; at most 1024"`` or ``"contains a control
    character (U+0001)"``."""
    if not isinstance(value, str) or not value:
        return "must not be empty"
    if len(value) > MAX_PUSH_TOKEN_LENGTH:
        return f"is {len(value)} characters; at most {MAX_PUSH_TOKEN_LENGTH}"
    return control_character_problem(value)


def normalize_phone(value: str) -> str:
    """Parse ``value`` (international format, leading ``+``) and return it in E.164.

    Raises:
        ValidationError(code="invalid_phone"): not parseable, or not a valid number.
    """
    try:
        parsed = phonenumbers.parse(value, None)
    except phonenumbers.NumberParseException as exc:
        # Our own words, never libphonenumber's ("(1) The string supplied did not seem to be…").
        raise ValidationError(_PARSE_ERRORS.get(exc.error_type, _NOT_A_NUMBER), code="invalid_phone") from None
    if not phonenumbers.is_valid_number(parsed):
        raise ValidationError("not a valid phone number for its country (E.164, e.g. +4915123456789)",
                              code="invalid_phone")
    return phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164)


def validate_iana_zone(value: str) -> str:
    """Return ``value`` if it is an IANA zone name such as ``Europe/Berlin`` (or ``UTC``).

    The one zone rule: the API (recipient ``timezone``, ``quiet_hours.timezone``), the admin's
    recipient and preferences forms, and every read of a stored zone (:func:`stored_zone`) use it.

    Raises:
        ValidationError(code="invalid_timezone"): empty, a tz database folder (``America``), a UTC
            offset (``+03:00``), an abbreviation (``EST``), ``Etc/…`` or not in the database
            (``Mars/Olympus``); the message says which.
    """
    if value in _ALLOWED_BARE_ZONES:
        return value
    problem = _zone_problem(value)
    if problem:
        raise ValidationError(f"{problem}; give an IANA time zone name such as 'Europe/Berlin'",
                              code="invalid_timezone")
    return value


def _zone_problem(value) -> str:
    """Why ``value`` is not an acceptable zone name, or ''."""
    if not isinstance(value, str) or not value.strip():
        return "no zone given (empty)"
    zones = _available()
    if _OFFSET.match(value):
        return f"'{value}' is a UTC offset, not a zone (an offset does not follow daylight saving time)"
    if value.startswith(("Etc/", "SystemV/")):
        return f"'{value}' is a fixed-offset zone (it does not follow daylight saving time)"
    if value not in zones:
        if any(z.startswith(value.rstrip("/") + "/") for z in zones):
            return f"'{value}' is a region of the tz database, not a zone"
        return f"'{value}' is not in the IANA time zone database"
    if "/" not in value:
        return f"'{value}' is a legacy abbreviation or alias, not an Area/Location zone name"
    try:
        zoneinfo.ZoneInfo(value)
    except Exception:  # an unreadable or odd data file: not a usable zone either
        return f"'{value}' cannot be loaded from the time zone data"
    return ""


def stored_zone(value: str, default: str = "UTC") -> tuple[zoneinfo.ZoneInfo, bool]:
    """The zone a stored zone name stands for, never raising.

    Returns ``(ZoneInfo(value), False)`` when ``value`` passes :func:`validate_iana_zone`, else
    ``(ZoneInfo(default), True)``: an empty value, or one stored before the rule (or past it, by
    SQL), falls back to ``default`` and the caller counts the fallback. ``default`` must itself be
    a valid zone name (settings are checked at start).
    """
    try:
        return zoneinfo.ZoneInfo(validate_iana_zone(value)), False
    except ValidationError:
        return zoneinfo.ZoneInfo(default), True


_OFFSET = re.compile(r"^(?:UTC|GMT)?\s*[+\-\u2212]\d{1,2}(?::?\d{2})?$", re.IGNORECASE)
_zones: set[str] | None = None


def _available() -> set[str]:
    global _zones
    if _zones is None:
        _zones = zoneinfo.available_timezones()
    return _zones
