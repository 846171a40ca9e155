"""What a provider callback costs the web process: ``manage.py bench_webhooks`` (docs/ARCHITECTURE.md
§6, "The provider webhooks' light path").

In-process, no server: ``requests`` signed Twilio status callbacks (one receipt each) and SendGrid
Event Webhook POSTs of 100 events, signed with the SDK helpers as the providers sign them, go
through each WSGI callable; ``time.process_time`` over the loop, divided by the requests. The
receipts land in the (bench) Redis buffer; a drain flag set beforehand keeps any drain from being
queued, and the buffer is emptied afterwards. Options: ``django`` (Django's handler, every
middleware), ``django_no_middleware`` (the same handler with ``MIDDLEWARE = []``: what a view exempt
from all middleware could reach at best), ``light`` (config/light_webhooks.py before Django).
"""

from __future__ import annotations

import base64
import io
import json
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlencode, urlsplit

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from django.conf import settings
from django.core.handlers.wsgi import WSGIHandler
from django.test.utils import override_settings
from twilio.request_validator import RequestValidator

from config.light_webhooks import with_light_webhooks
from core.redis_client import get_redis
from notifications import receipts_buffer
from providers.twilio.webhooks import _auth_token

TWILIO_PATH = "/webhooks/twilio/status"
SENDGRID_PATH = "/webhooks/sendgrid/events"
EVENTS_PER_POST = 100


def _environ(path: str, query: str, body: bytes, content_type: str, headers: dict[str, str]) -> dict:
    public = urlsplit(settings.PUBLIC_BASE_URL)
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": path, "QUERY_STRING": query, "SCRIPT_NAME": "",
               "CONTENT_TYPE": content_type, "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body),
               "wsgi.url_scheme": public.scheme, "SERVER_NAME": public.hostname or "127.0.0.1",
               "SERVER_PORT": str(public.port or 80), "HTTP_HOST": public.netloc, "REMOTE_ADDR": "127.0.0.1",
               "wsgi.errors": io.StringIO(), "wsgi.multithread": True, "wsgi.multiprocess": True}
    environ.update({"HTTP_" + name.upper().replace("-", "_"): value for name, value in headers.items()})
    return environ


def twilio_requests(count: int) -> list[tuple[str, str, bytes, str, dict]]:
    """``count`` status callbacks as Twilio posts them, signed with ``RequestValidator``."""
    account = "AC" + "0" * 32
    validator = RequestValidator(_auth_token(account))
    out = []
    for i in range(count):
        query = f"nid={uuid.uuid4()}"
        sid = f"SM{uuid.uuid4().hex}"
        status = ("sent", "delivered")[i % 2]
        params = {"MessageSid": sid, "SmsSid": sid, "MessageStatus": status, "SmsStatus": status,
                  "AccountSid": account, "From": "+15005550006", "To": "+4915112345678",
                  "ApiVersion": "2010-04-01"}
        signature = validator.compute_signature(f"{settings.PUBLIC_BASE_URL.rstrip('/')}{TWILIO_PATH}?{query}", params)
        out.append((TWILIO_PATH, query, urlencode(params).encode(), "application/x-www-form-urlencoded",
                    {"X-Twilio-Signature": signature}))
    return out


def sendgrid_requests(count: int, key: ec.EllipticCurvePrivateKey) -> list[tuple[str, str, bytes, str, dict]]:
    """``count`` Event Webhook POSTs of 100 events each, ECDSA-signed as SendGrid signs them."""
    out = []
    now = int(time.time())
    for _ in range(count):
        batch = uuid.uuid4().hex[:22]
        events = [{"email": f"user{i}@example.com", "timestamp": now, "event": ("processed", "delivered")[i % 2],
                   "sg_event_id": uuid.uuid4().hex, "sg_message_id": f"{batch}.filter{i}.0",
                   "notification_id": str(uuid.uuid4()), "smtp-id": f"<{batch}@example.com>"}
                  for i in range(EVENTS_PER_POST)]
        body = json.dumps(events).encode()
        signature = key.sign(str(now).encode() + body, ec.ECDSA(hashes.SHA256()))
        out.append((SENDGRID_PATH, "", body, "application/json",
                    {"X-Twilio-Email-Event-Webhook-Signature": base64.b64encode(signature).decode(),
                     "X-Twilio-Email-Event-Webhook-Timestamp": str(now)}))
    return out


def _cpu_us_per_request(app: Callable, requests: list) -> float:
    statuses: list[str] = []

    def start_response(status, headers):
        statuses.append(status)

    started = time.process_time()
    for path, query, body, content_type, headers in requests:
        b"".join(app(_environ(path, query, body, content_type, headers), start_response))
    spent = time.process_time() - started
    if any(not s.startswith("204") for s in statuses):
        raise RuntimeError(f"not every request was answered 204: {sorted(set(statuses))}")
    return round(spent / len(requests) * 1e6, 1)


def run(count: int) -> dict:
    """CPU-µs per request by option and provider (module docstring)."""
    key = ec.generate_private_key(ec.SECP256R1())
    der = key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    redis = get_redis()
    redis.set(receipts_buffer.DRAIN_FLAG, "1", ex=3600)
    result: dict[str, dict[str, float]] = {}
    try:
        with override_settings(SENDGRID_WEBHOOK_PUBLIC_KEY=base64.b64encode(der).decode()):
            django_app = WSGIHandler()
            with override_settings(MIDDLEWARE=[]):
                bare_app = WSGIHandler()
            options = {"django": django_app, "django_no_middleware": bare_app,
                       "light": with_light_webhooks(django_app)}
            for provider, make in (("twilio", twilio_requests), ("sendgrid_100_events", None)):
                requests = make(count) if make else sendgrid_requests(count, key)
                for name, app in options.items():
                    _cpu_us_per_request(app, requests[: max(1, count // 10)])  # warm up
                    result.setdefault(name, {})[provider] = _cpu_us_per_request(app, requests)
                    redis.delete(receipts_buffer.BUFFER_KEY)
    finally:
        redis.delete(receipts_buffer.BUFFER_KEY, receipts_buffer.DRAIN_FLAG)
    return {"requests": count, "cpu_us_per_request": result}
