"""``/v1/notifications``: send, read, cancel. Views validate and call a service, nothing more."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from notifications import services
from notifications.api.errors import field_error
from notifications.api.serializers import AcceptedSerializer, NotificationSerializer, SendRequestSerializer
from notifications.models import Notification, Priority

IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY_LENGTH = 255

_ERROR = OpenApiResponse(description="`{error: {status, code, message, fields: [{field, code, message}]}}`")


class NotificationListView(APIView):
    @extend_schema(
        summary="Send a notification to one user",
        request=SendRequestSerializer,
        parameters=[OpenApiParameter(IDEMPOTENCY_HEADER, str, OpenApiParameter.HEADER, required=True,
                                     description="Unique per request you mean to make once (≤ 255 chars). "
                                                 "Same key + same body replays the original response; "
                                                 "same key + different body is 422.")],
        responses={202: AcceptedSerializer, 400: _ERROR, 401: _ERROR, 403: _ERROR, 422: _ERROR, 429: _ERROR},
    )
    def post(self, request):
        key = request.headers.get(IDEMPOTENCY_HEADER, "")
        if not key:
            return field_error(IDEMPOTENCY_HEADER, "required", "the Idempotency-Key header is required", 400)
        if len(key) > MAX_KEY_LENGTH or not key.isprintable():
            return field_error(IDEMPOTENCY_HEADER, "invalid",
                               f"must be 1–{MAX_KEY_LENGTH} printable characters", 400)
        ser = SendRequestSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        client = request.auth
        if data["priority"] == Priority.HIGH and not client.allow_high:
            return field_error("priority", "not_permitted", "this API client may not send priority=high", 403,
                               error_code="permission_denied")
        try:
            result = services.accept_notification(
                client=client, idempotency_key=key,
                # Over the validated request (defaults filled in, instants parsed), so a retry that
                # spells out a default or writes "Z" for "+00:00" is still the same request.
                fingerprint=services.request_fingerprint({k: v for k, v in data.items() if k != "recipient"}),
                recipient=data["recipient"], channel=data["channel"], priority=data["priority"],
                content=data["content"], category=data["category"], scheduled_at=data["scheduled_at"],
                ttl_seconds=data["ttl_seconds"], sensitive=data["sensitive"])
        except services.IdempotencyKeyReused:
            return field_error(IDEMPOTENCY_HEADER, "idempotency_key_reused",
                               "this Idempotency-Key was already used with a different request body", 422)
        n = result.notification
        headers = {"Location": f"/v1/notifications/{n.pk}"}
        if result.replayed:
            headers["Idempotent-Replayed"] = "true"
        return Response({"id": str(n.pk), "status": n.accepted_status}, status=status.HTTP_202_ACCEPTED,
                        headers=headers)


def _own(request, notification_id):
    return Notification.objects.filter(pk=notification_id, client=request.auth)


class NotificationDetailView(APIView):
    @extend_schema(summary="A notification's status, reason and timeline",
                   responses={200: NotificationSerializer, 404: _ERROR})
    def get(self, request, notification_id):
        n = (_own(request, notification_id).select_related("recipient")
             .prefetch_related("events", "attempts_log__device").first())
        if n is None:
            return field_error("id", "not_found", "no notification with this id for this API client", 404,
                               error_code="not_found")
        return Response(NotificationSerializer(n).data)


class NotificationCancelView(APIView):
    @extend_schema(summary="Cancel a notification no worker has claimed yet", request=None,
                   responses={200: AcceptedSerializer, 404: _ERROR, 409: _ERROR})
    def post(self, request, notification_id):
        try:
            n = services.cancel_notification(notification_id, client=request.auth)
        except Notification.DoesNotExist:
            return field_error("id", "not_found", "no notification with this id for this API client", 404,
                               error_code="not_found")
        except services.NotCancellable as exc:
            return field_error("status", "not_cancellable", str(exc), 409, error_code="conflict")
        return Response({"id": str(n.pk), "status": n.status})
