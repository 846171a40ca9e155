"""Twilio Messages API: ``POST /2010-04-01/Accounts/{sid}/Messages.json`` (providers.md §1(b)).

Answers 201 with a Message resource (``status: "queued"``) or an error body
``{"code", "message", "more_info", "status"}``; never ``type``/``title``, which would make the SDK
raise ``TwilioServiceException`` instead of ``TwilioRestException``. An accepted message with a
``StatusCallback`` later gets signed status callbacks there (``receipts``, ``webhooks``).
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from datetime import UTC, datetime
from email.utils import format_datetime
from urllib.parse import parse_qs, urlsplit

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


def error(status: int, code: int, message: str | None = None, retry_after: float | None = None) -> web.Response:
    """A Twilio error response (providers.md §1(b))."""
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
    emu.store.add("twilio", to, None, body, message_sid, notification_id, sid)
    emu.stats.accepted("twilio")
    service_sid = form.get("MessagingServiceSid")
    if callback and emu.webhooks.enabled:
        rule = emu.receipts.match("twilio", to)
        base = receipts.twilio_base(message_sid, sid, to, _str(form.get("From")), _str(service_sid))
        emu.webhooks.twilio(str(callback), credentials[1], receipts.twilio_callbacks(rule, base),
                            rule.delay_ms / 1000.0, notification_id)
    now = format_datetime(datetime.now(UTC))
    uri = f"/{API_VERSION}/Accounts/{sid}/Messages/{message_sid}"
    return web.json_response(
        {
            "sid": message_sid,
            "account_sid": sid,
            "messaging_service_sid": service_sid,
            "to": to,
            "from": form.get("From"),
            "body": body,
            "status": "queued" if form.get("From") else "accepted",
            "num_segments": str(segments(body)),
            "num_media": str(len(form.getall("MediaUrl", []))),
            "direction": "outbound-api",
            "error_code": None,
            "error_message": None,
            "price": None,
            "price_unit": "USD",
            "api_version": API_VERSION,
            "uri": uri + ".json",
            "subresource_uris": {"media": uri + "/Media.json", "feedback": uri + "/Feedback.json"},
            "date_created": now,
            "date_updated": now,
            # Twilio answers null until the message has actually been sent.
            "date_sent": None,
        },
        status=201,
    )


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
