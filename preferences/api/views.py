"""Recipient, preference and device endpoints under ``/v1/users/{user_id}``."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import audit_notes, parameters
from core.api.errors import BODY, NotFoundError, error_responses, response_headers
from core.api.scopes import Scope
from preferences import services
from preferences.api.effective import effective_matrix
from preferences.api.erasure import erase_user
from preferences.api.serializers import (
    DeviceSerializer,
    ErasureSerializer,
    PreferencesSerializer,
    RecipientSerializer,
    recipient_payload,
)
from preferences.models import Device, Preferences, Recipient

_USER_ID = parameters.USER_ID.parameter("user_id")
_PUSH_TOKEN = parameters.PUSH_TOKEN.parameter("push_token")
_404 = "Unknown user_id (create it with PUT /v1/users/{user_id})."
_422_PATH = "Validation failed (including a path id that is empty, too long or has control characters)."


#: The erasure counts named in its audit entry (those above zero).
_ERASED = ("contacts_erased", "devices_deleted", "preferences_deleted", "segment_memberships_removed",
           "notifications_erased", "notifications_cancelled")


def _contacts(recipient: Recipient) -> dict:
    """What a recipient PUT changes, for the audit log: its contacts, attributes and invalid marks."""
    return {k: v for k, v in recipient_payload(recipient).items() if k != "user_id"}


def _device_state(device: Device) -> dict:
    """What a device registration changes, for the audit log: its owner and platform, whether active."""
    return {"user_id": device.recipient_id, "platform": device.platform, "active": device.active}


def recipient_or_404(user_id: str) -> Recipient:
    """The recipient. Raises InvalidParameter (422: ``user_id`` breaks the user-id rule,
    :data:`core.api.parameters.USER_ID`) or NotFoundError (404), both naming ``user_id``."""
    parameters.USER_ID.check("user_id", user_id)
    recipient = Recipient.objects.filter(pk=user_id).first()
    if recipient is None:
        raise NotFoundError("user_id", f"no user with this id; create it with PUT /v1/users/{user_id}")
    return recipient


class RecipientView(APIView):
    required_scopes = {"get": Scope.READ, "put": Scope.RECIPIENTS_WRITE, "delete": Scope.RECIPIENTS_WRITE}
    audit_object = "recipient"

    @extend_schema(request=RecipientSerializer, parameters=[_USER_ID, *response_headers()],
                   examples=[OpenApiExample("Contacts", request_only=True, value={
                       "email": "alice@example.com", "phone": "+49 151 12345678", "timezone": "Europe/Berlin",
                       "locale": "de-DE", "attributes": {"first_name": "Alice"}})],
                   responses={200: OpenApiResponse(RecipientSerializer, description="Replaced."),
                              201: OpenApiResponse(RecipientSerializer, description="Created."),
                              **error_responses(*BODY, 422, _422=_422_PATH)},
                   summary="Create or replace a recipient's contacts")
    def put(self, request, user_id: str):
        parameters.USER_ID.check("user_id", user_id)
        ser = RecipientSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        existing = Recipient.objects.filter(pk=user_id).first()
        recipient, created = services.upsert_recipient(user_id, **ser.validated_data)
        payload = recipient_payload(recipient)
        before = None if created or existing is None else _contacts(existing)
        audit_notes.note_changes(request, before, _contacts(recipient))
        return Response(payload, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(parameters=[_USER_ID, *response_headers()],
                   responses={200: RecipientSerializer, **error_responses(404, 422, _404=_404, _422=_422_PATH)},
                   summary="Get a recipient")
    def get(self, request, user_id: str):
        return Response(recipient_payload(recipient_or_404(user_id)))

    @extend_schema(parameters=[_USER_ID, *response_headers()],
                   responses={200: OpenApiResponse(ErasureSerializer, description="Erased (or, with `replayed`, "
                                                                                  "erased before: nothing left)."),
                              **error_responses(404, 422, _404=_404, _422=_422_PATH)},
                   summary="Erase a recipient's personal data (GDPR): contacts, devices, attributes, preferences, "
                           "segment memberships, notification content")
    def delete(self, request, user_id: str):
        recipient = recipient_or_404(user_id)
        erasure, replayed = erase_user(recipient, requested_by=f"api client {request.auth.name}")
        data = ErasureSerializer(erasure, context={"replayed": replayed}).data
        if not replayed:
            audit_notes.note_fields(request, [k for k in _ERASED if data[k]])
        return Response(data)


_PREFERENCES_EXAMPLE = {
    "opt_outs": ["sms"], "category_opt_outs": {"marketing": ["email"]}, "type_opt_outs": {"new_follower": ["push"]},
    "quiet_hours": {"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"}}
_EFFECTIVE_EXAMPLE = [
    {"type": "new_follower", "category": "social", "channel": "push", "allowed": False, "reason": "opted_out_type",
     "required": False},
    {"type": "new_follower", "category": "social", "channel": "email", "allowed": True, "reason": "",
     "required": False},
    {"type": "password_reset", "category": "security", "channel": "email", "allowed": True, "reason": "",
     "required": True},
    {"type": "password_reset", "category": "security", "channel": "sms", "allowed": True, "reason": "required",
     "required": True},
]


class PreferencesView(APIView):
    required_scopes = {"get": Scope.READ, "put": Scope.PREFERENCES_WRITE}
    audit_object = "preferences"

    @extend_schema(parameters=[_USER_ID, *response_headers()],
                   examples=[OpenApiExample("Preferences and their effective matrix", response_only=True,
                                            value=_PREFERENCES_EXAMPLE | {"effective": _EFFECTIVE_EXAMPLE})],
                   responses={200: PreferencesSerializer, **error_responses(404, 422, _404=_404, _422=_422_PATH)},
                   summary="Get a recipient's preferences and the effective matrix (type × channel → allowed, why)")
    def get(self, request, user_id: str):
        recipient = recipient_or_404(user_id)
        prefs = Preferences.objects.filter(recipient=recipient).first()
        return Response(PreferencesSerializer().to_representation(prefs) | {"effective": effective_matrix(recipient)})

    @extend_schema(request=PreferencesSerializer, parameters=[_USER_ID, *response_headers()],
                   examples=[OpenApiExample("Preferences", request_only=True, value=_PREFERENCES_EXAMPLE)],
                   responses={200: PreferencesSerializer,
                              **error_responses(*BODY, 404, 422, _404=_404, _422=_422_PATH)},
                   summary="Replace a recipient's opt-outs and quiet hours")
    def put(self, request, user_id: str):
        recipient = recipient_or_404(user_id)
        ser = PreferencesSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        before = PreferencesSerializer().to_representation(Preferences.objects.filter(recipient=recipient).first())
        prefs = services.set_preferences(recipient, **ser.validated_data)
        after = PreferencesSerializer().to_representation(prefs)
        audit_notes.note_changes(request, before, after)  # what was stored, not the matrix derived from it
        return Response(after | {"effective": effective_matrix(recipient)})


class DevicesView(APIView):
    required_scopes = {"get": Scope.READ, "put": Scope.DEVICES_WRITE}
    audit_object = "device"

    @extend_schema(parameters=[_USER_ID, *response_headers()],
                   responses={200: DeviceSerializer(many=True),
                              **error_responses(404, 422, _404=_404, _422=_422_PATH)},
                   summary="List push devices")
    def get(self, request, user_id: str):
        recipient = recipient_or_404(user_id)
        return Response(DeviceSerializer(recipient.devices.order_by("id"), many=True).data)

    @extend_schema(request=DeviceSerializer, parameters=[_USER_ID, *response_headers()],
                   examples=[OpenApiExample("Android device", request_only=True,
                                            value={"platform": "android", "push_token": "fcm-token-1"})],
                   responses={200: OpenApiResponse(DeviceSerializer, description="Already registered (to this "
                                                                                 "or another user): updated."),
                              201: OpenApiResponse(DeviceSerializer, description="Registered."),
                              **error_responses(*BODY, 404, 422, _404=_404, _422=_422_PATH)},
                   summary="Register a push token (moves it if another user had it)")
    def put(self, request, user_id: str):
        recipient = recipient_or_404(user_id)
        ser = DeviceSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        existing = Device.objects.filter(push_token=ser.validated_data["push_token"]).first()
        device, created = services.register_device(recipient, **ser.validated_data)
        audit_notes.note_changes(request, None if created or existing is None else _device_state(existing),
                           _device_state(device))
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(DeviceSerializer(device).data, status=code)


class DeviceView(APIView):
    required_scopes = {"delete": Scope.DEVICES_WRITE}
    audit_object = "device"

    @extend_schema(parameters=[_USER_ID, _PUSH_TOKEN, *response_headers()],
                   responses={204: OpenApiResponse(None, description="Removed (no body)."),
                              **error_responses(404, 422, _404="Unknown user_id, or no device with this push_token "
                                                               "for this user.", _422=_422_PATH)},
                   summary="Remove a push token")
    def delete(self, request, user_id: str, push_token: str):
        recipient = recipient_or_404(user_id)
        parameters.PUSH_TOKEN.check("push_token", push_token)
        if not services.remove_device(recipient, push_token):
            raise NotFoundError("push_token", "this user has no device with this push_token")
        return Response(status=status.HTTP_204_NO_CONTENT)
