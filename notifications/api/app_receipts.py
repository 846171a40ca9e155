"""``POST /v1/notifications/{id}/receipts``: the app's ``displayed`` / ``opened`` / ``dismissed``,
reported by the product's backend (rules: :mod:`notifications.app_receipts`, docs/APP.md). The view
validates and calls the service, nothing more."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from core import clock
from core.api import audit_notes
from core.api.errors import BODY, MALFORMED_BODY, error_responses, field_error, response_headers
from core.api.fields import AwareDateTimeField, RejectUnknownFields
from core.api.scopes import Scope
from notifications import app_receipts
from notifications.models import Notification
from notifications.readers import readable_archived_notifications, readable_live_notifications

_SKEW = int(app_receipts.MAX_FUTURE_SKEW.total_seconds())
_EVENTS = ", ".join(app_receipts.EVENTS)


class AppReceiptSerializer(RejectUnknownFields, serializers.Serializer):
    """What the app saw happen to a push or in-app notification."""

    event = serializers.ChoiceField(
        choices=[(e, e) for e in app_receipts.EVENTS],
        error_messages={"invalid_choice": f'"{{input}}" is not an app receipt event; one of: {_EVENTS}'},
        help_text="`displayed` (shown on the device or in the inbox), `opened` (the user opened it), "
                  "`dismissed` (swiped away or closed unopened).")
    at = AwareDateTimeField(required=False, allow_null=True, default=None,
                            help_text=f"When the app saw it (ISO 8601 with offset). Default: now. At most {_SKEW} s "
                                      "ahead of the platform clock (422 `too_far_ahead`); an instant before the "
                                      "notification's last timeline entry, or a little ahead, is stored clamped "
                                      "so the timeline stays in order.")

    def validate_at(self, value):
        if value is not None and value - clock.now() > app_receipts.MAX_FUTURE_SKEW:
            raise serializers.ValidationError(f"at most {_SKEW} seconds ahead of now (the platform clock, UTC)",
                                              code="too_far_ahead")
        return value


class AppReceiptResultSerializer(serializers.Serializer):
    id = serializers.UUIDField(source="notification.pk", help_text="The notification.")
    event = serializers.CharField()
    duplicate = serializers.BooleanField(help_text="This event was already reported for this notification: nothing "
                                                   "changed (200).")
    status = serializers.CharField(source="notification.status",
                                   help_text="The notification's status now (`sent` < `delivered` < `displayed` < "
                                             "`dismissed` < `opened`).")
    status_changed = serializers.BooleanField(help_text="Whether this receipt moved the status up.")
    at = serializers.DateTimeField(help_text="The receipt's timeline instant (UTC): `at` as stored (clamped into "
                                             "order), or the first report's for a duplicate.")


_404 = ("No notification with this id that this API client may read (its own single sends, and the sends of its "
        "own campaigns and of those made in the admin); nothing was written.")


class NotificationReceiptView(APIView):
    required_scopes = {"post": Scope.RECEIPTS}
    audit_object = "notification"

    @extend_schema(
        summary="Report what the app saw: displayed, opened or dismissed (push and in_app)",
        description="Called by the product's backend on behalf of its app. Stored once per notification and "
                    "event; moves the status up only (`sent` < `delivered` < `displayed` < `dismissed` < "
                    "`opened`): a late `displayed` never regresses `opened`; every receipt that is not a "
                    "duplicate is one timeline entry (`app_displayed`, `app_opened`, `app_dismissed`), even when "
                    "the status stays. A notification whose provider call was never recorded (`sending`, or "
                    "waiting for a re-send after an unknown outcome) is settled as sent first. Its own scope, "
                    "`notifications:receipts` (not `notifications:send`): a receipt moves the status and the "
                    "campaign counts of every notification the key can read, admin campaigns' included, so only "
                    "the backend the app reports to holds it.",
        request=AppReceiptSerializer, parameters=response_headers(),
        examples=[OpenApiExample("Opened", request_only=True, value={"event": "opened", "at": "2026-12-02T09:15:00Z"}),
                  OpenApiExample("Displayed now", request_only=True, value={"event": "displayed"})],
        responses={
            201: OpenApiResponse(AppReceiptResultSerializer, description="Stored: one new timeline entry "
                                                                         "(`status_changed` says whether it moved "
                                                                         "the status)."),
            200: OpenApiResponse(AppReceiptResultSerializer, description="A duplicate (`duplicate: true`): this "
                                                                         "event was reported before; nothing "
                                                                         "changed."),
            **error_responses(*BODY, 404, 409, 422, _404=_404, _400=MALFORMED_BODY,
                              _409="The notification was never sent: `fields[0].code` names its status "
                                   "(`notification_queued`, `notification_scheduled`, `notification_failed`, "
                                   "`notification_suppressed`, `notification_expired`, `notification_cancelled`); "
                                   "nothing was written.",
                              _422="Validation failed: an `event` not in the list, a bad or too-far-ahead `at`, an "
                                   "unknown field; or `event` for a channel without an app (`not_app_channel`: sms "
                                   "and email). Nothing was written.")})
    def post(self, request, notification_id):
        ser = AppReceiptSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        event, at = ser.validated_data["event"], ser.validated_data["at"]
        try:
            mine = readable_live_notifications(request.auth).filter(pk=notification_id)
            archived = readable_archived_notifications(request.auth).filter(pk=notification_id)
            applied = app_receipts.apply_app_receipt(mine, event, at, archived=archived)
        except Notification.DoesNotExist:
            return field_error("notification_id", "not_found",
                               "no notification with this id that this API client may read", 404,
                               error_code="not_found")
        except app_receipts.WrongChannel as exc:
            return field_error("event", "not_app_channel", str(exc), 422)
        except app_receipts.NotReached as exc:
            return field_error("status", exc.code, str(exc), 409, error_code="conflict")
        if not applied.duplicate:
            audit_notes.note_fields(request, ["timeline", *(["status"] if applied.status_changed else [])])
        return Response(AppReceiptResultSerializer(applied).data,
                        status=status.HTTP_200_OK if applied.duplicate else status.HTTP_201_CREATED)
