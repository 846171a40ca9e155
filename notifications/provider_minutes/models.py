"""The per-minute rollup the provider health page charts (registered by
:meth:`notifications.apps.NotificationsConfig.import_models`; written only by :mod:`.sampler`)."""

from __future__ import annotations

from django.db import models


class ProviderMinute(models.Model):
    """One provider's calls made in one minute (UTC), and its breaker as sampled in that minute.

    ``requests`` and ``errors`` count the minute's attempts, not HTTP requests (``notifications.health``'s
    ``CALL_OUTCOMES`` and ``ERROR_OUTCOMES``); ``latency_p95_ms`` is their p95, or, for a minute two
    samples split, the larger of the parts' p95s (an upper bound: docs/OPERATIONS.md). The breaker
    fields are empty in a minute with no sample.
    """

    provider = models.CharField(max_length=32)
    minute = models.DateTimeField(help_text="The minute (UTC, seconds zero).")
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    latency_p95_ms = models.PositiveIntegerField(null=True, blank=True)
    breaker_state = models.CharField(max_length=12, blank=True, default="",
                                     help_text="closed, open, half_open or unknown at the minute's last sample.")
    breaker_opened = models.PositiveIntegerField(default=0, help_text="Openings since the previous sample.")
    breaker_opened_total = models.PositiveIntegerField(default=0, help_text="The breaker's opening counter.")
    spell_began = models.DateTimeField(null=True, blank=True, help_text="The open spell the sample saw: began…")
    spell_ended = models.DateTimeField(null=True, blank=True, help_text="…and ended (empty: still open).")
    sampled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        app_label = "notifications"
        constraints = [models.UniqueConstraint(fields=["provider", "minute"], name="provider_minute_uniq")]
        indexes = [models.Index(fields=["minute"], name="provider_minute_minute_idx")]
        ordering = ["provider", "minute"]

    def __str__(self) -> str:
        return f"{self.provider} at {self.minute:%Y-%m-%d %H:%M}"


class RollupMark(models.Model):
    """How far the sampler has read the delivery log: the highest ``DeliveryAttempt.id`` counted. One
    row (``name="provider_minutes"``), locked for the length of a sample, so two never count twice."""

    name = models.CharField(max_length=32, primary_key=True)
    last_id = models.BigIntegerField()
    at = models.DateTimeField()

    class Meta:
        app_label = "notifications"

    def __str__(self) -> str:
        return f"{self.name}: attempts through id {self.last_id}"
