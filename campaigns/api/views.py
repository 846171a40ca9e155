"""``/v1/segments``, ``/v1/templates`` and ``/v1/campaigns``."""

from __future__ import annotations

from django.db.models import Count
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from campaigns import ownership, runs, services
from campaigns.api.segment_rules import EXAMPLE_RULES, SegmentSerializer
from campaigns.api.segment_template_serializers import (
    MembersResultSerializer,
    MembersSerializer,
    SegmentMemberSerializer,
    TemplateOutSerializer,
    TemplateSerializer,
)
from campaigns.api.send_time import stored_option
from campaigns.api.serializers import (
    DEFAULT_OCCURRENCES,
    MAX_OCCURRENCES,
    CampaignRequestSerializer,
    CampaignRunSerializer,
    CampaignSerializer,
    CampaignSummarySerializer,
    run_items,
)
from campaigns.models import Campaign, CampaignStatus, MissedPolicy, Segment, SegmentMember, Template
from core.api import audit_notes, parameters
from core.api.errors import BODY, MissingScope, NotFoundError, NotOwner, error_responses, field_error, response_headers
from core.api.pagination import Ordering, list_page, page_parameters, page_serializer
from core.api.scopes import Scope
from notifications.api.serializers import AcceptedSerializer
from notifications.api.typed import type_for
from notifications.api.views import (
    IDEMPOTENCY_PARAMETERS,
    accepted,
    check_priority_scope,
    idempotency_key_problem,
    key_reused,
    note_given_fields,
)
from notifications.services import request_fingerprint
from preferences.models import Channel

_SEGMENT_ID = parameters.SLUG.parameter("segment_id", examples=[OpenApiExample("segment", value="spring-sale")])
_TEMPLATE_ID = parameters.SLUG.parameter("template_id", examples=[OpenApiExample("template", value="welcome")])
_SLUG_422 = "Validation failed (including a path id that is not 1–64 letters, digits, '-' or '_'); `field` names it."
_CAMPAIGN_404 = "No campaign with this id that this API client may read (its own, or one made in the admin)."
_LIST_422 = "A bad query parameter (or path id); `field` names it."
_SEGMENT_403_CHANGE = ("Or `not_owner` on `segment_id`: the segment belongs to another API client, or was made in "
                       "the admin (only staff change it).")
_SEGMENT_403_READ = "Or `not_owner` on `segment_id`: the segment belongs to another API client."
_MEMBERS_403 = (_SEGMENT_403_CHANGE + " Or `missing_scope` on `segment_id`: an active high-priority campaign uses the "
                "segment, and changing its members needs `notifications:send_high`.")
_TEMPLATE_403 = ("Or `not_owner` on `template_id`: the template belongs to another API client, or was made in the "
                 "admin; or `missing_scope` on `template_id`: an active high-priority campaign uses it, and changing "
                 "it needs `notifications:send_high`.")
_CAMPAIGN_403 = ("Or `not_owner` on `segment_id` / `template_id`: a campaign uses only its client's own segments and "
                 "templates and those made in the admin.")
_BY_ID = Ordering(("pk",))


def _segment(segment_id: str) -> Segment:
    """The segment. Raises InvalidParameter (422, the id rule) or NotFoundError (404), naming ``segment_id``."""
    parameters.SLUG.check("segment_id", segment_id)
    segment = Segment.objects.filter(pk=segment_id).first()
    if segment is None:
        raise NotFoundError("segment_id", f"no segment with this id; create it with PUT /v1/segments/{segment_id}")
    return segment


def _refused(exc: ownership.NotOwner | ownership.NeedsHighScope) -> Exception:
    """The API's 403 for an ownership rule: ``not_owner`` on the path id, or ``missing_scope``
    (``notifications:send_high``) on ``template_id``, ``segment_id`` or ``campaign_id``."""
    if isinstance(exc, ownership.NeedsHighScope):
        return MissingScope(Scope.SEND_HIGH, field=f"{exc.kind}_id", why=exc.why)
    return NotOwner(f"{exc.kind}_id", str(exc))


def _owned(request, obj: Segment | Template, check=ownership.check_change, *args) -> None:
    """Runs an ownership ``check`` for the request's client; raises the API's 403 if it refuses."""
    try:
        check(obj, request.auth, *args)
    except (ownership.NotOwner, ownership.NeedsHighScope) as exc:
        raise _refused(exc) from None


def _template(template_id: str) -> Template:
    """The template. Raises InvalidParameter (422, the id rule) or NotFoundError (404), naming ``template_id``."""
    parameters.SLUG.check("template_id", template_id)
    template = Template.objects.filter(pk=template_id).first()
    if template is None:
        raise NotFoundError("template_id", f"no template with this id; create it with PUT /v1/templates/{template_id}")
    return template


def _segment_state(segment: Segment) -> dict:
    """What a segment PUT changes, for the audit log."""
    return {"name": segment.name, "description": segment.description, "rules": segment.rules}


def _template_state(template: Template) -> dict:
    """What a template PUT changes, for the audit log: variants by locale (``variants.de``)."""
    variants = {v.locale: (v.title, v.body, v.html) for v in template.variants.all()}
    return {"name": template.name, "default_locale": template.default_locale, "variants": variants}


def _segment_payload(segment: Segment) -> dict:
    return {"segment_id": segment.segment_id, "name": segment.name, "description": segment.description,
            "rules": segment.rules, "member_count": None if segment.is_rule else segment.members.count()}


class SegmentView(APIView):
    required_scopes = {"get": Scope.READ, "put": Scope.SEGMENTS_WRITE}
    audit_object = "segment"

    @extend_schema(request=SegmentSerializer, parameters=[_SEGMENT_ID, *response_headers()],
                   examples=[OpenApiExample("Segment", request_only=True, value={
                       "name": "Spring sale", "description": "Opted-in buyers of the last 12 months"}),
                             OpenApiExample("Rule segment", request_only=True, value={
                                 "name": "German gold members", "rules": EXAMPLE_RULES})],
                   responses={200: OpenApiResponse(SegmentSerializer, description="Updated."),
                              201: OpenApiResponse(SegmentSerializer, description="Created."),
                              **error_responses(*BODY, 403, 409, 422, _422=_SLUG_422 + " A bad rule: its path "
                                                  "(`rules.and[2].op`) and the rule it broke.",
                                                  _403=_SEGMENT_403_CHANGE,
                                                  _409="`list_segment` on `rules`: the segment has members.")},
                   summary="Create or change a segment (this client's own): a list, or a rule (docs/SEGMENTS.md)")
    def put(self, request, segment_id: str):
        parameters.SLUG.check("segment_id", segment_id)
        existing = Segment.objects.filter(pk=segment_id).first()
        if existing is not None:
            _owned(request, existing)  # before validation: a refused write learns nothing more
        ser = SegmentSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        try:
            segment, created = services.upsert_segment(segment_id, client=request.auth, **ser.validated_data)
        except (ownership.NotOwner, ownership.NeedsHighScope) as exc:  # created by another client meanwhile
            raise _refused(exc) from None
        except services.SegmentKindConflict as exc:
            return field_error(exc.field, "list_segment", str(exc), 409, "conflict")
        audit_notes.note_changes(request, None if created or existing is None else _segment_state(existing),
                           _segment_state(segment))
        return Response(_segment_payload(segment), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(parameters=[_SEGMENT_ID, *response_headers()],
                   responses={200: SegmentSerializer,
                              **error_responses(403, 404, 422, _403=_SEGMENT_403_READ, _422=_SLUG_422)},
                   summary="A segment and its member count (this client's own, or made in the admin)")
    def get(self, request, segment_id: str):
        segment = _segment(segment_id)
        _owned(request, segment, ownership.check_use, "read")
        return Response(_segment_payload(segment))


class SegmentListView(APIView):
    required_scopes = {"get": Scope.READ}

    @extend_schema(parameters=[*page_parameters(), *response_headers()],
                   responses={200: page_serializer("SegmentPage", SegmentSerializer()),
                              **error_responses(422, _422=_LIST_422)},
                   operation_id="v1_segments_list",
                   summary="Segments this client may read (its own and those made in the admin), by segment_id, "
                           "with member counts (keyset pagination)")
    def get(self, request):
        def items(rows):
            counts = dict(SegmentMember.objects.filter(segment_id__in=[r.pk for r in rows]).values("segment_id")
                          .annotate(n=Count("id")).order_by().values_list("segment_id", "n"))
            return [{"segment_id": r.segment_id, "name": r.name, "description": r.description, "rules": r.rules,
                     "member_count": None if r.is_rule else counts.get(r.segment_id, 0)} for r in rows]

        return Response(list_page(request.query_params, ownership.readable_segments(request.auth), _BY_ID, items,
                                  listing=("segments",)))


class SegmentMembersView(APIView):
    required_scopes = {"get": Scope.READ, "post": Scope.SEGMENTS_WRITE}
    audit_object = "segment_members"

    @extend_schema(parameters=[_SEGMENT_ID, *page_parameters(), *response_headers()],
                   responses={200: page_serializer("SegmentMemberPage", SegmentMemberSerializer()),
                              **error_responses(403, 404, 422, _422=_LIST_422, _403=_SEGMENT_403_READ)},
                   operation_id="v1_segments_members_list",
                   summary="A segment's members by user_id (keyset pagination)")
    def get(self, request, segment_id: str):
        segment = _segment(segment_id)
        _owned(request, segment, ownership.check_use, "read")
        return Response(list_page(request.query_params, SegmentMember.objects.filter(segment=segment),
                                  Ordering(("recipient_id",)),
                                  lambda rows: SegmentMemberSerializer(rows, many=True).data,
                                  listing=("segment_members", segment.segment_id)))

    @extend_schema(request=MembersSerializer, parameters=[_SEGMENT_ID, *response_headers()],
                   examples=[OpenApiExample("Members", request_only=True,
                                            value={"add": ["alice", "bob"], "remove": ["carol"]})],
                   responses={200: MembersResultSerializer,
                              **error_responses(*BODY, 403, 404, 409, 422, _403=_MEMBERS_403,
                                                _409="`rule_segment` on `add` / `remove`: a rule segment's "
                                                     "members are whoever its rule matches.")},
                   summary="Add and remove members of this client's segment (up to 10,000 ids a call)")
    def post(self, request, segment_id: str):
        segment = _segment(segment_id)
        _owned(request, segment, ownership.check_members_change)  # before validation: a refusal learns nothing
        ser = MembersSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        try:
            result = services.change_members(segment, client=request.auth, **ser.validated_data)
        except (ownership.NotOwner, ownership.NeedsHighScope) as exc:  # a campaign made meanwhile
            raise _refused(exc) from None
        except services.SegmentKindConflict as exc:
            return field_error(exc.field, "rule_segment", str(exc), 409, "conflict")
        audit_notes.note_fields(request, ["members"] if result["added"] or result["removed"] else [])
        result["member_count"] = segment.members.count()
        return Response(result)


class TemplateView(APIView):
    required_scopes = {"get": Scope.READ, "put": Scope.TEMPLATES_WRITE}
    audit_object = "template"

    @extend_schema(request=TemplateSerializer, parameters=[_TEMPLATE_ID, *response_headers()],
                   examples=[OpenApiExample("Template", request_only=True, value={
                       "name": "Welcome", "default_locale": "en", "variants": [
                           {"locale": "en", "title": "Welcome, {{ first_name }}", "body": "Hi {{ first_name }}!"},
                           {"locale": "de", "title": "Willkommen, {{ first_name }}", "body": "Hallo {{ first_name }}!",
                            "html": "<p>Hallo {{ first_name }}!</p>"}]})],
                   responses={200: OpenApiResponse(TemplateSerializer, description="Replaced."),
                              201: OpenApiResponse(TemplateSerializer, description="Created."),
                              **error_responses(*BODY, 403, 422, _422=_SLUG_422, _403=_TEMPLATE_403)},
                   summary="Create or replace a template (this client's own) and its locale variants")
    def put(self, request, template_id: str):
        parameters.SLUG.check("template_id", template_id)
        existing = Template.objects.filter(pk=template_id).first()
        if existing is not None:
            _owned(request, existing, ownership.check_template_change)
        ser = TemplateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        before = None if existing is None else _template_state(existing)
        try:
            template = services.upsert_template(template_id, client=request.auth, **ser.validated_data)
        except (ownership.NotOwner, ownership.NeedsHighScope) as exc:
            raise _refused(exc) from None
        created = existing is None
        audit_notes.note_changes(request, before, _template_state(template))
        return Response(self._payload(template), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(parameters=[_TEMPLATE_ID, *response_headers()],
                   responses={200: TemplateSerializer, **error_responses(404, 422, _422=_SLUG_422)},
                   summary="A template and its variants")
    def get(self, request, template_id: str):
        return Response(self._payload(_template(template_id)))

    @staticmethod
    def _payload(template: Template) -> dict:
        return {"template_id": template.template_id, "name": template.name,
                "default_locale": template.default_locale,
                "variants": [{"locale": v.locale, "title": v.title, "body": v.body, "html": v.html}
                             for v in template.variants.order_by("locale")]}


class TemplateListView(APIView):
    required_scopes = {"get": Scope.READ}

    @extend_schema(parameters=[*page_parameters(), *response_headers()],
                   responses={200: page_serializer("TemplatePage", TemplateOutSerializer()),
                              **error_responses(422, _422=_LIST_422)},
                   operation_id="v1_templates_list",
                   summary="Templates by template_id, with their variants (keyset pagination)")
    def get(self, request):
        return Response(list_page(request.query_params, Template.objects.prefetch_related("variants"), _BY_ID,
                                  lambda rows: [TemplateView._payload(t) for t in rows], listing=("templates",)))


_CAMPAIGN_FILTERS = {"status": CampaignStatus.values, "channel": Channel.values, "segment_id": parameters.SLUG}


class CampaignListView(APIView):
    required_scopes = {"get": Scope.READ, "post": Scope.CAMPAIGNS_WRITE}
    scope_notes = {"post": "`priority: high` also needs `notifications:send_high` (403 `missing_scope` on "
                           "`priority`)."}
    audit_object = "campaign"

    @extend_schema(
        operation_id="v1_campaigns_list",
        summary="Campaigns this client may read (its own and those made in the admin), newest first",
        parameters=[*page_parameters(status=(CampaignStatus.values, "Only campaigns in this status."),
                                     channel=(Channel.values, "Only this channel."),
                                     segment_id=(parameters.SLUG, "Only campaigns to this segment.")),
                    *response_headers()],
        responses={200: page_serializer("CampaignPage", CampaignSummarySerializer()),
                   **error_responses(422, _422=_LIST_422)})
    def get(self, request):
        return Response(list_page(request.query_params, _readable_campaigns(request),
                                  Ordering(("created_at", "id"), descending=True),
                                  lambda rows: CampaignSummarySerializer(rows, many=True).data, _CAMPAIGN_FILTERS,
                                  listing=("campaigns",)))

    @extend_schema(
        summary="Send one message to every member of a segment, now, at an instant, at a local time, or on a "
                "recurring schedule",
        request=CampaignRequestSerializer,
        parameters=IDEMPOTENCY_PARAMETERS,
        examples=[
            OpenApiExample("Template, now, spread over an hour", request_only=True, value={
                "name": "Spring sale", "segment_id": "spring-sale", "channel": "email", "template_id": "welcome",
                "spread_seconds": 3600}),
            OpenApiExample("Inline SMS at 10:00 in each recipient's zone", request_only=True, value={
                "segment_id": "spring-sale", "channel": "sms", "content": {"body": "Spring sale: 20% off today"},
                "local_time": {"date": "2030-03-01", "time": "10:00"}}),
            OpenApiExample("Every Monday at 09:00 Paris time, ten times (docs/RECURRING.md)", request_only=True, value={
                "name": "Weekly digest", "segment_id": "spring-sale", "channel": "email", "template_id": "welcome",
                "schedule": {"rrule": "FREQ=WEEKLY;BYDAY=MO;COUNT=10", "start": "2030-03-04T09:00:00",
                             "timezone": "Europe/Paris"}}),
        ],
        responses={202: OpenApiResponse(AcceptedSerializer, description="Accepted (or replayed: see "
                                                                        "`Idempotent-Replayed`); `status` is "
                                                                        "`scheduled`."),
                   **error_responses(*BODY, 403, 422, _403=_CAMPAIGN_403)},
    )
    def post(self, request):
        key, problem = idempotency_key_problem(request)
        if problem:
            return problem
        ser = CampaignRequestSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        check_priority_scope(request, data["priority"])
        _owned(request, data["segment"], ownership.check_use)
        if data["template"] is not None:
            _owned(request, data["template"], ownership.check_use)
        kind = data["notification_type"]
        if kind is not None:
            type_for(request, kind.key)  # the rule every road of a type passes: owner, high gate
        content = data.get("content") or {}
        local = data.get("local_time")
        schedule = data.get("schedule") or {}
        try:
            result = services.create_campaign(
                client=request.auth, idempotency_key=key,
                fingerprint=request_fingerprint({k: v for k, v in data.items()
                                                 if k not in ("segment", "template", "notification_type")
                                                 and not (k == "metadata" and v is None)}),
                name=data["name"], segment=data["segment"], channel=data["channel"], priority=data["priority"],
                category=data["category"], template=data["template"], title=content.get("title", ""),
                body=content.get("body", ""), html=content.get("html", ""),
                data=data["data"] if kind is not None else content.get("data"), notification_type=kind,
                scheduled_at=data["scheduled_at"], local_date=local["date"] if local else None,
                local_time=local["time"] if local else None,
                missed_policy=data["missed_policy"] or MissedPolicy.SKIP, spread_seconds=data["spread_seconds"],
                ttl_seconds=data["ttl_seconds"], schedule_rule=schedule.get("rrule", ""),
                schedule_start=schedule.get("start", ""), schedule_timezone=schedule.get("timezone", ""),
                metadata=data["metadata"], send_time=stored_option(data))
        except services.CampaignKeyReused:
            return key_reused()
        note_given_fields(request, CampaignRequestSerializer)
        campaign = result.campaign
        return accepted({"id": str(campaign.pk), "status": "scheduled"}, f"/v1/campaigns/{campaign.pk}",
                        result.replayed)


def _readable_campaigns(request):
    """What a client may read: its own campaigns and those created in the admin (no client)."""
    return ownership.readable_campaigns(request.auth)


def _own_campaign(request, campaign_id):
    return Campaign.objects.filter(pk=campaign_id, client=request.auth).first()


_OCCURRENCES = OpenApiParameter(
    "occurrences", {"type": "integer", "minimum": 1, "maximum": MAX_OCCURRENCES, "default": DEFAULT_OCCURRENCES},
    OpenApiParameter.QUERY, description="A recurring campaign: how many next occurrences `schedule` lists.")


class CampaignDetailView(APIView):
    required_scopes = {"get": Scope.READ}

    @extend_schema(parameters=[_OCCURRENCES, *response_headers()],
                   responses={200: CampaignSerializer, **error_responses(404, 422, _404=_CAMPAIGN_404,
                                                                         _422="A bad `occurrences`.")},
                   summary="Status and counts by status (this client's campaigns and those made in the admin)")
    def get(self, request, campaign_id):
        campaign = _readable_campaigns(request).filter(pk=campaign_id).first()
        if campaign is None:
            return field_error("campaign_id", "not_found", "no campaign with this id that this API client may read",
                               404,
                               error_code="not_found")
        raw = request.query_params.get("occurrences", str(DEFAULT_OCCURRENCES))
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_OCCURRENCES:
            return field_error("occurrences", "invalid", f"an integer from 1 to {MAX_OCCURRENCES}")
        return Response(CampaignSerializer(campaign, context={"occurrences": int(raw)}).data)


class CampaignRunsView(APIView):
    required_scopes = {"get": Scope.READ}

    @extend_schema(parameters=[*page_parameters(), *response_headers()],
                   responses={200: page_serializer("CampaignRunPage", CampaignRunSerializer()),
                              **error_responses(404, 422, _404=_CAMPAIGN_404, _422=_LIST_422)},
                   operation_id="v1_campaigns_runs_list",
                   summary="A recurring campaign's runs, latest occurrence first, each with its outcome "
                           "(keyset pagination)")
    def get(self, request, campaign_id):
        campaign = _readable_campaigns(request).filter(pk=campaign_id).first()
        if campaign is None:
            return field_error("campaign_id", "not_found", "no campaign with this id that this API client may read",
                               404, error_code="not_found")
        return Response(list_page(request.query_params, campaign.runs.all(),
                                  Ordering(("occurrence_at", "id"), descending=True), run_items,
                                  listing=("campaign_runs", str(campaign.pk))))


class _SeriesActionView(APIView):
    """``POST /v1/campaigns/{id}/pause`` and ``/resume`` (a recurring campaign of this client)."""

    required_scopes = {"post": Scope.CAMPAIGNS_WRITE}
    scope_notes = {"post": "A high-priority series (`priority: high` or a high-priority type) also needs "
                           "`notifications:send_high` (403 `missing_scope` on `campaign_id`)."}
    audit_object = "campaign"
    series_action = staticmethod(runs.pause)
    doing = "pausing"

    def post(self, request, campaign_id):
        campaign = _own_campaign(request, campaign_id)
        if campaign is None:
            return field_error("campaign_id", "not_found", "no campaign with this id for this API client", 404,
                               error_code="not_found")
        try:
            ownership.check_cancel(campaign, request.auth, self.doing)
        except ownership.NeedsHighScope as exc:
            raise _refused(exc) from None
        try:
            campaign = self.series_action(campaign_id)
        except runs.NotRecurring as exc:
            return field_error("schedule", "not_recurring", str(exc), 409, error_code="conflict")
        except runs.WrongStatus as exc:
            return field_error("status", "wrong_status", str(exc), 409, error_code="conflict")
        audit_notes.note_fields(request, ["status"])
        return Response(CampaignSerializer(campaign).data)


_SERIES_ERRORS = error_responses(404, 409, _404="No campaign with this id for this API client.",
                                 _409="Not a recurring campaign (`not_recurring` on `schedule`), or not in a status "
                                      "the action applies to (`wrong_status` on `status`).")


class CampaignPauseView(_SeriesActionView):
    series_action = staticmethod(runs.pause)

    @extend_schema(request=None, parameters=response_headers(), responses={200: CampaignSerializer, **_SERIES_ERRORS},
                   summary="Pause a recurring campaign: no new runs (a run already made goes on)")
    def post(self, request, campaign_id):
        return super().post(request, campaign_id)


class CampaignResumeView(_SeriesActionView):
    series_action = staticmethod(runs.resume)
    doing = "resuming"

    @extend_schema(request=None, parameters=response_headers(), responses={200: CampaignSerializer, **_SERIES_ERRORS},
                   summary="Resume a paused recurring campaign from its next occurrence after now (those missed "
                           "while paused are skipped, not sent)")
    def post(self, request, campaign_id):
        return super().post(request, campaign_id)


class CampaignCancelView(APIView):
    required_scopes = {"post": Scope.CAMPAIGNS_WRITE}
    scope_notes = {"post": "Cancelling a `priority: high` campaign also needs `notifications:send_high` (403 "
                           "`missing_scope` on `campaign_id`)."}
    audit_object = "campaign"

    @extend_schema(request=None, parameters=response_headers(),
                   responses={200: CampaignSerializer,
                              **error_responses(404, 409, _404="No campaign with this id for this API client "
                                                                    "(only its own campaigns can be cancelled).",
                                                _409="Already completed or cancelled.")},
                   summary="Stop fan-out and cancel every notification not yet claimed")
    def post(self, request, campaign_id):
        campaign = _own_campaign(request, campaign_id)
        if campaign is None:
            return field_error("campaign_id", "not_found", "no campaign with this id for this API client", 404,
                               error_code="not_found")
        try:
            ownership.check_cancel(campaign, request.auth)
        except ownership.NeedsHighScope as exc:
            raise _refused(exc) from None
        try:
            campaign, _ = services.cancel_campaign(campaign_id)
        except services.CampaignNotCancellable as exc:
            return field_error("status", "not_cancellable", str(exc), 409, error_code="conflict")
        audit_notes.note_fields(request, ["status"])
        return Response(CampaignSerializer(campaign).data)
