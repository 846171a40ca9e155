"""``POST /webhooks/sendgrid/events``: SendGrid Event Webhook (delivery receipts).

Verified with the SDK's ``EventWebhook`` helper: ECDSA P-256/SHA-256 over the timestamp header plus
the **raw** body, with the public key from ``SENDGRID_WEBHOOK_PUBLIC_KEY`` (base64 DER, as SendGrid's
console shows it); timestamps more than 5 minutes from now are refused as replays
(``shared/reference/providers.md`` §2(d)). Events map to receipts (§2(c)): ``processed`` → accepted;
``delivered`` → delivered; ``deferred`` → deferred; ``bounce`` (``type`` bounce = hard, blocked =
soft) and ``dropped`` → failed, with ``Bounced Address``/``Invalid`` and hard bounces marking the
address invalid; ``spamreport`` → complaint; ``unsubscribe``/``group_unsubscribe`` and ``dropped``
for unsubscribed/spam-reporting addresses → unsubscribe; ``open``/``click`` → engagement.
"""

from __future__ import annotations

import json
import time

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from sendgrid.helpers.eventwebhook import EventWebhook
from sendgrid.helpers.eventwebhook.eventwebhook_header import EventWebhookHeader

from notifications import receipts
from providers.webhooks import forbidden

MAX_SKEW_SECONDS = 300
_INVALID_DROP_REASONS = ("bounced address", "invalid")
_UNSUBSCRIBED_DROP_REASONS = ("unsubscribed address", "spam reporting address")


def to_receipt(event: dict) -> receipts.Receipt:
    """Map one SendGrid event (a dict from the JSON array) to a :class:`~notifications.receipts.Receipt`."""
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
        lowered = reason.lower()
        kind = receipts.UNSUBSCRIBE if lowered.startswith(_UNSUBSCRIBED_DROP_REASONS) else receipts.FAILED
        invalid = lowered.startswith(_INVALID_DROP_REASONS)
        if lowered.startswith("spam reporting"):
            kind = receipts.COMPLAINT
    elif kind_raw == "spamreport":
        kind = receipts.COMPLAINT
    elif kind_raw in ("unsubscribe", "group_unsubscribe"):
        kind = receipts.UNSUBSCRIBE
    else:
        kind = receipts.ENGAGEMENT
    message_id = str(event.get("sg_message_id", "")).split(".")[0]
    event_id = str(event.get("sg_event_id") or f"{message_id}:{kind_raw}:{event.get('timestamp', '')}")
    return receipts.Receipt(
        provider="sendgrid", dedup_key=f"sendgrid:{event_id}", kind=kind, raw=kind_raw or "unknown",
        notification_id=event.get("notification_id"), provider_message_id=message_id,
        error_code=str(event.get("status", "") or ""), detail=reason[:200], invalid_address=invalid)


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
        skew = abs(time.time() - int(timestamp))
    except ValueError:
        return forbidden("sendgrid", "timestamp header is not unix seconds")
    if skew > MAX_SKEW_SECONDS:
        return forbidden("sendgrid", f"timestamp is {int(skew)} s away from now (replay window is 300 s)")
    raw = request.body.decode("utf-8", errors="replace")
    try:
        valid = EventWebhook(public_key).verify_signature(raw, signature, timestamp)
    except Exception:  # malformed key or signature encoding
        valid = False
    if not valid:
        return forbidden("sendgrid", "signature does not match the raw body and timestamp")
    try:
        payload = json.loads(raw)
    except ValueError:
        return HttpResponse(status=400)
    items = payload if isinstance(payload, list) else [payload]
    receipts.apply_receipts([to_receipt(e) for e in items if isinstance(e, dict)])
    return HttpResponse(status=204)
