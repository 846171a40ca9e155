"""Recipients (end users), their devices and their delivery preferences (docs/ARCHITECTURE.md §4)."""

from __future__ import annotations

from datetime import datetime

from django.contrib.postgres.indexes import GinIndex, OpClass
from django.db import models
from django.db.models.functions import Lower

from core import clock


class Channel(models.TextChoices):
    SMS = "sms", "SMS"
    EMAIL = "email", "Email"
    PUSH = "push", "Push"
    IN_APP = "in_app", "In-app inbox"


class Recipient(models.Model):
    """An end user, keyed by the upstream service's ``user_id``.

    ``phone`` is E.164 (normalised with ``phonenumbers`` on the way in), ``timezone`` an IANA zone
    name. ``phone_invalid_reason`` / ``email_invalid_reason`` record that the provider told us the
    contact is dead (Twilio 21211, hard bounce…); sends to it are then ``suppressed``.
    """

    #: Template inputs (rendered into campaign content): never filtered in the admin
    #: (preferences.admin_guard).
    content_fields = frozenset({"attributes"})

    user_id = models.CharField(max_length=255, primary_key=True)
    email = models.EmailField(max_length=254, blank=True, default="")
    phone = models.CharField(max_length=16, blank=True, default="", db_index=True,
                             help_text="E.164, e.g. +4915123456789")
    timezone = models.CharField(max_length=64, blank=True, default="", help_text="IANA zone, e.g. Europe/Berlin")
    locale = models.CharField(max_length=35, blank=True, default="", help_text="BCP 47 tag, e.g. de-DE")
    attributes = models.JSONField(default=dict, blank=True,
                                  help_text='String attributes for templates, e.g. {"first_name": "Ada"}.')
    email_invalid_reason = models.CharField(max_length=64, blank=True, default="")
    email_invalid_at = models.DateTimeField(null=True, blank=True)
    phone_invalid_reason = models.CharField(max_length=64, blank=True, default="")
    phone_invalid_at = models.DateTimeField(null=True, blank=True)
    # The latest erasure's instant (the platform clock): what was created before it and is still in
    # flight when it commits is never sent, written to the inbox or replayed (erased_after).
    erased_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The upstream service's last write (PUT /v1/users, the platform clock): later than erased_at, the
    # user was re-created after its erasure and matches rule segments again on what was written since.
    written_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["email"], name="recipient_email_idx"),
                   # Rule segments (campaigns/rules.py, docs/SEGMENTS.md): attribute containment and key
                   # existence, and a locale or its more specific tags in any case (lower: = and LIKE 'de-%').
                   GinIndex(fields=["attributes"], name="recipient_attributes_gin"),
                   models.Index(OpClass(Lower("locale"), name="text_pattern_ops"), name="recipient_locale_idx")]

    def __str__(self) -> str:
        return self.user_id

    def erased_after(self, instant: datetime) -> bool:
        """Whether this recipient's personal data was erased after ``instant`` (a notification's
        creation): its content belongs to the erased user, not to whoever holds the id now. The
        same rule in SQL: ``notifications.models.ERASED_SINCE_CREATED``, ``notifications.inbox.store``."""
        return self.erased_at is not None and self.erased_at > instant

    def erasure_mark(self) -> str:
        """What a per-user list cursor binds (core/cursors.py's listing): "" until the first erasure,
        then the latest one's instant, so no cursor issued before an erasure reads on after it."""
        return self.erased_at.isoformat() if self.erased_at is not None else ""


class Device(models.Model):
    """A push token on one of a recipient's devices. A token belongs to one recipient at a time."""

    class Platform(models.TextChoices):
        IOS = "ios", "iOS"
        ANDROID = "android", "Android"
        WEB = "web", "Web"

    recipient = models.ForeignKey(Recipient, on_delete=models.CASCADE, related_name="devices")
    platform = models.CharField(max_length=8, choices=Platform.choices)
    push_token = models.CharField(max_length=4096, unique=True)
    active = models.BooleanField(default=True)
    deactivated_reason = models.CharField(max_length=64, blank=True, default="")
    deactivated_at = models.DateTimeField(null=True, blank=True)
    registered_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["recipient", "active"], name="device_recipient_active_idx")]

    def __str__(self) -> str:
        return f"{self.platform} …{self.push_token[-8:]}"


class SmsStop(models.Model):
    """The owner of ``phone`` replied STOP to ``sender`` (Twilio 21610 / carrier block 30004).

    Scoped to the sender, as carriers scope it: SMS from that number to this phone are suppressed
    until the recipient replies START (or an operator deletes the row); other senders are unaffected.
    """

    phone = models.CharField(max_length=16, help_text="E.164")
    sender = models.CharField(max_length=64, help_text="The From number or Messaging Service SID")
    source = models.CharField(max_length=32, help_text='e.g. "twilio 21610", "twilio 30004"')
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "SMS STOP"
        verbose_name_plural = "SMS STOPs"
        constraints = [models.UniqueConstraint(fields=["phone", "sender"], name="sms_stop_phone_sender_uniq")]

    def __str__(self) -> str:
        return f"{self.phone} stopped {self.sender}"


class Preferences(models.Model):
    """A recipient's opt-outs and quiet hours.

    ``opt_outs``: list of channels (``["sms"]``). ``category_opt_outs``: ``{category: [channel…]}``.
    ``type_opt_outs``: ``{notification type key: [channel…]}`` (docs/TYPES.md).
    Quiet hours: local wall-clock ``quiet_start`` (inclusive) to ``quiet_end`` (exclusive) in
    ``quiet_timezone`` (IANA; falls back to the recipient's zone, then UTC). A window may cross
    midnight (start > end). Which sends they defer: :mod:`notifications.quiet_hours_policy`.
    """

    recipient = models.OneToOneField(Recipient, on_delete=models.CASCADE, primary_key=True,
                                     related_name="preferences")
    opt_outs = models.JSONField(default=list, blank=True)
    category_opt_outs = models.JSONField(default=dict, blank=True)
    type_opt_outs = models.JSONField(default=dict, blank=True,
                                     help_text='{notification type: [channel…]}, e.g. {"new_follower": ["push"]}.')
    quiet_start = models.TimeField(null=True, blank=True)
    quiet_end = models.TimeField(null=True, blank=True)
    quiet_timezone = models.CharField(max_length=64, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "preferences"

    def __str__(self) -> str:
        return f"preferences of {self.recipient_id}"


class Erasure(models.Model):
    """A recipient's personal data erased on request (GDPR art. 17; ``DELETE /v1/users/{user_id}``).

    The record keeps who asked and when, and anonymised counts of what was erased; none of the
    erased data. The recipient row stays, bare (no contacts, devices, attributes or preferences),
    so the notifications keep their status history for counts with their content removed.
    """

    recipient = models.ForeignKey(Recipient, on_delete=models.PROTECT, related_name="erasures", db_index=False)
    requested_by = models.CharField(max_length=200, help_text='Who asked: "api client <name>" or "admin <user>".')
    erased_at = models.DateTimeField(default=clock.now, editable=False)  # the platform clock (one clock)
    notifications_erased = models.PositiveIntegerField(default=0, help_text="Notifications whose content was removed.")
    notifications_cancelled = models.PositiveIntegerField(default=0, help_text="Pending notifications cancelled.")
    devices_deleted = models.PositiveIntegerField(default=0)
    segment_memberships_removed = models.PositiveIntegerField(default=0)
    preferences_deleted = models.BooleanField(default=False)
    contacts_erased = models.BooleanField(default=False, help_text="Contacts, zone, locale or attributes were held.")

    class Meta:
        indexes = [models.Index(fields=["recipient", "-erased_at"], name="erasure_recipient_idx")]

    def __str__(self) -> str:
        return f"erasure of {self.recipient_id} at {self.erased_at:%Y-%m-%d %H:%M:%S} UTC"


class Unsubscribe(models.Model):
    """A recipient unsubscribed from a category on a channel through an email's link (RFC 8058
    one-click, or the confirm page): the record of *how*, beside the opt-out itself, which lives in
    :attr:`Preferences.category_opt_outs` (what the send path reads; preferences.unsubscribe).

    One row per opt-out it made: a repeated click of an already opted-out category writes none.
    ``campaign_id`` / ``notification_id`` name the email the link came from (attribution; no
    foreign keys: this floor sits below notifications and campaigns).
    """

    class Source(models.TextChoices):
        ONE_CLICK = "one_click", "One-click (the mail client's POST, RFC 8058)"
        PAGE = "page", "The confirm page's button"

    recipient = models.ForeignKey(Recipient, on_delete=models.CASCADE, related_name="unsubscribes")
    category = models.CharField(max_length=64)
    channel = models.CharField(max_length=8, choices=Channel.choices)
    source = models.CharField(max_length=16, choices=Source.choices)
    campaign_id = models.UUIDField(null=True, blank=True)
    notification_id = models.UUIDField(null=True, blank=True)
    at = models.DateTimeField(help_text="When (UTC).")

    class Meta:
        indexes = [models.Index(fields=["campaign_id"], name="unsubscribe_campaign_idx",
                                condition=models.Q(campaign_id__isnull=False))]

    def __str__(self) -> str:
        return f"{self.recipient_id} unsubscribed from {self.category} ({self.channel})"
