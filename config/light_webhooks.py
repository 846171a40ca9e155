"""The provider webhooks' light path: a WSGI app that answers ``POST /webhooks/twilio/status`` and
``POST /webhooks/sendgrid/events`` before Django's handler, every other path goes on to Django.

Each provider status is a request (Twilio: 2–3 per SMS), and Django's handler around the view (the
middleware chain: sessions, auth, CSRF, audit, axes; URL resolution; the request signals) cost more
CPU than the view itself. The views need none of it: they verify the signature with the SDK helper,
turn the request into :class:`providers.receipts.Receipt` events and append them to the receipts
buffer. So this calls the same view functions (their rules stay theirs: signatures and 403,
accounts, storable text, 400/204) with a plain ``WSGIRequest``, and answers what Django's handler
would for what can go wrong outside them: 405 for another method; 413 in the API's error shape for
a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` and 400 for a Host not allowed
(``config.urls.handler400``); 503 for a broken database (a receipt applied in the request when
Redis is down); 500 logged. The figures and the choice: docs/ARCHITECTURE.md §6, "The provider
webhooks' light path".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

from django.core.exceptions import SuspiciousOperation
from django.core.handlers.wsgi import WSGIRequest
from django.db import close_old_connections
from django.http import HttpResponse, JsonResponse

from core.api.errors import DATABASE_RETRY_AFTER, database_unavailable, json_error_view
from providers.sendgrid import webhooks as sendgrid_webhooks
from providers.twilio import webhooks as twilio_webhooks

log = logging.getLogger(__name__)

#: The paths answered here, and their views (config/urls.py routes the same paths to the same views).
ROUTES: dict[str, Callable] = {
    "/webhooks/twilio/status": twilio_webhooks.status_callback,
    "/webhooks/sendgrid/events": sendgrid_webhooks.events,
}


def with_light_webhooks(django_app: Callable) -> Callable:
    """``django_app`` with the provider webhooks' paths answered by :func:`answer` first."""

    def application(environ: dict, start_response: Callable) -> Iterable[bytes]:
        view = ROUTES.get(environ.get("PATH_INFO", ""))
        if view is None:
            return django_app(environ, start_response)
        response = answer(view, environ)
        status = f"{response.status_code} {response.reason_phrase}"
        start_response(status, [*response.items()])
        return [response.content]

    return application


def answer(view: Callable, environ: dict) -> HttpResponse:
    """``view``'s response to the request in ``environ``, or the error answer Django's handler would
    give (module docstring). The view's database connections are closed as at the end of a Django
    request when they are unusable or past their age."""
    request = WSGIRequest(environ)
    try:
        return view(request)
    except SuspiciousOperation as exc:  # a body over the limit (413), a Host not allowed (400)
        from config.urls import handler400

        return handler400(request, exc)
    except Exception as exc:
        body = database_unavailable(exc)
        if body is not None:
            response = JsonResponse(body, status=503)
            response["Retry-After"] = str(DATABASE_RETRY_AFTER)
            return response
        log.exception("provider webhook %s failed", environ.get("PATH_INFO"))
        return json_error_view(500, "server_error", "unexpected error; it has been logged")(None, exc)
    finally:
        close_old_connections()
