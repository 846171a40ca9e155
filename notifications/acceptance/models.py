"""Acceptance limits edited in the admin (docs/POLICIES.md, "Abuse limits").

Registered by :meth:`notifications.apps.NotificationsConfig.import_models`; import it from this
module. The rules in force are the settings' (``NOTIFY["ACCEPTANCE_LIMITS"]``) with these rows
added, or replacing a settings rule of the same ``name`` (:func:`notifications.acceptance.rules.effective_rules`).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from core import clock

#: The longest window a rule may have (seconds): one day.
MAX_WINDOW_SECONDS = 24 * 3600


class Per(models.TextChoices):
    USER = "user", "User: one recipient (user_id)"
    PHONE = "phone", "Phone: one phone number, across users (requests that would send an SMS)"
    EMAIL = "email", "Email: one address, across users (requests that would send an email)"


class AcceptanceLimit(models.Model):
    """At most ``limit`` accepted requests matching ``type_key`` and/or ``category`` per ``per``
    (user, phone number or email address) in any ``window_seconds``. ``enabled = False`` switches
    off the settings rule of the same name."""

    name = models.CharField(primary_key=True, max_length=64,
                            validators=[RegexValidator(r"^[a-z0-9_]+$", "lower-case letters, digits and _")],
                            help_text="Named in the 429's `limit` and the metric's label (`otp_per_user`). "
                                      "A settings rule of the same name is replaced by this row.")
    type_key = models.CharField(max_length=64, blank=True, default="",
                                help_text="Notification type key it counts (`otp`); empty: any type, or none.")
    category = models.CharField(max_length=64, blank=True, default="",
                                help_text="Category it counts (`security`); empty: any category.")
    per = models.CharField(max_length=8, choices=Per.choices)
    limit = models.PositiveIntegerField(validators=[MinValueValidator(1)],
                                        help_text="Requests accepted per window; the next one is 429.")
    window_seconds = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(MAX_WINDOW_SECONDS)],
        help_text="The sliding window, in seconds (at most one day).")
    enabled = models.BooleanField(default=True, help_text="Off: the rule (and a settings rule of the same name) "
                                                          "is not applied.")
    updated_at = models.DateTimeField(default=clock.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if not self.type_key and not self.category:
            raise ValidationError({"type_key": "give a type key, a category, or both: a limit on every "
                                               "notification is a rate limit, not an abuse limit"})
