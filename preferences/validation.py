"""Field rules shared by the API and the admin: E.164 phones, IANA zones.

Phones are parsed with ``phonenumbers`` (Google's libphonenumber port); zones are checked against
the IANA database shipped by ``tzdata``/the system via ``zoneinfo``. UTC offsets (``+03:00``) and
legacy abbreviations (``EST``, ``CET``) are rejected even where zoneinfo happens to know them: a
zone must be an ``Area/Location`` name (or ``UTC``) so DST rules follow the recipient.
"""

from __future__ import annotations

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


def validate_iana_zone(value: str) -> str:
    """Return ``value`` if it is an IANA zone name such as ``Europe/Berlin``.

    Raises:
        ValidationError(code="invalid_timezone"): unknown zone, UTC offset or abbreviation.
    """
    if value in _ALLOWED_BARE_ZONES:
        return value
    if "/" not in value or value.startswith(("Etc/", "SystemV/")) or value not in _available():
        raise ValidationError(
            f"'{value}' is not an IANA time zone name like 'Europe/Berlin' (UTC offsets and "
            "abbreviations such as EST are not accepted)", code="invalid_timezone")
    return value


_zones: set[str] | None = None


def _available() -> set[str]:
    global _zones
    if _zones is None:
        _zones = zoneinfo.available_timezones()
    return _zones
