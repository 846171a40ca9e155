"""``/v1/segments``, ``/v1/templates`` and ``/v1/campaigns``."""

from __future__ import annotations

import re

from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
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
from campaigns.models import Campaign, MissedPolicy, Segment, Template
from notifications.api.errors import BODY, error_responses, field_error, response_headers
from notifications.api.serializers import AcceptedSerializer
from notifications.api.views import (
    IDEMPOTENCY_PARAMETERS,
    accepted,
    high_priority_refused,
    idempotency_key_problem,
    key_reused,
)
from notifications.services import request_fingerprint

_SLUG = re.compile(r"^[-a-zA-Z0-9_]{1,64}$")
_SLUG_SCHEMA = {"type": "string", "pattern": _SLUG.pattern}
_SEGMENT_ID = OpenApiParameter("segment_id", _SLUG_SCHEMA, OpenApiParameter.PATH,
                               description="Letters, digits, '-' and '_'; at most 64.",
                               examples=[OpenApiExample("segment", value="spring-sale")])
_TEMPLATE_ID = OpenApiParameter("template_id", _SLUG_SCHEMA, OpenApiParameter.PATH,
                                description="Letters, digits, '-' and '_'; at most 64.",
                                examples=[OpenApiExample("template", value="welcome")])
_SLUG_422 = "Validation failed (including a path id that is not 1–64 letters, digits, '-' or '_')."
_CAMPAIGN_404 = "No campaign with this id for this API client."


def _segment_payload(segment: Segment) -> dict:
    return {"segment_id": segment.segment_id, "name": segment.name, "description": segment.description,
            "member_count": segment.members.count()}


class SegmentView(APIView):
    @extend_schema(request=SegmentSerializer, parameters=[_SEGMENT_ID, *response_headers()],
                   examples=[OpenApiExample("Segment", request_only=True, value={
                       "name": "Spring sale", "description": "Opted-in buyers of the last 12 months"})],
                   responses={200: OpenApiResponse(SegmentSerializer, description="Updated."),
                              201: OpenApiResponse(SegmentSerializer, description="Created."),
                              **error_responses(*BODY, 422, _422=_SLUG_422)},
                   summary="Create or rename a segment")
    def put(self, request, segment_id: str):
        if not _SLUG.match(segment_id):
            return field_error("segment_id", "invalid", "letters, digits, '-' and '_' only; at most 64", 422)
        ser = SegmentSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        segment, created = services.upsert_segment(segment_id, **ser.validated_data)
        return Response(_segment_payload(segment), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(parameters=[_SEGMENT_ID, *response_headers()],
                   responses={200: SegmentSerializer, **error_responses(404)},
                   summary="A segment and its member count")
    def get(self, request, segment_id: str):
        return Response(_segment_payload(get_object_or_404(Segment, pk=segment_id)))


class SegmentMembersView(APIView):
    @extend_schema(request=MembersSerializer, parameters=[_SEGMENT_ID, *response_headers()],
                   examples=[OpenApiExample("Members", request_only=True,
                                            value={"add": ["alice", "bob"], "remove": ["carol"]})],
                   responses={200: MembersResultSerializer, **error_responses(*BODY, 404, 422)},
                   summary="Add and remove members (up to 10,000 ids a call)")
    def post(self, request, segment_id: str):
        segment = get_object_or_404(Segment, pk=segment_id)
        ser = MembersSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        result = services.change_members(segment, **ser.validated_data)
        result["member_count"] = segment.members.count()
        return Response(result)


class TemplateView(APIView):
    @extend_schema(request=TemplateSerializer, parameters=[_TEMPLATE_ID, *response_headers()],
                   examples=[OpenApiExample("Template", request_only=True, value={
                       "name": "Welcome", "default_locale": "en", "variants": [
                           {"locale": "en", "title": "Welcome, {{ first_name }}", "body": "Hi {{ first_name }}!"},
                           {"locale": "de", "title": "Willkommen, {{ first_name }}", "body": "Hallo {{ first_name }}!",
                            "html": "<p>Hallo {{ first_name }}!</p>"}]})],
                   responses={200: OpenApiResponse(TemplateSerializer, description="Replaced."),
                              201: OpenApiResponse(TemplateSerializer, description="Created."),
                              **error_responses(*BODY, 422, _422=_SLUG_422)},
                   summary="Create or replace a template and its locale variants")
    def put(self, request, template_id: str):
        if not _SLUG.match(template_id):
            return field_error("template_id", "invalid", "letters, digits, '-' and '_' only; at most 64", 422)
        ser = TemplateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        created = not Template.objects.filter(pk=template_id).exists()
        template = services.upsert_template(template_id, **ser.validated_data)
        return Response(self._payload(template), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(parameters=[_TEMPLATE_ID, *response_headers()],
                   responses={200: TemplateSerializer, **error_responses(404)},
                   summary="A template and its variants")
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
        parameters=IDEMPOTENCY_PARAMETERS,
        examples=[
            OpenApiExample("Template, now, spread over an hour", request_only=True, value={
                "name": "Spring sale", "segment_id": "spring-sale", "channel": "email", "template_id": "welcome",
                "spread_seconds": 3600}),
            OpenApiExample("Inline SMS at 10:00 in each recipient's zone", request_only=True, value={
                "segment_id": "spring-sale", "channel": "sms", "content": {"body": "Spring sale: 20% off today"},
                "local_time": {"date": "2030-03-01", "time": "10:00"}}),
        ],
        responses={202: OpenApiResponse(AcceptedSerializer, description="Accepted (or replayed: see "
                                                                        "`Idempotent-Replayed`); `status` is "
                                                                        "`scheduled`."),
                   **error_responses(*BODY, 403, 422)},
    )
    def post(self, request):
        key, problem = idempotency_key_problem(request)
        if problem:
            return problem
        ser = CampaignRequestSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        refused = high_priority_refused(request, data["priority"])
        if refused:
            return refused
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
                local_time=local["time"] if local else None,
                missed_policy=data["missed_policy"] or MissedPolicy.SKIP, spread_seconds=data["spread_seconds"],
                ttl_seconds=data["ttl_seconds"])
        except services.CampaignKeyReused:
            return key_reused()
        campaign = result.campaign
        return accepted({"id": str(campaign.pk), "status": "scheduled"}, f"/v1/campaigns/{campaign.pk}",
                        result.replayed)


def _own_campaign(request, campaign_id):
    return Campaign.objects.filter(pk=campaign_id, client=request.auth).first()


class CampaignDetailView(APIView):
    @extend_schema(parameters=response_headers(),
                   responses={200: CampaignSerializer, **error_responses(404, _404=_CAMPAIGN_404)},
                   summary="Status and counts by status")
    def get(self, request, campaign_id):
        campaign = _own_campaign(request, campaign_id)
        if campaign is None:
            return field_error("id", "not_found", "no campaign with this id for this API client", 404,
                               error_code="not_found")
        return Response(CampaignSerializer(campaign).data)


class CampaignCancelView(APIView):
    @extend_schema(request=None, parameters=response_headers(),
                   responses={200: CampaignSerializer,
                              **error_responses(404, 409, _404=_CAMPAIGN_404,
                                                _409="Already completed or cancelled.")},
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
