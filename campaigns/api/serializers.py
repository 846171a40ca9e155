"""Request/response shapes for campaigns (their series, runs, counts and send-time option); segments' members
and templates: :mod:`campaigns.api.segment_template_serializers`."""

from __future__ import annotations

from datetime import UTC, datetime

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from campaigns import recurrence
from campaigns.api.segment_template_serializers import content_errors
from campaigns.api.send_time import (
    SendTimeOutSerializer,
    SendTimeSerializer,
    earliest_wall_time,
    send_time_errors,
)
from campaigns.audience import cached_reach
from campaigns.models import Campaign, CampaignStatus, MissedPolicy, Segment, Template
from campaigns.recurrence import RECIPIENT_ZONE
from campaigns.selectors import template_problem
from campaigns.services import local_time_problem
from core import clock
from core.api.fields import AwareDateTimeField, LabelField, RejectUnknownFields, WallTimeSecondsField
from core.vocabulary import CATEGORY_PATTERN
from notifications.acceptance.rules import bulk_send_problem
from notifications.admission import bulk_type_problem
from notifications.api.serializers import (
    ContentSerializer,
    channel_available_errors,
    channel_content_errors,
    check_schedule_window,
    checks_busy,
    metadata_field,
    priority_category_errors,
)
from notifications.api.typed import data_errors
from notifications.content_limits import MAX_TTL_SECONDS
from notifications.events.models import NotificationType
from notifications.models import Priority
from notifications.quiet_hours_policy import campaign_category_problem
from notifications.rendering.checking import CheckBudgetSpent, ChecksBusy
from preferences.models import Channel

MAX_SPREAD_SECONDS = 24 * 3600


class LocalTimeSerializer(RejectUnknownFields, serializers.Serializer):
    date = serializers.DateField(help_text="Wall-clock date in each recipient's zone (YYYY-MM-DD).")
    time = WallTimeSecondsField(help_text="Wall-clock time in each recipient's zone (HH:MM).")


class ScheduleSerializer(RejectUnknownFields, serializers.Serializer):
    """A recurring campaign's schedule (docs/RECURRING.md); the rule is :func:`campaigns.recurrence.parse`."""

    rrule = serializers.CharField(max_length=500, help_text=(
        "One RFC 5545 RRULE over local wall times, e.g. `FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0`; COUNT or a "
        "local UNTIL (no Z) ends it. Occurrences at least CAMPAIGN_SCHEDULE_MIN_INTERVAL_SECONDS (1 h) apart."))
    start = serializers.CharField(max_length=40, help_text="The first occurrence's local wall time (DTSTART), "
                                                           "`YYYY-MM-DDTHH:MM:SS`, no zone.")
    timezone = serializers.CharField(max_length=64, help_text=(
        f'The IANA zone the wall times are read in (`"Europe/Paris"`), or `"{RECIPIENT_ZONE}"`: each '
        "recipient's own zone, as `local_time` does."))


class CampaignRequestSerializer(RejectUnknownFields, serializers.Serializer):
    """``POST /v1/campaigns`` body: exactly one of ``content`` / ``template_id`` / ``type``, at most one of
    ``scheduled_at`` / ``local_time`` / ``schedule``, ``missed_policy`` and ``send_time`` only with
    ``local_time`` (or a schedule in each recipient's zone)."""

    #: The same rules in the OpenAPI schema (notifications.api.serializers.RejectUnknownFieldsSchema);
    #: null counts as absent, as in validate().
    schema_rules = {"allOf": [
        {"oneOf": [{"required": ["content"], "properties": {"content": {"type": "object"}}},
                   {"required": ["template_id"], "properties": {"template_id": {"type": "string"}}},
                   {"required": ["type"], "properties": {"type": {"type": "string"}}}]},
        {"not": {"required": ["scheduled_at", "local_time"],
                 "properties": {"scheduled_at": {"type": "string"}, "local_time": {"type": "object"}}}},
        {"not": {"required": ["schedule", "scheduled_at"],
                 "properties": {"schedule": {"type": "object"}, "scheduled_at": {"type": "string"}}}},
        {"not": {"required": ["schedule", "local_time"],
                 "properties": {"schedule": {"type": "object"}, "local_time": {"type": "object"}}}},
        {"anyOf": [{"not": {"required": ["missed_policy"], "properties": {"missed_policy": {"type": "string"}}}},
                   {"required": ["local_time"], "properties": {"local_time": {"type": "object"}}},
                   {"required": ["schedule"], "properties": {"schedule": {
                       "type": "object", "properties": {"timezone": {"enum": [RECIPIENT_ZONE]}}}}}]},
        {"anyOf": [{"not": {"required": ["send_time"], "properties": {"send_time": {"type": "object"}}}},
                   {"required": ["local_time"], "properties": {"local_time": {"type": "object"}}},
                   {"required": ["schedule"], "properties": {"schedule": {
                       "type": "object", "properties": {"timezone": {"enum": [RECIPIENT_ZONE]}}}}}]},
        {"anyOf": [{"not": {"required": ["data"], "properties": {"data": {"type": "object"}}}},
                   {"required": ["type"], "properties": {"type": {"type": "string"}}}]},
    ]}

    name = LabelField(required=False, allow_blank=True, default="")
    segment_id = serializers.CharField(max_length=64, trim_whitespace=False)
    channel = serializers.ChoiceField(choices=Channel.choices)
    # No schema defaults: a typed campaign takes the type's (a generated client would send the default).
    priority = serializers.ChoiceField(choices=Priority.choices, required=False,
                                       help_text="Default `standard`; with `type`, the type's.")
    category = serializers.RegexField(CATEGORY_PATTERN.pattern, required=False,
                                      help_text="Default `marketing`; with `type`, the type's.")
    content = ContentSerializer(required=False, allow_null=True)
    template_id = serializers.CharField(required=False, allow_null=True, max_length=64, trim_whitespace=False)
    type = serializers.CharField(required=False, allow_null=True, max_length=64,
                                 help_text="A notification type key: its templates for `channel` render each message "
                                           "(docs/TYPES.md); `data` is what they read as `{{ data.* }}`.")
    data = serializers.DictField(required=False, allow_null=True, default=None,
                                 help_text="With `type` only: the data its templates read (≤ 16 KB as JSON).")
    scheduled_at = AwareDateTimeField(required=False, allow_null=True, default=None)
    local_time = LocalTimeSerializer(required=False, allow_null=True, default=None)
    schedule = ScheduleSerializer(required=False, allow_null=True, default=None,
                                  help_text="Recurring: each occurrence sends one run (docs/RECURRING.md). Not with "
                                            "scheduled_at or local_time.")
    missed_policy = serializers.ChoiceField(
        choices=MissedPolicy.choices, required=False, allow_null=True, default=None,
        help_text="local_time campaigns only: members whose wall time had already passed in their zone when "
                  "their fan-out page ran (more than CAMPAIGN_MISSED_GRACE_SECONDS, 10 min, before) are "
                  "`skip`ped (default: suppressed, reason `local_time_passed`, counted in `missed_count`), "
                  "sent at once (`send_now`), or sent at that wall time the next day (`next_day`).")
    spread_seconds = serializers.IntegerField(required=False, default=0, min_value=0, max_value=MAX_SPREAD_SECONDS)
    ttl_seconds = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1,
                                           max_value=MAX_TTL_SECONDS)
    metadata = metadata_field()
    send_time = SendTimeSerializer(required=False, allow_null=True, default=None,
                                   help_text="Send-time optimisation (docs/SEND_TIME.md); local_time or a schedule "
                                             "in each recipient's zone only.")

    def validate(self, attrs):
        from core import clock

        errors = {}
        has_content, has_template = attrs.get("content") is not None, bool(attrs.get("template_id"))
        has_type = bool(attrs.get("type"))
        if has_content + has_template + has_type != 1:
            errors["content"] = serializers.ErrorDetail("give exactly one of content, template_id or type",
                                                        code="content_xor_template")
        if attrs.get("data") is not None and not has_type:
            errors["data"] = serializers.ErrorDetail("data goes with type (inline content has content.data)",
                                                     code="not_allowed_without_type")
        kind = NotificationType.objects.filter(pk=attrs["type"]).first() if has_type else None
        if kind is not None:
            errors.update(self._take_from_type(kind, attrs))
        attrs.setdefault("priority", Priority.STANDARD)
        attrs.setdefault("category", "marketing")
        errors.update(priority_category_errors(attrs["priority"], attrs["category"]))
        limited = bulk_send_problem(type_key=kind.key if kind is not None else "", category=attrs["category"],
                                    channels=[attrs["channel"]])
        if limited:
            errors["type" if kind is not None else "category"] = serializers.ErrorDetail(limited,
                                                                                         code="acceptance_limited")
        bulk = campaign_category_problem(attrs["priority"], attrs["category"])
        if bulk and "category" not in errors:
            errors["category"] = serializers.ErrorDetail(bulk[1], code=bulk[0])
        errors.update(channel_available_errors(attrs["channel"]))
        if attrs.get("scheduled_at") and attrs.get("local_time"):
            errors["local_time"] = serializers.ErrorDetail("give at most one of scheduled_at or local_time",
                                                           code="schedule_conflict")
        try:
            check_schedule_window(attrs.get("scheduled_at"), clock.now())
        except serializers.ValidationError as exc:
            errors["scheduled_at"] = exc.detail[0]
        local = attrs.get("local_time")
        errors.update(send_time_errors(attrs))
        if local:
            # The wall time is reached somewhere between UTC+14 and UTC-12 of that date: it must still be
            # ahead in the earliest zone (else some recipients' send time has already passed); with
            # send_time, the earliest hour of its window too.
            passed = local_time_problem(local["date"], earliest_wall_time(local["time"], attrs), clock.now())
            start = datetime.combine(local["date"], local["time"], tzinfo=UTC)
            if passed:
                errors["local_time"] = serializers.ErrorDetail(passed, code="local_time_passed")
            else:
                try:
                    check_schedule_window(start, clock.now())
                except serializers.ValidationError as exc:
                    errors["local_time.date"] = exc.detail[0]
        elif attrs.get("missed_policy") is not None and not (
                attrs.get("schedule") and attrs["schedule"]["timezone"] == RECIPIENT_ZONE):
            errors["missed_policy"] = serializers.ErrorDetail("applies to local_time campaigns only; give "
                                                              "local_time or leave missed_policy out",
                                                              code="local_time_only")
        errors.update(_schedule_errors(attrs))
        if has_content and not has_template:
            errors.update(channel_content_errors(attrs["channel"], attrs["content"]))
            parts = {name: attrs["content"].get(name, "") or "" for name in ("title", "body", "html")}
            try:
                errors.update(content_errors(parts, prefix="content."))
            except ChecksBusy as exc:
                raise checks_busy(str(exc)) from None
            except CheckBudgetSpent as exc:
                errors["content"] = serializers.ErrorDetail(str(exc), code=exc.code)
        segment = Segment.objects.filter(pk=attrs["segment_id"]).first()
        if segment is None:
            errors["segment_id"] = serializers.ErrorDetail("unknown segment; create it with PUT /v1/segments/{id}",
                                                           code="unknown_segment")
        template = None
        if has_template:
            template = Template.objects.filter(pk=attrs["template_id"]).prefetch_related("variants").first()
            if template is None:
                errors["template_id"] = serializers.ErrorDetail("unknown template", code="unknown_template")
            elif attrs["channel"] == Channel.EMAIL and any(not v.title for v in template.variants.all()):
                errors["template_id"] = serializers.ErrorDetail(
                    "email needs a subject: every variant of this template needs a title", code="missing_title")
            elif problem := template_problem(template):  # saved before the rule: it would fail every send
                errors["template_id"] = serializers.ErrorDetail(problem, code="template_error")
        if has_type:
            if kind is None:
                errors["type"] = serializers.ErrorDetail("unknown notification type", code="unknown_type")
            elif attrs["channel"] not in kind.channels:
                errors["channel"] = serializers.ErrorDetail(
                    f"type {kind.key} does not use {attrs['channel']} (its channels: {', '.join(kind.channels)})",
                    code="not_in_type")
            elif problem := bulk_type_problem(kind):
                errors["type"] = serializers.ErrorDetail(problem, code="not_for_campaigns")
            else:
                errors.update(data_errors(kind, attrs.get("data") or {}))
        if errors:
            raise serializers.ValidationError(errors)
        attrs["segment"] = segment
        attrs["template"] = template
        attrs["notification_type"] = kind
        return attrs

    def _take_from_type(self, kind: NotificationType, attrs: dict) -> dict:
        """A typed campaign sends the type's content with the type's priority and category, as every
        other road of a type does (a standard campaign of a high type would skip the high gate); given
        with ``type``: ``not_allowed_with_type``, as on a typed send (docs/TYPES.md)."""
        errors = {}
        for name in ("priority", "category"):
            if name in attrs:
                errors[name] = serializers.ErrorDetail(
                    f"comes from the type (type {kind.key} has {name} {getattr(kind, name)}); leave {name} out",
                    code="not_allowed_with_type")
            attrs[name] = getattr(kind, name)
        if attrs.get("ttl_seconds") is None:
            attrs["ttl_seconds"] = kind.ttl_seconds  # as every other road of the type
        return errors


def _schedule_errors(attrs: dict) -> dict[str, serializers.ErrorDetail]:
    """A schedule's errors: given with another schedule kind, or refused by the one rule
    (:func:`campaigns.recurrence.parse`: ``schedule.rrule``, ``schedule.start``, ``schedule.timezone``)."""
    schedule = attrs.get("schedule")
    if not schedule:
        return {}
    if attrs.get("scheduled_at") or attrs.get("local_time"):
        return {"schedule": serializers.ErrorDetail("give one of schedule, scheduled_at or local_time",
                                                    code="schedule_conflict")}
    try:
        recurrence.parse(schedule["rrule"], schedule["start"], schedule["timezone"], now=clock.now())
    except recurrence.ScheduleError as exc:
        return {exc.field: serializers.ErrorDetail(str(exc), code=exc.code)}
    return {}


class ByStatusSerializer(serializers.Serializer):
    """Notifications of the campaign in each status (every status present, 0 if none)."""

    scheduled = serializers.IntegerField()
    queued = serializers.IntegerField()
    sending = serializers.IntegerField()
    sent = serializers.IntegerField()
    delivered = serializers.IntegerField()
    displayed = serializers.IntegerField(help_text="Push and in_app: the app reported it shown (not opened or "
                                                   "dismissed since).")
    dismissed = serializers.IntegerField(help_text="Push and in_app: the app reported it dismissed unopened.")
    opened = serializers.IntegerField(help_text="Push and in_app: the app reported it opened.")
    failed = serializers.IntegerField()
    suppressed = serializers.IntegerField()
    expired = serializers.IntegerField()
    cancelled = serializers.IntegerField()


class OutcomeSerializer(serializers.Serializer):
    """What became of the campaign's notifications so far, sent and not sent kept apart."""

    sent = serializers.IntegerField(help_text="Accepted by a provider: by_status.sent + delivered + displayed + "
                                              "dismissed + opened.")
    delivered = serializers.IntegerField(help_text="Of those, confirmed delivered by a receipt (the provider's, or "
                                                   "the app's: delivered + displayed + dismissed + opened).")
    displayed = serializers.IntegerField(help_text="Of those, shown on the device or in the inbox, as the app "
                                                   "reported (displayed + dismissed + opened).")
    opened = serializers.IntegerField(help_text="Of those, opened by the user, as the app reported.")
    not_sent = serializers.IntegerField(help_text="Ended without a send: suppressed + failed + expired + cancelled.")
    suppressed = serializers.IntegerField()
    failed = serializers.IntegerField()
    expired = serializers.IntegerField()
    cancelled = serializers.IntegerField()
    pending = serializers.IntegerField(help_text="Not finished yet: scheduled + queued + sending.")


class CampaignCountsSerializer(serializers.Serializer):
    total = serializers.IntegerField(help_text="Notifications created so far (whatever became of them).")
    outcome = OutcomeSerializer()
    by_status = ByStatusSerializer()
    suppressed_by_reason = serializers.DictField(child=serializers.IntegerField(),
                                                 help_text="Suppressed notifications by reason (no_phone, …).")
    failed_by_reason = serializers.DictField(child=serializers.IntegerField(),
                                             help_text="Failed notifications by reason.")
    history_expired = serializers.BooleanField(
        help_text="True once the notification history's retention may have dropped some of the campaign's "
                  "notifications (its fan-out began more than RETENTION_NOTIFICATIONS_DAYS + HOT_HOURS ago): "
                  "the counts are of the notifications left.")


class ReachSerializer(serializers.Serializer):
    members = serializers.IntegerField(help_text="Members of the segment now.")
    eligible = serializers.IntegerField(
        allow_null=True,
        help_text="Members the suppression rule lets through now: not opted out of the channel or of the "
                  "campaign's category on it, with a usable contact (phone / email / active push device), no "
                  "SMS STOP. What fan-out will create as not suppressed if nothing changes. Null when `exact` "
                  "is false.")
    suppressed_by_reason = serializers.DictField(child=serializers.IntegerField(),
                                                 help_text="The other members by reason (no_phone, …); empty "
                                                           "when `exact` is false.")
    exact = serializers.BooleanField(help_text="False: counting took longer than SEGMENT_PREVIEW_TIMEOUT_MS (as "
                                               "for POST /v1/segment-preview), `members` is the database "
                                               "planner's estimate and `eligible` is null.")


class OccurrenceSerializer(serializers.Serializer):
    at = serializers.DateTimeField(help_text="The occurrence's instant (UTC); for a schedule in each recipient's "
                                             "zone, when the earliest zone (UTC+14) reaches it and its run starts.")
    local = serializers.CharField(help_text="Its local wall time, YYYY-MM-DDTHH:MM:SS.")


class ScheduleOutSerializer(serializers.Serializer):
    rrule = serializers.CharField()
    start = serializers.CharField()
    timezone = serializers.CharField()
    next_run_at = serializers.DateTimeField(allow_null=True, help_text="The next run's instant; null once the rule "
                                                                       "has no occurrence left or it is cancelled.")
    paused_at = serializers.DateTimeField(allow_null=True)
    next_occurrences = OccurrenceSerializer(many=True, help_text=(
        "The next occurrences after now, DST-correct (GET /v1/campaigns/{id}?occurrences=N, 1–50, default 5); "
        "empty once completed or cancelled. Paused: those a resume now would send."))


#: Occurrences shown by default, and at most, in ``schedule.next_occurrences``.
DEFAULT_OCCURRENCES, MAX_OCCURRENCES = 5, 50


def schedule_payload(campaign: Campaign, occurrences: int = DEFAULT_OCCURRENCES) -> dict | None:
    """A series' schedule as the API (and the admin) show it, or ``None`` for other campaigns."""
    if not campaign.is_recurring:
        return None
    upcoming = [{"at": o.at, "local": o.wall.strftime(recurrence.START_FORMAT)}
                for o in recurrence.upcoming(campaign, occurrences, clock.now())]
    return {"rrule": campaign.schedule_rule, "start": campaign.schedule_start, "timezone": campaign.schedule_timezone,
            "next_run_at": campaign.next_run_at, "paused_at": campaign.paused_at, "next_occurrences": upcoming}


class CampaignSerializer(serializers.ModelSerializer):
    """A campaign's definition, status and progress counts."""

    segment_id = serializers.CharField(read_only=True)
    schedule = serializers.SerializerMethodField()
    series_id = serializers.UUIDField(allow_null=True, read_only=True, help_text=(
        "A run of a recurring campaign: that campaign's id (docs/RECURRING.md)."))
    occurrence_at = serializers.DateTimeField(allow_null=True, read_only=True, help_text="A run: its occurrence.")
    skip_reason = serializers.CharField(read_only=True, help_text=(
        "A `skipped` run: why (`previous run still active`, or a later occurrence already due)."))
    template_id = serializers.CharField(allow_null=True, read_only=True)
    scheduled_at = AwareDateTimeField(allow_null=True, read_only=True)
    local_time = serializers.SerializerMethodField()
    counts = serializers.SerializerMethodField()
    reach = serializers.SerializerMethodField()
    unsubscribes = serializers.SerializerMethodField(
        help_text="Recipients who opted out of the campaign's category through this campaign's emails' "
                  "unsubscribe link (one-click or the confirm page).")
    unsubscribe_rate = serializers.SerializerMethodField(
        help_text="unsubscribes ÷ counts.outcome.sent (0–1, may exceed 1 only if links are forwarded); "
                  "null while nothing was sent.")
    send_time = serializers.SerializerMethodField(
        help_text="Send-time optimisation: the option and, per group, members, sent, opened and open rate "
                  "(docs/SEND_TIME.md); null when off.")

    class Meta:
        model = Campaign
        fields = ["id", "name", "status", "segment_id", "channel", "priority", "category", "template_id",
                  "scheduled_at", "local_time", "missed_policy", "spread_seconds", "ttl_seconds", "fanout_at",
                  "member_count", "reach", "created_count", "default_zone_count", "missed_count", "fanout_failures",
                  "last_error", "last_error_at", "started_at", "fanned_out_at", "completed_at",
                  "cancelled_at", "created_at", "counts", "unsubscribes", "unsubscribe_rate", "schedule",
                  "series_id", "occurrence_at", "skip_reason", "metadata", "send_time"]
        read_only_fields = fields  # a response: every field is always present

    @extend_schema_field(ScheduleOutSerializer(allow_null=True))
    def get_schedule(self, obj) -> dict | None:
        return schedule_payload(obj, self.context.get("occurrences", DEFAULT_OCCURRENCES))

    @extend_schema_field(LocalTimeSerializer(allow_null=True))
    def get_local_time(self, obj) -> dict | None:
        if obj.local_date is None:
            return None
        return {"date": obj.local_date.isoformat(), "time": obj.local_time.strftime("%H:%M")}

    @extend_schema_field(SendTimeOutSerializer(allow_null=True))
    def get_send_time(self, obj) -> dict | None:
        from campaigns.send_time import comparison

        if not obj.send_time:
            return None
        return {**obj.send_time, "groups": comparison(obj)}

    @extend_schema_field(ReachSerializer(allow_null=True))
    def get_reach(self, obj) -> dict | None:
        """Before fan-out (draft, scheduled) the pre-launch reach (bounded: an estimate past the preview's
        timeout), at most 30 s old; after, ``null``
        (``member_count`` and ``counts`` tell what happened)."""
        if obj.status not in (CampaignStatus.DRAFT, CampaignStatus.SCHEDULED):
            return None
        return cached_reach(obj, clock.now()).as_dict()

    @extend_schema_field(CampaignCountsSerializer)
    def get_counts(self, obj) -> dict:
        from campaigns.selectors import campaign_counts

        obj._counts = campaign_counts(obj)  # read again by the unsubscribe fields
        return obj._counts

    def _unsubscribe_stats(self, obj) -> dict:
        from campaigns.selectors import unsubscribe_stats

        if not hasattr(obj, "_unsubscribe_stats"):
            counts = getattr(obj, "_counts", None)
            obj._unsubscribe_stats = unsubscribe_stats(obj, counts["outcome"]["sent"] if counts else None)
        return obj._unsubscribe_stats

    def get_unsubscribes(self, obj) -> int:
        return self._unsubscribe_stats(obj)["unsubscribes"]

    @extend_schema_field(serializers.FloatField(allow_null=True))
    def get_unsubscribe_rate(self, obj) -> float | None:
        return self._unsubscribe_stats(obj)["unsubscribe_rate"]


class CampaignSummarySerializer(CampaignSerializer):
    """A campaign in a list: its definition and status, without the counts (``GET /v1/campaigns/{id}``)."""

    created_via = serializers.SerializerMethodField(help_text="`api` (this client's POST) or `admin` (marketing's "
                                                              "admin pages).")

    class Meta(CampaignSerializer.Meta):
        fields = [f for f in CampaignSerializer.Meta.fields
                  if f not in ("counts", "unsubscribes", "unsubscribe_rate", "send_time")] + ["created_via"]
        read_only_fields = fields

    def get_created_via(self, obj) -> str:
        return "api" if obj.client_id else "admin"


class CampaignRunSerializer(serializers.Serializer):
    """One run of a recurring campaign; its full counts are ``GET /v1/campaigns/{id}`` of the run."""

    id = serializers.UUIDField()
    occurrence_at = serializers.DateTimeField()
    status = serializers.ChoiceField(choices=CampaignStatus.choices)
    skip_reason = serializers.CharField()
    member_count = serializers.IntegerField(allow_null=True, help_text="Members in the run's snapshot.")
    outcome = OutcomeSerializer()
    history_expired = serializers.BooleanField(help_text="As the run's `counts.history_expired`: the outcome is "
                                                         "of the notifications the history still keeps.")


def run_items(rows: list[Campaign]) -> list[dict]:
    """A page of runs with their outcomes (``selectors.counts_for``: their tallies, the rest one grouped query)."""
    from campaigns.selectors import counts_for

    counts = counts_for(rows)
    return [{"id": str(r.pk), "occurrence_at": r.occurrence_at, "status": r.status, "skip_reason": r.skip_reason,
             "member_count": r.member_count, "outcome": counts[r.pk]["outcome"],
             "history_expired": counts[r.pk]["history_expired"]}
            for r in rows]
