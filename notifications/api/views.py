"""``/v1/notifications``: send, read, cancel. Views validate and call a service, nothing more."""

from __future__ import annotations

from collections.abc import Sequence

from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import ErrorDetail, ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import audit_notes, parameters
from core.api.errors import BODY, MissingScope, error_responses, field_error, response_headers
from core.api.pagination import Ordering, list_page, page_parameters, page_serializer
from core.api.reused import field_names, validator
from core.api.scopes import Scope
from notifications import records, services
from notifications.admission import high_gate_problem
from notifications.api.serializers import (
    AcceptedSerializer,
    CancelledSerializer,
    NotificationSerializer,
    NotificationSummarySerializer,
    SendRequestSerializer,
)
from notifications.api.typed import data_errors, type_for
from notifications.events import services as event_services
from notifications.models import Notification, Status
from notifications.readers import readable_notifications
from preferences.api.views import _USER_ID, recipient_or_404
from preferences.models import Channel

IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255

# What the server accepts is 1–255 printable characters; the schema documents the portable subset
# (visible ASCII, inner spaces), which is what HTTP header values can carry unambiguously.
IDEMPOTENCY_KEY_SCHEMA = {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH,
                          "pattern": r"^[!-~]([ -~]*[!-~])?$"}
IDEMPOTENCY_PARAMETERS = [
    OpenApiParameter(IDEMPOTENCY_HEADER, IDEMPOTENCY_KEY_SCHEMA, OpenApiParameter.HEADER, required=True,
                     description="Unique per request you mean to make once (1–255 printable characters). "
                                 "Same key + same body replays the original response; "
                                 "same key + different body is 422.",
                     examples=[OpenApiExample("key", value="signup-4711-otp")]),
    *response_headers(created=(202,)),
    OpenApiParameter("Idempotent-Replayed", str, OpenApiParameter.HEADER, enum=["true"], response=[202],
                     description="Present when this answer replays the one given to an earlier request "
                                 "with the same Idempotency-Key and body."),
]
#: The 429 and 503 of the create endpoints: an abuse limit at acceptance (docs/POLICIES.md).
ACCEPTANCE_ERRORS = {
    "_429": "Over this API client's rate limit (`throttled`), or over an abuse limit at acceptance "
            "(`acceptance_limited`: `limit` names it, e.g. `otp_per_user`; `retry_after` and `Retry-After` "
            "give the seconds until a slot frees). Nothing was written; a replay of an accepted request is "
            "never refused.",
    "_503": "`acceptance_limits_unavailable`: an abuse limit applies to this request and its windows (Redis) "
            "cannot be reached; or `database_unavailable` (Postgres restarting; with `Retry-After`). Nothing "
            "was written; retry shortly.",
}
_NOTIFICATION_404 = ("No notification with this id that this API client may read (its own single sends, and "
                     "the sends of its own campaigns and of those made in the admin).")


# --- the idempotent-accept protocol, shared by POST /v1/notifications and POST /v1/campaigns -----

def idempotency_key_problem(request) -> tuple[str, Response | None]:
    """The request's Idempotency-Key, and the 400 to answer instead when it is missing or invalid."""
    key = request.headers.get(IDEMPOTENCY_HEADER, "")
    if not key:
        return key, field_error(IDEMPOTENCY_HEADER, "required", "the Idempotency-Key header is required", 400)
    if len(key) > MAX_KEY_LENGTH or not key.isprintable():
        return key, field_error(IDEMPOTENCY_HEADER, "invalid", f"must be 1–{MAX_KEY_LENGTH} printable characters",
                                400)
    return key, None


def check_priority_scope(request, priority: str) -> None:
    """``priority: high`` needs the scope ``notifications:send_high`` as well. Raises MissingScope
    (403 ``missing_scope`` on the field ``priority``) when the API key lacks it."""
    why = high_gate_problem(request.auth, priority)
    if why:  # the gate's rule, asked before the request is validated further
        raise MissingScope(Scope.SEND_HIGH, field="priority", why=why)


def note_given_fields(request, serializer_class) -> None:
    """Audit (:mod:`notifications.audit`): a create changed the request's fields that the serializer knows."""
    known = field_names(serializer_class)
    audit_notes.note_fields(request, [k for k in request.data if k in known])


def key_reused() -> Response:
    return field_error(IDEMPOTENCY_HEADER, "idempotency_key_reused",
                       "this Idempotency-Key was already used with a different request body", 422)


def accepted(body: dict, location: str, replayed: bool) -> Response:
    """202 with ``Location``, and ``Idempotent-Replayed: true`` when it replays an earlier answer."""
    headers = {"Location": location}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return Response(body, status=status.HTTP_202_ACCEPTED, headers=headers)


class NotificationListView(APIView):
    required_scopes = {"post": Scope.SEND}
    scope_notes = {"post": "`priority: high` also needs `notifications:send_high` (403 `missing_scope` on "
                           "`priority`)."}
    audit_object = "notification"

    @extend_schema(
        summary="Send a notification to one user",
        request=SendRequestSerializer,
        parameters=IDEMPOTENCY_PARAMETERS,
        examples=[
            OpenApiExample("SMS one-time code", request_only=True, value={
                "user_id": "alice", "channel": "sms", "priority": "high",
                "content": {"body": "Your code is 123456"}, "sensitive": True, "ttl_seconds": 300}),
            OpenApiExample("Email", request_only=True, value={
                "user_id": "alice", "channel": "email", "category": "security",
                "content": {"title": "New sign-in", "body": "You signed in from a new device.",
                            "html": "<p>You signed in from a new device.</p>"}}),
            OpenApiExample("Push", request_only=True, value={
                "user_id": "alice", "channel": "push",
                "content": {"title": "New message", "body": "Bob wrote to you", "data": {"screen": "inbox"}}}),
        ],
        responses={202: OpenApiResponse(AcceptedSerializer, description="Accepted (or replayed: see "
                                                                        "`Idempotent-Replayed`)."),
                   **error_responses(*BODY, 403, 422, 503, **ACCEPTANCE_ERRORS)},
    )
    def post(self, request):
        key, problem = idempotency_key_problem(request)
        if problem:
            return problem
        ser = validator(SendRequestSerializer, request.data)  # made once per thread (core/api/reused.py)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        client = request.auth
        if "type" in data:
            return _typed_send(request, key, data)
        check_priority_scope(request, data["priority"])
        try:
            result = services.accept_notification(
                client=client, idempotency_key=key,
                # Over the validated request (defaults filled in, instants parsed), so a retry that
                # spells out a default or writes "Z" for "+00:00" is still the same request.
                fingerprint=services.request_fingerprint(_fingerprinted(data)),
                recipient=data["recipient"], channel=data["channel"], priority=data["priority"],
                content=data["content"], category=data["category"], scheduled_at=data["scheduled_at"],
                ttl_seconds=data["ttl_seconds"], sensitive=data["sensitive"], metadata=data["metadata"])
        except services.IdempotencyKeyReused:
            return key_reused()
        note_given_fields(request, SendRequestSerializer)
        n = result.notification
        return accepted({"id": str(n.pk), "status": n.accepted_status}, f"/v1/notifications/{n.pk}",
                        result.replayed)


def _fingerprinted(data: dict) -> dict:
    """The request as its fingerprint counts it: all but the loaded recipient, and ``metadata`` only
    when given (a request without it keeps the fingerprint it had before the field existed)."""
    return {k: v for k, v in data.items() if k != "recipient" and not (k == "metadata" and v is None)}


def _typed_send(request, key: str, data: dict) -> Response:
    """``POST /v1/notifications`` with ``type`` and ``data``: one notification on ``channel``, made from
    the type's template at send time (an event of one user and one channel, docs/TYPES.md)."""
    kind = type_for(request, data["type"])
    errors = data_errors(kind, data.get("data") or {})
    if data["channel"] not in kind.channels:
        errors["channel"] = ErrorDetail(f"type {kind.key} does not use {data['channel']} (its channels: "
                                        f"{', '.join(kind.channels)})", code="not_in_type")
    if errors:
        raise ValidationError(errors)
    fingerprint = services.request_fingerprint(_fingerprinted(data))
    try:
        result = event_services.accept_event(
            client=request.auth, idempotency_key=key, fingerprint=fingerprint, kind=kind,
            recipients=[data["recipient"]], data=data.get("data") or {}, scheduled_at=data["scheduled_at"],
            ttl_seconds=data["ttl_seconds"], channel=data["channel"], metadata=data["metadata"])
    except services.IdempotencyKeyReused:
        return key_reused()
    note_given_fields(request, SendRequestSerializer)
    (n,) = result.notifications
    return accepted({"id": str(n.pk), "status": n.accepted_status}, f"/v1/notifications/{n.pk}", result.replayed)


def _own(request, notification_id):
    return Notification.objects.filter(pk=notification_id, client=request.auth)


def _readable(request, notification_id):
    """The notification if this client may read it, live or archived
    (:func:`notifications.readers.readable_notifications`, the rule ``GET /v1/users/{id}/notifications``
    lists by too)."""
    return readable_notifications(request.auth).filter(pk=notification_id)


class NotificationDetailView(APIView):
    required_scopes = {"get": Scope.READ}

    @extend_schema(summary="A notification's status, reason and timeline", parameters=response_headers(),
                   responses={200: NotificationSerializer, **error_responses(404, _404=_NOTIFICATION_404)})
    def get(self, request, notification_id):
        n = _readable(request, notification_id).first()
        if n is None:
            return field_error("notification_id", "not_found",
                               "no notification with this id that this API client may read", 404,
                               error_code="not_found")
        return Response(NotificationSerializer(records.with_logs([n])[0]).data)


class NotificationCancelView(APIView):
    required_scopes = {"post": Scope.SEND}
    audit_object = "notification"

    @extend_schema(summary="Cancel a notification no worker has claimed yet", request=None,
                   parameters=response_headers(),
                   responses={200: CancelledSerializer,
                              **error_responses(404, 409, _404="No single send with this id by this API client.",
                                                _409="A worker has claimed it already, or it is final.")})
    def post(self, request, notification_id):
        try:
            n = services.cancel_notification(notification_id, client=request.auth)
        except Notification.DoesNotExist:
            return field_error("notification_id", "not_found", "no notification with this id for this API client", 404,
                               error_code="not_found")
        except services.NotCancellable as exc:
            return field_error("status", "not_cancellable", str(exc), 409, error_code="conflict")
        audit_notes.note_fields(request, ["status"])
        return Response({"id": str(n.pk), "status": n.status})


_NEWEST_FIRST = Ordering(("created_at", "id"), descending=True)
_USER_NOTIFICATION_FILTERS: dict[str, Sequence[str] | parameters.IdRule] = {
    "status": Status.values, "channel": Channel.values, "category": parameters.CATEGORY}


class UserNotificationsView(APIView):
    """What this client sent to one user, newest first: the user's notifications it may read
    (:func:`notifications.readers.readable_notifications`: its own single sends, and the sends of its
    own campaigns and of those made in the admin), as ``GET /v1/notifications/{id}`` reads them."""

    required_scopes = {"get": Scope.READ}

    @extend_schema(
        operation_id="v1_users_notifications_list",
        summary="A user's notifications this client may read, newest first (keyset pagination)",
        description="The user's notifications that `GET /v1/notifications/{id}` opens for this client: its "
                    "own single sends, and the sends of its own campaigns and of those made in the admin. "
                    "Other clients' messages to the same user are not listed (support reads them in the "
                    "admin).",
        parameters=[_USER_ID, *page_parameters(status=(Status.values, "Only notifications in this status."),
                                     channel=(Channel.values, "Only this channel."),
                                     category=(parameters.CATEGORY, "Only this category.")),
                    *response_headers()],
        responses={200: page_serializer("NotificationPage", NotificationSummarySerializer()),
                   **error_responses(404, 422, _404="Unknown user_id.",
                                     _422="A bad query parameter or path id; `field` names it.")})
    def get(self, request, user_id: str):
        recipient = recipient_or_404(user_id)
        listing = ("user_notifications", recipient.pk, recipient.erasure_mark())  # no cursor outlives an erasure
        return Response(list_page(request.query_params,
                                  readable_notifications(request.auth).filter(recipient=recipient),
                                  _NEWEST_FIRST, lambda rows: NotificationSummarySerializer(rows, many=True).data,
                                  _USER_NOTIFICATION_FILTERS, listing=listing))
