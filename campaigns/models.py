"""Segments, templates and campaigns (docs/ARCHITECTURE.md §4, §7)."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from core import clock
from notifications.events.models import NotificationType
from notifications.models import APIClient, Priority
from preferences.models import Channel, Recipient

CAMPAIGN_ID_NAMESPACE = uuid.UUID("0b6e1f9a-8d4c-4b1e-9c3f-2a7d5e8f1c40")


OWNER_HELP = ("The API client that created it through the API: only it may change it there (and use it in its "
              "campaigns). Empty: made in the admin; only staff change it, in the admin.")


class Touched:
    """``updated_at`` on each save, and ``created_at`` by default, on the platform clock
    (``core.clock``, which the end-to-end tests move), as every instant the platform stamps: Django's
    ``auto_now`` reads the host's."""

    def save(self, *args, **kwargs):
        self.updated_at = clock.now()  # written unless update_fields leaves it out, as auto_now
        super().save(*args, **kwargs)  # type: ignore[misc]


class Segment(Touched, models.Model):
    """A named audience. Membership is written by an upstream tool (bulk API, CSV in the admin) and
    read as a snapshot when a campaign starts fanning out: members added after that are not included.
    ``client`` owns it (see :mod:`campaigns.ownership`)."""

    segment_id = models.SlugField(max_length=64, primary_key=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True, default="")
    client = models.ForeignKey(APIClient, on_delete=models.PROTECT, null=True, blank=True, related_name="segments",
                               verbose_name="owner (API client)", help_text=OWNER_HELP)
    rules = models.JSONField(
        null=True, blank=True,
        help_text="A rule segment: who matches this rule when a campaign snapshots it (docs/SEGMENTS.md). "
                  "Empty: a list segment (members added by the API or a CSV).")
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    def __str__(self) -> str:
        return self.name or self.segment_id

    @property
    def is_rule(self) -> bool:
        return self.rules is not None


class SegmentMember(models.Model):
    """One recipient in one segment. ``(segment, recipient)`` is unique and is the keyset order
    fan-out pages through."""

    segment = models.ForeignKey(Segment, on_delete=models.CASCADE, related_name="members")
    recipient = models.ForeignKey(Recipient, on_delete=models.CASCADE, related_name="segment_memberships")
    added_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["segment", "recipient"], name="segment_member_uniq")]

    def __str__(self) -> str:
        return f"{self.recipient_id} in {self.segment_id}"


class CampaignMember(models.Model):
    """One recipient in a campaign's snapshot of a rule segment, written once when fan-out starts
    (:func:`campaigns.membership.snapshot`) and paged through like a list segment's members; deleted
    when fan-out completes."""

    campaign = models.ForeignKey("Campaign", on_delete=models.CASCADE, related_name="snapshot_members",
                                 db_index=False)
    recipient = models.ForeignKey(Recipient, on_delete=models.CASCADE, related_name="campaign_snapshots",
                                  db_index=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["campaign", "recipient"], name="campaign_member_uniq")]
        indexes = [models.Index(fields=["recipient"], name="campaign_member_recipient_idx")]

    def __str__(self) -> str:
        return f"{self.recipient_id} in the snapshot of {self.campaign_id}"


class Template(Touched, models.Model):
    """A message template with per-locale variants, rendered at send time (so fixing a typo fixes what
    is still queued). Rendering is sandboxed Jinja2; see :mod:`notifications.rendering`. ``client`` owns it
    (see :mod:`campaigns.ownership`)."""

    template_id = models.SlugField(max_length=64, primary_key=True)
    name = models.CharField(max_length=200)
    default_locale = models.CharField(max_length=35, default="en",
                                      help_text="Variant used when none matches the recipient's locale.")
    client = models.ForeignKey(APIClient, on_delete=models.PROTECT, null=True, blank=True, related_name="templates",
                               verbose_name="owner (API client)", help_text=OWNER_HELP)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    def __str__(self) -> str:
        return self.name or self.template_id


class TemplateVariant(Touched, models.Model):
    #: Never filtered or searched in the admin (preferences.admin_guard).
    content_fields = frozenset({"title", "body", "html"})

    template = models.ForeignKey(Template, on_delete=models.CASCADE, related_name="variants")
    locale = models.CharField(max_length=35, help_text='BCP 47 tag: "en", "de", "de-AT"…')
    title = models.CharField(max_length=998, blank=True, default="", help_text="Email subject / push title.")
    body = models.TextField()
    html = models.TextField(blank=True, default="", help_text="Email only. Variables are HTML-escaped.")
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["template", "locale"], name="template_variant_locale_uniq")]

    def __str__(self) -> str:
        return f"{self.template_id} [{self.locale}]"


class CampaignStatus(models.TextChoices):
    DRAFT = "draft", "Draft (not launched)"
    SCHEDULED = "scheduled", "Scheduled"
    FANNING_OUT = "fanning_out", "Fanning out"
    SENDING = "sending", "Sending"
    COMPLETED = "completed", "Completed"
    CANCELLED = "cancelled", "Cancelled"
    PAUSED = "paused", "Paused (recurring: no new runs)"
    SKIPPED = "skipped", "Skipped (a recurring campaign's occurrence not sent)"


class MissedPolicy(models.TextChoices):
    """What a local-time campaign does for members whose wall time had already passed in their zone
    when their fan-out page ran (more than ``CAMPAIGN_MISSED_GRACE_SECONDS`` before)."""

    SKIP = "skip", "Skip them (suppressed, reason local_time_passed)"
    SEND_NOW = "send_now", "Send to them at once"
    NEXT_DAY = "next_day", "Send at the same wall time on the next day"


class Campaign(Touched, models.Model):
    """The same message to every member of a segment, at one instant or at a local wall time in each
    recipient's zone, optionally smeared over ``spread_seconds``."""

    #: Message content (and what may quote or hash it): never filtered or searched in the admin
    #: (preferences.admin_guard).
    content_fields = frozenset({"title", "body", "html", "data", "last_error", "request_fingerprint"})

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200, blank=True, default="")
    client = models.ForeignKey(APIClient, on_delete=models.PROTECT, null=True, blank=True, related_name="campaigns")
    idempotency_key = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL: admin-made
    request_fingerprint = models.CharField(max_length=64, blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True)

    segment = models.ForeignKey(Segment, on_delete=models.PROTECT, related_name="campaigns")
    channel = models.CharField(max_length=8, choices=Channel.choices)
    priority = models.CharField(max_length=8, choices=Priority.choices, default=Priority.STANDARD)
    category = models.CharField(max_length=64, default="marketing")
    template = models.ForeignKey(Template, on_delete=models.PROTECT, null=True, blank=True, related_name="campaigns")
    notification_type = models.ForeignKey(
        NotificationType, on_delete=models.PROTECT, null=True, blank=True, related_name="campaigns",
        help_text="Render with this notification type's templates for the campaign's channel (docs/TYPES.md); "
                  "data is what they read as {{ data.* }}.")
    title = models.CharField(max_length=998, blank=True, default="")
    body = models.TextField(blank=True, default="")
    html = models.TextField(blank=True, default="")
    data = models.JSONField(null=True, blank=True)
    #: The client's own object (notifications/metadata.py), on each of its notifications.
    metadata = models.JSONField(null=True, blank=True)

    scheduled_at = models.DateTimeField(null=True, blank=True, help_text="Absolute send instant (UTC).")
    local_date = models.DateField(null=True, blank=True, help_text="Local-time campaigns: the wall-clock date…")
    local_time = models.TimeField(null=True, blank=True, help_text="…and time, in each recipient's zone.")
    missed_policy = models.CharField(
        max_length=8, choices=MissedPolicy.choices, default=MissedPolicy.SKIP,
        help_text="Local-time campaigns: members whose wall time had already passed in their zone at fan-out "
                  "are skipped, sent at once, or sent at that wall time the next day.")
    spread_seconds = models.PositiveIntegerField(default=0, help_text="Smear sends uniformly over this window.")
    ttl_seconds = models.PositiveIntegerField(null=True, blank=True)
    send_time = models.JSONField(
        null=True, blank=True,
        help_text='Send-time optimisation (docs/SEND_TIME.md): {"window": {"start": "09:00", "end": "21:00"}, '
                  '"holdout_percent": 10}; each member at their best hour in the window. Empty: off.')

    status = models.CharField(max_length=12, choices=CampaignStatus.choices, default=CampaignStatus.SCHEDULED)
    fanout_at = models.DateTimeField(null=True, blank=True,
                                     help_text="When fan-out starts (UTC): the send instant, or for local-time "
                                               "campaigns the instant the earliest zone reaches it.")
    snapshot_at = models.DateTimeField(null=True, blank=True, help_text="Membership snapshot instant.")
    snapshot_kind = models.CharField(
        max_length=4, blank=True, default="", choices=[("list", "list"), ("rule", "rule")],
        help_text="What the snapshot is, decided when it is taken: a list segment's members added up to "
                  "snapshot_at, or a rule segment's matches (campaign members), whatever the segment became "
                  "since. Empty before the snapshot.")
    member_count = models.PositiveIntegerField(null=True, blank=True, help_text="Members in the snapshot.")
    created_count = models.PositiveIntegerField(default=0, help_text="Notifications created by fan-out.")
    default_zone_count = models.PositiveIntegerField(
        default=0, help_text="Local-time recipients with a missing/invalid zone, sent in the default zone.")
    missed_count = models.PositiveIntegerField(
        default=0, help_text="Local-time members whose wall time had already passed at fan-out (handled by "
                             "missed_policy).")
    last_error = models.TextField(blank=True, default="", help_text="The last error of a fan-out page.")
    last_error_at = models.DateTimeField(null=True, blank=True)
    fanout_failures = models.PositiveIntegerField(default=0, help_text="Fan-out pages that failed (each is retried).")
    started_at = models.DateTimeField(null=True, blank=True)
    fanned_out_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=clock.now, editable=False)
    updated_at = models.DateTimeField(default=clock.now, editable=False)

    # A recurring campaign (a *series*, docs/RECURRING.md) carries a schedule and never fans out itself:
    # each occurrence is a *run*, a campaign of its own with ``series`` and ``occurrence_at`` set.
    schedule_rule = models.CharField(
        max_length=500, blank=True, default="",
        help_text='Recurring: an RFC 5545 RRULE over local wall times, e.g. "FREQ=WEEKLY;BYDAY=MO" '
                  '(docs/RECURRING.md).')
    schedule_start = models.CharField(
        max_length=19, blank=True, default="",
        help_text="Recurring: the first occurrence's local wall time (DTSTART), YYYY-MM-DDTHH:MM:SS, no zone.")
    schedule_timezone = models.CharField(
        max_length=64, blank=True, default="",
        help_text='Recurring: the IANA zone the wall times are read in, or "recipient" for each recipient\'s zone.')
    next_run_at = models.DateTimeField(null=True, blank=True,
                                       help_text="Recurring: the next occurrence's instant (UTC).")
    paused_at = models.DateTimeField(null=True, blank=True)
    series = models.ForeignKey("self", on_delete=models.PROTECT, null=True, blank=True, related_name="runs",
                               help_text="A run: the recurring campaign it is an occurrence of.")
    occurrence_at = models.DateTimeField(null=True, blank=True,
                                         help_text="A run: its occurrence's instant (UTC; for recipient-zone "
                                                   "schedules, when the earliest zone reaches the wall time).")
    skip_reason = models.CharField(max_length=200, blank=True, default="", help_text="A skipped run: why.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["client", "idempotency_key"], name="campaign_client_idem_key_uniq",
                                    condition=models.Q(idempotency_key__isnull=False)),
            models.UniqueConstraint(fields=["series", "occurrence_at"], name="campaign_run_occurrence_uniq",
                                    condition=models.Q(series__isnull=False)),
        ]
        indexes = [models.Index(fields=["fanout_at"], name="campaign_due_idx",
                                condition=models.Q(status="scheduled")),
                   models.Index(fields=["next_run_at"], name="campaign_series_due_idx",
                                condition=models.Q(status="scheduled", next_run_at__isnull=False))]

    def __str__(self) -> str:
        return self.name or f"campaign {self.pk}"

    @property
    def is_local_time(self) -> bool:
        return self.local_date is not None

    @property
    def is_recurring(self) -> bool:
        """A series: it has a schedule and makes runs (it never fans out itself)."""
        return bool(self.schedule_rule)


class CampaignShard(models.Model):
    """An independent slice of a campaign's segment, fanned out page by page.

    Members with ``lower < recipient_id <= upper`` (``None`` = unbounded) belong to the shard;
    ``cursor`` is the last ``recipient_id`` whose page committed, so a crashed fan-out resumes after it.
    """

    #: A fan-out error may quote content: never filtered in the admin (preferences.admin_guard).
    content_fields = frozenset({"last_error"})

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="shards")
    number = models.PositiveIntegerField()
    lower = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL = unbounded
    upper = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL = unbounded
    cursor = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 - NULL = not started
    done = models.BooleanField(default=False)
    pages = models.PositiveIntegerField(default=0)
    created = models.PositiveIntegerField(default=0)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    progressed_at = models.DateTimeField(null=True, blank=True,
                                         help_text="When a page of this shard last committed (re-drives do not count).")
    failures = models.PositiveIntegerField(default=0, help_text="Pages of this shard that failed.")
    last_error = models.TextField(blank=True, default="")
    last_error_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["campaign", "number"], name="campaign_shard_uniq")]
        indexes = [models.Index(fields=["heartbeat_at"], name="shard_pending_idx", condition=models.Q(done=False))]

    def __str__(self) -> str:
        return f"shard {self.number} of {self.campaign_id}"


class SendTimeMember(models.Model):
    """A member of a send-time optimised campaign: their group and the local hour chosen (docs/SEND_TIME.md),
    written by the fan-out page with the member's notification, read by the campaign's comparison."""

    class Group(models.TextChoices):
        OPTIMISED = "optimised", "Optimised: sent at their best hour in the window"
        HOLDOUT = "holdout", "Holdout: sent at the campaign's own time"
        NO_HISTORY = "no_history", "No history: sent at the campaign's own time"

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="send_time_members")
    recipient = models.ForeignKey(Recipient, on_delete=models.CASCADE, db_constraint=False, db_index=False,
                                  related_name="+")
    notification_id = models.UUIDField()
    group = models.CharField(max_length=12, choices=Group.choices)
    hour = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Optimised: the local hour chosen.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["campaign", "recipient"], name="send_time_member_uniq")]

    def __str__(self) -> str:
        return f"{self.recipient_id}: {self.group}"


class CampaignMinute(models.Model):
    """One minute of a launched campaign's pace (docs/CAMPAIGNS.md, "Pace"): its counts as last
    sampled in that minute (``campaigns.selectors.campaign_counts``), and how long the rows sent in
    that minute took from due to sent. Written by beat's sampler (``campaigns.pace``); the campaign
    page reads the latest row and at most a day of them, however large the campaign."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="minutes")
    minute = models.DateTimeField(help_text="The minute (UTC, seconds zero).")
    sampled_at = models.DateTimeField()
    counts = models.JSONField(help_text="campaign_counts() at sampled_at: by status, outcome, reasons.")
    sent_rows = models.PositiveIntegerField(default=0, help_text="Rows sent in this minute (latency's sample).")
    due_to_sent_p50_ms = models.PositiveIntegerField(null=True, blank=True)
    due_to_sent_p95_ms = models.PositiveIntegerField(null=True, blank=True)
    last_due_at = models.DateTimeField(null=True, blank=True,
                                       help_text="When its last scheduled row is due (none scheduled: null).")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["campaign", "minute"], name="campaign_minute_uniq")]
        ordering = ["campaign", "minute"]

    def __str__(self) -> str:
        return f"{self.campaign_id} at {self.minute:%Y-%m-%d %H:%M}"



class CampaignTally(models.Model):
    """A sampled campaign's counts kept up to date from what changed (``campaigns.tally``): one full
    count when beat first samples it, then each tick adds the changes its rows' writers appended to
    :class:`CampaignTallyChange`, sampled or not (kept when it finishes: late receipts). Every reader
    of a campaign's counts reads it (``campaigns.selectors.counts_for``)."""

    campaign = models.OneToOneField(Campaign, on_delete=models.CASCADE, primary_key=True, related_name="tally")
    counts = models.JSONField(help_text='{"<status>": {"<reason>": n}}: the reason only for suppressed and failed.')
    counted_at = models.DateTimeField(help_text="When the full count it started from was taken.")

    def __str__(self) -> str:
        return f"tally of {self.campaign_id}"


class CampaignTallyChange(models.Model):
    """What one statement changed in a campaign's counts: ``n`` rows more (or fewer) in ``status``
    (``reason`` for suppressed and failed, else empty). Appended by database triggers on every
    INSERT and UPDATE of notifications (live and history; migration 0021), in the writer's
    transaction; consumed (deleted) by beat's pace tick (``campaigns.tally``)."""

    campaign_id = models.UUIDField()
    status = models.CharField(max_length=12)
    reason = models.CharField(max_length=32, blank=True)
    n = models.IntegerField()

    def __str__(self) -> str:
        return f"{self.campaign_id} {self.status} {self.reason} {self.n:+d}"
