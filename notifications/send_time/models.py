"""A recipient's learned send-time profile, recomputed in bulk by :mod:`notifications.send_time.compute`
(registered by :meth:`notifications.apps.NotificationsConfig.import_models`; docs/SEND_TIME.md)."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models

from core import clock
from preferences.models import Recipient


class SendTimeProfile(models.Model):
    """Engagements by local hour over the last ``SEND_TIME_HISTORY_DAYS`` (raw counts; the rule smooths
    them), and the best hour of the whole day. A recipient without one has no history."""

    recipient = models.OneToOneField(Recipient, on_delete=models.CASCADE, primary_key=True,
                                     related_name="send_time_profile")
    counts = ArrayField(models.PositiveIntegerField(), size=24,
                        help_text="Engaged notifications by local hour 0–23 (the first engagement of each).")
    events = models.PositiveIntegerField(help_text="Engaged notifications counted (the sum of counts).")
    best_hour = models.PositiveSmallIntegerField(help_text="Local hour with the highest smoothed score, all day.")
    computed_at = models.DateTimeField(default=clock.now)

    class Meta:
        app_label = "notifications"
        verbose_name = "send-time profile"

    def __str__(self) -> str:
        return f"{self.recipient_id}: best {self.best_hour:02d}:00 from {self.events} engagements"
