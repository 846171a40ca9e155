"""The audit log of API writes: :class:`AuditMiddleware` records every write under ``/v1/`` made with
a valid API key, after its answer, as one :class:`~notifications.models.APIAuditEntry`: who, what
(method, path, object, changed fields), when, and the outcome. Refusals are recorded; 401 (no one to
attribute) and 429 (would grow without bound) are not. Bodies are never stored: a view names its
changes with :func:`note_changes` or :func:`note_fields` (:mod:`core.api.audit_notes`, so every
app's views can note without importing this app); push tokens in paths read ``{push_token}``. It
learns the object's type from the view's ``audit_object``, so it imports nothing above this floor.
docs/API.md, "Audit log".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from django.db import DatabaseError, transaction

from core import clock
from core.api.audit_notes import changed_fields, note_changes, note_fields  # noqa: F401 (the views' API)
from notifications.models import APIAuditEntry, APIClient

log = logging.getLogger(__name__)

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
API_PREFIX = "/v1/"
#: Path parameters that are contacts, replaced by their name in the recorded path.
HIDDEN_PATH_PARAMETERS = ("push_token",)
#: Path parameters naming the object written, most specific first.
OBJECT_ID_PARAMETERS = ("notification_id", "campaign_id", "segment_id", "template_id", "user_id")


def storable(text: str, limit: int) -> str:
    """``text`` as Postgres can store it, at most ``limit`` characters: control characters (NUL cannot
    be stored) and lone surrogates become U+FFFD. (Paths and ids are the caller's, and a request
    refused for such a path id is recorded too.)"""
    return "".join("\ufffd" if ord(c) < 32 or ord(c) == 127 or 0xD800 <= ord(c) <= 0xDFFF else c
                   for c in text[:limit])


def _path(request) -> str:
    path = request.path
    kwargs = getattr(request.resolver_match, "kwargs", None) or {}
    for name in HIDDEN_PATH_PARAMETERS:
        value = kwargs.get(name)
        if value and path.endswith(value):
            path = path[: -len(value)] + "{" + name + "}"
    return storable(path, 500)


def _object(request, response) -> tuple[str, str]:
    match = request.resolver_match
    view_class = getattr(getattr(match, "func", None), "cls", None)
    object_type = getattr(view_class, "audit_object", "") or getattr(match, "url_name", "") or ""
    kwargs = getattr(match, "kwargs", None) or {}
    object_id = next((str(kwargs[k]) for k in OBJECT_ID_PARAMETERS if k in kwargs), "")
    data = getattr(response, "data", None)
    if not object_id and response.status_code < 400 and isinstance(data, Mapping):
        object_id = str(data.get("id") or "")  # created: POST /v1/notifications, /v1/campaigns
    return object_type[:32], storable(object_id, 255)


def _error_code(response) -> str:
    data = getattr(response, "data", None)
    if response.status_code >= 400 and isinstance(data, Mapping) and isinstance(data.get("error"), Mapping):
        return str(data["error"].get("code", ""))[:64]
    return ""


def record(request, response, client: APIClient) -> APIAuditEntry:
    """Store the audit entry of one answered write (see the module docstring for what is kept)."""
    object_type, object_id = _object(request, response)
    succeeded = response.status_code < 400 and not response.has_header("Idempotent-Replayed")
    fields = {"at": clock.now(), "client": client, "method": request.method, "path": _path(request),
              "object_type": object_type, "object_id": object_id, "status": response.status_code,
              "error_code": _error_code(response), "fields": getattr(request, "audit_fields", []) if succeeded else []}
    if not transaction.get_connection().in_atomic_block:
        return APIAuditEntry.objects.create(**fields)  # one statement, committed by itself (no BEGIN/COMMIT)
    with transaction.atomic():  # a savepoint inside a transaction: a failure here never breaks the caller's
        return APIAuditEntry.objects.create(**fields)


class AuditMiddleware:
    """Django middleware: after the answer, records an API write (see the module docstring). A failure
    to record is logged, never turned into an error: the write itself has already happened."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if request.method in WRITE_METHODS and request.path.startswith(API_PREFIX) and response.status_code != 429:
            client = getattr(request, "auth", None)
            if isinstance(client, APIClient):
                try:
                    record(request, response, client)
                except DatabaseError:
                    log.exception("API write not recorded in the audit log: %s %s by client %s",
                                  request.method, _path(request), client.pk)
        return response
