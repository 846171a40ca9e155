"""FCM HTTP v1: ``POST /token`` (OAuth2 JWT bearer grant) and ``POST /v1/projects/{p}/messages:send``.

Error bodies follow docs/PROVIDERS.md §3(b)::

    {"error": {"code": 404, "message": "...", "status": "NOT_FOUND",
               "details": [{"@type": "type.googleapis.com/google.firebase.fcm.v1.FcmError",
                            "errorCode": "UNREGISTERED"}]}}

so firebase-admin raises its own exception classes (``UnregisteredError``, ``QuotaExceededError``...).

Each accepted message is recorded with ``details = {"message": <the "message" object as
received>}`` (kept as the raw request body, decoded when read: ``store.RawJsonDetails``), so a test
can assert the whole message: no ``notification`` block, ``apns.headers["apns-push-type"]``,
``apns.payload.aps["content-available"]``... A message with ``apns-push-type: background`` and
``apns-priority: 10`` is refused with 400 INVALID_ARGUMENT on ``message.apns.headers`` (Apple: a
background push must have priority 5; FCM: a data message to an Apple device sent with priority 10
is rejected with INVALID_ARGUMENT, "Set the priority of a message"). With the engagement model on and
its ``app_receipts_url`` set, a message to a token may be followed by the app's ``opened`` (``engagement``).
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

from aiohttp import web

from providers.emulator.context import bearer_token, emulator_of
from providers.emulator.faults import Fault
from providers.emulator.store import RawJsonDetails

JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
FCM_ERROR = "type.googleapis.com/google.firebase.fcm.v1.FcmError"
BAD_REQUEST = "type.googleapis.com/google.rpc.BadRequest"
MAX_DATA_BYTES = 4096
MAX_TOPIC_DATA_BYTES = 2048
TARGETS = ("token", "fid", "topic", "condition")
#: FCM errorCode -> (HTTP status, google.rpc status).
BY_ERROR_CODE = {
    "INVALID_ARGUMENT": (400, "INVALID_ARGUMENT"),
    "UNREGISTERED": (404, "NOT_FOUND"),
    "SENDER_ID_MISMATCH": (403, "PERMISSION_DENIED"),
    "QUOTA_EXCEEDED": (429, "RESOURCE_EXHAUSTED"),
    "UNAVAILABLE": (503, "UNAVAILABLE"),
    "INTERNAL": (500, "INTERNAL"),
    "THIRD_PARTY_AUTH_ERROR": (401, "UNAUTHENTICATED"),
    "APNS_AUTH_ERROR": (401, "UNAUTHENTICATED"),
    "UNSPECIFIED_ERROR": (500, "UNKNOWN"),
}
#: HTTP status -> (google.rpc status, FCM errorCode or None) for faults given only a status.
BY_STATUS = {
    400: ("INVALID_ARGUMENT", "INVALID_ARGUMENT"),
    401: ("UNAUTHENTICATED", None),
    403: ("PERMISSION_DENIED", None),
    404: ("NOT_FOUND", "UNREGISTERED"),
    429: ("RESOURCE_EXHAUSTED", "QUOTA_EXCEEDED"),
    500: ("INTERNAL", "INTERNAL"),
    503: ("UNAVAILABLE", "UNAVAILABLE"),
    504: ("DEADLINE_EXCEEDED", None),
}
MESSAGES = {
    "INVALID_ARGUMENT": "Request contains an invalid argument.",
    "UNREGISTERED": "Requested entity was not found.",
    "SENDER_ID_MISMATCH": "SenderId mismatch",
    "QUOTA_EXCEEDED": "Quota exceeded for quota metric 'Send requests'.",
    "UNAVAILABLE": "The service is currently unavailable.",
    "INTERNAL": "Internal error encountered.",
    "THIRD_PARTY_AUTH_ERROR": "Auth error from APNS or Web Push Service",
    "APNS_AUTH_ERROR": "Auth error from APNS or Web Push Service",
    "UNAUTHENTICATED": "Request had invalid authentication credentials. Expected OAuth 2 access "
                       "token, login cookie or other valid authentication credential.",
}
BAD_REGISTRATION_MESSAGE = "The registration token is not a valid FCM registration token"


def error(
    status: int,
    rpc_status: str,
    message: str,
    error_code: str | None = None,
    field: str | None = None,
    retry_after: float | None = None,
) -> web.Response:
    """A Google API error; ``error_code`` adds the FcmError detail, ``field`` a BadRequest detail."""
    details: list[dict[str, Any]] = []
    if error_code:
        details.append({"@type": FCM_ERROR, "errorCode": error_code})
    if field:
        details.append({"@type": BAD_REQUEST, "fieldViolations": [{"field": field, "description": message}]})
    body: dict[str, Any] = {"code": status, "message": message, "status": rpc_status}
    if details:
        body["details"] = details
    headers = {"Retry-After": str(int(retry_after))} if retry_after is not None else None
    return web.json_response({"error": body}, status=status, headers=headers)


def fault_response(fault: Fault) -> web.Response:
    """The FCM answer for an injected fault; INVALID_ARGUMENT on a ``to`` rule names message.token."""
    error_code = str(fault.code).upper() if fault.code is not None else None
    if fault.status is not None:
        status = fault.status
        rpc_status, default_code = BY_STATUS.get(status, ("UNKNOWN", None))
        if error_code in BY_ERROR_CODE and BY_ERROR_CODE[error_code][0] == status:
            rpc_status = BY_ERROR_CODE[error_code][1]
        error_code = error_code or default_code
    else:
        status, rpc_status = BY_ERROR_CODE.get(error_code, (500, "UNKNOWN"))
    field = fault.field
    if error_code == "INVALID_ARGUMENT" and field is None and fault.to is not None:
        field = "message.token"
    if field in ("message.token", "message.fid"):
        message = BAD_REGISTRATION_MESSAGE
    else:
        message = MESSAGES.get(error_code or rpc_status, MESSAGES["INTERNAL"])
    return error(status, rpc_status, message, error_code, field, fault.retry_after)


async def token(request: web.Request) -> web.Response:
    """OAuth2 token endpoint for google-auth service-account credentials (signature not checked)."""
    emu = emulator_of(request)
    emu.stats.token_requests += 1
    form = await request.post()
    if form.get("grant_type") != JWT_BEARER:
        return web.json_response(
            {"error": "unsupported_grant_type", "error_description": f"grant_type must be {JWT_BEARER}"},
            status=400,
        )
    if str(form.get("assertion", "")).count(".") != 2:
        return web.json_response({"error": "invalid_grant", "error_description": "Invalid JWT"}, status=400)
    return web.json_response(
        {"access_token": "ya29.emulator-" + secrets.token_urlsafe(24), "expires_in": 3599, "token_type": "Bearer"},
    )


async def send(request: web.Request) -> web.Response:
    """Validate one FCM message; record it unless ``validate_only`` (dry run), with account = the
    project id of the path (also what fault rules with ``account`` match)."""
    emu = emulator_of(request)
    if bearer_token(request) is None:
        emu.stats.rejected("fcm")
        return error(401, "UNAUTHENTICATED", MESSAGES["UNAUTHENTICATED"])
    raw = await request.read()
    try:
        payload = json.loads(raw)
        message = payload["message"]
        if not isinstance(message, dict):
            raise TypeError
    except (ValueError, KeyError, TypeError):
        emu.stats.rejected("fcm")
        return error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.", "INVALID_ARGUMENT")
    targets = [t for t in TARGETS if message.get(t) is not None]
    destination = str(message[targets[0]]) if len(targets) == 1 else ""
    project = request.match_info["project"]
    fault = await emu.fault_for("fcm", (destination,), account=project)
    if fault is not None:
        emu.stats.rejected("fcm")
        return fault_response(fault)
    problem = _validate(message, targets)
    if problem is not None:
        emu.stats.rejected("fcm")
        return problem
    name = f"projects/{project}/messages/0:{time.time_ns() // 1000}%{secrets.token_hex(8)}"
    if not payload.get("validate_only"):
        notification = message.get("notification") or {}
        data = message.get("data") or {}
        emu.store.add("fcm", destination, notification.get("title"), notification.get("body"), name,
                      data.get("notification_id"), project, details=RawJsonDetails(raw, "message"))
        if emu.engagement is not None and targets[0] == "token":
            emu.engage_push(destination, data.get("notification_id"), emu.clock.now())
    emu.stats.accepted("fcm", 0 if payload.get("validate_only") else 1)
    return web.json_response({"name": name})


def _validate(message: dict[str, Any], targets: list[str]) -> web.Response | None:
    if len(targets) != 1:
        return error(400, "INVALID_ARGUMENT", "Exactly one of token, fid, topic or condition is required.",
                     "INVALID_ARGUMENT")
    target = targets[0]
    value = message[target]
    if target in ("token", "fid") and (not isinstance(value, str) or not value or any(c.isspace() for c in value)):
        return error(400, "INVALID_ARGUMENT", BAD_REGISTRATION_MESSAGE, "INVALID_ARGUMENT", f"message.{target}")
    if not isinstance(message.get("notification") or {}, dict):
        return error(400, "INVALID_ARGUMENT", "Invalid value at 'message.notification'.", "INVALID_ARGUMENT",
                     "message.notification")
    data = message.get("data") or {}
    if not isinstance(data, dict) or any(not isinstance(k, str) or not isinstance(v, str) for k, v in data.items()):
        return error(400, "INVALID_ARGUMENT", "Invalid value at 'message.data': values must be strings.",
                     "INVALID_ARGUMENT", "message.data")
    apns = message.get("apns") or {}
    headers = apns.get("headers") if isinstance(apns, dict) else None
    if isinstance(headers, dict) and headers.get("apns-push-type") == "background" \
            and str(headers.get("apns-priority")) == "10":
        return error(400, "INVALID_ARGUMENT", "A background notification (apns-push-type background) must have "
                     "apns-priority 5, not 10.", "INVALID_ARGUMENT", "message.apns.headers")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in data.items())
    limit = MAX_DATA_BYTES if target in ("token", "fid") else MAX_TOPIC_DATA_BYTES
    if size > limit:
        return error(400, "INVALID_ARGUMENT", f"Message is too big: data payload {size} bytes exceeds "
                     f"{limit}.", "INVALID_ARGUMENT", "message.data")
    return None


def add_routes(app: web.Application) -> None:
    app.router.add_post("/token", token)
    app.router.add_post("/v1/projects/{project}/messages:send", send)
