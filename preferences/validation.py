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


def phone_search_term(term: str) -> str | None:
    """The E.164 form of a phone number typed into an admin search box (``+49 151 1234 5678``,
    ``+49 (151) 1234-5678``), or None when ``term`` is not a valid number in international format."""
    term = term.strip()
    if not term.startswith("+") or not any(c.isdigit() for c in term):
        return None
    if any(not (c.isdigit() or c in " +-./()") for c in term):
        return None
    try:
        return normalize_phone(term)
    except ValidationError:
        return None


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
