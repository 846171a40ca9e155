"""Recipient, preference and device endpoints under ``/v1/users/{user_id}``."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from notifications.api.errors import field_error
from preferences import services
from preferences.api.serializers import (
    DeviceSerializer,
    PreferencesSerializer,
    RecipientSerializer,
    recipient_payload,
)
from preferences.models import Preferences, Recipient

_NOT_FOUND = OpenApiResponse(description="Unknown user_id (create it with PUT /v1/users/{user_id}).")


class BadPathId(Exception):
    def __init__(self, response):
        self.response = response


def check_path_id(name: str, value: str, max_length: int = 255) -> None:
    """Path ids must be 1–``max_length`` characters without control characters (NUL cannot even be
    stored). Raises BadPathId carrying the 422 response."""
    if not value or len(value) > max_length or any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise BadPathId(field_error(name, "invalid", f"must be 1–{max_length} characters without control "
                                                     "characters", 422))


def _recipient(user_id: str) -> Recipient:
    check_path_id("user_id", user_id)
    return get_object_or_404(Recipient, pk=user_id)


class PathIdView(APIView):
    """Answers a :class:`BadPathId` with its 422."""

    def handle_exception(self, exc):
        if isinstance(exc, BadPathId):
            return exc.response
        return super().handle_exception(exc)


class RecipientView(PathIdView):
    @extend_schema(request=RecipientSerializer, responses={200: RecipientSerializer, 201: RecipientSerializer},
                   summary="Create or replace a recipient's contacts")
    def put(self, request, user_id: str):
        check_path_id("user_id", user_id)
        ser = RecipientSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        recipient, created = services.upsert_recipient(user_id, **ser.validated_data)
        return Response(recipient_payload(recipient), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses={200: RecipientSerializer, 404: _NOT_FOUND}, summary="Get a recipient")
    def get(self, request, user_id: str):
        return Response(recipient_payload(_recipient(user_id)))


class PreferencesView(PathIdView):
    @extend_schema(responses={200: PreferencesSerializer, 404: _NOT_FOUND}, summary="Get a recipient's preferences")
    def get(self, request, user_id: str):
        recipient = _recipient(user_id)
        prefs = Preferences.objects.filter(recipient=recipient).first()
        return Response(PreferencesSerializer().to_representation(prefs))

    @extend_schema(request=PreferencesSerializer, responses={200: PreferencesSerializer, 404: _NOT_FOUND},
                   summary="Replace a recipient's opt-outs and quiet hours")
    def put(self, request, user_id: str):
        recipient = _recipient(user_id)
        ser = PreferencesSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        prefs = services.set_preferences(recipient, **ser.validated_data)
        return Response(PreferencesSerializer().to_representation(prefs))


class DevicesView(PathIdView):
    @extend_schema(responses={200: DeviceSerializer(many=True), 404: _NOT_FOUND}, summary="List push devices")
    def get(self, request, user_id: str):
        recipient = _recipient(user_id)
        return Response(DeviceSerializer(recipient.devices.order_by("id"), many=True).data)

    @extend_schema(request=DeviceSerializer,
                   responses={200: DeviceSerializer, 201: DeviceSerializer, 404: _NOT_FOUND},
                   summary="Register a push token (moves it if another user had it)")
    def put(self, request, user_id: str):
        recipient = _recipient(user_id)
        ser = DeviceSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        device, created = services.register_device(recipient, **ser.validated_data)
        code = status.HTTP_201_CREATED if created else status.HTTP_200_OK
        return Response(DeviceSerializer(device).data, status=code)


class DeviceView(PathIdView):
    @extend_schema(responses={204: None, 404: _NOT_FOUND}, summary="Remove a push token")
    def delete(self, request, user_id: str, push_token: str):
        recipient = _recipient(user_id)
        check_path_id("push_token", push_token, 4096)
        if not services.remove_device(recipient, push_token):
            return Response({"error": {"status": 404, "code": "not_found",
                                       "message": "this user has no device with that push_token"}},
                            status=status.HTTP_404_NOT_FOUND)
        return Response(status=status.HTTP_204_NO_CONTENT)
