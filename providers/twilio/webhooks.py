"""``POST /webhooks/twilio/status``: Twilio message status callbacks (delivery receipts).

Verified with the SDK's ``RequestValidator`` against the public URL and the form parameters, with
the account's AuthToken (``docs/PROVIDERS.md`` §1(d)). Unsigned or forged requests, and outside
emulator mode those signed with the emulator's public token, get 403 and change nothing. Statuses
map to receipts as docs/PROVIDERS.md "Delivery receipts" says. NUL or a lone surrogate in a
parameter is stored as U+FFFD: answered 204, never a 500 Twilio retries.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from twilio.request_validator import RequestValidator

from providers import receipts
from providers.emulator_credentials import BUILT_IN_SECRETS
from providers.webhooks import forbidden, public_url, storable, storable_fields

STATUS_KINDS = {
    "queued": receipts.ACCEPTED, "accepted": receipts.ACCEPTED, "sending": receipts.ACCEPTED,
    "sent": receipts.ACCEPTED, "scheduled": receipts.ACCEPTED, "delivered": receipts.DELIVERED,
    "read": receipts.ENGAGEMENT, "undelivered": receipts.FAILED, "failed": receipts.FAILED,
    "canceled": receipts.FAILED,
}


def _auth_token(account_sid: str) -> str:
    """The AuthToken of the configured Twilio account ``account_sid`` (the primary or a backup such
    as ``twilio_backup``: each account signs its own callbacks), else the primary ``twilio`` entry's;
    ``""`` (every signature refused) when there is none, or when it is the emulator's public built-in
    token outside emulator mode. The request still has to carry a valid signature made with it."""
    token = ""
    entries = [e for e in settings.PROVIDERS.get("sms", [])
               if e.get("NAME") == "twilio" or str(e.get("BACKEND", "")).endswith("TwilioSmsBackend")]
    by_account = [e for e in entries if account_sid and e["OPTIONS"].get("ACCOUNT_SID") == account_sid]
    for entry in by_account or [e for e in entries if e.get("NAME") == "twilio"]:
        token = str(entry["OPTIONS"].get("AUTH_TOKEN") or "")
        break
    if token in BUILT_IN_SECRETS and getattr(settings, "PROVIDER_MODE", "real") != "emulator":
        return ""
    return token


@csrf_exempt
@require_POST
def status_callback(request):
    signature = request.headers.get("X-Twilio-Signature", "")
    token = _auth_token(request.POST.get("AccountSid", ""))
    if not signature:
        return forbidden("twilio", "missing X-Twilio-Signature header")
    if not token or not RequestValidator(token).validate(public_url(request), request.POST, signature):
        return forbidden("twilio", "signature does not match the public URL and parameters")
    # After the signature (which covers the parameters as sent): what is stored must be storable.
    params = storable_fields(request.POST.dict())
    status = (params.get("MessageStatus") or params.get("SmsStatus") or "").lower()
    sid = params.get("MessageSid") or params.get("SmsSid") or ""
    code = params.get("ErrorCode") or ""
    receipt = receipts.Receipt(
        provider="twilio", dedup_key=f"twilio:{sid}:{status}:{code}", kind=STATUS_KINDS.get(status, "unknown"),
        raw=status or "unknown", notification_id=storable(request.GET.get("nid")), provider_message_id=sid,
        error_code=code, sender=params.get("From", "") or params.get("MessagingServiceSid", ""),
        contact=params.get("To", ""))
    receipts.publish([receipt])
    return HttpResponse(status=204)
