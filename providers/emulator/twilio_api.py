"""Twilio Messages API: create and list (docs/PROVIDERS.md §1(b)).

``POST /2010-04-01/Accounts/{sid}/Messages.json`` answers 201 with a Message resource (``status:
"queued"``) or an error body ``{"code", "message", "more_info", "status"}``; never ``type``/``title``,
which would make the SDK raise ``TwilioServiceException`` instead of ``TwilioRestException``. An
accepted message with a ``StatusCallback`` later gets signed status callbacks there (``receipts``,
``webhooks``).

``GET /2010-04-01/Accounts/{sid}/Messages.json[?To=&From=&PageSize=]`` answers 200 with Twilio's list
shape, the messages of that account only, newest first::

    {"messages": [<Message resource>, ...], "page": 0, "page_size": 50, "start": 0, "end": 1,
     "uri": "/2010-04-01/Accounts/AC…/Messages.json?To=%2B1555…&PageSize=50&Page=0",
     "first_page_uri": <the same>, "next_page_uri": null, "previous_page_uri": null}

Each resource is the one the create answer gave (``date_created`` in RFC 2822, UTC, whole seconds;
``status`` as at creation: the emulator does not track later statuses). ``To``/``From`` match
exactly; ``PageSize`` is 1..1000 (default 50). Only the first page is served (``next_page_uri`` is
always null) and other parameters (``DateSent``, ``Page`` > 0, ``PageToken``…) are answered 400.
Fault rules apply to sends only, never to the list; list requests are counted apart
(``/_emulator/stats`` ``twilio.list_requests``). Each accepted message is recorded with ``details =
{"from", "messaging_service_sid"}`` as the request gave them (``null`` when absent).
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from aiohttp import web

from providers.emulator import receipts
from providers.emulator.context import emulator_of
from providers.emulator.faults import Fault

API_VERSION = "2010-04-01"
E164 = re.compile(r"^\+[1-9]\d{6,14}$")
#: Characters of the GSM 03.38 basic set (plus the extension table), for segment counting.
GSM7 = frozenset(
    "@£$¥èéùìòÇ\nØø\rÅåΔ_ΦΓΛΩΠΨΣΘΞÆæßÉ !\"#¤%&'()*+,-./0123456789:;<=>?¡ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "ÄÖÑÜ§¿abcdefghijklmnopqrstuvwxyzäöñüà^{}\\[~]|€"
)
MAX_BODY_CHARS = 1600
#: Default error text per Twilio code (wording approximates Twilio's docs).
MESSAGES = {
    20003: "Authenticate",
    20404: "The requested resource was not found",
    20429: "Too Many Requests",
    21211: "The 'To' number is not a valid phone number.",
    21408: "Permission to send an SMS has not been enabled for the region indicated by the 'To' number.",
    21602: "Message body is required.",
    21603: "A 'From' phone number is required.",
    21606: "The 'From' phone number provided is not a valid message-capable Twilio phone number for this destination.",
    21610: "Attempt to send to unsubscribed recipient",
    21614: "'To' number is not a valid mobile number",
    21617: "The concatenated message body exceeds the 1600 character limit.",
    21659: "The 'From' number is not a Twilio phone number or verified outgoing caller ID for your account.",
}
#: HTTP status for a fault given only a Twilio code.
STATUS_OF_CODE = {20003: 401, 20404: 404, 20429: 429}
#: Twilio code for a fault given only an HTTP status (5xx answer with the status as code).
CODE_OF_STATUS = {400: 21211, 401: 20003, 404: 20404, 429: 20429}
#: Query parameters of the message list the emulator serves.
LIST_PARAMETERS = ("To", "From", "PageSize", "Page")
#: Twilio's default and largest PageSize.
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
#: Twilio's "invalid parameter" error code, for a list query the emulator refuses.
INVALID_PARAMETER = 20001
#: Distinct ``extra`` tuples of Twilio messages, one object shared by all messages with the same
#: value (a store holds hundreds of thousands of messages from a handful of senders); bounded.
_EXTRAS: dict[tuple, tuple] = {}
#: The same for the recorded ``details`` (:func:`_details`).
_SHARED_DETAILS: dict[tuple[str | None, str | None], dict[str, str | None]] = {}
_MAX_EXTRAS = 10_000


def error(status: int, code: int, message: str | None = None, retry_after: float | None = None) -> web.Response:
    """A Twilio error response (docs/PROVIDERS.md §1(b))."""
    body = {
        "code": code,
        "message": message or MESSAGES.get(code, "Error"),
        "more_info": f"https://www.twilio.com/docs/errors/{code}",
        "status": status,
    }
    headers = {"Retry-After": _seconds(retry_after)} if retry_after is not None else None
    return web.json_response(body, status=status, headers=headers)


def fault_response(fault: Fault) -> web.Response:
    """The Twilio answer for an injected fault (status and/or code)."""
    code = int(fault.code) if isinstance(fault.code, int) or str(fault.code or "").isdigit() else None
    status = fault.status or STATUS_OF_CODE.get(code or 0, 400)
    if code is None:
        code = CODE_OF_STATUS.get(status, status)
    return error(status, code, retry_after=fault.retry_after)


def segments(body: str) -> int:
    """SMS segments: GSM-7 160/153 characters per part, else UCS-2 70/67."""
    single, multi = (160, 153) if all(ch in GSM7 for ch in body) else (70, 67)
    if len(body) <= single:
        return 1
    return -(-len(body) // multi)


async def create_message(request: web.Request) -> web.Response:
    """Validate and accept one SMS; records it with notification id = ``nid`` of StatusCallback and
    account = the AccountSid of the path (also what fault rules with ``account`` match)."""
    emu = emulator_of(request)
    sid = request.match_info["sid"]
    credentials = _credentials(request, sid)
    if credentials is None:
        emu.stats.rejected("twilio")
        return error(401, 20003)
    form = await request.post()
    to = str(form.get("To", ""))
    fault = await emu.fault_for("twilio", (to,), account=sid)
    if fault is not None:
        emu.stats.rejected("twilio")
        return fault_response(fault)
    problem = _validate(form, to)
    if problem is not None:
        emu.stats.rejected("twilio")
        return problem
    body = str(form.get("Body", ""))
    message_sid = "SM" + secrets.token_hex(16)
    callback = form.get("StatusCallback")
    notification_id = _notification_id(callback)
    service_sid = _str(form.get("MessagingServiceSid"))
    sender = _str(form.get("From"))
    num_media = len(form.getall("MediaUrl", []))
    created_ms = emu.store.add("twilio", to, None, body, message_sid, notification_id, sid,
                               extra=_extra(sender, service_sid, num_media), details=_details(sender, service_sid))
    emu.stats.accepted("twilio")
    if callback and emu.webhooks.enabled:
        rule = emu.receipts.match("twilio", to)
        base = receipts.twilio_base(message_sid, sid, to, sender, service_sid)
        emu.webhooks.twilio(str(callback), credentials[1], receipts.twilio_callbacks(rule, base),
                            rule.delay_ms / 1000.0, notification_id)
    return web.json_response(
        message_resource(message_sid, sid, to, sender, service_sid, body, num_media, created_ms), status=201,
    )


def message_resource(
    message_sid: str, account: str, to: str, sender: str | None, service_sid: str | None, body: str,
    num_media: int, created_ms: int,
) -> dict[str, Any]:
    """A Twilio Message resource as created (docs/PROVIDERS.md §1(b)); ``created_ms`` is UTC epoch ms."""
    created = format_datetime(datetime.fromtimestamp(created_ms / 1000, UTC).replace(microsecond=0))
    uri = f"/{API_VERSION}/Accounts/{account}/Messages/{message_sid}"
    return {
        "sid": message_sid,
        "account_sid": account,
        "messaging_service_sid": service_sid,
        "to": to,
        "from": sender,
        "body": body,
        "status": "queued" if sender else "accepted",
        "num_segments": str(segments(body)),
        "num_media": str(num_media),
        "direction": "outbound-api",
        "error_code": None,
        "error_message": None,
        "price": None,
        "price_unit": "USD",
        "api_version": API_VERSION,
        "uri": uri + ".json",
        "subresource_uris": {"media": uri + "/Media.json", "feedback": uri + "/Feedback.json"},
        "date_created": created,
        "date_updated": created,
        # Twilio answers null until the message has actually been sent.
        "date_sent": None,
    }


async def list_messages(request: web.Request) -> web.Response:
    """The account's messages, newest first, filtered by ``To``/``From`` (see the module docstring)."""
    emu = emulator_of(request)
    emu.stats.twilio_list_requests += 1
    sid = request.match_info["sid"]
    if _credentials(request, sid) is None:
        return error(401, 20003)
    query = request.query
    unknown = sorted(set(query) - set(LIST_PARAMETERS))
    if unknown:
        return error(400, INVALID_PARAMETER, f"The emulator does not support the parameter(s) {', '.join(unknown)}.")
    if query.get("Page", "0") != "0":
        return error(400, INVALID_PARAMETER, "The emulator serves the first page (Page=0) only.")
    raw_size = query.get("PageSize", str(DEFAULT_PAGE_SIZE))
    if not raw_size.isdigit() or not 1 <= int(raw_size) <= MAX_PAGE_SIZE:
        return error(400, INVALID_PARAMETER, f"PageSize must be an integer from 1 to {MAX_PAGE_SIZE}.")
    page_size = int(raw_size)
    to, sender = query.get("To"), query.get("From")
    filters = {"provider": "twilio", "account": sid, **({"to": to} if to is not None else {})}
    messages = []
    for record, extra in emu.store.newest(filters):
        message_sender, service_sid, num_media = extra or (None, None, 0)
        if sender is not None and message_sender != sender:
            continue
        messages.append(message_resource(record["provider_message_id"], sid, record["to"], message_sender,
                                         service_sid, record["body"] or "", num_media, record["received_at_ms"]))
        if len(messages) == page_size:
            break
    kept = [(k, query[k]) for k in ("To", "From") if k in query]
    uri = f"/{API_VERSION}/Accounts/{sid}/Messages.json?" + urlencode([*kept, ("PageSize", page_size), ("Page", 0)])
    return web.json_response({
        "messages": messages,
        "page": 0,
        "page_size": page_size,
        "start": 0,
        "end": max(0, len(messages) - 1),
        "uri": uri,
        "first_page_uri": uri,
        "next_page_uri": None,
        "previous_page_uri": None,
    })


def _extra(sender: str | None, service_sid: str | None, num_media: int) -> tuple:
    """The store's ``extra`` of a Twilio message: ``(From, MessagingServiceSid, number of media)``,
    one shared tuple per distinct value while there are at most :data:`_MAX_EXTRAS`."""
    key = (sender, service_sid, num_media)
    shared = _EXTRAS.get(key)
    if shared is not None:
        return shared
    if len(_EXTRAS) < _MAX_EXTRAS:
        _EXTRAS[key] = key
    return key


def _details(sender: str | None, service_sid: str | None) -> dict[str, str | None]:
    """The recorded ``details`` of a Twilio message: ``{"from", "messaging_service_sid"}`` as the
    request gave them (``None`` when absent), one shared dict per distinct pair while there are at
    most :data:`_MAX_EXTRAS` (never mutated: the store hands it out as is)."""
    key = (sender, service_sid)
    shared = _SHARED_DETAILS.get(key)
    if shared is not None:
        return shared
    details = {"from": sender, "messaging_service_sid": service_sid}
    if len(_SHARED_DETAILS) < _MAX_EXTRAS:
        _SHARED_DETAILS[key] = details
    return details


def _validate(form, to: str) -> web.Response | None:
    if not E164.match(to):
        return error(400, 21211, f"The 'To' number {to} is not a valid phone number.")
    if not form.get("From") and not form.get("MessagingServiceSid"):
        return error(400, 21603)
    body = str(form.get("Body", ""))
    if not body and not form.get("MediaUrl") and not form.get("ContentSid"):
        return error(400, 21602)
    if len(body) > MAX_BODY_CHARS:
        return error(400, 21617)
    return None


def _credentials(request: web.Request, sid: str) -> tuple[str, str] | None:
    """``(user, secret)`` of HTTP Basic ``AccountSid:AuthToken`` (or ``ApiKeySid:Secret``), else ``None``.

    The secret signs the status callbacks (with an API key, real Twilio would use the account's
    AuthToken, which the emulator cannot know).
    """
    scheme, _, encoded = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, _, secret = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    if not user or not secret:
        return None
    return (user, secret) if user == sid or user.startswith("SK") else None


def _str(value: object) -> str | None:
    return str(value) if value else None


def _notification_id(callback: object) -> str | None:
    if not callback:
        return None
    values = parse_qs(urlsplit(str(callback)).query).get("nid")
    return values[0] if values else None


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def add_routes(app: web.Application) -> None:
    app.router.add_post(f"/{API_VERSION}/Accounts/{{sid}}/Messages.json", create_message)
    app.router.add_get(f"/{API_VERSION}/Accounts/{{sid}}/Messages.json", list_messages)
