"""The senders a notification type may name (``email_from``, ``email_reply_to``, ``sms_from``): an
allow-list that staff keep in the admin (docs/TYPES.md "Senders", docs/SECURITY.md "Senders").

An entry is global or one API client's; an email entry is an address or a whole domain (not its
subdomains), an SMS entry an E.164 number or a Messaging Service SID; the settings' own senders are
always allowed. Whether a value is well formed is :mod:`providers.senders`' rule; this module only
answers whether a well-formed sender is allowed (:func:`allowlist_problems`). Django registers the
model through ``NotificationsConfig.import_models``.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import validate_email
from django.db import models
from django.db.models import Q

from core import clock
from notifications.models import APIClient
from providers.senders import configured_senders, sender_address, sms_sender_problem

#: A type's sender fields and the channel of each.
SENDER_FIELDS = {"email_from": "email", "email_reply_to": "email", "sms_from": "sms"}


class AllowedSender(models.Model):
    """One sender (or email domain) that types may name; ``client`` empty: every client's."""

    class Channel(models.TextChoices):
        EMAIL = "email", "Email (From / Reply-To)"
        SMS = "sms", "SMS (From)"

    channel = models.CharField(max_length=8, choices=Channel.choices)
    value = models.CharField(
        max_length=254, help_text="Email: an address (shop@example.com) or a whole domain (example.com). SMS: an "
                                  "E.164 number (+15005550006) or a Messaging Service SID (MG…).")
    client = models.ForeignKey(APIClient, on_delete=models.CASCADE, null=True, blank=True,
                               related_name="allowed_senders", verbose_name="API client",
                               help_text="Empty: every API client and the admin's own types may use it.")
    note = models.CharField(max_length=200, blank=True, default="", help_text="Who asked for it and why.")
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["channel", "value"]
        verbose_name = "allowed sender"
        constraints = [
            models.UniqueConstraint(fields=["channel", "value"], condition=Q(client__isnull=True),
                                    name="allowed_sender_global_uniq"),
            models.UniqueConstraint(fields=["channel", "value", "client"], name="allowed_sender_client_uniq"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} {self.value} ({self.client.name if self.client is not None else 'every client'})"

    def clean(self) -> None:
        """An email entry is a bare address or a domain (stored lower-cased); an SMS entry a sender
        the SMS backends accept (:func:`providers.senders.sms_sender_problem`)."""
        value = (self.value or "").strip()
        if self.channel == self.Channel.EMAIL:
            value = value.lower().lstrip("@")
            try:
                validate_email(value if "@" in value else f"postmaster@{value}")
            except ValidationError:
                raise ValidationError({"value": "an email address (shop@example.com) or a domain (example.com)"}) \
                    from None
        elif self.channel == self.Channel.SMS and sms_sender_problem(value):
            raise ValidationError({"value": sms_sender_problem(value)})
        self.value = value


def is_allowed(channel: str, value: str, client: APIClient | None) -> bool:
    """Whether the well-formed sender ``value`` on ``channel`` is allowed for types of ``client``
    (``None``: the admin's own types, global entries only)."""
    address = sender_address(channel, value)
    if address in configured_senders(channel):
        return True
    wanted = [address]
    if channel == "email" and "@" in address:
        wanted.append(address.rsplit("@", 1)[1])
    scope = Q(client__isnull=True) | Q(client=client) if client is not None else Q(client__isnull=True)
    return AllowedSender.objects.filter(scope, channel=channel, value__in=wanted).exists()


def allowlist_problems(fields: dict, client: APIClient | None, refused: set) -> dict[str, tuple[str, str]]:
    """``{field: (code, message)}`` for each sender of a type's ``fields`` not on the allow-list of
    ``client``; fields in ``refused`` (already refused as malformed) and empty ones are skipped.
    Code ``sender_not_allowed``."""
    problems = {}
    for name, channel in SENDER_FIELDS.items():
        value = fields.get(name) or ""
        if value and name not in refused and not is_allowed(channel, value, client):
            problems[name] = ("sender_not_allowed",
                              f"{name}: {sender_address(channel, value)!r} is not on the sender allow-list of the "
                              "type's owner: staff add senders (an address, a domain or a number, for every client "
                              "or one) in the admin (Allowed senders); the configured default is always allowed")
    return problems
