"""``GET /u/{token}`` and ``POST /u/{token}``: an email's unsubscribe link (RFC 8058; docs/TYPES.md,
"Unsubscribe"). Not part of the API: no API key, no login, no CSRF token, not in the schema.

``GET`` shows what the link will do and a button; it never changes anything (scanners follow GETs).
``POST`` with ``List-Unsubscribe=One-Click`` (source ``one_click``; trailing CRLF ignored) or
``confirm=unsubscribe`` (source ``page``) opts out of the link's category on its channel,
idempotently: 200. A bad token or a POST with neither field: 400 page; a recipient deleted or
erased since: 404 page; nothing changed.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from notifications import metrics
from notifications.quiet_hours_policy import bypass_categories
from preferences.models import Recipient, Unsubscribe
from preferences.unsubscribe import BadToken, UnsubscribeToken, check_live, read_token, unsubscribe
from providers.base import ONE_CLICK

TEMPLATE = "unsubscribe/page.html"
#: The page button's form field and value (the one-click field is ``List-Unsubscribe``).
CONFIRM_FIELD, CONFIRM_VALUE = "confirm", "unsubscribe"
#: RFC 8058's one-click field and value, as the ``List-Unsubscribe-Post`` header we send names them.
ONE_CLICK_FIELD, ONE_CLICK_VALUE = ONE_CLICK.split("=", 1)


def is_one_click(request: HttpRequest) -> bool:
    """Whether the POST's form (``application/x-www-form-urlencoded`` or ``multipart/form-data``, the
    two RFC 8058 allows) has ``List-Unsubscribe`` = ``One-Click``. Trailing blanks (a body ending in
    CRLF, as some mailbox providers send it, stays in the last value) are ignored; nothing else is:
    another value, case or leading blanks are not the one-click."""
    return request.POST.get(ONE_CLICK_FIELD, "").rstrip(" \t\r\n") == ONE_CLICK_VALUE


def _page(request: HttpRequest, state: str, status: int, link: UnsubscribeToken | None = None,
          message: str = "") -> HttpResponse:
    response = render(request, TEMPLATE, {"state": state, "link": link, "message": message,
                                          "confirm_field": CONFIRM_FIELD, "confirm_value": CONFIRM_VALUE},
                      status=status)
    response["Cache-Control"] = "no-store"
    response["Referrer-Policy"] = "no-referrer"  # the token is in the URL
    response["X-Robots-Tag"] = "noindex"
    return response


@csrf_exempt
@require_http_methods(["GET", "POST"])
def unsubscribe_view(request: HttpRequest, token: str) -> HttpResponse:
    """The link's page (GET) or its opt-out (POST); see the module docstring for the answers."""
    try:
        link = read_token(token)
    except BadToken as exc:
        return _page(request, "invalid", 400, message=str(exc))
    if link.category in bypass_categories():
        # Never made since the rule (notifications.unsubscribe): a security or transactional email
        # cannot be unsubscribed from by a link, which would silence password resets as well.
        return _page(request, "invalid", 400, link, f"{link.category} emails (security alerts, password resets, "
                                                    "receipts) cannot be unsubscribed from: they are what you "
                                                    "asked for or need")
    if request.method == "GET":
        try:
            check_live(link)
        except Recipient.DoesNotExist:
            return _page(request, "invalid", 404, message="this link's recipient no longer exists")
        return _page(request, "confirm", 200, link)
    if is_one_click(request):
        source = Unsubscribe.Source.ONE_CLICK
    elif request.POST.get(CONFIRM_FIELD) == CONFIRM_VALUE:
        source = Unsubscribe.Source.PAGE
    else:
        return _page(request, "invalid", 400, link, "List-Unsubscribe: the form field must be One-Click "
                                                    "(RFC 8058), or use the button on this page")
    try:
        made = unsubscribe(link, source.value)
    except Recipient.DoesNotExist:
        return _page(request, "invalid", 404, message="this link's recipient no longer exists")
    if made:
        metrics.unsubscribed(link.category, source.value)
    return _page(request, "done", 200, link)
