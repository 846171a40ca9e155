"""Serializer fields and the strict-input mixin every API of the platform shares: unknown fields and
wrong JSON types are refused by name (422 ``unknown_field`` / ``invalid_type``), aware datetimes
only, ``HH:MM`` wall times, categories and labels. Raised errors are DRF ``ValidationError``s, shaped by
:func:`core.api.errors.exception_handler`."""

from __future__ import annotations

import difflib
import json
import math
from datetime import UTC, timedelta

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.settings import api_settings

from core.identifiers import no_control_pattern, problem_code, text_problem
from core.vocabulary import CATEGORY_PATTERN


def _json_type(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)  # type: ignore[call-overload]


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
        shown = got
        if expected == "integer" and got == "number":
            # 1e2 is 100 but written as a float; 1.5 has a fraction: say which.
            number = float(value)
            shown = ("a number out of range" if not math.isfinite(number)
                     else "a number in float notation (write it without a fraction or exponent)"
                     if number.is_integer() else "a number with a fraction")
        return {path: serializers.ErrorDetail(f"must be a JSON {expected}, not {shown}", code="invalid_type")}
    errors: dict[str, serializers.ErrorDetail] = {}
    child = getattr(field, "child", None)
    if child is not None and not isinstance(child, serializers.BaseSerializer):
        items = enumerate(value) if expected == "array" else value.items()
        for key, item in items:
            errors.update(strict_type_errors(child, item, f"{path}.{key}"))
    return errors


def nearest(given: str, known) -> str | None:
    """The one name of ``known`` near enough to ``given`` to be what was meant (difflib, cutoff 0.75),
    or None: ``opt_out`` → ``opt_outs``. Every "did you mean" of the API (fields, query parameters,
    type keys) asks here."""
    near = difflib.get_close_matches(given, list(known), n=1, cutoff=0.75) if len(given) <= 100 else []
    return near[0] if near else None


def unknown_field_message(key: str, known) -> str:
    """``"unknown field"``, and the nearest known name if one is near (:func:`nearest`): ``opt_out`` →
    ``"unknown field; did you mean opt_outs?"``."""
    near = nearest(key, known)
    return f"unknown field; did you mean {near}?" if near else "unknown field"


def list_choices(field) -> None:
    """Make ``field``'s ``invalid_choice`` message (and its children's: a list or map of choices) name
    the valid values: ``"fax" is not a valid choice; one of: sms, email, push, in_app``. A message
    a serializer wrote itself is kept."""
    default = serializers.ChoiceField.default_error_messages["invalid_choice"]
    if isinstance(field, serializers.ChoiceField) and field.error_messages.get("invalid_choice") == default:
        valid = ", ".join(str(choice) for choice in field.choices).replace("{", "{{").replace("}", "}}")
        field.error_messages["invalid_choice"] = f'"{{input}}" is not a valid choice; one of: {valid}'
    child = getattr(field, "child", None)
    if child is not None and not isinstance(child, serializers.BaseSerializer):
        list_choices(child)


class RejectUnknownFields:
    """Serializer mixin for request bodies: a key the serializer does not know is a 422 naming it
    (``unknown_field``, suggesting the nearest known name), so a typo (``opt_out`` for ``opt_outs``)
    can never silently replace data with defaults; JSON types are strict (:func:`strict_type_errors`,
    ``invalid_type``); and a wrong choice lists the valid ones (:func:`list_choices`)."""

    def get_fields(self):
        fields = super().get_fields()
        for field in fields.values():
            list_choices(field)
        return fields

    def to_internal_value(self, data):
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                writable = [name for name, field in self.fields.items() if not field.read_only]
                # An empty key, or one spelled like DRF's own "non_field_errors", is quoted so that the
                # error still names it (found by tests/test_api_generated.py: the field came out null).
                raise serializers.ValidationError({
                    json.dumps(key) if key in ("", api_settings.NON_FIELD_ERRORS_KEY) else key:
                    [serializers.ErrorDetail(unknown_field_message(key, writable), code="unknown_field")]
                    for key in unknown})
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
    """ISO 8601 instant that must carry a UTC offset or ``Z``; naive times are rejected. Returned in
    UTC: Python accepts offsets up to ±23:59 where Postgres stops at ±15:59, and an instant whose UTC
    form falls outside years 1–9999 is kept as given when its offset is one Postgres takes, else
    refused (``out_of_range``)."""

    default_error_messages = {
        "out_of_range": "its UTC instant is outside the years 1–9999",
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
        try:
            return value.astimezone(UTC)
        except OverflowError:  # UTC is before year 1 or after 9999: Postgres takes it with a small offset
            if abs(value.utcoffset()) < timedelta(hours=16):
                return value  # (the caller's own range rule, e.g. too_far_past, then names it)
            self.fail("out_of_range")

    def to_representation(self, value):
        return value.isoformat() if value else None


@extend_schema_field({"type": "string", "pattern": CATEGORY_PATTERN.pattern, "maxLength": 64})
class CategoryField(serializers.CharField):
    """A category name (or empty: drf-spectacular adds that alternative for ``allow_blank``, so the
    pattern must not match "" too, or ``oneOf`` refuses it); checked by ``validate_category``
    (``invalid_category``)."""


MAX_LABEL_LENGTH = 200


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": MAX_LABEL_LENGTH,
                      "pattern": no_control_pattern(MAX_LABEL_LENGTH, name=True)})
class LabelField(serializers.CharField):
    """A one-line name shown in lists and logs (a segment's, a template's, a campaign's): at most
    MAX_LABEL_LENGTH characters, no invisible character (:func:`core.identifiers.text_problem`: a line
    break, a terminal escape or a bidirectional override in an admin list or a log line); code
    ``control_character``. Any script is fine. (Or empty, where ``allow_blank``: drf-spectacular adds
    that alternative.)"""

    def __init__(self, **kwargs) -> None:
        super().__init__(max_length=MAX_LABEL_LENGTH, **kwargs)

    def to_internal_value(self, data):
        # Checked before DRF trims the surrounding whitespace, of which U+0085 is a part for Python.
        problem = text_problem(data) if isinstance(data, str) else ""
        if problem:
            raise serializers.ValidationError(f"a name {problem}", code=problem_code(problem))
        return super().to_internal_value(data)


class TextField(serializers.CharField):
    """A multi-line text shown to people (a segment's description, a recipient's attribute values):
    the rule of a type's description (:func:`core.identifiers.text_problem`, line breaks and tabs
    allowed), checked before DRF trims; code ``control_character``."""

    def to_internal_value(self, data):
        problem = text_problem(data, multiline=True) if isinstance(data, str) else ""
        if problem:
            raise serializers.ValidationError(f"a text {problem}", code=problem_code(problem))
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
