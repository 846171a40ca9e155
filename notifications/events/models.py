"""Notification types, their templates, and the events that use them (docs/TYPES.md).

Registered by :meth:`notifications.apps.NotificationsConfig.import_models`; import them from this
module."""

from __future__ import annotations

import uuid

from django.db import models

from core import clock
from notifications.ids import digest_notification_id
from notifications.models import APIClient, Priority
from preferences.models import Channel


class Routing(models.TextChoices):
    ALL = "all", "All: every eligible channel"
    FALLBACK = "fallback", "Fallback: in order, the next only if the one before could not reach the user"


class QuietHoursPolicy(models.TextChoices):
    DEFER = "defer", "Defer: wait for the end of the recipient's quiet hours"
    BYPASS = "bypass", "Bypass: send now (security alerts, one-time codes)"
    SILENT = "silent", "Silent: push now as a data-only message (no alert, no sound); other channels defer"


class NotificationType(models.Model):
    """What an event of one kind becomes (``order_shipped``): its category (what users opt out of),
    priority, channels and routing policy, quiet-hours policy, defaults (TTL, collapse key, senders)
    and templates per channel and locale (:class:`TypeTemplate`), rendered at send time.

    ``channels`` is an ordered list of channel names (the order is the fallback order).
    ``required_data``: names of ``data`` keys an event must carry (else 422 naming it); any other
    variable a template uses and the event lacks renders empty. ``client`` owns it when it was
    made through the API (only that client changes it there); empty: made in the admin."""

    #: Template sources may quote content: never filtered or searched in the admin.
    content_fields = frozenset({"collapse_key"})

    key = models.SlugField(max_length=64, primary_key=True, help_text='e.g. "order_shipped".')
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    category = models.CharField(max_length=64, help_text='What users opt out of: "shipping", "security", …')
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.STANDARD)
    channels = models.JSONField(default=list, help_text='Ordered channel names, e.g. ["push", "email"].')
    routing = models.CharField(max_length=8, choices=Routing.choices, default=Routing.ALL)
    quiet_hours = models.CharField(max_length=8, choices=QuietHoursPolicy.choices, default=QuietHoursPolicy.DEFER)
    in_app_quiet_hours = models.BooleanField(
        default=False, help_text="in_app items wait for the end of quiet hours too (policy defer or silent); by "
                                 "default an inbox item is written at once: it makes no sound.")
    required = models.BooleanField(default=False, help_text="Opt-outs do not apply (security, legal); contact "
                                                            "validity and SMS STOP still do.")
    sensitive = models.BooleanField(default=False, help_text="Content and event data (e.g. a one-time code) are "
                                                             "never shown or logged.")
    ttl_seconds = models.PositiveIntegerField(
        null=True, blank=True, help_text="Default time to live of its notifications (an event may set its own).")
    collapse_key = models.CharField(max_length=255, blank=True, default="",
                                    help_text="Push collapse key template (a device shows one copy per key), e.g. "
                                              "order-{{ data.order_id }}. Empty: the notification id.")
    sms_from = models.CharField(max_length=64, blank=True, default="",
                                help_text="SMS sender (E.164 or Messaging Service SID); empty: the provider's.")
    email_from = models.CharField(max_length=254, blank=True, default="",
                                  help_text='Email From ("Name <addr>"); empty: the provider\'s.')
    email_reply_to = models.CharField(max_length=254, blank=True, default="", help_text="Email Reply-To.")
    required_data = models.JSONField(default=list, blank=True,
                                     help_text='data keys an event must carry, e.g. ["tracking_url"].')
    digest = models.JSONField(null=True, blank=True, default=None,
                              help_text='Batch events into one notification per window: {"window_seconds": 600, '
                                        '"key": "{{ data.post_id }}"} (empty key: one digest per user). '
                                        "Empty: every event is sent on its own.")
    default_locale = models.CharField(max_length=35, default="en",
                                      help_text="Templates of this locale are used when none matches the "
                                                "recipient's locale.")
    client = models.ForeignKey(APIClient, on_delete=models.PROTECT, null=True, blank=True,
                               related_name="notification_types", verbose_name="owner (API client)")
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["key"]
        verbose_name = "notification type"

    def __str__(self) -> str:
        return self.key


class TypeTemplate(models.Model):
    """A type's content for one channel and locale: push ``title``, ``body``, ``data`` (``{key:
    template}``); email ``title`` (the subject), ``body`` (text), ``html``; SMS ``body``. Sandboxed
    Jinja2 over the recipient and the event's ``data`` (:mod:`notifications.rendering`)."""

    #: Never filtered or searched in the admin (preferences.admin_guard).
    content_fields = frozenset({"title", "body", "html", "data"})

    type = models.ForeignKey(NotificationType, on_delete=models.CASCADE, related_name="templates")
    channel = models.CharField(max_length=8, choices=Channel.choices)
    locale = models.CharField(max_length=35, help_text='BCP 47 tag: "en", "de", "de-AT"…')
    title = models.CharField(max_length=998, blank=True, default="", help_text="Email subject / push title.")
    body = models.TextField()
    html = models.TextField(blank=True, default="", help_text="Email only. Variables are HTML-escaped.")
    data = models.JSONField(default=dict, blank=True, help_text="Push only: {key: template}.")
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["channel", "locale"]
        constraints = [models.UniqueConstraint(fields=["type", "channel", "locale"], name="type_template_uniq")]

    def __str__(self) -> str:
        return f"{self.type_id} {self.channel} [{self.locale}]"


class Event(models.Model):
    """One semantic event accepted through ``POST /v1/events`` (or a typed ``POST
    /v1/notifications``): its type, data and users, and the notifications it became (one per user
    and channel of the type, ids ``uuid5(event, user, channel)``). ``channels`` and ``routing`` are
    the type's when it was accepted (what its notifications were made from)."""

    #: The event's data is template input and may be content: never filtered or searched in the admin.
    content_fields = frozenset({"data", "request_fingerprint"})

    id = models.UUIDField(primary_key=True, editable=False)
    client = models.ForeignKey(APIClient, on_delete=models.PROTECT, related_name="events",
                               db_index=False)
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL: typed single send
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")
    type = models.ForeignKey(NotificationType, on_delete=models.PROTECT, related_name="events", db_index=False)
    data = models.JSONField(default=dict, blank=True)
    user_ids = models.JSONField(default=list, help_text="The users, in the order given.")
    channels = models.JSONField(default=list)
    routing = models.CharField(max_length=8, choices=Routing.choices)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    ttl_seconds = models.PositiveIntegerField(null=True, blank=True)
    collapse_key = models.CharField(max_length=255, blank=True, default="")
    sensitive = models.BooleanField(default=False, help_text="Its type was sensitive when it was accepted: its data "
                                                             "is never shown (nor if the type is sensitive now).")
    cancelled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["client", "idempotency_key"], name="event_client_idem_key_uniq",
                                    condition=models.Q(idempotency_key__isnull=False)),
        ]
        indexes = [models.Index(fields=["-created_at"], name="event_created_idx"),  # the admin's list, newest first
                   models.Index(fields=["client", "-created_at"], name="event_client_created_idx"),
                   models.Index(fields=["type", "-created_at"], name="event_type_created_idx")]

    def __str__(self) -> str:
        return f"{self.type_id} {self.pk}"


class Digest(models.Model):
    """The events of one digest type for one user and rendered ``key`` inside one window
    (docs/TYPES.md, "Digests"), sent as ONE notification per channel when the window closes.

    Opened by the first event (``opened_at``), closed at ``closes_at`` = ``opened_at`` +
    ``window_seconds`` (UTC) by the scheduler or by the next event after it: at most one open digest
    per (type, user, key, API client) (partial unique index). ``channels`` and ``routing`` are the type's when it
    opened. Its items are :class:`DigestItem` rows, in order of acceptance."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    type = models.ForeignKey(NotificationType, on_delete=models.PROTECT, related_name="digests", db_index=False)
    recipient = models.ForeignKey("preferences.Recipient", on_delete=models.PROTECT, related_name="digests",
                                  db_index=False)
    client = models.ForeignKey(APIClient, on_delete=models.PROTECT, null=True, blank=True, related_name="digests",
                               db_index=False, help_text="The API client whose events it holds: a digest never "
                                                         "mixes two clients' events (their data would show in "
                                                         "one client's notification).")
    key = models.CharField(max_length=255, blank=True, default="", help_text="The rendered digest key.")
    window_seconds = models.PositiveIntegerField()
    channels = models.JSONField(default=list)
    routing = models.CharField(max_length=8, choices=Routing.choices, default=Routing.ALL)
    opened_at = models.DateTimeField()
    closes_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    item_count = models.PositiveIntegerField(default=0, help_text="Set when it closes.")

    class Meta:
        ordering = ["-opened_at"]
        constraints = [models.UniqueConstraint(fields=["type", "recipient", "key", "client"],
                                               name="digest_open_uniq", condition=models.Q(closed_at__isnull=True),
                                               nulls_distinct=False)]
        indexes = [models.Index(fields=["closes_at"], name="digest_closes_idx",
                                condition=models.Q(closed_at__isnull=True)),  # the scheduler's sweep
                   models.Index(fields=["-opened_at"], name="digest_opened_idx"),  # the admin's list
                   models.Index(fields=["recipient", "-opened_at"], name="digest_recipient_idx")]

    def __str__(self) -> str:
        return f"{self.type_id} {self.recipient_id} [{self.shown_key}] {self.state}"

    #: What staff read instead of a sensitive type's digest key.
    HIDDEN_KEY = "(hidden: sensitive type)"

    @property
    def shown_key(self) -> str:
        """The key as the admin and the timeline show it: a sensitive type's (a keyed hash of what
        may be a code; docs/TYPES.md, "Digests") is :attr:`HIDDEN_KEY`, never the hash."""
        return self.HIDDEN_KEY if self.key and self.type.sensitive else self.key

    @property
    def state(self) -> str:
        return "closed" if self.closed_at else "open"

    def notification_ids(self) -> list[uuid.UUID]:
        """The ids of its notifications (made when it closes), in channel order."""
        return [digest_notification_id(self.pk, c) for c in self.channels]


class DigestItem(models.Model):
    """One event in a digest; ``id`` order is acceptance order (items of one digest are appended under
    the digest's row lock, one transaction after another)."""

    id = models.BigAutoField(primary_key=True)
    digest = models.ForeignKey(Digest, on_delete=models.CASCADE, related_name="items", db_index=False)
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="digest_items", db_index=False)
    created_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["digest", "event"], name="digest_item_uniq")]
        indexes = [models.Index(fields=["event"], name="digest_item_event_idx")]

    def __str__(self) -> str:
        return f"{self.digest_id} #{self.pk}"
