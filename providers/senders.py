"""Per-message senders (:attr:`providers.base.OutboundMessage.sender` and ``reply_to``): which
forms the backends accept, and why a value is not one of them.

* SMS: a From number in E.164 (``+15005550006``, parsed with ``phonenumbers``; it must already be
  written in E.164) or a Twilio Messaging Service SID (``MG`` + 32 hex digits, the pattern of
  Twilio's API definition), which Twilio then sends from one of the service's numbers
  (docs/PROVIDERS.md "Silent pushes and sender overrides").
* Email (From and Reply-To): one address, ``addr@example.com`` or ``Name <addr@example.com>``
  (RFC 5322 ``name-addr``), the address checked with Django's ``validate_email``; never a line
  break (header injection) and never a list.

The ``*_problem`` functions return a sentence naming the rule (for a 4xx or a form error), or
``None`` when the value is fine. Importing this module touches no provider SDK.
"""

from __future__ import annotations

import re
from email.utils import getaddresses, parseaddr

import phonenumbers
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

__all__ = ["MESSAGING_SERVICE_SID", "email_address_problem", "is_messaging_service", "sms_sender_problem"]

#: A Twilio Messaging Service SID.
MESSAGING_SERVICE_SID = re.compile(r"^MG[0-9a-fA-F]{32}$")
#: Longest email sender we accept (RFC 5321 path limit for the address; a display name adds to it).
MAX_EMAIL_SENDER_CHARS = 254


def is_messaging_service(sender: str | None) -> bool:
    """Whether an SMS ``sender`` is a Twilio Messaging Service SID (sent as ``MessagingServiceSid``,
    not ``From``)."""
    return sender is not None and sender.startswith("MG")


def sms_sender_problem(value: str) -> str | None:
    """Why ``value`` cannot be an SMS sender, or ``None``: it must be an E.164 number or a
    Messaging Service SID (``MG`` + 32 hex digits)."""
    if not isinstance(value, str) or not value:
        return "an SMS sender must be an E.164 number (e.g. +15005550006) or a Messaging Service SID (MG…)"
    if value.startswith("MG"):
        if MESSAGING_SERVICE_SID.match(value):
            return None
        return f"{value!r} is not a Messaging Service SID: MG followed by 32 hexadecimal digits"
    try:
        parsed = phonenumbers.parse(value, None)
    except phonenumbers.NumberParseException:
        parsed = None
    if parsed is None or not phonenumbers.is_possible_number(parsed) or \
            phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164) != value:
        return (f"{value!r} is not an E.164 number (+, country code and number, no spaces, e.g. "
                "+15005550006) nor a Messaging Service SID (MG…)")
    return None


def email_address_problem(value: str) -> str | None:
    """Why ``value`` cannot be an email From or Reply-To, or ``None``: one address, bare or as
    ``Name <addr>``, at most 254 characters, no line break."""
    if not isinstance(value, str) or not value.strip():
        return 'an email sender must be an address, "addr@example.com" or "Name <addr@example.com>"'
    if "\r" in value or "\n" in value:
        return "an email sender may not contain a line break"
    if len(value) > MAX_EMAIL_SENDER_CHARS:
        return f"an email sender has at most {MAX_EMAIL_SENDER_CHARS} characters"
    if len(getaddresses([value])) != 1:
        return f"{value!r} is more than one address: give exactly one"
    address = parseaddr(value)[1]
    try:
        validate_email(address)
    except ValidationError:
        return f'{value!r} is not an email address ("addr@example.com" or "Name <addr@example.com>")'
    return None
