"""What a request that names a notification type may do with it (``POST /v1/events`` and a typed
``POST /v1/notifications`` alike): which types a client may trigger, and the rules of event data."""

from __future__ import annotations

import json

from django.db.models import Q
from rest_framework import serializers

from core.api.errors import MissingScope
from core.api.fields import nearest
from core.api.refusals import NotOwner
from core.api.scopes import Scope
from notifications.admission import high_gate_problem
from notifications.events.models import NotificationType

#: An event's ``data`` as JSON, at most (bytes).
DATA_MAX_BYTES = 16 * 1024


def type_for(request, key: str, field: str = "type") -> NotificationType:
    """The type an event (or typed send) of this client may use: its own or one defined in the admin;
    a ``high`` type needs ``notifications:send_high``. Raises ValidationError (422 ``unknown_type``:
    "did you mean" a near key it may use, else how to define one), NotOwner or MissingScope (403)
    naming ``field``."""
    kind = NotificationType.objects.filter(pk=key).first()
    if kind is None:
        usable = NotificationType.objects.filter(Q(client__isnull=True) | Q(client=request.auth))
        near = nearest(key, usable.values_list("key", flat=True))
        hint = f"did you mean {near}?" if near else f"define it with PUT /v1/notification-types/{key}"
        raise serializers.ValidationError({field: serializers.ErrorDetail(
            f"no notification type {key!r}; {hint}", code="unknown_type")})
    if kind.client_id is not None and kind.client_id != request.auth.pk:
        raise NotOwner(field, "this notification type belongs to another API client")
    why = high_gate_problem(request.auth, "", kind)
    if why:  # the gate's rule (notifications.admission), asked before the data is validated
        raise MissingScope(Scope.SEND_HIGH, field=field, why=why)
    return kind


def data_errors(kind: NotificationType, data: dict, prefix: str = "data") -> dict:
    """``{path: ErrorDetail}`` for event data: at most 16 KB as JSON, and every key the type requires."""
    errors = {}
    size = len(json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode())
    if size > DATA_MAX_BYTES:
        errors[prefix] = serializers.ErrorDetail(f"event data is {size} bytes as JSON; at most {DATA_MAX_BYTES}",
                                                 code="payload_too_large")
    for name in kind.required_data or []:
        if data.get(name) in (None, ""):
            errors[f"{prefix}.{name}"] = serializers.ErrorDetail(
                f"type {kind.key} requires {name} in data (its templates use it)", code="required")
    return errors


