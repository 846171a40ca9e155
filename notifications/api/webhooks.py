"""``/v1/webhook-endpoints``: an API client's status webhook endpoints (docs/WEBHOOKS.md). Scope
``webhooks``; a client sees and changes only its own. The signing secret is in the create answer
and nowhere else."""

from __future__ import annotations

from django.urls import reverse
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api.errors import BODY, MALFORMED_BODY, error_responses, field_error, response_headers
from core.api.fields import RejectUnknownFields
from core.api.pagination import Ordering, list_page, page_parameters, page_serializer
from core.api.scopes import Scope
from notifications.webhooks import delivery, endpoints
from notifications.webhooks.models import EVENTS, WebhookEndpoint
from notifications.webhooks.safety import Refused, check_url

_EVENTS = ", ".join(EVENTS)


class EndpointCreateSerializer(RejectUnknownFields, serializers.Serializer):
    url = serializers.CharField(max_length=2000, help_text="Where events are POSTed: `https://` to a public address "
                                                           "(no loopback, private or link-local one).")
    events = serializers.ListField(
        child=serializers.ChoiceField(choices=[(e, e) for e in EVENTS], error_messages={
            "invalid_choice": f'"{{input}}" is not an event; one of: {_EVENTS}'}),
        min_length=1, help_text=f"The events sent to it: {_EVENTS}.")
    description = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")

    def validate_url(self, value: str) -> str:
        try:
            check_url(value)
        except Refused as exc:
            raise serializers.ValidationError(str(exc), code="url_not_allowed") from None
        return value


class EndpointSerializer(serializers.Serializer):
    id = serializers.UUIDField()
    url = serializers.CharField()
    events = serializers.ListField(child=serializers.CharField())
    description = serializers.CharField()
    active = serializers.BooleanField(help_text="False: disabled (`disabled_reason` says why); nothing is sent.")
    disabled_reason = serializers.CharField(allow_blank=True)
    failing_since = serializers.DateTimeField(allow_null=True, help_text="First failed attempt since the last "
                                                                         "success; null: healthy.")
    created_at = serializers.DateTimeField()


class EndpointCreatedSerializer(EndpointSerializer):
    secret = serializers.CharField(help_text="`whsec_…`: verify each delivery's `webhook-signature` with it. Shown "
                                             "only in this answer: store it now.")


class TestSentSerializer(serializers.Serializer):
    delivery_id = serializers.CharField(help_text="The `webhook-id` the test event is sent with.")
    event = serializers.CharField()


_404 = "No webhook endpoint with this id of this API client."


def _mine(request, endpoint_id) -> WebhookEndpoint | None:
    return WebhookEndpoint.objects.filter(client=request.auth, pk=endpoint_id).first()


def _not_found() -> Response:
    return field_error("endpoint_id", "not_found", "no webhook endpoint with this id of this API client", 404,
                       error_code="not_found")


class WebhookEndpointListView(APIView):
    required_scopes = {"get": Scope.WEBHOOKS, "post": Scope.WEBHOOKS}
    audit_object = "webhook_endpoint"

    @extend_schema(parameters=[*page_parameters(), *response_headers()],
                   responses={200: page_serializer("WebhookEndpointPage", EndpointSerializer()),
                              **error_responses(422)},
                   operation_id="v1_webhook_endpoints_list", summary="This client's webhook endpoints (no secrets)")
    def get(self, request):
        qs = WebhookEndpoint.objects.filter(client=request.auth)
        return Response(list_page(request.query_params, qs, Ordering(("created_at", "id")),
                                  lambda rows: EndpointSerializer(rows, many=True).data,
                                  listing=("webhook_endpoints",)))

    @extend_schema(
        request=EndpointCreateSerializer, parameters=response_headers(created=(201,)),
        summary="Register a webhook endpoint; the answer holds its signing secret, once",
        examples=[OpenApiExample("Sent and delivered", request_only=True, value={
            "url": "https://hooks.example.com/notify", "events": ["notification.sent", "notification.delivered"],
            "description": "order service"})],
        responses={201: OpenApiResponse(EndpointCreatedSerializer, description="Created, with `secret`."),
                   **error_responses(*BODY, 409, 422, _400=MALFORMED_BODY,
                                     _409="The client has the most endpoints allowed (`too_many_endpoints`).",
                                     _422="Validation failed: `url` not https or to a non-public address "
                                          "(`url_not_allowed`), an unknown event, an unknown field. Nothing "
                                          "was written.")})
    def post(self, request):
        ser = EndpointCreateSerializer(data=request.data)
        ser.is_valid(raise_exception=True)
        try:
            endpoint = endpoints.create(request.auth, **ser.validated_data)
        except endpoints.TooMany as exc:
            return field_error("url", "too_many_endpoints", str(exc), 409, error_code="conflict")
        body = {**EndpointSerializer(endpoint).data, "secret": endpoint.secret}
        return Response(body, status=status.HTTP_201_CREATED,
                        headers={"Location": reverse("webhook-endpoint", args=[endpoint.pk])})


class WebhookEndpointView(APIView):
    required_scopes = {"get": Scope.WEBHOOKS, "delete": Scope.WEBHOOKS}
    audit_object = "webhook_endpoint"

    @extend_schema(parameters=response_headers(), summary="One webhook endpoint (never its secret)",
                   responses={200: EndpointSerializer, **error_responses(404, _404=_404)})
    def get(self, request, endpoint_id):
        endpoint = _mine(request, endpoint_id)
        return _not_found() if endpoint is None else Response(EndpointSerializer(endpoint).data)

    @extend_schema(parameters=response_headers(), summary="Delete a webhook endpoint (its pending deliveries too)",
                   responses={204: OpenApiResponse(description="Deleted."), **error_responses(404, _404=_404)})
    def delete(self, request, endpoint_id):
        endpoint = _mine(request, endpoint_id)
        if endpoint is None:
            return _not_found()
        endpoints.delete(endpoint)
        return Response(status=status.HTTP_204_NO_CONTENT)


class WebhookEndpointTestView(APIView):
    required_scopes = {"post": Scope.WEBHOOKS}
    audit_object = "webhook_endpoint"

    @extend_schema(request=None, parameters=response_headers(),
                   summary="Send a signed `webhook.test` event to the endpoint now",
                   responses={202: OpenApiResponse(TestSentSerializer, description="Queued; see the admin for the "
                                                                                   "answer."),
                              **error_responses(404, 409, _404=_404,
                                                _409="The endpoint is disabled (`endpoint_disabled`).")})
    def post(self, request, endpoint_id):
        endpoint = _mine(request, endpoint_id)
        if endpoint is None:
            return _not_found()
        if not endpoint.active:
            return field_error("endpoint_id", "endpoint_disabled", f"disabled: {endpoint.disabled_reason}", 409,
                               error_code="conflict")
        sent = delivery.send_test(endpoint)
        return Response({"delivery_id": sent.message_id, "event": sent.event_type}, status=status.HTTP_202_ACCEPTED)
