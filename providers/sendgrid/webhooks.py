"""``POST /webhooks/sendgrid/events``: SendGrid Event Webhook (delivery receipts).

Verified with the SDK's ``EventWebhook``: ECDSA over the timestamp plus the **raw** body with
``SENDGRID_WEBHOOK_PUBLIC_KEY``; timestamps over 5 minutes off are replays (``docs/PROVIDERS.md``
§2(d)). Events map to receipts per §2(c) (:data:`DROP_REASONS`); the event's ``timestamp`` is the
receipt's ``occurred_at`` and part of its key (:func:`dedup_key`). A batch shares one message id,
so a receipt without our ``notification_id`` applies only to the row sent to its ``email``. What
cannot be stored is stored as U+FFFD or refused with 400, never a 5xx SendGrid retries for days
(docs/SECURITY.md).
"""

from __future__ import annotations

import base64
import json
import time
from datetime import UTC, datetime

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from sendgrid.helpers.eventwebhook import EventWebhook
from sendgrid.helpers.eventwebhook.eventwebhook_header import EventWebhookHeader

from providers import receipts
from providers.webhooks import forbidden, storable_fields

MAX_SKEW_SECONDS = 300

#: A ``dropped`` event's documented ``reason`` (SendGrid Event Webhook reference, "dropped"; the
#: glossary's "Drops") → ``(receipt kind, whether the address is invalid)``, matched whole (case and
#: surrounding blanks aside). Only the suppression-list reasons say anything about the address; a
#: reason about the request or its content (``Invalid SMTPAPI header`` can carry 1,000 recipients)
#: and any reason not listed fail this message only. docs/PROVIDERS.md §2(c) has the same table.
DROP_REASONS: dict[str, tuple[str, bool]] = {
    "bounced address": (receipts.FAILED, True),
    "invalid": (receipts.FAILED, True),
    "unsubscribed address": (receipts.UNSUBSCRIBE, False),
    "spam reporting address": (receipts.COMPLAINT, False),
    "invalid smtpapi header": (receipts.FAILED, False),
    "spam content": (receipts.FAILED, False),
    "recipient list over package quota": (receipts.FAILED, False),
    "duplicate message": (receipts.FAILED, False),
}


def _unix_seconds(value) -> int | None:
    """An event's ``timestamp`` (unix seconds, int, float or numeric string) as int; None if absent
    or not a number."""
    try:
        return int(float(value))
    except (TypeError, ValueError, OverflowError):
        return None


def event_time(event: dict) -> datetime | None:
    """When SendGrid says the event happened: its ``timestamp`` as an aware UTC datetime, or None
    when it is missing or not a representable unix time."""
    seconds = _unix_seconds(event.get("timestamp"))
    if seconds is None:
        return None
    try:
        return datetime.fromtimestamp(seconds, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None


def dedup_key(event: dict) -> str:
    """The receipt's de-duplication key: ``"sendgrid:<sg_message_id>:<event>:<timestamp>"``.

    Not ``sg_event_id``: SendGrid re-posts an event it believes we missed under a fresh one. The whole
    ``sg_message_id`` (one recipient's message; its prefix is the batch's ``X-Message-Id``), else our
    ``notification_id`` custom arg. The price: two events of one type for one message in the same
    second (two clicks) are stored once; only engagement events repeat so, and no state depends on
    them. Without a message or a numeric timestamp: ``sg_event_id``.

    Args:
        event: one event of the Event Webhook's JSON array (``timestamp``: unix seconds).

    Returns:
        At most 200 characters (longer keys are cut to the column's length where stored).
    """
    kind_raw = str(event.get("event", "")).lower()
    message = str(event.get("sg_message_id") or "")
    if not message and event.get("notification_id"):
        message = f"nid={event['notification_id']}"
    timestamp = _unix_seconds(event.get("timestamp"))
    if message and timestamp is not None:
        return f"sendgrid:{message}:{kind_raw}:{timestamp}"[:200]
    if event.get("sg_event_id"):
        return f"sendgrid:{event['sg_event_id']}"[:200]
    return f"sendgrid:{message}:{kind_raw}:"[:200]


def to_receipt(event: dict) -> receipts.Receipt:
    """Map one SendGrid event (a dict from the JSON array) to a :class:`~providers.receipts.Receipt`."""
    kind_raw = str(event.get("event", "")).lower()
    reason = str(event.get("reason", ""))
    invalid = False
    if kind_raw == "processed":
        kind = receipts.ACCEPTED
    elif kind_raw == "delivered":
        kind = receipts.DELIVERED
    elif kind_raw == "deferred":
        kind = receipts.DEFERRED
    elif kind_raw == "bounce":
        kind = receipts.FAILED
        invalid = str(event.get("type", "bounce")).lower() == "bounce"
    elif kind_raw == "dropped":
        kind, invalid = DROP_REASONS.get(reason.strip().casefold(), (receipts.FAILED, False))
    elif kind_raw == "spamreport":
        kind = receipts.COMPLAINT
    elif kind_raw in ("unsubscribe", "group_unsubscribe"):
        kind = receipts.UNSUBSCRIBE
    else:
        kind = receipts.ENGAGEMENT
    message_id = str(event.get("sg_message_id", "")).split(".")[0]
    return receipts.Receipt(
        provider="sendgrid", dedup_key=dedup_key(event), kind=kind, raw=kind_raw or "unknown",
        notification_id=event.get("notification_id"), provider_message_id=message_id,
        error_code=str(event.get("status", "") or ""), detail=reason[:200], invalid_address=invalid,
        occurred_at=event_time(event), address=str(event.get("email") or ""),
        contact=str(event.get("email") or ""))


@csrf_exempt
@require_POST
def events(request):
    headers = EventWebhookHeader
    signature = request.headers.get(headers.SIGNATURE, "")
    timestamp = request.headers.get(headers.TIMESTAMP, "")
    public_key = getattr(settings, "SENDGRID_WEBHOOK_PUBLIC_KEY", "")
    if not signature or not timestamp:
        return forbidden("sendgrid", "missing signature or timestamp header")
    if not public_key:
        return forbidden("sendgrid", "SENDGRID_WEBHOOK_PUBLIC_KEY is not configured; cannot verify")
    try:
        # The host's clock, not the platform clock: the header is SendGrid's own wall time, and a
        # test offset on the platform clock must not refuse every genuine webhook.
        skew = abs(time.time() - int(timestamp))
    except ValueError:
        return forbidden("sendgrid", "timestamp header is not unix seconds")
    if skew > MAX_SKEW_SECONDS:
        return forbidden("sendgrid", f"timestamp is {int(skew)} s away from now (replay window is 300 s)")
    if not signature_valid(public_key, signature, timestamp, request.body):
        return forbidden("sendgrid", "signature does not match the raw body and timestamp")
    try:
        payload = json.loads(request.body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return _unreadable(exc)
    items = payload if isinstance(payload, list) else [payload]
    receipts.publish([to_receipt(storable_fields(e)) for e in items if isinstance(e, dict)])
    return HttpResponse(status=204)


def signature_valid(public_key: str, signature: str, timestamp: str, body: bytes) -> bool:
    """Whether ``signature`` (base64 ECDSA P-256/SHA-256) signs ``timestamp`` + the raw ``body`` for
    ``public_key`` (base64 DER, parsed by the SDK's ``EventWebhook``). The SDK's own
    ``verify_signature`` takes the body as text and encodes it as UTF-8 again, so a body that is not
    UTF-8 could not be checked as sent: this is its check over the bytes SendGrid signed. Never raises."""
    try:
        key = EventWebhook(public_key).public_key
        key.verify(base64.b64decode(signature), timestamp.encode("utf-8") + body, ec.ECDSA(hashes.SHA256()))
    except Exception:  # malformed key or signature encoding, or InvalidSignature
        return False
    return True


def _unreadable(exc: Exception) -> JsonResponse:
    """400 for a signed body that is not UTF-8 JSON, or nests deeper than can be read (nothing stored)."""
    why = ("JSON nested too deeply" if isinstance(exc, RecursionError) else
           "not UTF-8" if isinstance(exc, UnicodeDecodeError) else "not JSON")
    return JsonResponse({"error": {"status": 400, "code": "parse_error", "message": f"body: {why}"}}, status=400)
