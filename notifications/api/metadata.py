"""``metadata``: the client's own keys on a send or an event (an order id, a tenant), stored with
each notification, returned on reads and in the status webhooks (docs/API.md, "Metadata"). Bounded,
flat and visible: at most :data:`MAX_KEYS` keys of :data:`KEY_PATTERN`, each value a string (≤
:data:`MAX_STRING`, no invisible character), a number, a boolean or null, :data:`MAX_BYTES` as JSON."""

from __future__ import annotations

import math
import re

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from core.identifiers import control_character_problem
from notifications.content_limits import json_bytes

MAX_KEYS = 20
MAX_STRING = 500
MAX_BYTES = 2048
KEY_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$"
_KEY = re.compile(KEY_PATTERN)


@extend_schema_field({"type": "object", "maxProperties": MAX_KEYS, "additionalProperties": {
    "nullable": True, "oneOf": [{"type": "string", "maxLength": MAX_STRING}, {"type": "number"}, {"type": "boolean"}]}})
class MetadataField(serializers.DictField):
    """The ``metadata`` object: each broken rule is a 422 on ``metadata`` or ``metadata.<key>``."""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("required", False)
        kwargs.setdefault("help_text", f"Your own keys for this send, returned on reads and in its status webhooks: at "
                                       f"most {MAX_KEYS} keys (letters, digits, _ . : -; at most 64), values strings "
                                       f"(≤ {MAX_STRING} characters), numbers, booleans or null; ≤ {MAX_BYTES} bytes "
                                       "as JSON.")
        super().__init__(child=serializers.JSONField(allow_null=True), **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        if len(value) > MAX_KEYS:
            raise serializers.ValidationError(f"{len(value)} keys; at most {MAX_KEYS}", code="too_many_keys")
        errors = {}
        for key, item in value.items():
            problem = _problem(key, item)
            if problem:
                errors[key] = serializers.ErrorDetail(problem[1], code=problem[0])
        if errors:
            raise serializers.ValidationError(errors)
        size = json_bytes(value)
        if size > MAX_BYTES:
            raise serializers.ValidationError(f"{size} bytes as JSON; at most {MAX_BYTES}", code="payload_too_large")
        return value


def _problem(key: str, item) -> tuple[str, str] | None:
    if not _KEY.match(key):
        return "invalid_key", "a key is 1-64 letters, digits, '_', '.', ':' or '-', not starting with '.', ':' or '-'"
    if isinstance(item, str):
        if len(item) > MAX_STRING:
            return "max_length", f"{len(item)} characters; at most {MAX_STRING}"
        problem = control_character_problem(item)
        return ("control_character", problem) if problem else None
    if isinstance(item, bool) or item is None:
        return None
    if isinstance(item, int | float):
        return None if not isinstance(item, float) or math.isfinite(item) else ("invalid", "a finite number")
    return "wrong_type", "a string, a number, a boolean or null (metadata is flat: no objects or lists)"
