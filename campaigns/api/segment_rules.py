"""Segments in the API: a segment's shape with its ``rules``, and ``POST /v1/segment-preview``
(docs/SEGMENTS.md)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from campaigns import ownership, rules
from campaigns.membership import preview, segment_preview
from campaigns.models import Segment
from campaigns.rules import Context, RuleError
from core import clock
from core.api.errors import BODY, NotOwner, error_responses, response_headers
from core.api.fields import LabelField, RejectUnknownFields, TextField
from core.api.scopes import Scope
from core.vocabulary import CATEGORY_PATTERN, CHANNELS, TYPE_KEY_PATTERN
from notifications.events.models import NotificationType

RULES_HELP = ("A rule segment's rule (docs/SEGMENTS.md): `and` / `or` (lists), `not`, and leaves `attribute` "
              "(`op` eq / in / exists), `locale`, `timezone`, `has` (email, phone, push_device), `subscribed`, "
              "`engaged` (opened / sent, `within_days`). A bad rule: 422 naming its path (`rules.and[2].op`) "
              "and the rule it broke (`unknown_rule`, `unknown_operator`, `unknown_key`, `wrong_type`, `empty`, "
              f"`out_of_range`, `too_deep` past {rules.MAX_DEPTH}, `too_many_rules` past {rules.MAX_NODES}).")

EXAMPLE_RULES = {"and": [{"attribute": "plan", "op": "in", "value": ["gold", "platinum"]},
                         {"locale": ["de"]}, {"has": "email"}, {"subscribed": True},
                         {"not": {"engaged": "sent", "within_days": 7}}]}


@extend_schema_field({"type": "object", "description": RULES_HELP, "example": EXAMPLE_RULES})
class RuleField(serializers.JSONField):
    """A rule (JSON)."""


@extend_schema_field({"type": "object", "nullable": True, "description": RULES_HELP, "example": EXAMPLE_RULES})
class RulesField(serializers.JSONField):
    """A rule (JSON), or null for a list segment."""


def rule_errors(value, path: str = "rules") -> tuple[dict | None, bool]:
    """``(errors, needs_context)``: ``errors`` in the serializers' shape naming the broken rule's
    path, ``None`` when ``value`` is a valid rule; ``needs_context``: it uses ``subscribed``."""
    try:
        return None, rules.validate(value, path)
    except RuleError as exc:
        return {exc.path: serializers.ErrorDetail(exc.message, code=exc.code)}, False


class SegmentSerializer(RejectUnknownFields, serializers.Serializer):
    segment_id = serializers.CharField(read_only=True)
    name = LabelField()
    description = TextField(required=False, allow_blank=True, default="", max_length=10_000)
    rules = RulesField(required=False, allow_null=True, default=None)
    member_count = serializers.IntegerField(read_only=True, allow_null=True,
                                            help_text="A list segment's members; null for a rule segment "
                                                      "(count it with POST /v1/segment-preview).")

    def validate(self, attrs):
        if attrs.get("rules") is not None:
            errors, _uses_context = rule_errors(attrs["rules"])
            if errors:
                raise serializers.ValidationError(errors)
        return attrs


class SegmentPreviewSerializer(RejectUnknownFields, serializers.Serializer):
    """What to count: a ``rules`` draft, or a stored ``segment_id``; and the campaign it is for."""

    #: One of the two, in the OpenAPI schema too (core.api.fields.RejectUnknownFieldsSchema).
    schema_rules = {"allOf": [{"oneOf": [{"required": ["rules"]}, {"required": ["segment_id"]}]}]}

    rules = RuleField(required=False, help_text="The rule to count (not saved).")
    segment_id = serializers.SlugField(required=False, max_length=64, help_text="Or a stored segment to count.")
    channel = serializers.ChoiceField(choices=CHANNELS, required=False,
                                      help_text="The campaign's channel: needed when the rule uses `subscribed`.")
    category = serializers.RegexField(CATEGORY_PATTERN, required=False, default="marketing",
                                      help_text="The campaign's category (`subscribed`).")
    notification_type = serializers.RegexField(TYPE_KEY_PATTERN, required=False, default="",
                                               help_text="The campaign's notification type, if any (`subscribed`): "
                                                         "an existing type (422 `unknown_type` otherwise).")

    def validate(self, attrs):
        given = [f for f in ("rules", "segment_id") if f in attrs]
        if len(given) != 1:
            raise serializers.ValidationError({"rules": serializers.ErrorDetail(
                "give either rules or segment_id", code="required" if not given else "invalid")})
        if "segment_id" in attrs:
            segment = Segment.objects.filter(pk=attrs["segment_id"]).first()
            if segment is None:
                raise serializers.ValidationError({"segment_id": serializers.ErrorDetail(
                    "no segment with this id", code="not_found")})
            attrs["segment"] = segment
            uses = segment.is_rule and rules.validate(segment.rules)
        else:
            errors, uses = rule_errors(attrs["rules"])
            if errors:
                raise serializers.ValidationError(errors)
        if attrs["notification_type"] and not NotificationType.objects.filter(pk=attrs["notification_type"]).exists():
            raise serializers.ValidationError({"notification_type": serializers.ErrorDetail(
                "unknown notification type", code="unknown_type")})  # as POST /v1/campaigns' type
        if uses and not attrs.get("channel"):
            raise serializers.ValidationError({"channel": serializers.ErrorDetail(
                "the rule uses subscribed: give the campaign's channel", code="required")})
        return attrs


class SegmentCountSerializer(serializers.Serializer):
    count = serializers.IntegerField(help_text="Recipients the rule matches now (a list segment: its members).")
    exact = serializers.BooleanField(help_text="False: counting took longer than SEGMENT_PREVIEW_TIMEOUT_MS, and "
                                               "`count` is the database planner's estimate.")


class SegmentPreviewView(APIView):
    required_scopes = {"post": Scope.SEGMENTS_WRITE}

    @extend_schema(request=SegmentPreviewSerializer, parameters=[*response_headers()],
                   examples=[OpenApiExample("A draft rule", request_only=True,
                                            value={"rules": EXAMPLE_RULES, "channel": "email"})],
                   responses={200: SegmentCountSerializer,
                              **error_responses(*BODY, 403, 422, _403="Or `not_owner` on `segment_id`: the segment "
                                                                      "belongs to another API client.")},
                   summary="Count who a rule (or a stored segment) matches now, before a campaign uses it")
    def post(self, request):
        named = request.data.get("segment_id") if isinstance(request.data, dict) else None
        stored = Segment.objects.filter(pk=named).first() if isinstance(named, str) else None
        if stored is not None:  # before validation: another client's segment tells nothing of its rule
            try:
                ownership.check_use(stored, request.auth, "read")
            except ownership.NotOwner as exc:
                raise NotOwner("segment_id", str(exc)) from None
        ser = SegmentPreviewSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        context = Context(now=clock.now(), channel=data.get("channel", ""), category=data["category"],
                          type_key=data["notification_type"])
        segment = data.get("segment")
        if segment is None:
            return Response(preview(data["rules"], context).as_dict())
        return Response(segment_preview(segment, context).as_dict())
