"""Webhook endpoints, their deliveries (the outbox) and each delivery's attempts (docs/WEBHOOKS.md).

A :class:`WebhookDelivery` row is written in the transaction that moves a notification's status
(:mod:`notifications.webhooks.outbox`), one per subscribed endpoint; the webhook worker reads due
rows in batches and records every HTTP attempt as a :class:`WebhookAttempt`. No field is named
``status``: a notification's status has one writer (tests/test_status_writers.py).
"""

from __future__ import annotations

import uuid

from django.db import models

from core import clock
from notifications.models import APIClient

#: The events an endpoint may subscribe to (docs/WEBHOOKS.md, "Events").
NOTIFICATION_EVENTS = tuple(f"notification.{s}" for s in (
    "sent", "delivered", "failed", "suppressed", "expired", "cancelled", "displayed", "opened", "dismissed"))
#: An event's user decided: a channel sent it, or every channel ended without sending (once per user).
OUTCOME_EVENTS = ("event.reached", "event.not_reached")
CAMPAIGN_EVENTS = ("campaign.completed",)
EVENTS: tuple[str, ...] = (*NOTIFICATION_EVENTS, *OUTCOME_EVENTS, *CAMPAIGN_EVENTS)
#: Sent by ``POST /v1/webhook-endpoints/{id}/test`` only; never subscribed to.
TEST_EVENT = "webhook.test"


class WebhookEndpoint(models.Model):
    """Where an API client wants its notifications' status events, and which ones.

    ``secret`` (``whsec_`` + base64 of 24 random bytes) signs every delivery; it is returned once, by
    the create call, and never shown again (not by the API, not by the admin). ``disabled_reason``
    says why an endpoint stopped receiving: failing for ``WEBHOOKS["DISABLE_AFTER_SECONDS"]``, or a
    person's choice."""

    content_fields = frozenset({"secret"})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    client = models.ForeignKey(APIClient, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=2000)
    events = models.JSONField(default=list, help_text="The event types sent to this endpoint.")
    description = models.CharField(max_length=500, blank=True, default="")
    secret = models.CharField(max_length=100, editable=False)
    active = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=500, blank=True, default="")
    disabled_at = models.DateTimeField(null=True, blank=True)
    failing_since = models.DateTimeField(null=True, blank=True,
                                         help_text="First failed attempt since the last success (none: healthy).")
    #: The delivery worker holding this endpoint until then (one batch in flight per endpoint).
    busy_until = models.DateTimeField(null=True, blank=True, editable=False)
    #: The token of the run holding ``busy_until``: only it renews or releases the lease.
    lease = models.UUIDField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name = "webhook endpoint"

    def __str__(self) -> str:
        return self.url

    def save(self, *args, **kwargs):
        self.updated_at = clock.now()
        super().save(*args, **kwargs)


class WebhookDelivery(models.Model):
    """One event for one endpoint: the outbox row, then its delivery state.

    ``id`` is the ``webhook-id`` header (``msg_<hex>``): the same on every retry, so a receiver
    de-duplicates by it (delivery is at least once)."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending (due at next_attempt_at)"
        DELIVERED = "delivered", "Delivered (2xx)"
        FAILED = "failed", "Failed (final: a 4xx, or retries ran out)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries")
    event_type = models.CharField(max_length=40)
    notification_id = models.UUIDField(null=True, blank=True)
    #: What is told once per endpoint (``event:<event id>:<user id>`` for an event's outcome); "" otherwise.
    subject = models.CharField(max_length=400, blank=True, default="")
    payload = models.JSONField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=clock.now)
    #: Set by the first attempt (then + ``RETRY_FOR_SECONDS``); a replay clears it: a fresh window.
    give_up_at = models.DateTimeField(null=True, blank=True)
    last_http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["-created_at", "id"]
        verbose_name = "webhook delivery"
        verbose_name_plural = "webhook deliveries"
        indexes = [
            # The worker's read: an endpoint's due deliveries in order (few pending at any time).
            models.Index(fields=["endpoint", "next_attempt_at"], name="webhook_due_idx",
                         condition=models.Q(state="pending")),
            models.Index(fields=["endpoint", "-created_at"], name="webhook_endpoint_time_idx"),
            # Erasure's read: the deliveries of a user's notifications.
            models.Index(fields=["notification_id"], name="webhook_notification_idx",
                         condition=models.Q(notification_id__isnull=False)),
        ]
        constraints = [models.UniqueConstraint(fields=["endpoint", "subject"], name="webhook_subject_once",
                                               condition=~models.Q(subject=""))]

    def __str__(self) -> str:
        return f"{self.event_type} → {self.endpoint_id} ({self.state})"

    @property
    def message_id(self) -> str:
        """The ``webhook-id`` header."""
        return f"msg_{self.id.hex}"


class WebhookAttempt(models.Model):
    """One HTTP request of a delivery: what the endpoint answered and how long it took."""

    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    error = models.CharField(max_length=500, blank=True, default="")
    retry_at = models.DateTimeField(null=True, blank=True, help_text="When it is tried again (none: final).")
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["created_at", "id"]
        verbose_name = "webhook attempt"

    def __str__(self) -> str:
        return f"attempt {self.number}: {self.http_status or self.error}"
