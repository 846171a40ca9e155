"""Request/response shapes for recipients, preferences and devices."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.api.fields import RejectUnknownFields, TextField, WallTimeField
from core.identifiers import MAX_PUSH_TOKEN_LENGTH, no_control_pattern, push_token_problem
from core.vocabulary import CATEGORY_PATTERN, LOCALE_PATTERN, TYPE_KEY_PATTERN
from preferences import suppression
from preferences.api.effective import REQUIRED
from preferences.models import Channel, Device, Erasure, Recipient
from preferences.validation import normalize_phone, validate_iana_zone


@extend_schema_field({"type": "string", "maxLength": 35, "pattern": LOCALE_PATTERN.pattern})
class LocaleField(serializers.CharField):
    """A BCP 47 language tag (or empty: drf-spectacular adds that alternative for ``allow_blank``);
    the pattern is checked by ``validate_locale`` (``invalid_locale``)."""


def _run(validator, value):
    try:
        return validator(value)
    except DjangoValidationError as exc:
        raise serializers.ValidationError(exc.messages[0], code=exc.code) from None


#: A recipient's attributes: at most this many, each named like an identifier (templates read them).
MAX_ATTRIBUTES = 50
ATTRIBUTE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


class RecipientSerializer(RejectUnknownFields, serializers.Serializer):
    """A recipient's contacts. PUT replaces them all: an omitted field becomes empty."""

    #: The attributes' count in the OpenAPI schema too; their names' rule is in the field's description
    #: (a pattern for property names, ``propertyNames``, is JSON Schema that OpenAPI 3.0 lacks).
    schema_rules = {"allOf": [{"properties": {"attributes": {"maxProperties": MAX_ATTRIBUTES}}}]}

    user_id = serializers.CharField(read_only=True)
    email = serializers.EmailField(required=False, allow_blank=True, max_length=254, default="")
    phone = serializers.CharField(required=False, allow_blank=True, max_length=32, default="",
                                  help_text="International format; stored as E.164.")
    timezone = serializers.CharField(required=False, allow_blank=True, max_length=64, default="",
                                     help_text="IANA zone name, e.g. Europe/Berlin.")
    locale = LocaleField(required=False, allow_blank=True, max_length=35, default="",
                         help_text="BCP 47 language tag, e.g. de-DE.")
    attributes = serializers.DictField(child=TextField(max_length=1000, allow_blank=True),
                                       required=False, default=dict,
                                       help_text=f"String attributes usable in templates ({{{{ first_name }}}}): "
                                                 f"at most {MAX_ATTRIBUTES}; each name a letter or `_`, then "
                                                 f"letters, digits or `_`, at most 64 (`{ATTRIBUTE_NAME.pattern}`, "
                                                 "422 `invalid_name`; OpenAPI 3.0 cannot state a pattern for "
                                                 "property names).")
    email_invalid_reason = serializers.CharField(read_only=True)
    phone_invalid_reason = serializers.CharField(read_only=True)

    def validate_phone(self, value: str) -> str:
        return _run(normalize_phone, value) if value else ""

    def validate_timezone(self, value: str) -> str:
        return _run(validate_iana_zone, value) if value else ""

    def validate_attributes(self, value: dict) -> dict:
        if len(value) > MAX_ATTRIBUTES:
            raise serializers.ValidationError(f"at most {MAX_ATTRIBUTES} attributes", code="max_length")
        for key in value:
            if not ATTRIBUTE_NAME.match(key):
                raise serializers.ValidationError(
                    f"attribute name '{key[:70]}' must be an identifier (letters, digits, _; ≤ 64)",
                    code="invalid_name")
        return value

    def validate_locale(self, value: str) -> str:
        if value and not LOCALE_PATTERN.match(value):
            raise serializers.ValidationError("not a BCP 47 language tag like 'en' or 'de-DE'", code="invalid_locale")
        return value


class QuietHoursSerializer(RejectUnknownFields, serializers.Serializer):
    start = WallTimeField(help_text="Local wall-clock start, inclusive (HH:MM).")
    end = WallTimeField(help_text="Local wall-clock end, exclusive (HH:MM); may be before start "
                                  "(the window crosses midnight); must differ from start as a time, so `7:5` "
                                  "and `07:05` are equal (422 `empty_window`: send `quiet_hours: null` for no "
                                  "window; OpenAPI cannot compare two properties).")
    timezone = serializers.CharField(required=False, allow_blank=True, max_length=64, default="",
                                     help_text="IANA zone; defaults to the recipient's timezone, then UTC.")

    def validate_timezone(self, value: str) -> str:
        return _run(validate_iana_zone, value) if value else ""

    def validate(self, attrs):
        if attrs["start"] == attrs["end"]:
            raise serializers.ValidationError({"end": serializers.ErrorDetail(
                "must differ from start (an empty window is no window: send null instead)", code="empty_window")})
        return attrs


#: At most this many keys in ``category_opt_outs`` and in ``type_opt_outs``.
MAX_CATEGORY_OPT_OUTS = 100
MAX_TYPE_OPT_OUTS = 200
#: Every ``reason`` of an effective-matrix entry: ``""`` (allowed), the suppression rule's codes,
#: ``required`` (allowed: an opt-out the type's ``required`` flag overrides).
EFFECTIVE_REASONS = ("", *suppression.REASONS, REQUIRED)


@extend_schema_field({"type": "string", "enum": list(EFFECTIVE_REASONS)})
class EffectiveReasonField(serializers.CharField):
    """An effective-matrix entry's reason: one of :data:`EFFECTIVE_REASONS` (the schema's
    ``EffectiveReasonEnum``, named in ``SPECTACULAR_SETTINGS["ENUM_NAME_OVERRIDES"]``: a notification's
    own ``reason`` is another set)."""


class ChannelsByKeyField(serializers.DictField):
    """``{key: [channel…]}`` (a category's or a notification type's opt-outs): at most ``max_keys``
    keys (checked by the serializer's ``validate_<field>``, which also checks the keys' rule), each
    with at most 3 channels by the channel rule; the schema states ``maxProperties``."""

    def __init__(self, *, max_keys: int, **kwargs) -> None:
        self.max_keys = max_keys
        child = serializers.ListField(child=serializers.ChoiceField(choices=Channel.choices), max_length=4)
        super().__init__(child=child, **kwargs)


class ChannelsByKeySchema(OpenApiSerializerFieldExtension):
    """The schema of a :class:`ChannelsByKeyField`: drf-spectacular's object of channel arrays, plus
    ``maxProperties``."""

    target_class = ChannelsByKeyField

    def map_serializer_field(self, auto_schema, direction):
        schema = auto_schema._map_serializer_field(self.target, direction, bypass_extensions=True)
        return schema | {"maxProperties": self.target.max_keys}


class EffectiveEntrySerializer(serializers.Serializer):
    """One notification type on one of its channels: whether it may reach the recipient, and why not."""

    # Every field is read-only (an answer only), so the schema has no request form of this component.
    type = serializers.RegexField(TYPE_KEY_PATTERN.pattern, max_length=64, read_only=True,
                                 help_text="The notification type's key.")
    category = serializers.RegexField(CATEGORY_PATTERN.pattern, max_length=64, read_only=True,
                                      help_text="The type's category (what category_opt_outs name).")
    channel = serializers.ChoiceField(choices=Channel.choices, read_only=True)
    allowed = serializers.BooleanField(
        read_only=True, help_text="Whether a notification of this type may reach the recipient on this channel "
                                  "now (quiet hours only defer, never forbid).")
    reason = EffectiveReasonField(
        read_only=True, help_text="Not allowed: why (the suppressed reason a send would get: opted_out_channel, "
                                  "opted_out_category, opted_out_type, no_phone, phone_invalid, sms_stopped, "
                                  "no_email, email_invalid, no_active_device). Allowed: empty, or `required` when "
                                  "an opt-out exists that the type's required flag overrides.")
    required = serializers.BooleanField(
        read_only=True, help_text="The type is required (security, legal): opt-outs do not apply to it; contacts "
                                  "and SMS STOP still do.")


def _keys_by_rule(value: dict, most: int, what: str, pattern, code: str, message: str) -> dict:
    """``value`` (``{key: [channel…]}``) if it has at most ``most`` keys, each matching ``pattern``;
    else ValidationError ``max_length`` or ``code`` (``message`` with the key, cut to 70)."""
    if len(value) > most:
        raise serializers.ValidationError(f"at most {most} {what}", code="max_length")
    for key in value:
        if not pattern.match(key):
            raise serializers.ValidationError(message.format(key[:70]), code=code)
    return value


class PreferencesSerializer(RejectUnknownFields, serializers.Serializer):
    """A recipient's opt-outs and quiet hours. PUT replaces them all: an omitted field becomes empty.
    The answer (GET and PUT) adds `effective`, the matrix those preferences give."""

    opt_outs = serializers.ListField(child=serializers.ChoiceField(choices=Channel.choices), required=False,
                                     default=list, max_length=4)
    category_opt_outs = ChannelsByKeyField(max_keys=MAX_CATEGORY_OPT_OUTS, required=False, default=dict)
    type_opt_outs = ChannelsByKeyField(
        max_keys=MAX_TYPE_OPT_OUTS, required=False, default=dict,
        help_text=f"Opted out of single notification types: {{type key: [channel…]}}, e.g. "
                  f'{{"new_follower": ["push"]}}; at most {MAX_TYPE_OPT_OUTS} keys, each a type key '
                  "(lower-case letters, digits, '_', '-'; at most 64). A key need not name a type that exists "
                  "yet (types may be created later); it applies once one does. Ignored by required types.")
    quiet_hours = QuietHoursSerializer(required=False, allow_null=True, default=None)
    effective = EffectiveEntrySerializer(
        many=True, read_only=True,
        help_text="The effective matrix: every notification type on each of its channels (sorted by type key, "
                  "then the type's channel order), allowed or not and why, from these preferences and the "
                  "recipient's contacts, active devices and SMS STOPs. Read-only (ignored in a PUT body).")

    def validate_category_opt_outs(self, value: dict) -> dict:
        return _keys_by_rule(value, MAX_CATEGORY_OPT_OUTS, "categories", CATEGORY_PATTERN, "invalid_category",
                             "category '{}' must be lower-case letters, digits, '_', '.', '-' (at most 64), as "
                             "categories are on sends")

    def validate_type_opt_outs(self, value: dict) -> dict:
        return _keys_by_rule(value, MAX_TYPE_OPT_OUTS, "notification types", TYPE_KEY_PATTERN, "invalid_type_key",
                             "notification type '{}' must be a type key: lower-case letters, digits, '_', '-' "
                             "(at most 64), starting with a letter or digit")

    def to_representation(self, prefs):
        """The stored preferences (``prefs``: a :class:`~preferences.models.Preferences` or ``None``),
        without ``effective`` (the view adds it: it needs the recipient's other facts)."""
        quiet = None
        if prefs is not None and prefs.quiet_start is not None:
            quiet = {"start": prefs.quiet_start.strftime("%H:%M"), "end": prefs.quiet_end.strftime("%H:%M"),
                     "timezone": prefs.quiet_timezone}
        return {
            "opt_outs": list(prefs.opt_outs) if prefs else [],
            "category_opt_outs": dict(prefs.category_opt_outs) if prefs else {},
            "type_opt_outs": dict(prefs.type_opt_outs) if prefs else {},
            "quiet_hours": quiet,
        }


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": MAX_PUSH_TOKEN_LENGTH,
                       "pattern": no_control_pattern(MAX_PUSH_TOKEN_LENGTH)})
class PushTokenField(serializers.CharField):
    """A push token, by the one token rule (:func:`preferences.validation.push_token_problem`) that
    ``DELETE /v1/users/{id}/devices/{push_token}`` applies too: a token that can be registered can be
    removed. Taken as given (never trimmed); code ``invalid``."""

    def __init__(self, **kwargs) -> None:
        super().__init__(max_length=MAX_PUSH_TOKEN_LENGTH, trim_whitespace=False, **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        # Empty and overlong values are left to DRF's own checks (codes ``blank``, ``max_length``).
        problem = push_token_problem(value) if 0 < len(value) <= MAX_PUSH_TOKEN_LENGTH else ""
        if problem:
            raise serializers.ValidationError(f"a push token {problem}", code="invalid")
        return value


class DeviceSerializer(RejectUnknownFields, serializers.ModelSerializer):
    # FCM registration tokens are ~160 characters, APNs tokens 64 hex digits; 1,024 leaves room
    # and stays well inside what the unique index can hold.
    push_token = PushTokenField()

    class Meta:
        model = Device
        fields = ["platform", "push_token", "active", "deactivated_reason", "registered_at"]
        read_only_fields = ["active", "deactivated_reason", "registered_at"]


def recipient_payload(recipient: Recipient) -> dict:
    return RecipientSerializer(recipient).data | {"user_id": recipient.user_id}


class ErasureSerializer(serializers.ModelSerializer):
    """The record of an erasure: who asked, when, and what was removed (counts only)."""

    user_id = serializers.CharField(source="recipient_id", read_only=True)
    replayed = serializers.SerializerMethodField(help_text="true when nothing was left to erase and this is the "
                                                           "record of the earlier erasure.")

    class Meta:
        model = Erasure
        fields = ["user_id", "erased_at", "requested_by", "contacts_erased", "devices_deleted", "preferences_deleted",
                  "segment_memberships_removed", "notifications_erased", "notifications_cancelled", "replayed"]
        read_only_fields = fields

    def get_replayed(self, obj) -> bool:
        return bool(self.context.get("replayed"))
