"""Request/response shapes for ``/v1/notifications``.

Channel rules (Twilio's 1,600-character body, FCM's 4,096-byte payload, SendGrid's custom args:
``docs/PROVIDERS.md`` §1, §2, §3): sms only a ``body``; email a one-line ``title`` (≤ 998, RFC 5322),
optional ``html``, ``data`` ≤ 10,000 bytes; push ``title`` + ``body`` + ``data`` ≤ 4,096 bytes, string
values, no key FCM reserves (:func:`providers.fcm.data_keys.data_key_problem`) nor
``notification_id``. The rules in full: docs/API.md.
"""

from __future__ import annotations

from datetime import timedelta

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core import clock
from core.api.fields import AwareDateTimeField, CategoryField, RejectUnknownFields
from core.api.refusals import Busy
from core.compiled import Compiled
from core.vocabulary import CATEGORY_PATTERN
from notifications import metadata as metadata_rule
from notifications.content_limits import (
    BODY_MAX_CHARS,
    EMAIL_DATA_MAX_BYTES,
    EMAIL_SUBJECT_MAX,
    HTML_MAX_CHARS,
    INBOX_BODY_MAX_CHARS,
    INBOX_DATA_MAX_BYTES,
    MAX_TTL_SECONDS,
    PUSH_MAX_BYTES,
    SMS_MAX_CHARS,
    inbox_data_problems,
    inbox_text_problem,
    json_bytes,
    shows_nothing,
)
from notifications.models import DeliveryAttempt, NotificationRecord, Priority, TimelineEntry
from notifications.quiet_hours_policy import priority_category_problem
from notifications.rendering.checking import ChecksBusy, busy_retry_after
from preferences.models import Channel, Recipient
from providers.base import platform_key_problem
from providers.fcm.data_keys import data_key_problem
from providers.registry import unavailable_channel_problem

MAX_SCHEDULE_AHEAD = timedelta(days=366)
# A past instant means "now"; but not any past: an instant before year 1 in UTC (0001-01-01+05:00)
# cannot even be read back from Postgres, so anything older than this is refused.
MAX_SCHEDULE_BEHIND = timedelta(days=366)


def check_schedule_window(value, now=None):
    """``value`` (an aware datetime, or None) if it is within 366 days of ``now`` either way (default:
    the platform clock, :func:`core.clock.now`, as acceptance uses); ValidationError
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


def too_long_messages(what: str) -> dict[str, str]:
    """``error_messages`` for a text field's ``max_length`` in the house style (as the channel limits
    below word theirs): ``body is 100001 characters; at most 100000`` (code ``max_length``). DRF fills
    ``{max_length}``, Django's MaxLengthValidator ``%(show_value)d``."""
    return {"max_length": f"{what} is %(show_value)d characters; at most {{max_length}}"}


def body_field(**kwargs) -> serializers.CharField:
    """A message body (a template's source or inline text): at most BODY_MAX_CHARS characters, kept as given."""
    return serializers.CharField(max_length=BODY_MAX_CHARS, trim_whitespace=False,
                                 error_messages=too_long_messages("body"), **kwargs)


def html_field(**kwargs) -> serializers.CharField:
    """An email's html part: at most HTML_MAX_CHARS characters, kept as given; may be blank."""
    return serializers.CharField(required=False, allow_blank=True, max_length=HTML_MAX_CHARS, trim_whitespace=False,
                                 error_messages=too_long_messages("html"), **kwargs)


class ContentSerializer(RejectUnknownFields, serializers.Serializer):
    title = serializers.CharField(required=False, allow_blank=True, max_length=EMAIL_SUBJECT_MAX,
                                  help_text="Email subject (required for email; one line: 422 `line_break`) or "
                                            "push title. Not for SMS.")
    body = body_field(help_text="Plain-text body.")
    html = html_field(help_text="Email only: HTML body.")
    data = serializers.DictField(child=serializers.CharField(allow_blank=True, trim_whitespace=False),
                                 required=False, allow_empty=True,
                                 help_text="String-to-string map: push data payload / email custom args (≤ "
                                           "10,000 bytes as JSON); not for SMS (422 `not_allowed_for_channel`). "
                                           "Push: no key FCM reserves (`from`, `message_type`, starting with "
                                           "`google.` or `gcm.`, any case); push and email: not "
                                           "`notification_id` (the platform sets it); 422 `reserved_key` on "
                                           "`content.data.<key>`.")


#: The recipient of a send, looked up on every request (compiled once per thread: core/compiled.py).
_RECIPIENT = Compiled(lambda user_id: Recipient.objects.filter(pk=user_id)[:1], ("user_id",))


@extend_schema_field({"type": "object", "nullable": True, "maxProperties": metadata_rule.MAX_KEYS,
                      "additionalProperties": {"nullable": True, "oneOf": [
                          {"type": "string"}, {"type": "number"}, {"type": "boolean"}]},
                      "description": "Your own data about this send, returned on reads and in every webhook "
                                     "payload's `data.metadata.client`: at most 20 keys (a letter or `_`, then "
                                     "letters, digits, `_`, `.`, `-`; ≤ 64), values strings, numbers, booleans "
                                     "or null, ≤ 2 KB as JSON."})
class MetadataField(serializers.JSONField):
    """``metadata``: the client's object (:mod:`notifications.metadata`), errors on ``metadata.<key>``."""

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        found = metadata_rule.problems(value)
        if None in found:
            message, code = found.pop(None)
            if not found:
                raise serializers.ValidationError(message, code=code)
        if found:
            raise serializers.ValidationError({key: [serializers.ErrorDetail(message, code=code)]
                                               for key, (message, code) in found.items()})
        return value


def metadata_field() -> MetadataField:
    return MetadataField(required=False, allow_null=True, default=None)


class SendRequestSerializer(RejectUnknownFields, serializers.Serializer):
    """``POST /v1/notifications`` body: ``content``, or ``type`` (with ``data``); with ``type`` no
    ``category``, ``priority`` or ``sensitive`` (the type's)."""

    #: The same rules in the OpenAPI schema (core.api.fields.RejectUnknownFieldsSchema).
    schema_rules = {"allOf": [
        {"oneOf": [{"required": ["content"]}, {"required": ["type"]}]},
        *({"not": {"required": ["type", name]}} for name in ("category", "priority", "sensitive")),
        {"not": {"required": ["content", "data"]}},
    ]}

    user_id = serializers.CharField(max_length=255, trim_whitespace=False,
                                    help_text="An existing user id, exactly as stored (never trimmed).")
    # priority, category and sensitive declare no default (the schema would state it, and a generated
    # client then sends it always, 422 with `type`): their defaults apply without `type` only, in validate().
    channel = serializers.ChoiceField(choices=Channel.choices)
    priority = serializers.ChoiceField(choices=Priority.choices, required=False,
                                       help_text="Default `standard`. Not with `type` (the type's: 422 "
                                                 "`not_allowed_with_type`).")
    category = CategoryField(required=False, allow_blank=True, max_length=64,
                             help_text='e.g. "marketing", "security"; matched against category opt-outs. Default '
                                       'none. Not with `type` (the type\'s).')
    content = ContentSerializer(required=False, help_text="The message itself; or leave it out and give `type` and "
                                                          "`data` (rendered from the type's templates at send time).")
    type = serializers.CharField(required=False, max_length=64,
                                 help_text="A notification type key: its template for `channel` renders the content "
                                           "with `data`; category, priority and sensitivity are the type's (do not "
                                           "give them).")
    data = serializers.DictField(required=False, help_text="With `type`: the event data its templates use (≤ 16 KB).")
    scheduled_at = AwareDateTimeField(required=False, allow_null=True, default=None,
                                      help_text="Send at this instant (ISO 8601 with offset). Omit to send now.")
    ttl_seconds = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1,
                                           max_value=MAX_TTL_SECONDS,
                                           help_text="Expire this many seconds after the send time.")
    sensitive = serializers.BooleanField(required=False,
                                         help_text="Content (e.g. an OTP) is never shown in the admin or logs. "
                                                   "Default false. Not with `type` (the type's).")
    metadata = metadata_field()

    def validate_category(self, value: str) -> str:
        if value and not CATEGORY_PATTERN.match(value):
            raise serializers.ValidationError("lower-case letters, digits, '_', '.', '-'; at most 64",
                                              code="invalid_category")
        return value

    def validate_scheduled_at(self, value):
        return check_schedule_window(value)

    def validate(self, attrs):
        if "type" in attrs:
            errors = {name: serializers.ErrorDetail(f"comes from the notification type; leave {name} out",
                                                    code="not_allowed_with_type")
                      for name in ("content", "category", "priority", "sensitive") if name in self.initial_data}
        elif "content" not in attrs:
            errors = {"content": serializers.ErrorDetail("give content, or type and data", code="required")}
        else:
            attrs = {"priority": Priority.STANDARD, "category": "", "sensitive": False, **attrs}
            errors = channel_content_errors(attrs["channel"], attrs["content"])
            if "data" in attrs:
                errors["data"] = serializers.ErrorDetail("data goes with type; inline content has content.data",
                                                         code="not_allowed_without_type")
            if attrs["sensitive"] and attrs["channel"] == Channel.IN_APP:
                errors["sensitive"] = serializers.ErrorDetail(
                    "sensitive content never goes to an inbox: an item is kept and listed for weeks (docs/APP.md); "
                    "send it by sms, email or push", code="sensitive_not_in_app")
            errors.update(priority_category_errors(attrs["priority"], attrs["category"]))
        errors.update(channel_available_errors(attrs["channel"]))
        if errors:
            raise serializers.ValidationError(errors)
        found = _RECIPIENT.models(attrs["user_id"])
        recipient = found[0] if found else None
        if recipient is None:
            raise serializers.ValidationError({"user_id": serializers.ErrorDetail(
                f"unknown user; create it with PUT /v1/users/{attrs['user_id']}", code="unknown_user")})
        attrs["recipient"] = recipient
        return attrs


def checks_busy(message: str) -> Busy:
    """503 ``template_checks_busy`` with ``Retry-After``: no template-check slot of this process
    freed in time (:class:`notifications.rendering.checking.ChecksBusy`); nothing is saved."""
    return Busy(ChecksBusy.code, message, busy_retry_after())


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
    if shows_nothing(body):  # blank, or only invisible characters (zero-width, fillers, braille blank)
        errors[f"{prefix}.body"] = serializers.ErrorDetail("must not be blank (nothing in it shows)", code="blank")
    if channel == Channel.SMS:
        if len(body) > SMS_MAX_CHARS:
            errors[f"{prefix}.body"] = serializers.ErrorDetail(
                f"SMS body is {len(body)} characters; at most {SMS_MAX_CHARS}", code="max_length")
        for name in ("title", "html", "data"):
            if content.get(name):
                errors[f"{prefix}.{name}"] = serializers.ErrorDetail(
                    f"not used by SMS; leave {name} out", code="not_allowed_for_channel")
    elif channel == Channel.EMAIL:
        title = content.get("title") or ""
        if shows_nothing(title):
            errors[f"{prefix}.title"] = serializers.ErrorDetail("email needs a subject in title (one that shows)",
                                                                code="required")
        elif "\r" in title or "\n" in title:
            errors[f"{prefix}.title"] = serializers.ErrorDetail(
                "an email subject is one line: no line breaks (\\r, \\n)", code="line_break")
        data = content.get("data") or {}
        _data_key_errors(errors, prefix, data, lambda key: platform_key_problem(key, "every email's custom_args"))
        size = json_bytes(data) if data else 0
        if size > EMAIL_DATA_MAX_BYTES:
            errors[f"{prefix}.data"] = serializers.ErrorDetail(
                f"email data (SendGrid custom_args, as JSON) is {size} bytes; at most {EMAIL_DATA_MAX_BYTES}",
                code="payload_too_large")
    elif channel == Channel.IN_APP:
        if content.get("html"):
            errors[f"{prefix}.html"] = serializers.ErrorDetail("not used by in_app; leave html out",
                                                               code="not_allowed_for_channel")
        if len(body) > INBOX_BODY_MAX_CHARS:
            errors[f"{prefix}.body"] = serializers.ErrorDetail(
                f"an inbox body is {len(body)} characters; at most {INBOX_BODY_MAX_CHARS}", code="max_length")
        for part in ("title", "body"):
            problem = inbox_text_problem(part, content.get(part) or "")
            if problem:
                errors[f"{prefix}.{part}"] = serializers.ErrorDetail(problem, code="control_character")
        for path, problem in inbox_data_problems(content.get("data")).items():
            errors[f"{prefix}.{path}"] = serializers.ErrorDetail(problem, code="control_character")
        size = json_bytes(content.get("data")) if content.get("data") else 0
        if size > INBOX_DATA_MAX_BYTES:
            errors[f"{prefix}.data"] = serializers.ErrorDetail(
                f"inbox data (as JSON) is {size} bytes; at most {INBOX_DATA_MAX_BYTES}", code="payload_too_large")
    elif channel == Channel.PUSH:
        if content.get("html"):
            errors[f"{prefix}.html"] = serializers.ErrorDetail("not used by push; leave html out",
                                                               code="not_allowed_for_channel")
        _data_key_errors(errors, prefix, content.get("data") or {}, data_key_problem)
        payload = {k: content[k] for k in ("title", "body", "data") if content.get(k)}
        size = json_bytes(payload)
        if size > PUSH_MAX_BYTES:
            errors[prefix] = serializers.ErrorDetail(
                f"push payload (title+body+data as JSON) is {size} bytes; at most {PUSH_MAX_BYTES}",
                code="payload_too_large")
    return errors


def _data_key_errors(errors: dict, prefix: str, data: dict, problem_of) -> None:
    """Add a ``reserved_key`` error on ``{prefix}.data.{key}`` for each key ``problem_of`` refuses."""
    for key in data:
        problem = problem_of(key)
        if problem:
            errors[f"{prefix}.data.{key}"] = serializers.ErrorDetail(problem, code="reserved_key")




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
    """A notification with its status, reason and full timeline (content hidden when sensitive), live or
    archived (a :class:`~notifications.models.NotificationRecord` with its logs attached:
    :func:`notifications.records.with_logs`)."""

    user_id = serializers.CharField(source="recipient_id", read_only=True)
    type = serializers.CharField(source="notification_type_id", allow_null=True, read_only=True,
                                 help_text="The notification type it was made from (docs/TYPES.md); null: inline "
                                           "content or a campaign's.")
    event_id = serializers.UUIDField(allow_null=True, read_only=True, help_text="The event that made it, if any.")
    content = serializers.SerializerMethodField(
        help_text="null when the notification is `sensitive`; a campaign's notification has an empty title and "
                  "body: its content is the campaign's, rendered for the member when sent (GET /v1/campaigns/{id}).")
    timeline = EventSerializer(many=True, read_only=True)
    attempts_log = AttemptSerializer(many=True, read_only=True)
    scheduled_at = AwareDateTimeField(allow_null=True, read_only=True)

    class Meta:
        model = NotificationRecord
        fields = ["id", "user_id", "type", "event_id", "channel", "priority", "category", "status", "reason",
                  "reason_detail", "sensitive", "content", "metadata", "scheduled_at", "expires_at", "attempts",
                  "provider",
                  "provider_message_id", "created_at", "sent_at", "delivered_at", "timeline", "attempts_log"]
        read_only_fields = fields  # a response: every field is always present
        extra_kwargs = {"reason": {"allow_blank": True}}  # read-only drops it; "" is a value here

    @extend_schema_field(ContentSerializer(allow_null=True))
    def get_content(self, obj: NotificationRecord):
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
        fields = ["id", "user_id", "campaign_id", "type", "event_id", "channel", "priority", "category", "status",
                  "reason",
                  "reason_detail", "sensitive", "content", "metadata", "scheduled_at", "attempts", "provider",
                  "created_at",
                  "sent_at", "delivered_at"]
        read_only_fields = fields
