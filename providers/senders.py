"""Per-message senders (:attr:`providers.base.OutboundMessage.sender` and ``reply_to``): which
forms the backends accept, and why a value is not one of them.

SMS: an E.164 From number or a Twilio Messaging Service SID. Email: exactly one mailbox
(``addr@example.com`` or ``Name <addr@example.com>``), never a line break, list, group, RFC 2047
encoded word or an address-like display name (docs/TYPES.md, "Senders"). :func:`parse_sender` is
the one parse of an email sender, read by the check and by every email backend, so what goes out is
what was checked; :func:`sender_address` is what an allow-list compares, :func:`configured_senders`
the always-allowed senders of the settings. ``*_problem`` functions return a sentence naming the
rule, or ``None``. Importing this module touches no provider SDK.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from email.headerregistry import Address, HeaderRegistry

import phonenumbers
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from core.identifiers import control_character_problem, shows_nothing

__all__ = ["MESSAGING_SERVICE_SID", "configured_senders", "email_address_problem", "is_messaging_service",
           "parse_sender", "sender_address", "sender_header", "sms_sender_problem"]

#: A Twilio Messaging Service SID.
MESSAGING_SERVICE_SID = re.compile(r"^MG[0-9a-fA-F]{32}$")
#: Longest email sender we accept (RFC 5321 path limit for the address; a display name adds to it).
MAX_EMAIL_SENDER_CHARS = 254
#: Where an RFC 2047 encoded word starts; no sender may hold it (module docstring).
ENCODED_WORD_START = "=?"
#: Characters a display name may not hold (after NFKC, which folds ＠ ﹫ ＜ ＞): it would look like an
#: address. The angle brackets' look-alikes NFKC keeps apart are listed too.
NAME_ADDRESS_CHARACTERS = "@<>˂˃‹›❮❯〈〉⟨⟩⦑⦒ⓐ"
#: A domain in a display name (after NFKC: ``security﹒paypal﹒com`` reads ``security.paypal.com``).
_NAME_DOMAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}")


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
    if parsed is None or not phonenumbers.is_valid_number(parsed) or \
            phonenumbers.format_number(parsed, phonenumbers.PhoneNumberFormat.E164) != value:
        return (f"{value!r} is not an E.164 number (+, country code and number, no spaces, e.g. "
                "+15005550006) nor a Messaging Service SID (MG…)")
    return None


def _mailbox(value: str) -> tuple[Address | None, str]:
    """The one mailbox ``value`` names and ``""``, or ``None`` and why not: ``"list"`` (more than
    one address), ``"group"`` or ``"invalid"`` (the parser found a defect)."""
    try:
        header = HeaderRegistry()("from", value)
    except (ValueError, IndexError, TypeError):  # the parser's own errors on malformed input
        return None, "invalid"
    groups = header.groups  # type: ignore[attr-defined]
    if any(group.display_name is not None for group in groups):
        return None, "group"
    if sum(len(group.addresses) for group in groups) > 1:
        return None, "list"
    if header.defects or len(groups) != 1 or len(groups[0].addresses) != 1:
        return None, "invalid"
    return groups[0].addresses[0], ""


@functools.lru_cache(maxsize=1024)
def parse_sender(value: str) -> tuple[str, str]:
    """The one parse of an email sender: ``"Shop <shop@example.com>"`` → ``("Shop",
    "shop@example.com")``, ``"shop@example.com"`` → ``("", "shop@example.com")``. A value that is
    not one mailbox (never one that passed :func:`email_address_problem`) gives ``("", value)``.
    Cached: the backends ask it for every message (a header parse is ~70 µs), of a few senders."""
    mailbox, _why = _mailbox(value)
    if mailbox is None:
        return "", value.strip()
    return mailbox.display_name or "", mailbox.addr_spec


def sender_header(value: str) -> str:
    """A sender as a header value rebuilt from :func:`parse_sender` (``Shop <shop@example.com>``,
    the name quoted where it needs it), so a header says exactly what was checked."""
    name, address = parse_sender(value)
    username, at, domain = address.rpartition("@")
    if not at:
        return address
    return str(Address(display_name=name, username=username, domain=domain))


def email_address_problem(value: str) -> str | None:
    """Why ``value`` cannot be an email From or Reply-To, or ``None``: exactly one mailbox, bare or
    as ``Name <addr>``, at most 254 characters, no line break, no list, no group."""
    if not isinstance(value, str) or not value.strip():
        return 'an email sender must be an address, "addr@example.com" or "Name <addr@example.com>"'
    if "\r" in value or "\n" in value:
        return "an email sender may not contain a line break"
    if len(value) > MAX_EMAIL_SENDER_CHARS:
        return f"an email sender has at most {MAX_EMAIL_SENDER_CHARS} characters"
    if invisible := control_character_problem(value):  # a bidi override in a name reorders what people read
        return f"an email sender {invisible}"
    if ENCODED_WORD_START in value:
        return 'an email sender may not contain an encoded word ("=?…?="): write the name as plain text'
    mailbox, why = _mailbox(value)
    if why == "list":
        return f"{value!r} is more than one address: give exactly one"
    if why == "group":
        return f"{value!r} is a group of addresses: give exactly one address"
    try:
        validate_email(mailbox.addr_spec if mailbox is not None else "")
    except ValidationError:
        return f'{value!r} is not an email address ("addr@example.com" or "Name <addr@example.com>")'
    name, address = parse_sender(value)
    folded = unicodedata.normalize("NFKC", name)
    if any(char in folded for char in NAME_ADDRESS_CHARACTERS):  # ＠ ﹫ ＜ too
        return f"the display name {name!r} may not contain @, < or >: a name that looks like an address impersonates it"
    domain = address.rpartition("@")[2].lower()
    if any(found.lower() != domain for found in _NAME_DOMAIN.findall(folded)):
        return (f"the display name {name!r} names a domain other than the address's ({domain}): a name that "
                "looks like another address impersonates it")
    if folded.strip() and shows_nothing(folded):
        return f"the display name {name!r} shows nothing: leave it out or write a name"
    username = address.rpartition("@")[0]
    if not address.isascii() or any(char in username for char in '"@\\ '):
        return (f"{address!r}: an email sender's address is plain ASCII with an unquoted local part (no quotes, "
                "@ or spaces before the domain; an internationalised domain in its xn-- form)")
    return None


def sender_address(channel: str, value: str) -> str:
    """What an allow-list compares of a well-formed sender: an email sender's address, lower-cased
    (``Shop <Shop@Example.com>`` → ``shop@example.com``); an SMS sender as it is."""
    if channel != "email":
        return value
    return parse_sender(value)[1].lower()


def configured_senders(channel: str) -> set[str]:
    """The senders the settings configure for ``channel`` (``"email"``: every provider's
    ``FROM_EMAIL`` address, lower-cased; ``"sms"``: every ``FROM_NUMBER``): the defaults, which a
    type may always name."""
    from django.conf import settings

    option = {"email": "FROM_EMAIL", "sms": "FROM_NUMBER"}.get(channel)
    providers = getattr(settings, "PROVIDERS", None) or {}
    entries = providers.get(channel) or [] if isinstance(providers, dict) else []
    found = {str((entry.get("OPTIONS") or {}).get(option) or "") for entry in entries} if option else set()
    return {sender_address(channel, value) for value in found if value}
