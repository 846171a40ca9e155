"""One error shape for every API error, naming the field and the rule.

::

    {"error": {"status": 422, "code": "validation_error", "message": "…",
               "fields": [{"field": "content.body", "code": "max_length", "message": "…"}]}}

``field`` is a dotted path into the request (``"Idempotency-Key"`` for that header); ``code`` is
the rule that failed (DRF's error codes: ``required``, ``max_length``, ``invalid``, ``invalid_choice``…
or ours, e.g. ``naive_datetime``, ``missing_contact``).
"""

from __future__ import annotations

from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from core.api.parsers import FieldParseError
from core.api.refusals import AcceptanceLimited, MissingScope, NotOwner


class NotFoundError(exceptions.NotFound):
    """404 naming the path field that matched nothing: ``NotFoundError("user_id", "no user 'bob'")``."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, code="not_found")
        self.field = field


class InvalidParameter(serializers.ValidationError):
    """422 ``validation_error`` naming a path id or query parameter and the rule it broke:
    ``InvalidParameter("segment_id", "invalid", "contains a control character (U+0000); …")`` answers
    ``{"error": {"status": 422, "code": "validation_error", "message": "segment_id: contains …",
    "fields": [{"field": "segment_id", "code": "invalid", "message": "contains …"}]}}``."""

    def __init__(self, field: str, code: str, message: str) -> None:
        super().__init__({field: [serializers.ErrorDetail(message, code=code)]})


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "payload_too_large"


def too_large_message() -> str:
    """The 413 message, naming the limit (``settings.DATA_UPLOAD_MAX_MEMORY_SIZE``)."""
    from django.conf import settings

    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return f"the request body is larger than the limit of {limit:,} bytes ({limit / 2**20:g} MiB)"


class FieldErrorSerializer(serializers.Serializer):
    field = serializers.CharField(allow_null=True, help_text='Dotted path into the request ("content.body", '
                                                              '"Idempotency-Key"); null for the body as a whole.')
    code = serializers.CharField(help_text="The rule that failed: required, max_length, invalid_choice, …")
    message = serializers.CharField()


class ErrorBodySerializer(serializers.Serializer):
    status = serializers.IntegerField(help_text="The HTTP status code again.")
    code = serializers.CharField(help_text="validation_error, not_found, conflict, not_authenticated, throttled, …")
    message = serializers.CharField()
    fields = FieldErrorSerializer(many=True, required=False, help_text="Present for field-level errors.")
    limit = serializers.CharField(required=False, help_text="`acceptance_limited` only: the abuse limit's name "
                                                            "(`otp_per_user`).")
    retry_after = serializers.IntegerField(required=False, help_text="`acceptance_limited` only: seconds until a "
                                                                     "slot frees (as `Retry-After`).")


class ErrorSerializer(serializers.Serializer):
    """Every API error: ``{"error": {status, code, message, fields?}}``."""

    error = ErrorBodySerializer()


#: The 400 of every JSON body, with the rules of core.api.parsers that hold for any string or number
#: (OpenAPI 3.0 cannot state a rule for every string of a body, map keys included).
MALFORMED_BODY = ("Malformed JSON body (`parse_error`), a key given twice (`duplicate_key`), or a value no field "
                  "can hold: a string (value or key) with a NUL character (\\u0000) or a lone UTF-16 surrogate "
                  "(`unstorable_character`), a number that overflows a double (`not_finite`); `field` names it.")

ERROR_DESCRIPTIONS = {
    400: f"{MALFORMED_BODY} Or a missing/invalid `Idempotency-Key` header.",
    401: "No API key, or an unknown (`invalid_api_key`), revoked (`revoked_api_key`) or expired "
         "(`expired_api_key`) one (`WWW-Authenticate: Api-Key`).",
    403: "The API key lacks the scope this operation needs (`missing_scope`, naming it).",
    404: "Unknown id (or one of another API client).",
    409: "Not cancellable any more.",
    413: "The body is larger than the limit (5 MiB, `DATA_UPLOAD_MAX_MEMORY_SIZE`); the message names it.",
    415: "The body is not `application/json`.",
    422: "Validation failed; `fields` names each field and the rule it broke.",
    429: "Over this API client's rate limit; retry after `Retry-After` seconds.",
    503: "A dependency the request needs cannot be reached; nothing was written: retry shortly "
         "(`database_unavailable`: Postgres restarting or failing over; after `Retry-After` seconds).",
}

# Every endpoint needs an API key, is rate limited and needs the database (503 database_unavailable).
# (403, the scope, is added to every operation by notifications.api.schema.ScopedAutoSchema, which
# names the scope the view declares.)
ALWAYS = (401, 429, 503)
# Endpoints that parse a JSON body can also answer 400 (malformed JSON), 413 (too large) and 415 (not JSON).
BODY = (400, 413, 415)


def error_responses(*codes: int, **descriptions: str) -> dict[int, OpenApiResponse]:
    """``responses=`` entries for the given error statuses (plus 401 and 429) with the Error schema.
    ``descriptions`` overrides a status's description: ``error_responses(404, _404="Unknown user")``."""
    out = {}
    for code in sorted(set(codes) | set(ALWAYS)):
        out[code] = OpenApiResponse(ErrorSerializer, description=descriptions.get(f"_{code}", ERROR_DESCRIPTIONS[code]))
    return out


def response_headers(*, created: tuple[int, ...] = ()) -> list[OpenApiParameter]:
    """Response headers common to every endpoint (``WWW-Authenticate`` on 401, ``Retry-After`` on 429)
    and, for the statuses in ``created``, ``Location``."""
    headers = [
        OpenApiParameter("WWW-Authenticate", str, OpenApiParameter.HEADER, required=True, response=[401],
                         description="`Api-Key`: the scheme to authenticate with."),
        OpenApiParameter("Retry-After", OpenApiTypes.INT, OpenApiParameter.HEADER, response=[429, 503],
                         description="Seconds until the rate limit lets this client through again (429), or "
                                     "to wait before retrying (503)."),
    ]
    if created:
        headers.append(OpenApiParameter("Location", str, OpenApiParameter.HEADER, required=True,
                                        response=list(created), description="Where to read the resource."))
    return headers


def field_error(field: str, code: str, message: str, status_code: int = 422,
                error_code: str = "validation_error") -> Response:
    """A ready response for one field error; the top-level message starts with the field's name."""
    return Response(field_error_body(field, code, message, status_code, error_code), status=status_code)


def field_error_body(field: str | None, code: str, message: str, status_code: int,
                     error_code: str) -> dict:
    """The error shape's body for one field error (``field`` None: the request as a whole): the
    top-level message starts with the field's name. Also for writers outside Django's responses
    (gunicorn's own errors: config/gunicorn_conf.py), so every error has the one layout."""
    return _body(status_code, error_code, f"{field}: {message}" if field else message,
                 [{"field": field, "code": code, "message": message}])


def _body(status_code: int, code: str, message: str, fields: list[dict] | None = None) -> dict:
    body = {"status": status_code, "code": code, "message": message}
    if fields:
        body["fields"] = fields
    return {"error": body}


def json_error_view(status_code: int, code: str, message: str):
    """A plain Django view answering the API's error shape (for URL-level 400/404/500)."""
    from django.http import JsonResponse

    def view(request, exception=None):
        return JsonResponse(_body(status_code, code, message), status=status_code)

    return view


def _flatten(detail, prefix: str = "") -> list[dict]:
    out: list[dict] = []
    if isinstance(detail, dict) and set(detail) == {"message", "code"}:
        out.append({"field": prefix or None, "code": detail["code"], "message": str(detail["message"])})
    elif isinstance(detail, dict):
        for key, value in detail.items():
            name = prefix if key == "non_field_errors" else (f"{prefix}.{key}" if prefix else str(key))
            out.extend(_flatten(value, name))
    elif isinstance(detail, list):
        if all(isinstance(d, dict) and "message" in d and "code" in d for d in detail):
            out.extend({"field": prefix or None, "code": d["code"], "message": str(d["message"])} for d in detail)
        else:
            for i, item in enumerate(detail):
                out.extend(_flatten(item, f"{prefix}.{i}" if prefix else str(i)))
    elif isinstance(detail, exceptions.ErrorDetail):
        out.append({"field": prefix or None, "code": detail.code, "message": str(detail)})
    return out


#: Seconds a client is told to wait (``Retry-After``) when the database cannot be reached: a
#: Postgres restart or failover takes a few seconds.
DATABASE_RETRY_AFTER = 5
_UNAVAILABLE = "the database cannot be reached; nothing was written: retry shortly"


def database_unavailable(exc: BaseException) -> dict | None:
    """The error body for a request that failed because the database could not be reached or the
    connection broke (``OperationalError``, ``InterfaceError``: a Postgres restart, a failover, a full
    connection table): ``503 database_unavailable``, sent with ``Retry-After:``
    :data:`DATABASE_RETRY_AFTER`. The request's transaction rolled back, so nothing was written.
    ``None`` for any other exception. The one rule for DRF views (:func:`exception_handler`) and every
    other view (:class:`DatabaseUnavailableMiddleware`)."""
    if not isinstance(exc, OperationalError | InterfaceError):
        return None
    return _body(503, "database_unavailable", _UNAVAILABLE)


class DatabaseUnavailableMiddleware:
    """503 with ``Retry-After`` (:func:`database_unavailable`), not Django's 500, for a view outside
    DRF that hit a broken database connection (webhooks, the unsubscribe page, the admin): the error
    shape, or a line of text for a browser (``Accept: text/html``)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        from django.http import HttpResponse, JsonResponse

        body = database_unavailable(exception)
        if body is None:
            return None
        if "text/html" in request.headers.get("Accept", ""):
            response = HttpResponse(f"503 Service Unavailable: {_UNAVAILABLE}.", status=503,
                                    content_type="text/plain; charset=utf-8")
        else:
            response = JsonResponse(body, status=503)
        response["Retry-After"] = str(DATABASE_RETRY_AFTER)
        return response


def exception_handler(exc, context):
    unavailable = database_unavailable(exc)
    if unavailable is not None:
        from rest_framework.views import set_rollback

        set_rollback()
        return Response(unavailable, status=503, headers={"Retry-After": str(DATABASE_RETRY_AFTER)})
    if isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge(too_large_message())
    elif isinstance(exc, Http404):
        # Django's own text ("No Recipient matches the given query.") never reaches a client.
        exc = exceptions.NotFound("no such resource; see /api/docs/", code="not_found")
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, FieldParseError):
        response.data = _body(400, "parse_error", str(exc.detail),
                              [{"field": exc.field, "code": exc.code, "message": exc.rule}])
        return response
    if isinstance(exc, exceptions.ParseError):  # the body as a whole (malformed JSON, NaN, too deep)
        response.data = _body(400, "parse_error", f"body: {exc.detail}",
                              [{"field": None, "code": "parse_error", "message": str(exc.detail)}])
        return response
    if isinstance(exc, exceptions.UnsupportedMediaType):
        got = getattr(context.get("request"), "content_type", "") or "none"
        message = f"must be application/json, not {got[:100]}"
        response.data = _body(415, "unsupported_media_type", f"Content-Type: {message}",
                              [{"field": "Content-Type", "code": "unsupported_media_type", "message": message}])
        return response
    if isinstance(exc, MissingScope | NotOwner):
        code = exc.get_codes()
        response.data = _body(403, code, f"{exc.field}: {exc.detail}",
                              [{"field": exc.field, "code": code, "message": str(exc.detail)}])
        return response
    if isinstance(exc, AcceptanceLimited):
        response.data = _body(429, "acceptance_limited", f"{exc.field}: {exc.detail}",
                              [{"field": exc.field, "code": "acceptance_limited", "message": str(exc.detail)}])
        response.data["error"].update(limit=exc.limit, retry_after=exc.wait)
        return response
    if isinstance(exc, NotFoundError):
        response.data = _body(404, "not_found", f"{exc.field}: {exc.detail}",
                              [{"field": exc.field, "code": "not_found", "message": str(exc.detail)}])
        return response
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        code = exc.get_codes() if isinstance(exc.get_codes(), str) else "not_authenticated"
        message = (str(exc.detail) if isinstance(exc, exceptions.AuthenticationFailed)
                   else "required: send `Authorization: Api-Key <key>`")
        response.data = _body(response.status_code, code, f"Authorization: {message}",
                              [{"field": "Authorization", "code": code, "message": message}])
        return response
    if isinstance(exc, exceptions.MethodNotAllowed):
        view, request = context.get("view"), context.get("request")
        allowed = ", ".join(view.allowed_methods) if view is not None else ""
        method = getattr(request, "method", "") or "this method"
        message = f"{method} is not allowed on this endpoint; it allows {allowed}"
        response.data = _body(405, "method_not_allowed", f"method: {message}",
                              [{"field": "method", "code": "method_not_allowed", "message": message}])
        return response
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.get_full_details())
        first = fields[0] if fields else {"field": None, "message": "invalid request"}
        message = f"{first['field']}: {first['message']}" if first.get("field") else first["message"]
        status_code = status.HTTP_422_UNPROCESSABLE_ENTITY
        return Response(_body(status_code, "validation_error", message, fields), status=status_code)
    code = exc.get_codes() if hasattr(exc, "get_codes") else None
    if not isinstance(code, str):
        code = {404: "not_found", 403: "permission_denied", 405: "method_not_allowed"}.get(response.status_code,
                                                                                            "error")
    message = str(exc.detail) if hasattr(exc, "detail") else str(exc)
    response.data = _body(response.status_code, code, message)
    return response
