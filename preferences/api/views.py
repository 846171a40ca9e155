"""Recipient, preference and device endpoints under ``/v1/users/{user_id}``."""

from __future__ import annotations

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from preferences import services
from preferences.api.serializers import (
    DeviceSerializer,
    PreferencesSerializer,
    RecipientSerializer,
    recipient_payload,
)
from preferences.models import Preferences, Recipient

_NOT_FOUND = OpenApiResponse(description="Unknown user_id (create it with PUT /v1/users/{user_id}).")


def _recipient(user_id: str) -> Recipient:
    return get_object_or_404(Recipient, pk=user_id)


class RecipientView(APIView):
    @extend_schema(request=RecipientSerializer, responses={200: RecipientSerializer, 201: RecipientSerializer},
                   summary="Create or replace a recipient's contacts")
    def put(self, request, user_id: str):
        ser = RecipientSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        recipient, created = services.upsert_recipient(user_id, **ser.validated_data)
        return Response(recipient_payload(recipient), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses={200: RecipientSerializer, 404: _NOT_FOUND}, summary="Get a recipient")
    def get(self, request, user_id: str):
        return Response(recipient_payload(_recipient(user_id)))


class PreferencesView(APIView):
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


class DevicesView(APIView):
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


class DeviceView(APIView):
    @extend_schema(responses={204: None, 404: _NOT_FOUND}, summary="Remove a push token")
    def delete(self, request, user_id: str, push_token: str):
        recipient = _recipient(user_id)
        if not services.remove_device(recipient, push_token):
            return Response({"error": {"status": 404, "code": "not_found",
                                       "message": "this user has no device with that push_token"}},
                            status=status.HTTP_404_NOT_FOUND)
        return Response(status=status.HTTP_204_NO_CONTENT)
