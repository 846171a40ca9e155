"""``/v1/segments``, ``/v1/templates`` and ``/v1/campaigns``."""

from __future__ import annotations

import re

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from campaigns import services
from campaigns.api.serializers import (
    CampaignRequestSerializer,
    CampaignSerializer,
    MembersResultSerializer,
    MembersSerializer,
    SegmentSerializer,
    TemplateSerializer,
)
from campaigns.models import Campaign, Segment, Template
from notifications.api.errors import field_error
from notifications.api.serializers import AcceptedSerializer
from notifications.api.views import IDEMPOTENCY_HEADER, MAX_KEY_LENGTH
from notifications.models import Priority
from notifications.services import request_fingerprint

_SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
_ERROR = OpenApiResponse(description="`{error: {status, code, message, fields: [{field, code, message}]}}`")


def _segment_payload(segment: Segment) -> dict:
    return {"segment_id": segment.segment_id, "name": segment.name, "description": segment.description,
            "member_count": segment.members.count()}


class SegmentView(APIView):
    @extend_schema(request=SegmentSerializer, responses={200: SegmentSerializer, 201: SegmentSerializer, 422: _ERROR},
                   summary="Create or rename a segment")
    def put(self, request, segment_id: str):
        if not _SLUG.match(segment_id):
            return field_error("segment_id", "invalid", "letters, digits, '-' and '_' only; at most 64", 422)
        ser = SegmentSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        segment, created = services.upsert_segment(segment_id, **ser.validated_data)
        return Response(_segment_payload(segment), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses={200: SegmentSerializer, 404: _ERROR}, summary="A segment and its member count")
    def get(self, request, segment_id: str):
        return Response(_segment_payload(get_object_or_404(Segment, pk=segment_id)))


class SegmentMembersView(APIView):
    @extend_schema(request=MembersSerializer, responses={200: MembersResultSerializer, 404: _ERROR, 422: _ERROR},
                   summary="Add and remove members (up to 10,000 ids a call)")
    def post(self, request, segment_id: str):
        segment = get_object_or_404(Segment, pk=segment_id)
        ser = MembersSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        result = services.change_members(segment, **ser.validated_data)
        result["member_count"] = segment.members.count()
        return Response(result)


class TemplateView(APIView):
    @extend_schema(request=TemplateSerializer, responses={200: TemplateSerializer, 201: TemplateSerializer,
                                                          422: _ERROR},
                   summary="Create or replace a template and its locale variants")
    def put(self, request, template_id: str):
        if not _SLUG.match(template_id):
            return field_error("template_id", "invalid", "letters, digits, '-' and '_' only; at most 64", 422)
        ser = TemplateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        created = not Template.objects.filter(pk=template_id).exists()
        template = services.upsert_template(template_id, **ser.validated_data)
        return Response(self._payload(template), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(responses={200: TemplateSerializer, 404: _ERROR}, summary="A template and its variants")
    def get(self, request, template_id: str):
        return Response(self._payload(get_object_or_404(Template, pk=template_id)))

    @staticmethod
    def _payload(template: Template) -> dict:
        return {"template_id": template.template_id, "name": template.name,
                "default_locale": template.default_locale,
                "variants": [{"locale": v.locale, "title": v.title, "body": v.body, "html": v.html}
                             for v in template.variants.order_by("locale")]}


class CampaignListView(APIView):
    @extend_schema(
        summary="Send one message to every member of a segment, now, at an instant, or at a local time",
        request=CampaignRequestSerializer,
        parameters=[OpenApiParameter(IDEMPOTENCY_HEADER, str, OpenApiParameter.HEADER, required=True)],
        responses={202: AcceptedSerializer, 400: _ERROR, 403: _ERROR, 422: _ERROR},
    )
    def post(self, request):
        key = request.headers.get(IDEMPOTENCY_HEADER, "")
        if not key or len(key) > MAX_KEY_LENGTH or not key.isprintable():
            return field_error(IDEMPOTENCY_HEADER, "required" if not key else "invalid",
                               f"the Idempotency-Key header is required (1–{MAX_KEY_LENGTH} printable characters)",
                               400)
        ser = CampaignRequestSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        if data["priority"] == Priority.HIGH and not request.auth.allow_high:
            return field_error("priority", "not_permitted", "this API client may not send priority=high", 403,
                               error_code="permission_denied")
        content = data.get("content") or {}
        local = data.get("local_time")
        try:
            result = services.create_campaign(
                client=request.auth, idempotency_key=key,
                fingerprint=request_fingerprint({k: v for k, v in data.items() if k not in ("segment", "template")}),
                name=data["name"], segment=data["segment"], channel=data["channel"], priority=data["priority"],
                category=data["category"], template=data["template"], title=content.get("title", ""),
                body=content.get("body", ""), html=content.get("html", ""), data=content.get("data"),
                scheduled_at=data["scheduled_at"], local_date=local["date"] if local else None,
                local_time=local["time"] if local else None, spread_seconds=data["spread_seconds"],
                ttl_seconds=data["ttl_seconds"])
        except services.CampaignKeyReused:
            return field_error(IDEMPOTENCY_HEADER, "idempotency_key_reused",
                               "this Idempotency-Key was already used with a different request body", 422)
        campaign = result.campaign
        headers = {"Location": f"/v1/campaigns/{campaign.pk}"}
        if result.replayed:
            headers["Idempotent-Replayed"] = "true"
        return Response({"id": str(campaign.pk), "status": "scheduled"}, status=status.HTTP_202_ACCEPTED,
                        headers=headers)


def _own_campaign(request, campaign_id):
    return Campaign.objects.filter(pk=campaign_id, client=request.auth).first()


class CampaignDetailView(APIView):
    @extend_schema(responses={200: CampaignSerializer, 404: _ERROR}, summary="Status and counts by status")
    def get(self, request, campaign_id):
        campaign = _own_campaign(request, campaign_id)
        if campaign is None:
            return field_error("id", "not_found", "no campaign with this id for this API client", 404,
                               error_code="not_found")
        return Response(CampaignSerializer(campaign).data)


class CampaignCancelView(APIView):
    @extend_schema(request=None, responses={200: CampaignSerializer, 404: _ERROR, 409: _ERROR},
                   summary="Stop fan-out and cancel every notification not yet claimed")
    def post(self, request, campaign_id):
        if _own_campaign(request, campaign_id) is None:
            return field_error("id", "not_found", "no campaign with this id for this API client", 404,
                               error_code="not_found")
        try:
            campaign, _ = services.cancel_campaign(campaign_id)
        except services.CampaignNotCancellable as exc:
            return field_error("status", "not_cancellable", str(exc), 409, error_code="conflict")
        return Response(CampaignSerializer(campaign).data)
