"""``/v1/events``: a service sends a semantic event (``order_shipped`` for a user, with data); the
platform decides channels, content and timing from the event's type (docs/TYPES.md)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import audit_notes
from core.api.errors import BODY, NotFoundError, error_responses, field_error, response_headers
from core.api.fields import AwareDateTimeField, RejectUnknownFields
from core.api.pagination import list_page, page_parameters, page_serializer
from core.api.refusals import AcceptanceLimited
from core.api.scopes import Scope
from core.identifiers import MAX_USER_ID_LENGTH, no_control_pattern
from notifications.api.event_reads import (
    BY_USER,
    ISO,
    EventDetailSerializer,
    EventRecipientSerializer,
    event_body,
    recipients_body,
    recipients_listing,
    recipients_query,
)
from notifications.api.serializers import channel_available_errors, check_schedule_window, metadata_field
from notifications.api.typed import data_errors, type_for
from notifications.api.views import (
    ACCEPTANCE_ERRORS,
    IDEMPOTENCY_PARAMETERS,
    accepted,
    idempotency_key_problem,
    key_reused,
)
from notifications.content_limits import MAX_TTL_SECONDS
from notifications.events import services
from notifications.events.models import Event
from notifications.models import Notification
from notifications.services import request_fingerprint
from preferences.models import Recipient

MAX_USERS = 1000
MAX_COLLAPSE_KEY = 64
#: How many unknown users a 422 names (a list of 1,000 unknown ids is not a useful answer).
MAX_NAMED_UNKNOWN = 20


class EventRequestSerializer(RejectUnknownFields, serializers.Serializer):
    """``POST /v1/events`` body: ``user_id`` or ``user_ids``, not both."""

    type = serializers.CharField(max_length=64, help_text="A notification type key (`order_shipped`).")
    user_id = serializers.CharField(required=False, max_length=MAX_USER_ID_LENGTH, trim_whitespace=False,
                                    help_text="One existing user (or give `user_ids`).")
    user_ids = serializers.ListField(child=serializers.CharField(max_length=MAX_USER_ID_LENGTH, trim_whitespace=False),
                                     required=False, min_length=1, max_length=MAX_USERS,
                                     help_text=f"Up to {MAX_USERS:,} existing users, no duplicates.")
    data = serializers.DictField(required=False, default=dict,
                                 help_text="A JSON object (≤ 16 KB): the templates' `{{ data.* }}`.")
    scheduled_at = AwareDateTimeField(required=False, allow_null=True, default=None,
                                      help_text="Send at this instant (ISO 8601 with offset). Omit to send now.")
    ttl_seconds = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1,
                                           max_value=MAX_TTL_SECONDS, help_text="Overrides the type's TTL.")
    collapse_key = serializers.RegexField(no_control_pattern(MAX_COLLAPSE_KEY, 0), required=False, allow_blank=True,
                                          default="", max_length=MAX_COLLAPSE_KEY,
                                          error_messages={"invalid": "no control characters"},
                                          help_text="Push collapse key (overrides the type's template).")
    metadata = metadata_field()

    def validate_scheduled_at(self, value):
        return check_schedule_window(value)

    def validate(self, attrs):
        given = [name for name in ("user_id", "user_ids") if name in attrs]
        if len(given) != 1:
            raise serializers.ValidationError({"user_id": serializers.ErrorDetail(
                "give user_id (one user) or user_ids (a list), exactly one of them",
                code="required" if not given else "exclusive")})
        users = [attrs["user_id"]] if "user_id" in attrs else attrs["user_ids"]
        path = (lambda i: "user_id") if "user_id" in attrs else (lambda i: f"user_ids.{i}")
        errors, seen = {}, set()
        for index, user in enumerate(users):
            if user in seen:
                errors[path(index)] = serializers.ErrorDetail(f"{user!r} is listed twice", code="duplicate")
            seen.add(user)
        if errors:
            raise serializers.ValidationError(errors)
        found = Recipient.objects.in_bulk(users)
        unknown = [(i, u) for i, u in enumerate(users) if u not in found]
        if unknown:
            raise serializers.ValidationError({path(i): serializers.ErrorDetail(
                "unknown user; create it with PUT /v1/users/{user_id}"
                + (f" ({len(unknown)} unknown in all)" if len(unknown) > 1 else ""), code="unknown_user")
                for i, _u in unknown[:MAX_NAMED_UNKNOWN]})
        attrs["users"] = users
        attrs["recipients"] = [found[u] for u in users]
        return attrs


class EventNotificationSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    user_id = serializers.CharField()
    channel = serializers.CharField()
    status = serializers.CharField(help_text="`queued` (a high-priority type's, due now), or `scheduled`: due "
                                             "later, waiting in fallback order, or a standard type's due now "
                                             "(the scheduler releases them in batches within a second).")
    reason = serializers.CharField(help_text="`fallback_waiting` for a channel that waits for the one before it.")


class EventDigestSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    user_id = serializers.CharField()
    key = serializers.CharField(help_text="The rendered digest key (`\"\"`: one digest per user and type).")
    closes_at = serializers.DateTimeField(help_text="When the window ends and its notifications are made (UTC).")


class EventAcceptedSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    type = serializers.CharField()
    notifications = EventNotificationSerializer(many=True, help_text="Empty for a digest type's event (see "
                                                                     "`digests`).")
    digests = EventDigestSerializer(many=True, help_text="A digest type's event: the open digest it joined, per "
                                                         "user; empty otherwise.")


def accepted_body(event: Event, rows: list[Notification], digests=()) -> dict:
    return {"id": str(event.pk), "type": event.type_id, "notifications": [
        {"id": str(n.pk), "user_id": n.recipient_id, "channel": n.channel, "status": n.accepted_status,
         "reason": "fallback_waiting" if n.fallback_after else ""} for n in rows],
        "digests": [{"id": str(d.pk), "user_id": d.recipient_id, "key": d.key, "closes_at": ISO(d.closes_at)}
                    for d in digests]}


class EventListView(APIView):
    required_scopes = {"post": Scope.SEND}
    scope_notes = {"post": "A `high` type also needs `notifications:send_high` (403 `missing_scope` on `type`)."}
    audit_object = "event"

    @extend_schema(
        summary="Send a semantic event: the platform picks channels, content and timing from its type",
        request=EventRequestSerializer, parameters=IDEMPOTENCY_PARAMETERS,
        examples=[OpenApiExample("Order shipped", request_only=True, value={
            "type": "order_shipped", "user_id": "42",
            "data": {"order_id": "8812", "tracking_url": "https://t.example/8812"}})],
        responses={202: OpenApiResponse(EventAcceptedSerializer, description="Accepted (or replayed: see "
                                                                             "`Idempotent-Replayed`)."),
                   **error_responses(*BODY, 403, 422, 503, **ACCEPTANCE_ERRORS)})
    def post(self, request):
        key, problem = idempotency_key_problem(request)
        if problem:
            return problem
        ser = EventRequestSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        data = ser.validated_data
        kind = type_for(request, data["type"])
        errors = data_errors(kind, data["data"])
        if kind.digest:
            for name in ("scheduled_at", "ttl_seconds", "collapse_key", "metadata"):
                if data[name]:
                    errors[name] = serializers.ErrorDetail(
                        f"type {kind.key} is a digest: its notifications are made when the digest's window closes, "
                        "with the type's TTL and collapse key", code="digest_type")
        for channel in kind.channels:
            for detail in channel_available_errors(channel).values():
                errors["type"] = detail
        if errors:
            raise serializers.ValidationError(errors)
        fingerprint = request_fingerprint({"type": kind.key, "users": data["users"], "data": data["data"],
                                           "scheduled_at": data["scheduled_at"], "ttl_seconds": data["ttl_seconds"],
                                           "collapse_key": data["collapse_key"],
                                           **({"metadata": data["metadata"]} if data["metadata"] is not None else {})})
        try:
            result = services.accept_event(client=request.auth, idempotency_key=key, fingerprint=fingerprint, kind=kind,
                                           recipients=data["recipients"], data=data["data"],
                                           scheduled_at=data["scheduled_at"], ttl_seconds=data["ttl_seconds"],
                                           collapse_key=data["collapse_key"], metadata=data["metadata"])
        except AcceptanceLimited as exc:
            if "user_ids" in request.data:  # name the list item, not a field the request did not use
                exc.field = f"user_ids.{[r.user_id for r in data['recipients']].index(exc.user_id)}"
            raise
        except services.IdempotencyKeyReused:
            return key_reused()
        except services.DigestKeyFailed as exc:
            raise serializers.ValidationError({"data": serializers.ErrorDetail(
                f"the type's digest key could not be rendered with this data: {exc}", code="digest_key")}) from None
        audit_notes.note_fields(request, [k for k in request.data if k in EventRequestSerializer().fields])
        return accepted(accepted_body(result.event, result.notifications, result.digests),
                        f"/v1/events/{result.event.pk}", result.replayed)


def _own_event(request, event_id) -> Event:
    """This client's event ``event_id``; raises NotFoundError (404 on ``event_id``) for any other."""
    event = Event.objects.select_related("type").filter(pk=event_id, client=request.auth).first()
    if event is None:
        raise NotFoundError("event_id", "no event with this id for this API client")
    return event


_EVENT_404 = "No event with this id sent by this API client."


class EventDetailView(APIView):
    required_scopes = {"get": Scope.READ}

    @extend_schema(summary="An event, its data, counts per outcome and channel, and its first recipients",
                   description="Bounded whatever the number of users: `summary` counts them all; `recipients` "
                               "are the first few by `user_id`, each with their notifications and timelines; "
                               "`GET /v1/events/{event_id}/recipients` lists them all, a page at a time.",
                   parameters=response_headers(),
                   responses={200: EventDetailSerializer, **error_responses(404, _404=_EVENT_404)})
    def get(self, request, event_id):
        event = _own_event(request, event_id)
        return Response(event_body(event))


class EventRecipientsView(APIView):
    required_scopes = {"get": Scope.READ}

    @extend_schema(operation_id="v1_events_recipients_list",
                   summary="An event's users by user_id, each with outcome, notifications and timelines (keyset "
                           "pagination)",
                   parameters=[*page_parameters(), *response_headers()],
                   responses={200: page_serializer("EventRecipientPage", EventRecipientSerializer()),
                              **error_responses(404, 422, _404=_EVENT_404,
                                                _422="A bad query parameter; `field` names it.")})
    def get(self, request, event_id):
        event = _own_event(request, event_id)
        return Response(list_page(request.query_params, recipients_query(event), BY_USER,
                                  lambda rows: recipients_body(event, [r.pk for r in rows]),
                                  listing=recipients_listing(event)))


class EventCancelView(APIView):
    required_scopes = {"post": Scope.SEND}
    audit_object = "event"

    @extend_schema(summary="Cancel what of an event no worker has claimed yet", request=None,
                   parameters=response_headers(),
                   responses={200: EventDetailSerializer,
                              **error_responses(404, 409, _404=_EVENT_404,
                                                _409="Every notification was claimed already or has finished.")})
    def post(self, request, event_id):
        event = _own_event(request, event_id)
        try:
            services.cancel_event(event)
        except services.NotCancellable as exc:
            return field_error("status", "not_cancellable", str(exc), 409, error_code="conflict")
        audit_notes.note_fields(request, ["status"])
        event.refresh_from_db()
        return Response(event_body(event))
