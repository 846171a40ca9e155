"""Request/response shapes for ``/v1/notifications``.

Channel rules (sources: Twilio Messages API docs for the 1,600-character body limit; FCM HTTP v1
docs for the 4,096-byte data payload limit, ``shared/reference/providers.md`` §1, §3):

* sms: ``body`` ≤ 1,600 characters; no ``title``/``html``.
* email: ``title`` (the subject) required, ≤ 998 characters (RFC 5322 line limit); optional ``html``.
* push: ``title`` + ``body`` + ``data`` together ≤ 4,096 bytes as JSON; ``data`` values are strings;
  no ``html``.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings

from notifications import clock
from notifications.models import DeliveryAttempt, Notification, Priority, TimelineEntry
from notifications.quiet_hours_policy import priority_category_problem
from preferences.models import Channel, Recipient
from preferences.validation import control_character_problem, no_control_pattern
from providers.registry import unavailable_channel_problem

SMS_MAX_CHARS = 1600
PUSH_MAX_BYTES = 4096
EMAIL_SUBJECT_MAX = 998
MAX_SCHEDULE_AHEAD = timedelta(days=366)
# A past instant means "now"; but not any past: an instant before year 1 in UTC (0001-01-01+05:00)
# cannot even be read back from Postgres, so anything older than this is refused.
MAX_SCHEDULE_BEHIND = timedelta(days=366)
MAX_TTL_SECONDS = 28 * 24 * 3600  # FCM's maximum TTL (4 weeks)
CATEGORY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _expected_json_type(field) -> str | None:
    """The JSON type a field takes (``string``, ``integer``, ``boolean``, ``array``, ``object``), or None
    when the field checks its input itself (nested serializers, date-times, times…)."""
    if isinstance(field, serializers.BooleanField):
        return "boolean"
    if isinstance(field, serializers.IntegerField):
        return "integer"
    if isinstance(field, serializers.ListField | serializers.ListSerializer):
        return "array"
    if isinstance(field, serializers.DictField):
        return "object"
    if isinstance(field, serializers.CharField | serializers.ChoiceField):
        return "string"
    return None


def strict_type_errors(field, value, path: str) -> dict[str, serializers.ErrorDetail]:
    """``{path: ErrorDetail(code="invalid_type")}`` for every value (recursing into arrays and objects of
    plain fields) whose JSON type is not the field's. DRF alone coerces: ``"sensitive": "yes"`` is True,
    ``"user_id": 123`` is ``"123"``, ``"ttl_seconds": "60"`` is 60; this API takes none of that."""
    if value is None:
        return {}  # allow_null / required rules are DRF's
    expected = _expected_json_type(field)
    if expected is None:
        return {}
    got = _json_type(value)
    if got != expected and not (expected == "integer" and got == "number" and isinstance(value, int)):
        shown = "a number with a fraction" if expected == "integer" and got == "number" else got
        return {path: serializers.ErrorDetail(f"must be a JSON {expected}, not {shown}", code="invalid_type")}
    errors: dict[str, serializers.ErrorDetail] = {}
    child = getattr(field, "child", None)
    if child is not None and not isinstance(child, serializers.BaseSerializer):
        items = enumerate(value) if expected == "array" else value.items()
        for key, item in items:
            errors.update(strict_type_errors(child, item, f"{path}.{key}"))
    return errors


class RejectUnknownFields:
    """Serializer mixin for request bodies: a key the serializer does not know is a 422 naming it
    (``unknown_field``), so a typo (``opt_out`` for ``opt_outs``) can never silently replace data with
    defaults; and JSON types are strict (:func:`strict_type_errors`, ``invalid_type``)."""

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                # An empty key, or one spelled like DRF's own "non_field_errors", is quoted so that the
                # error still names it (found by tests/test_api_generated.py: the field came out null).
                raise serializers.ValidationError({
                    json.dumps(key) if key in ("", api_settings.NON_FIELD_ERRORS_KEY) else key:
                    [serializers.ErrorDetail("unknown field", code="unknown_field")] for key in unknown})
            errors: dict[str, serializers.ErrorDetail] = {}
            for name, value in data.items():
                field = self.fields[name]
                if not field.read_only:
                    errors.update(strict_type_errors(field, value, name))
            if errors:
                raise serializers.ValidationError(errors)
        return super().to_internal_value(data)


class RejectUnknownFieldsSchema(OpenApiSerializerExtension):
    """The OpenAPI schema of a :class:`RejectUnknownFields` request body says what the code does:
    ``additionalProperties: false`` (an unknown key is refused), plus the rules across fields the
    serializer states in its ``schema_rules`` (merged into the object schema). Responses are left
    as drf-spectacular maps them. A serializer without its own docstring gets no description
    (not the mixin's)."""

    target_class = RejectUnknownFields
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if direction == "request":
            schema["additionalProperties"] = False
            schema.update(getattr(self.target, "schema_rules", {}))
        if type(self.target).__doc__ is None:
            schema.pop("description", None)
        return schema


@extend_schema_field(OpenApiTypes.DATETIME)
class AwareDateTimeField(serializers.Field):
    """ISO 8601 instant that must carry a UTC offset or ``Z``; naive times are rejected."""

    default_error_messages = {
        "invalid": "not an ISO 8601 date-time (e.g. 2026-12-01T09:00:00+01:00)",
        "naive_datetime": "must include a UTC offset or Z (e.g. 2026-12-01T09:00:00+01:00); naive times are ambiguous",
    }

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        try:
            value = parse_datetime(data)
        except ValueError:
            value = None
        if value is None:
            self.fail("invalid")
        if timezone.is_naive(value):
            self.fail("naive_datetime")
        return value

    def to_representation(self, value):
        return value.isoformat() if value else None


@extend_schema_field({"type": "string", "pattern": r"^[a-z0-9][a-z0-9_.-]{0,63}$", "maxLength": 64})
class CategoryField(serializers.CharField):
    """A category name (or empty: drf-spectacular adds that alternative for ``allow_blank``, so the
    pattern must not match "" too, or ``oneOf`` refuses it); checked by ``validate_category``
    (``invalid_category``)."""


MAX_LABEL_LENGTH = 200


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": MAX_LABEL_LENGTH,
                      "pattern": no_control_pattern(MAX_LABEL_LENGTH)})
class LabelField(serializers.CharField):
    """A one-line name shown in lists and logs (a segment's, a template's, a campaign's): at most
    MAX_LABEL_LENGTH characters, no control character (C0, DEL, C1: a line break or a terminal
    escape in an admin list or a log line); code ``invalid``. (Or empty, where ``allow_blank``:
    drf-spectacular adds that alternative.)"""

    def __init__(self, **kwargs) -> None:
        super().__init__(max_length=MAX_LABEL_LENGTH, **kwargs)

    def to_internal_value(self, data):
        # Checked before DRF trims the surrounding whitespace, of which U+0085 is a part for Python.
        problem = control_character_problem(data) if isinstance(data, str) else ""
        if problem:
            raise serializers.ValidationError(f"a name {problem}", code="invalid")
        return super().to_internal_value(data)


@extend_schema_field({"type": "string", "pattern": r"^([01]?[0-9]|2[0-3]):[0-5]?[0-9]$", "example": "22:00"})
class WallTimeField(serializers.TimeField):
    """A wall-clock time written ``HH:MM`` (in and out). Documented with a pattern: the OpenAPI ``time``
    format is RFC 3339's ``full-time`` (seconds and offset), which this is not."""

    def __init__(self, **kwargs):
        kwargs.setdefault("format", "%H:%M")
        kwargs.setdefault("input_formats", ["%H:%M"])
        super().__init__(**kwargs)


@extend_schema_field({"type": "string", "pattern": r"^([01]?[0-9]|2[0-3]):[0-5]?[0-9](:[0-5]?[0-9])?$",
                      "example": "09:30"})
class WallTimeSecondsField(WallTimeField):
    """:class:`WallTimeField` that also accepts ``HH:MM:SS`` (answered as ``HH:MM``)."""

    def __init__(self, **kwargs):
        kwargs.setdefault("input_formats", ["%H:%M", "%H:%M:%S"])
        super().__init__(**kwargs)


def check_schedule_window(value, now=None):
    """``value`` (an aware datetime, or None) if it is within 366 days of ``now`` either way (default:
    the platform clock, :func:`notifications.clock.now`, as acceptance uses); ValidationError
    (``too_far_ahead`` / ``too_far_past``) otherwise."""
    if value is None:
        return value
    now = now or clock.now()
    if value - now > MAX_SCHEDULE_AHEAD:
        raise serializers.ValidationError("at most 366 days ahead", code="too_far_ahead")
    if now - value > MAX_SCHEDULE_BEHIND:
        raise serializers.ValidationError("at most 366 days in the past (a past instant means now)",
                                          code="too_far_past")
    return value


class ContentSerializer(RejectUnknownFields, serializers.Serializer):
    title = serializers.CharField(required=False, allow_blank=True, max_length=EMAIL_SUBJECT_MAX,
                                  help_text="Email subject (required for email) or push title.")
    body = serializers.CharField(max_length=100_000, trim_whitespace=False, help_text="Plain-text body.")
    html = serializers.CharField(required=False, allow_blank=True, max_length=1_000_000, trim_whitespace=False,
                                 help_text="Email only: HTML body.")
    data = serializers.DictField(child=serializers.CharField(allow_blank=True, trim_whitespace=False),
                                 required=False, allow_empty=True,
                                 help_text="String-to-string map: push data payload / email custom args.")


class SendRequestSerializer(RejectUnknownFields, serializers.Serializer):
    """``POST /v1/notifications`` body."""

    user_id = serializers.CharField(max_length=255, trim_whitespace=False,
                                    help_text="An existing user id, exactly as stored (never trimmed).")
    channel = serializers.ChoiceField(choices=Channel.choices)
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.STANDARD)
    category = CategoryField(required=False, allow_blank=True, default="", max_length=64,
                             help_text='e.g. "marketing", "security"; matched against category opt-outs.')
    content = ContentSerializer()
    scheduled_at = AwareDateTimeField(required=False, allow_null=True, default=None,
                                      help_text="Send at this instant (ISO 8601 with offset). Omit to send now.")
    ttl_seconds = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1,
                                           max_value=MAX_TTL_SECONDS,
                                           help_text="Expire this many seconds after the send time.")
    sensitive = serializers.BooleanField(required=False, default=False,
                                         help_text="Content (e.g. an OTP) is never shown in the admin or logs.")

    def validate_category(self, value: str) -> str:
        if value and not CATEGORY_PATTERN.match(value):
            raise serializers.ValidationError("lower-case letters, digits, '_', '.', '-'; at most 64",
                                              code="invalid_category")
        return value

    def validate_scheduled_at(self, value):
        return check_schedule_window(value)

    def validate(self, attrs):
        errors = channel_content_errors(attrs["channel"], attrs["content"])
        errors.update(priority_category_errors(attrs["priority"], attrs["category"]))
        errors.update(channel_available_errors(attrs["channel"]))
        if errors:
            raise serializers.ValidationError(errors)
        recipient = Recipient.objects.filter(pk=attrs["user_id"]).first()
        if recipient is None:
            raise serializers.ValidationError({"user_id": serializers.ErrorDetail(
                f"unknown user; create it with PUT /v1/users/{attrs['user_id']}", code="unknown_user")})
        attrs["recipient"] = recipient
        return attrs


def channel_available_errors(channel: str) -> dict:
    """``{"channel": ErrorDetail(code="channel_unavailable")}`` when the platform has no provider for
    ``channel`` (its ``*_PROVIDERS`` list is empty: :func:`providers.registry.unavailable_channel_problem`),
    else ``{}``: a send that could only become a dead letter is refused when it is made."""
    problem = unavailable_channel_problem(channel)
    return {"channel": serializers.ErrorDetail(problem, code="channel_unavailable")} if problem else {}


def priority_category_errors(priority: str, category: str) -> dict:
    """Accept-time quiet-hours rule (:mod:`notifications.quiet_hours_policy`): ``{"priority": ErrorDetail}``
    when this priority and category may not go together (``marketing_not_high``, ``category_not_high``)."""
    problem = priority_category_problem(priority, category)
    return {"priority": serializers.ErrorDetail(problem[1], code=problem[0])} if problem else {}


def channel_content_errors(channel: str, content: dict, prefix: str = "content") -> dict:
    """Per-channel content rules (module docstring). Returns ``{field path: ErrorDetail}``."""
    errors: dict[str, serializers.ErrorDetail] = {}
    body = content.get("body", "")
    if not body.strip():
        errors[f"{prefix}.body"] = serializers.ErrorDetail("must not be blank", code="blank")
    if channel == Channel.SMS:
        if len(body) > SMS_MAX_CHARS:
            errors[f"{prefix}.body"] = serializers.ErrorDetail(
                f"SMS body is {len(body)} characters; at most {SMS_MAX_CHARS}", code="max_length")
        for name in ("title", "html"):
            if content.get(name):
                errors[f"{prefix}.{name}"] = serializers.ErrorDetail(
                    f"not used by SMS; leave {name} out", code="not_allowed_for_channel")
    elif channel == Channel.EMAIL:
        if not (content.get("title") or "").strip():
            errors[f"{prefix}.title"] = serializers.ErrorDetail("email needs a subject in title",
                                                                code="required")
    elif channel == Channel.PUSH:
        if content.get("html"):
            errors[f"{prefix}.html"] = serializers.ErrorDetail("not used by push; leave html out",
                                                               code="not_allowed_for_channel")
        payload = {k: content[k] for k in ("title", "body", "data") if content.get(k)}
        size = len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode())
        if size > PUSH_MAX_BYTES:
            errors[prefix] = serializers.ErrorDetail(
                f"push payload (title+body+data as JSON) is {size} bytes; at most {PUSH_MAX_BYTES}",
                code="payload_too_large")
    return errors


class AcceptedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.CharField(help_text="`queued` (due now) or `scheduled` (due later).")


class CancelledSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    status = serializers.CharField(help_text="`cancelled`.")


class EventSerializer(serializers.ModelSerializer):
    at = serializers.DateTimeField(source="created_at", read_only=True)

    class Meta:
        model = TimelineEntry
        fields = ["at", "kind", "status", "reason", "detail"]
        read_only_fields = fields  # a response: every field is always present
        extra_kwargs = {"status": {"allow_blank": True}}  # read-only drops it; "" is a value here


class AttemptSerializer(serializers.ModelSerializer):
    at = serializers.DateTimeField(source="created_at", read_only=True)
    device_platform = serializers.CharField(source="device.platform", default=None, allow_null=True, read_only=True,
                                            help_text="Push only: the device's platform.")

    class Meta:
        model = DeliveryAttempt
        fields = ["number", "at", "provider", "outcome", "error_code", "error_message", "http_status",
                  "latency_ms", "provider_message_id", "device_platform"]
        read_only_fields = fields


class NotificationSerializer(serializers.ModelSerializer):
    """A notification with its status, reason and full timeline (content hidden when sensitive)."""

    user_id = serializers.CharField(source="recipient_id", read_only=True)
    content = serializers.SerializerMethodField(help_text="null when the notification is `sensitive`.")
    timeline = EventSerializer(many=True, read_only=True)
    attempts_log = AttemptSerializer(many=True, read_only=True)
    scheduled_at = AwareDateTimeField(allow_null=True, read_only=True)

    class Meta:
        model = Notification
        fields = ["id", "user_id", "channel", "priority", "category", "status", "reason", "reason_detail",
                  "sensitive", "content", "scheduled_at", "expires_at", "attempts", "provider",
                  "provider_message_id", "created_at", "sent_at", "delivered_at", "timeline", "attempts_log"]
        read_only_fields = fields  # a response: every field is always present
        extra_kwargs = {"reason": {"allow_blank": True}}  # read-only drops it; "" is a value here

    @extend_schema_field(ContentSerializer(allow_null=True))
    def get_content(self, obj: Notification):
        if obj.sensitive:
            return None
        content = {"title": obj.title, "body": obj.body}
        if obj.html:
            content["html"] = obj.html
        if obj.data:
            content["data"] = obj.data
        return content


class NotificationSummarySerializer(NotificationSerializer):
    """A notification in a list: status, reason and content (null when sensitive), no timeline
    (``GET /v1/notifications/{id}`` has it)."""

    campaign_id = serializers.UUIDField(allow_null=True, read_only=True,
                                        help_text="The campaign that sent it; null for a single send.")

    class Meta(NotificationSerializer.Meta):
        fields = ["id", "user_id", "campaign_id", "channel", "priority", "category", "status", "reason",
                  "reason_detail", "sensitive", "content", "scheduled_at", "attempts", "provider", "created_at",
                  "sent_at", "delivered_at"]
        read_only_fields = fields
