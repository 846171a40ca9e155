"""Notifications, the delivery log and API clients (docs/ARCHITECTURE.md §4–6)."""

from __future__ import annotations

from datetime import datetime

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models
from rest_framework_api_key.models import AbstractAPIKey

from core import clock
from core.api.scopes import Scope, canonical, default_scopes, validate_scopes
from core.vocabulary import CATEGORY_PATTERN
from preferences.models import Channel, Device, Recipient


class Priority(models.TextChoices):
    HIGH = "high", "High (OTP, security)"
    STANDARD = "standard", "Standard"


class APIClient(AbstractAPIKey):
    """An internal service allowed to call the API, authenticated by a hashed API key.

    The key itself is shown once at creation (``manage.py create_api_client``); only its SHA-512
    hash is stored (djangorestframework-api-key). ``scopes`` is what the key may do (a list of
    :class:`~core.api.scopes.Scope` values; default :data:`~core.api.scopes.DEFAULT_SCOPES`).
    ``rate_limit`` uses DRF's syntax (``"600/min"``); empty means ``settings.API_DEFAULT_RATE_LIMIT``.

    There is no separate "may send high" flag: :attr:`allow_high` reads and writes the scope
    ``notifications:send_high``, so the one list is the single source of truth.

    Its primary key is ``prefix.<hash of the key>``: no admin lookup or search reaches it or the hash
    (``content_fields``, preferences/admin_guard.py), and the admin addresses a client by its
    ``prefix`` (notifications/admin/clients.py).
    """

    content_fields = frozenset({"id", "hashed_key"})

    scopes = models.JSONField(default=default_scopes, blank=True, validators=[validate_scopes],
                              help_text="What this key may do; see the README's scopes table.")
    rate_limit = models.CharField(
        max_length=32, blank=True, default="", help_text='DRF rate, e.g. "600/min"; empty = platform default.',
        validators=[RegexValidator(r"^\d+/(s|sec|second|m|min|minute|h|hour|d|day)$",
                                   'a rate like "600/min" (per s, min, hour or day)')])

    class Meta(AbstractAPIKey.Meta):
        verbose_name = "API client"
        verbose_name_plural = "API clients"

    def has_scope(self, scope: str) -> bool:
        return scope in (self.scopes or ())

    @property
    def allow_high(self) -> bool:
        """May send ``priority: high``: holds ``notifications:send_high``."""
        return self.has_scope(Scope.SEND_HIGH)

    @allow_high.setter
    def allow_high(self, value: bool) -> None:
        held = [s for s in (self.scopes or []) if s != Scope.SEND_HIGH]
        self.scopes = canonical([*held, Scope.SEND_HIGH] if value else held)


class Status(models.TextChoices):
    SCHEDULED = "scheduled", "Scheduled"
    QUEUED = "queued", "Queued"
    SENDING = "sending", "Sending"
    SENT = "sent", "Sent"
    DELIVERED = "delivered", "Delivered"
    # Reported by the app (notifications/app_receipts.py): push and in_app only, above delivered.
    DISPLAYED = "displayed", "Displayed (app)"
    DISMISSED = "dismissed", "Dismissed (app)"
    OPENED = "opened", "Opened (app)"
    FAILED = "failed", "Failed"
    SUPPRESSED = "suppressed", "Suppressed"
    EXPIRED = "expired", "Expired"
    CANCELLED = "cancelled", "Cancelled"


#: The app's receipts ladder above ``delivered`` (notifications/app_receipts.py): a receipt only moves up.
APP_STATUSES = (Status.DISPLAYED, Status.DISMISSED, Status.OPENED)
#: Statuses of a notification the provider accepted (it reached the recipient's device or inbox).
REACHED_STATUSES = (Status.SENT, Status.DELIVERED, *APP_STATUSES)
#: Statuses a row ends in: no step of the send path leaves them (only a receipt, a replay or a fallback's
#: reopen may). notifications/lifecycle/table.py names them FINISHED; the archiver moves them to the history.
FINISHED_STATUSES = (*REACHED_STATUSES, Status.FAILED, Status.SUPPRESSED, Status.EXPIRED, Status.CANCELLED)
#: Statuses not decided yet: an event's user with a notification in one is ``pending``.
PENDING_STATUSES = (Status.SCHEDULED, Status.QUEUED, Status.SENDING)


def user_outcome(statuses, history_expired: bool = False) -> str:
    """An event's user's outcome over the statuses of their notifications of the event: ``reached``
    (a channel sent it), ``pending`` (one is not decided yet) or ``not_reached`` (every channel ended
    without sending); ``unknown`` instead of ``not_reached`` once the history may have dropped some of
    them (``history_expired``: :func:`notifications.records.history_expired`), since the rows that
    are left cannot tell. One rule for the API's event reads, the admin and the ``event.*`` webhooks."""
    statuses = set(statuses)
    if statuses & set(REACHED_STATUSES):
        return "reached"
    if statuses & set(PENDING_STATUSES):
        return "pending"
    return "unknown" if history_expired else "not_reached"


class Reason(models.TextChoices):
    """Why a notification was not (yet) delivered. Shown to support agents."""

    OPTED_OUT_CHANNEL = "opted_out_channel", "Recipient opted out of this channel"
    OPTED_OUT_CATEGORY = "opted_out_category", "Recipient opted out of this category on this channel"
    NO_PHONE = "no_phone", "Recipient has no phone number"
    NO_EMAIL = "no_email", "Recipient has no email address"
    NO_ACTIVE_DEVICE = "no_active_device", "Recipient has no active push device"
    PHONE_INVALID = "phone_invalid", "Phone number marked invalid by the provider"
    EMAIL_INVALID = "email_invalid", "Email address marked invalid by the provider"
    QUIET_HOURS = "quiet_hours", "Deferred: recipient's quiet hours"
    TTL_EXPIRED = "ttl_expired", "Time to live ran out before it could be sent"
    CANCELLED_BY_CLIENT = "cancelled_by_client", "Cancelled through the API"
    CAMPAIGN_CANCELLED = "campaign_cancelled", "Its campaign was cancelled"
    RECIPIENT_ERASED = "recipient_erased", ("Cancelled: the recipient's personal data was erased "
                                            "(DELETE /v1/users/{id}) before it was sent")
    LOCAL_TIME_PASSED = "local_time_passed", ("The campaign's local send time had already passed in the "
                                              "recipient's zone when it fanned out (missed_policy skip)")
    TEMPLATE_ERROR = "template_error", "The template could not be rendered"
    SMS_STOPPED = "sms_stopped", "Recipient replied STOP to this sender"
    PROVIDER_UNDELIVERED = "provider_undelivered", "Provider reported it undelivered (receipt)"
    PROVIDER_BOUNCED = "provider_bounced", "Email bounced or was dropped (receipt)"
    CONTACT_INVALID = "contact_invalid", "Provider said the address/number/token is invalid"
    PERMANENT_ERROR = "permanent_error", "Provider refused the message permanently"
    CONFIGURATION_ERROR = "configuration_error", "Provider configuration error"
    ATTEMPTS_EXHAUSTED = "attempts_exhausted", "Transient errors until the attempt budget ran out"
    RETRY_SCHEDULED = "retry_scheduled", "Transient provider error; retry scheduled"
    OUTCOME_UNKNOWN = "outcome_unknown", ("The provider did not answer in time: it may have accepted the "
                                          "message, so it is looked up or waited for before any re-send")
    LEASE_EXPIRED = "lease_expired", ("The worker sending it stopped renewing its lease (killed or stalled); "
                                      "re-driven after a wait, as its call may have been made")
    WORKER_ERROR = "worker_error", "The worker failed on this notification (a bug); retried a bounded number of times"
    OPTED_OUT_TYPE = "opted_out_type", "Recipient opted out of this notification type on this channel"
    FALLBACK_WAITING = "fallback_waiting", ("Waits for the channel before it in its type's fallback order: sent "
                                            "only if that one cannot reach the recipient")
    FALLBACK_NOT_NEEDED = "fallback_not_needed", ("Not sent: a channel before it in its type's fallback order "
                                                  "reached the recipient")
    WORKER_LOST = "worker_lost", ("Its worker died or stalled on it repeatedly (poison message): dead-lettered "
                                  "after the attempt budget")
    FREQUENCY_CAPPED = "frequency_capped", ("Not sent: the recipient already got as many of this category on this "
                                            "channel as a frequency cap allows in its window")
    ACCEPTANCE_LIMITED = "acceptance_limited", ("Not sent: the recipient (or its phone or address) was over an abuse "
                                                "limit when its campaign fanned out (docs/POLICIES.md)")
    HIGH_NOT_ALLOWED = "high_not_allowed", ("Not sent: a high-priority type's content, and the campaign's API key "
                                            "lacks notifications:send_high")
    NOT_FOR_CAMPAIGNS = "not_for_campaigns", ("Not sent: its campaign's type overrides users' choices (required, "
                                              "quiet hours bypass) or is a digest type, which no campaign may send")


class NotificationColumns(models.Model):
    """The columns of a notification, wherever it lives: :class:`Notification` (the live table) and
    :class:`NotificationRecord` (live and history, read-only) share them, so the two can never
    disagree on a column (docs/ARCHITECTURE.md, "Where a row lives")."""

    #: Fields that hold or reveal message content (the fingerprint is a hash of the request body, so
    #: a guessed body can be confirmed through it): never filtered or searched in the admin
    #: (preferences.admin_guard), whoever asks.
    content_fields = frozenset({"title", "body", "html", "data", "reason_detail", "request_fingerprint"})

    id = models.UUIDField(primary_key=True, editable=False)
    # NULL for campaign sends (no key): the unique constraint only covers API sends.
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    request_fingerprint = models.CharField(max_length=64, blank=True, default="",
                                           help_text="Keyed hash (HMAC) of the canonical request body.")
    campaign_id = models.UUIDField(null=True, blank=True, db_index=True)
    fallback_after = models.UUIDField(null=True, blank=True,
                                      help_text="Fallback routing: the notification of the channel before this "
                                                "one; this one waits until that one cannot reach the recipient.")
    channel = models.CharField(max_length=8, choices=Channel.choices)
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.STANDARD)
    category = models.CharField(max_length=64, blank=True, default="")
    title = models.CharField(max_length=998, blank=True, default="")
    body = models.TextField()
    html = models.TextField(blank=True, default="")
    data = models.JSONField(null=True, blank=True)
    #: The client's own object sent with the request (:mod:`notifications.metadata`): not content, but
    #: it may name a person, so an erasure blanks it.
    metadata = models.JSONField(null=True, blank=True)
    sensitive = models.BooleanField(default=False, help_text="Content (e.g. an OTP) is never shown or logged.")
    # The abuse limits' mark of the contact at acceptance (acceptance.rules.contact_mark): the send
    # counts an SMS/email row again when its contact is no longer this one. A database default, as
    # campaign pages COPY their rows without it.
    limit_contact = models.CharField(max_length=16, blank=True, default="", db_default="")

    status = models.CharField(max_length=12, choices=Status.choices, default=Status.QUEUED)
    reason = models.CharField(max_length=32, choices=Reason.choices, blank=True, default="")
    reason_detail = models.CharField(max_length=500, blank=True, default="")
    accepted_status = models.CharField(max_length=12, blank=True, default="",
                                       help_text="Status returned by the accepting request (replayed).")

    scheduled_at = models.DateTimeField(null=True, blank=True, help_text="Requested send time (UTC).")
    due_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    queued_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # Claims ever made of the row: never reset (a replay resets ``attempts``) nor given back (a wait
    # gives its attempt back), so a worker's claim number is never another's: every record and lease
    # renewal is fenced on it (notifications/lifecycle/send.py).
    claims = models.PositiveIntegerField(default=0, db_default=0)  # raw INSERTs omit it
    first_attempt_at = models.DateTimeField(null=True, blank=True)
    provider = models.CharField(max_length=32, blank=True, default="")
    provider_message_id = models.CharField(max_length=255, blank=True, default="")  # indexed in Meta
    sent_at = models.DateTimeField(null=True, blank=True)
    dead_lettered_at = models.DateTimeField(  # indexed in Meta (partial)
        null=True, blank=True,
        help_text="Set when it failed for a reason a person must look at (attempts ran out, our config).")
    delivered_at = models.DateTimeField(null=True, blank=True)
    # The order key of the last provider receipt that ended the row (delivered/failed): an older
    # one does not move it (notifications/lifecycle/receipts.py, docs/ARCHITECTURE.md §5).
    receipt_at = models.DateTimeField(null=True, blank=True)
    receipt_rank = models.PositiveSmallIntegerField(default=0, db_default=0)  # raw INSERTs omit it
    created_at = models.DateTimeField(default=clock.now, editable=False)  # the platform clock (one clock)
    # Not auto_now (that is the host's clock): set with created_at on insert, and by every UPDATE
    # that changes the row's state (each passes updated_at explicitly, from the platform clock).
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        abstract = True

    def __str__(self) -> str:
        return f"{self.channel} {self.priority} to {getattr(self, 'recipient_id', '?')} ({self.status})"


class Notification(NotificationColumns):
    """One message to one recipient on one channel (docs/ARCHITECTURE.md §4–5).

    The id is derived, never random: ``uuid5(NOTIFICATION_ID_NAMESPACE, f"{client_id}:{key}")`` for
    API sends, so a repeated creation yields the same id and the primary key rejects the copy.
    ``due_at`` is when the scheduler should next release a ``scheduled`` row (the requested
    ``scheduled_at``, the end of quiet hours, or a retry's backoff). ``lease_until`` is set while a
    worker holds a ``sending`` claim. All instants are UTC.
    """

    # No FK indexes of their own: every index is maintained on each of a row's three writes (fan-out
    # insert, claim, sent); the composite indexes in Meta cover the lookups (event_idx: an event's
    # rows). A digest's notification is rendered from its items (its ids: uuid5(digest, channel)).
    client = models.ForeignKey(APIClient, on_delete=models.PROTECT, null=True, blank=True,
                               related_name="notifications", db_index=False)
    event = models.ForeignKey("notifications.Event", on_delete=models.PROTECT, null=True, blank=True,
                              related_name="notifications", db_index=False)
    notification_type = models.ForeignKey("notifications.NotificationType", on_delete=models.PROTECT, null=True,
                                          blank=True, related_name="notifications", db_index=False)
    digest = models.ForeignKey("notifications.Digest", on_delete=models.PROTECT, null=True, blank=True,
                               related_name="notifications", db_index=False)
    recipient = models.ForeignKey(Recipient, on_delete=models.PROTECT, related_name="notifications",
                                  db_constraint=True, db_index=False)
    #: False: the row is live; :class:`ArchivedNotification` (a history row) says True.
    archived = False
    #: When it moved to the history (the history's partition key): None while live;
    #: :class:`ArchivedNotification` has it from ``archive.archived``.
    archived_at: datetime | None = None

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["client", "idempotency_key"], name="notification_client_idem_key_uniq",
                                    condition=models.Q(idempotency_key__isnull=False)),
        ]
        indexes = [
            # Scheduler: due rows in order. Partial, so it stays small however big the table is.
            models.Index(fields=["due_at"], name="notification_due_idx",
                         condition=models.Q(status="scheduled")),
            # Reconciler: expired leases and stale queued rows.
            models.Index(fields=["lease_until"], name="notification_lease_idx",
                         condition=models.Q(status="sending")),
            models.Index(fields=["queued_at"], name="notification_queued_idx",
                         condition=models.Q(status="queued")),
            # /metrics: the oldest queued high-tier row, which the index above would reach only past
            # every older standard row (a campaign queues millions). Few rows at any time.
            models.Index(fields=["queued_at"], name="notification_queued_high_idx",
                         condition=models.Q(status="queued", priority="high")),
            # Campaign completion: does the campaign still have unfinished notifications?
            models.Index(fields=["campaign_id"], name="notification_campaign_open_idx",
                         condition=models.Q(status__in=["scheduled", "queued", "sending"])),
            # A campaign's pace (campaigns/pace.py): the rows it sent this minute (the sampler's latency)
            # and its last scheduled send; each bounded by those rows, not the campaign's size.
            models.Index(fields=["campaign_id", "sent_at"], name="notification_campaign_sent_idx",
                         condition=models.Q(campaign_id__isnull=False, sent_at__isnull=False)),
            models.Index(fields=["campaign_id", "due_at"], name="notification_campaign_due_idx",
                         condition=models.Q(campaign_id__isnull=False, status="scheduled")),
            # Support: the notification list, newest first (and by status), without sorting the table.
            models.Index(fields=["-created_at"], name="notification_created_idx"),
            models.Index(fields=["status", "-created_at"], name="notification_status_time_idx"),
            # Support: a recipient's history, newest first.
            models.Index(fields=["recipient", "-created_at"], name="notification_recipient_idx"),
            # Receipts find their notification by the provider's message id; only sent rows have one.
            models.Index(fields=["provider_message_id"], name="notification_pmid_idx",
                         condition=~models.Q(provider_message_id="")),
            # An event's notifications (its detail page, cancel); single sends and campaigns stay out.
            models.Index(fields=["event"], name="notification_event_idx", condition=models.Q(event__isnull=False)),
            # Fallback routing: the rows waiting for the one before them (few at any time).
            models.Index(fields=["fallback_after"], name="notification_fallback_idx",
                         condition=models.Q(status="scheduled", reason="fallback_waiting")),
            # The archiver (notifications/lifecycle/archive.py): finished rows, oldest change first;
            # dead letters stay out (they wait for a person: the dead-letter index finds the expired).
            models.Index(fields=["updated_at"], name="notification_finished_idx",
                         condition=models.Q(status__in=FINISHED_STATUSES, dead_lettered_at__isnull=True)),
            # Dead letters (admin list, depth gauge): a handful of rows in a big table.
            models.Index(fields=["dead_lettered_at"], name="notification_dead_letter_idx",
                         condition=models.Q(dead_lettered_at__isnull=False)),
        ]


class _Copy(NotificationColumns):
    """A notification's columns outside the live table: references without constraints or accessors."""

    client = models.ForeignKey(APIClient, on_delete=models.DO_NOTHING, null=True, related_name="+",
                               db_constraint=False)
    event = models.ForeignKey("notifications.Event", on_delete=models.DO_NOTHING, null=True, related_name="+",
                              db_constraint=False)
    notification_type = models.ForeignKey("notifications.NotificationType", on_delete=models.DO_NOTHING,
                                          null=True, related_name="+", db_constraint=False)
    digest = models.ForeignKey("notifications.Digest", on_delete=models.DO_NOTHING, null=True, related_name="+",
                               db_constraint=False)
    recipient = models.ForeignKey(Recipient, on_delete=models.DO_NOTHING, related_name="+", db_constraint=False)

    class Meta:
        abstract = True


class NotificationRecord(_Copy):
    """A notification wherever it lives, read-only: the view ``notifications_notificationrecord``,
    the live table ``UNION ALL`` the partitioned history (migration 0037 docs/ARCHITECTURE.md,
    "Where a row lives"). Support and API reads by id, recipient, campaign or event use it; every
    write goes to :class:`Notification` through the lifecycle. ``live``: not archived yet."""

    live = models.BooleanField(help_text="Still in the live table (not archived to the history yet).")
    archived_at = models.DateTimeField(null=True, blank=True,
                                       help_text="When it was archived to the history; null while live.")

    class Meta:
        managed = False
        db_table = "notifications_notificationrecord"


class NotificationHistory(_Copy):
    """Finished notifications the archiver moved out of the live table, partitioned by day of
    ``archived_at`` (when it moved; DB key ``(id, archived_at)``: filter by it where known, one
    partition is read; :func:`notifications.lifecycle.archive.in_history`). Written by the lifecycle
    (late receipts) and erasure only (docs/ARCHITECTURE.md §13)."""

    archived_at = models.DateTimeField(help_text="When the archiver moved it here (the partition key).")

    class Meta:
        managed = False
        db_table = "notifications_notificationhistory"


class FrequencyCap(models.Model):
    """A frequency-cap rule edited in the admin (docs/POLICIES.md, "Frequency caps"): at most
    ``limit`` notifications of ``category`` on ``channel`` per recipient in any rolling
    ``window_seconds``. A row adds to the rules of ``settings.NOTIFY["FREQUENCY_CAPS"]`` or, with the
    same ``name``, replaces that rule (``active`` off switches it off). High-priority rows and
    ``required`` types are exempt unless ``include_high`` / ``include_required``."""

    name = models.SlugField(max_length=64, unique=True, help_text="Rows override a settings rule of the same name.")
    category = models.CharField(max_length=64, validators=[RegexValidator(
        CATEGORY_PATTERN, "a category: 1-64 of lower-case letters, digits, _ . - (starting with a letter or digit)")])
    channel = models.CharField(max_length=8, choices=Channel.choices)
    limit = models.PositiveIntegerField(help_text="Notifications allowed per recipient in the window (0: none).")
    window_seconds = models.PositiveIntegerField(validators=[MinValueValidator(1), MaxValueValidator(28 * 86400)],
                                                 help_text="The rolling window, in seconds (86400 = 24 h; ≤ 28 days).")
    active = models.BooleanField(default=True)
    include_high = models.BooleanField(default=False, help_text="Also count and cap high-priority notifications.")
    include_required = models.BooleanField(default=False, help_text="Also count and cap types marked required.")
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        ordering = ["category", "channel", "name"]
        verbose_name = "frequency cap"

    def __str__(self) -> str:
        return self.name

    def save(self, *args, **kwargs):
        self.updated_at = clock.now()
        super().save(*args, **kwargs)


#: The recipient's personal data was erased after the notification was created: in SQL, the rule of
#: ``preferences.models.Recipient.erased_after``.
ERASED_SINCE_CREATED = models.Q(recipient__erased_at__gt=models.F("created_at"))
#: The dead letters support lists and may replay: failed, dead-lettered, and not of a recipient erased
#: since (a row in flight at the erasure and dead-lettered after it: a replay would send the erased
#: user's message, or an empty one, to whoever holds the id next).
DEAD_LETTERS = models.Q(status=Status.FAILED, dead_lettered_at__isnull=False) & ~ERASED_SINCE_CREATED


class DeadLetter(Notification):
    """Notifications that failed for a reason a person must look at: attempts ran out, or a
    permanent error that is ours (bad payload, configuration, template). Replayable from the admin."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
        verbose_name_plural = "dead letters"


class ArchivedNotification(Notification):
    """A history row as a :class:`Notification` for code that reads one (receipts, replays, cancels;
    :func:`notifications.lifecycle.archive.archived`). Never saved: the lifecycle writes the history."""

    archived = True

    class Meta:
        proxy = True

    def save(self, *args, **kwargs):
        raise TypeError("an archived notification is written through notifications.lifecycle, never saved")


class DeliveryAttempt(models.Model):
    """One provider call for a notification (one per device for push). Written after the call."""

    class Outcome(models.TextChoices):
        ACCEPTED = "accepted", "Accepted by provider"
        TRANSIENT = "transient", "Transient error (retried)"
        PERMANENT = "permanent", "Permanent error"
        CONTACT_INVALID = "contact_invalid", "Contact invalid"
        CONFIGURATION = "configuration", "Configuration error"
        DUPLICATE_SKIPPED = "duplicate_skipped", "Skipped: already sent (sent marker)"
        UNKNOWN = "unknown", "No answer in time: the provider may have accepted it"
        FOUND_BY_LOOKUP = "found_by_lookup", "Found at the provider: an earlier call had been accepted"
        LEARNED_FROM_RECEIPT = "from_receipt", "Accepted: learned from the provider's receipt (no answer recorded)"

    #: A provider's error text may quote the message: never filtered in the admin (preferences.admin_guard).
    content_fields = frozenset({"error_message"})

    # No FK index of its own: attempt_notification_idx (notification, created_at) serves it. No FK
    # constraint: its notification may be archived to the history (docs/ARCHITECTURE.md, "Where a row lives").
    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="attempts_log",
                                     db_index=False, db_constraint=False)
    number = models.PositiveIntegerField(help_text="The notification's attempt number (1-based).")
    provider = models.CharField(max_length=32)
    device = models.ForeignKey(Device, on_delete=models.SET_NULL, null=True, blank=True)
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    error_code = models.CharField(max_length=64, blank=True, default="")
    error_message = models.CharField(max_length=500, blank=True, default="")
    http_status = models.PositiveSmallIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField(null=True, blank=True)
    provider_message_id = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField(default=clock.now, editable=False)  # the platform clock (one clock)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["notification", "created_at"], name="attempt_notification_idx")]

    def __str__(self) -> str:
        return f"attempt {self.number} via {self.provider}: {self.outcome}"


class DeliveryEvent(models.Model):
    """A state change or receipt in a notification's timeline, in order."""

    #: Error details may quote content: never filtered in the admin (preferences.admin_guard).
    content_fields = frozenset({"detail"})

    # No FK index of its own: event_notification_idx (notification, created_at) serves it. No FK
    # constraint: its notification may be archived to the history (docs/ARCHITECTURE.md, "Where a row lives").
    notification = models.ForeignKey(Notification, on_delete=models.CASCADE, related_name="events", db_index=False,
                                     db_constraint=False)
    kind = models.CharField(max_length=32, help_text="accepted, released, claimed, sent, suppressed, …")
    status = models.CharField(max_length=12, choices=Status.choices, blank=True, default="")
    reason = models.CharField(max_length=32, blank=True, default="")
    detail = models.CharField(max_length=500, blank=True, default="")
    # Receipts only: "<provider>:<provider event id>", stored once by notifications.receipts under an
    # advisory lock (a partitioned table's unique index would have to hold created_at).
    dedup_key = models.CharField(max_length=200, null=True, blank=True)  # noqa: DJ001 - set on receipts only
    created_at = models.DateTimeField(default=clock.now, editable=False)  # the platform clock (one clock)

    class Meta:
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["notification", "created_at"], name="event_notification_idx"),
                   # Only receipts carry a key; state-change events (most rows) stay out of the index.
                   models.Index(fields=["dedup_key"], name="event_dedup_key_idx",
                                condition=models.Q(dedup_key__isnull=False))]

    def __str__(self) -> str:
        return f"{self.kind} ({self.status})"


class TimelineEntry(models.Model):
    """One line of a notification's timeline as every reader shows it (API, admin, support pages):
    its DeliveryEvent rows, plus one ``sent`` line per attempt that was accepted (or found by the
    lookup, or skipped on a sent marker), read from the DeliveryAttempt row that says the same, unless
    the notification has a ``sent`` event (rows written before migration 0015). The pipeline writes
    no ``sent`` event of its own (one row fewer per notification, docs/ARCHITECTURE.md). A database
    view (migration 0015); ``id`` is the event's, or minus the attempt's."""

    id = models.BigIntegerField(primary_key=True)
    notification = models.ForeignKey(Notification, on_delete=models.DO_NOTHING, related_name="timeline",
                                     db_constraint=False)
    kind = models.CharField(max_length=32)
    status = models.CharField(max_length=12, choices=Status.choices, blank=True, default="")
    reason = models.CharField(max_length=32, blank=True, default="")
    detail = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()

    #: Error details may quote content: never filtered in the admin (preferences.admin_guard).
    content_fields = frozenset({"detail"})

    class Meta:
        managed = False
        db_table = "notifications_timeline"
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"{self.kind} ({self.status})"


class APIAuditEntry(models.Model):
    """One write through the API (``POST``/``PUT``/``PATCH``/``DELETE`` under ``/v1/`` by a valid key),
    allowed or refused: who, what, when and the outcome (:mod:`notifications.audit` records it after
    the response). Never a request body: ``fields`` names what changed (``["phone"]``,
    ``["attributes.first_name"]``), never the values; push tokens in paths read ``{push_token}``."""

    at = models.DateTimeField(default=clock.now, editable=False)  # the platform clock (one clock)
    client = models.ForeignKey(APIClient, on_delete=models.PROTECT, related_name="audit_entries", db_index=False)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=500)
    object_type = models.CharField(max_length=32, help_text="recipient, preferences, device, notification, "
                                                            "segment, segment_members, template, campaign")
    object_id = models.CharField(max_length=255, blank=True, default="")
    status = models.PositiveSmallIntegerField(help_text="The HTTP status of the answer.")
    error_code = models.CharField(max_length=64, blank=True, default="",
                                  help_text="The error's code for a refusal (missing_scope, not_owner, …).")
    fields = models.JSONField(default=list, blank=True, help_text="Which fields the write changed (names only).")

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name = "API write"
        verbose_name_plural = "API audit log"
        indexes = [models.Index(fields=["client", "-at"], name="audit_client_at_idx"),
                   models.Index(fields=["-at"], name="audit_at_idx")]

    def __str__(self) -> str:
        return f"{self.method} {self.path} → {self.status}"


def log_of(model: type[DeliveryAttempt | DeliveryEvent | TimelineEntry], notifications) -> models.QuerySet:
    """``model``'s rows (attempts, events, timeline lines) of ``notifications``, read from the
    earliest one's ``created_at`` on: no such row is older than its notification, and the bound lets
    Postgres skip every older day partition (docs/ARCHITECTURE.md §13)."""
    rows = list(notifications)
    if not rows:
        return model.objects.none()
    return model.objects.filter(notification_id__in=[n.pk for n in rows],
                                created_at__gte=min(n.created_at for n in rows))


__all__ = ["APIAuditEntry", "APIClient", "ArchivedNotification", "DeadLetter", "DeliveryAttempt", "DeliveryEvent",
           "FrequencyCap", "Notification", "NotificationColumns", "NotificationHistory", "NotificationRecord",
           "Priority", "Reason", "Status", "TimelineEntry", "log_of", "user_outcome"]
