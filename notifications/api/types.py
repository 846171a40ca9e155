"""``/v1/notification-types``: define what an event becomes (docs/TYPES.md). Views validate
(:func:`notifications.events.validation.type_problems`, the admin's rule too) and call a service."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api import audit_notes, parameters
from core.api.errors import BODY, MissingScope, NotFoundError, error_responses, response_headers
from core.api.fields import LabelField, RejectUnknownFields
from core.api.pagination import Ordering, list_page, page_parameters, page_serializer
from core.api.refusals import NotOwner
from core.api.scopes import Scope
from core.vocabulary import CATEGORY_PATTERN, TEMPLATE_LOCALE_PATTERN
from notifications.api.serializers import body_field, checks_busy, html_field
from notifications.content_limits import MAX_TTL_SECONDS
from notifications.events import services
from notifications.events.digests import MAX_WINDOW_SECONDS, MIN_WINDOW_SECONDS
from notifications.events.models import NotificationType, QuietHoursPolicy, Routing
from notifications.events.validation import DATA_NAME, type_problems
from notifications.models import Priority
from notifications.rendering.checking import ChecksBusy
from notifications.senders import allowlist_problems
from preferences.models import Channel

#: How every answer writes an instant (DRF's: UTC with "Z").
_INSTANT = serializers.DateTimeField()
_KEY = parameters.TYPE_KEY.parameter("key", description="The type's key, e.g. `order_shipped`.")


class TypeTemplateSerializer(RejectUnknownFields, serializers.Serializer):
    channel = serializers.ChoiceField(choices=Channel.choices)
    locale = serializers.RegexField(TEMPLATE_LOCALE_PATTERN.pattern, max_length=35,
                                    error_messages={"invalid": "a BCP 47 tag like 'en' or 'de-AT'"},
                                    help_text='BCP 47 tag: "en", "de-AT".')
    title = serializers.CharField(required=False, allow_blank=True, default="", max_length=998,
                                  help_text="Push title / email subject (one line). Not for SMS.")
    body = body_field(help_text="Push body / email text / SMS text.")
    html = html_field(default="", help_text="Email only; variables are HTML-escaped.")
    data = serializers.DictField(child=serializers.CharField(allow_blank=True, max_length=4096, trim_whitespace=False),
                                 required=False, default=dict, help_text="Push only: `{key: template}`.")


class DigestSerializer(RejectUnknownFields, serializers.Serializer):
    """A type's digest (docs/TYPES.md, "Digests")."""

    window_seconds = serializers.IntegerField(
        min_value=MIN_WINDOW_SECONDS, max_value=MAX_WINDOW_SECONDS,
        help_text=f"Seconds from a digest's first event until it is sent ({MIN_WINDOW_SECONDS}..{MAX_WINDOW_SECONDS}).")
    key = serializers.CharField(required=False, allow_blank=True, default="", max_length=255, trim_whitespace=False,
                                help_text="Template over the event's data (`{{ data.post_id }}`): events of one key "
                                          "share a digest; empty: one digest per user and type.")


class NotificationTypeSerializer(RejectUnknownFields, serializers.Serializer):
    """A notification type as ``PUT`` takes it and ``GET`` answers it (with ``key`` and the stamps)."""

    key = serializers.CharField(read_only=True)
    name = LabelField()
    description = serializers.CharField(required=False, allow_blank=True, default="", max_length=10_000)
    category = serializers.RegexField(CATEGORY_PATTERN.pattern, max_length=64,
                                      error_messages={"invalid": "lower-case letters, digits, '_', '.', '-'; at "
                                                                 "most 64; starting with a letter or digit"},
                                      help_text="What users opt out of: `shipping`, `security`, …")
    priority = serializers.ChoiceField(choices=Priority.choices, default=Priority.STANDARD,
                                       help_text="`high` needs the scope notifications:send_high, to define and to "
                                                 "trigger.")
    channels = serializers.ListField(child=serializers.ChoiceField(choices=Channel.choices), min_length=1, max_length=4,
                                     help_text="The channels it may use, in fallback order (each once).")
    routing = serializers.ChoiceField(choices=Routing.choices, default=Routing.ALL)
    quiet_hours = serializers.ChoiceField(choices=QuietHoursPolicy.choices, default=QuietHoursPolicy.DEFER)
    in_app_quiet_hours = serializers.BooleanField(
        default=False, help_text="`in_app` items wait for the end of quiet hours too (policy defer or silent). "
                                 "Default false: an inbox item is written at once, it makes no sound.")
    required = serializers.BooleanField(default=False, help_text="Opt-outs do not apply (security, legal).")
    sensitive = serializers.BooleanField(default=False, help_text="Content and event data never shown or logged.")
    ttl_seconds = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=1,
                                           max_value=MAX_TTL_SECONDS)
    collapse_key = serializers.CharField(required=False, allow_blank=True, default="", max_length=255,
                                         help_text="Push collapse key template; empty: the notification id.")
    sms_from = serializers.CharField(required=False, allow_blank=True, default="", max_length=64,
                                     help_text="One E.164 number or Messaging Service SID on the sender allow-list "
                                               "(422 `sender_not_allowed`); empty: the provider's.")
    email_from = serializers.CharField(required=False, allow_blank=True, default="", max_length=254,
                                       help_text='Exactly one mailbox ("Shop <shop@example.com>") on the sender '
                                                 "allow-list; empty: the provider's.")
    email_reply_to = serializers.CharField(required=False, allow_blank=True, default="", max_length=254,
                                           help_text="Exactly one mailbox on the sender allow-list.")
    required_data = serializers.ListField(child=serializers.RegexField(
        DATA_NAME.pattern, max_length=64, error_messages={"invalid": "a data key name: letters, digits, _; not "
                                                                     "starting with a digit"}),
                                          required=False, default=list,
                                          max_length=50, help_text="data keys every event must carry (else 422).")
    default_locale = serializers.RegexField(TEMPLATE_LOCALE_PATTERN.pattern, required=False, default="en",
                                            max_length=35,
                                            error_messages={"invalid": "a BCP 47 tag like 'en' or 'de-AT'"})
    digest = DigestSerializer(required=False, allow_null=True, default=None,
                              help_text="Batch its events: one notification per user, key and window, rendered with "
                                        "`items`, `count`, `first`, `last`. Null: every event is sent on its own.")
    templates = TypeTemplateSerializer(many=True, help_text="Per channel and locale; every channel needs one.")
    owner = serializers.CharField(read_only=True, allow_null=True,
                                  help_text="The API client that defined it; null: defined in the admin.")
    created_at = serializers.DateTimeField(read_only=True)
    updated_at = serializers.DateTimeField(read_only=True)

    def validate(self, attrs):
        """:func:`type_problems`, then each well-formed sender against the allow-list of the type's
        owner (context ``client``: the API's caller, the admin's type's owner; ``None``: an admin
        type), :func:`notifications.senders.allowlist_problems`."""
        if attrs.get("digest") is not None:
            attrs["digest"] = dict(attrs["digest"])  # stored as JSON
        problems = {path: (p.code, p.message) for path, p in type_problems(attrs, attrs.get("templates") or []).items()}
        if problems.get("templates", ("",))[0] == ChecksBusy.code:
            raise checks_busy(problems["templates"][1])
        problems.update(allowlist_problems(attrs, self.context.get("client"), set(problems)))
        if problems:
            raise serializers.ValidationError({path: serializers.ErrorDetail(message, code=code)
                                               for path, (code, message) in problems.items()})
        return attrs


def payload(kind: NotificationType) -> dict:
    """The API's view of a type (``NotificationTypeSerializer``'s fields)."""
    body = {name: getattr(kind, name) for name in services.TYPE_FIELDS}
    body.update(key=kind.key, owner=kind.client.name if kind.client is not None else None,
                created_at=_INSTANT.to_representation(kind.created_at),
                updated_at=_INSTANT.to_representation(kind.updated_at),
                templates=[{f: getattr(t, f) for f in services.TEMPLATE_FIELDS} for t in kind.templates.all()])
    return body


_EXAMPLE = {
    "name": "Order shipped", "category": "shipping", "channels": ["push", "email", "sms"], "routing": "all",
    "quiet_hours": "silent", "required_data": ["tracking_url"], "collapse_key": "order-{{ data.order_id }}",
    "templates": [
        {"channel": "push", "locale": "en", "title": "Your order shipped",
         "body": "Order {{ data.order_id }} is on its way", "data": {"url": "{{ data.tracking_url }}"}},
        {"channel": "push", "locale": "de", "title": "Bestellung verschickt",
         "body": "Bestellung {{ data.order_id }} ist unterwegs", "data": {"url": "{{ data.tracking_url }}"}},
        {"channel": "email", "locale": "en", "title": "Order {{ data.order_id }} shipped",
         "body": "Hi {{ first_name }}, track it: {{ data.tracking_url }}",
         "html": "<p>Hi {{ first_name }}, <a href=\"{{ data.tracking_url }}\">track it</a></p>"},
        {"channel": "sms", "locale": "en", "body": "Order {{ data.order_id }} shipped: {{ data.tracking_url }}"}]}


def check_override_scope(request, fields: dict) -> None:
    """A type that overrides users' choices, ``required: true`` (opt-outs do not apply) or
    ``quiet_hours: bypass``, needs the scope ``types:override`` besides ``types:write``. Raises
    MissingScope (403 ``missing_scope`` on the field) when the key lacks it. Types that already
    hold these flags keep them; a replacement that sets them again needs the scope."""
    if request.auth.has_scope(Scope.TYPES_OVERRIDE):
        return
    if fields.get("required"):
        raise MissingScope(Scope.TYPES_OVERRIDE, field="required", why="needed for a type users cannot opt out of")
    if fields.get("quiet_hours") == QuietHoursPolicy.BYPASS:
        raise MissingScope(Scope.TYPES_OVERRIDE, field="quiet_hours",
                           why="needed for a type that bypasses users' quiet hours")


class TypeView(APIView):
    required_scopes = {"get": Scope.READ, "put": Scope.TYPES_WRITE}
    scope_notes = {"put": "A `high` type also needs `notifications:send_high` (403 `missing_scope` on `priority`); "
                          "`required: true` or `quiet_hours: bypass` needs `types:override` (403 `missing_scope` on "
                          "that field)."}
    audit_object = "notification_type"

    @extend_schema(request=NotificationTypeSerializer, parameters=[_KEY, *response_headers()],
                   examples=[OpenApiExample("Order shipped", request_only=True, value=_EXAMPLE)],
                   responses={200: OpenApiResponse(NotificationTypeSerializer, description="Replaced."),
                              201: OpenApiResponse(NotificationTypeSerializer, description="Created."),
                              **error_responses(*BODY, 403, 422, _403="Another API client's type, one defined in "
                                                                      "the admin, or `high` without the scope.")},
                   summary="Create or replace a notification type (this client's own) and its templates")
    def put(self, request, key: str):
        parameters.TYPE_KEY.check("key", key)
        existing = NotificationType.objects.filter(pk=key).first()
        if existing is not None and existing.client_id != request.auth.pk:
            raise NotOwner("key", "this notification type was defined by another API client" if existing.client_id
                           else "this notification type was defined in the admin; staff change it there")
        ser = NotificationTypeSerializer(data=request.data, context={"client": request.auth})
        ser.is_valid(raise_exception=True)
        fields = dict(ser.validated_data)
        templates = fields.pop("templates")
        if Priority.HIGH in (fields["priority"], getattr(existing, "priority", None)) and not request.auth.has_scope(
                Scope.SEND_HIGH):
            raise MissingScope(Scope.SEND_HIGH, field="priority", why="needed to define or change a high type")
        check_override_scope(request, fields)
        try:
            kind, created = services.save_type(key, fields, templates, client=request.auth,
                                               may_high=request.auth.has_scope(Scope.SEND_HIGH))
        except services.TypeNotOwned as exc:  # a concurrent request made it first
            raise NotOwner("key", "this notification type was defined in the admin; staff change it there"
                           if exc.admin_made else "this notification type was defined by another API client") from None
        except services.HighNotAllowed:
            raise MissingScope(Scope.SEND_HIGH, field="priority",
                               why="needed to define or change a high type") from None
        audit_notes.note_fields(request, [k for k in request.data if k in NotificationTypeSerializer().fields])
        return Response(payload(kind), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    @extend_schema(parameters=[_KEY, *response_headers()],
                   responses={200: NotificationTypeSerializer, **error_responses(404, 422)},
                   summary="A notification type")
    def get(self, request, key: str):
        parameters.TYPE_KEY.check("key", key)
        kind = NotificationType.objects.select_related("client").prefetch_related("templates").filter(pk=key).first()
        if kind is None:
            raise NotFoundError("key", f"no notification type {key!r}")
        return Response(payload(kind))


class TypeListView(APIView):
    required_scopes = {"get": Scope.READ}

    @extend_schema(parameters=[*page_parameters(), *response_headers()],
                   responses={200: page_serializer("NotificationTypePage", NotificationTypeSerializer()),
                              **error_responses(422)},
                   operation_id="v1_notification_types_list", summary="Notification types by key (keyset pagination)")
    def get(self, request):
        qs = NotificationType.objects.select_related("client").prefetch_related("templates")
        return Response(list_page(request.query_params, qs, Ordering(("key",)),
                                  lambda rows: [payload(k) for k in rows], listing=("notification_types",)))
