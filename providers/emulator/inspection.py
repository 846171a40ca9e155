"""Inspection and control API of the emulator, under ``/_emulator/``.

* ``GET /_emulator/health`` -> ``{"status": "ok"}``
* ``GET /_emulator/messages[?to=&channel=&provider=&account=&notification_id=]`` -> list of
  ``{"provider", "account", "channel", "to", "title", "body", "provider_message_id",
  "notification_id", "received_at_ms", "details"}`` (UTC epoch ms), oldest first; ``account`` is the
  Twilio AccountSid of the request path or the FCM project id, ``null`` for SendGrid and SMTP;
  ``details`` is what the provider received beyond these fields (Twilio From/MessagingServiceSid,
  SendGrid From/Reply-To of the personalization, SMTP envelope sender and headers, FCM the whole
  message: ``store.FIELDS``). Filters match exactly and never match a null field.
  ``GET /_emulator/messages/count`` -> ``{"count": n}`` with the same filters;
  ``DELETE /_emulator/messages`` clears memory only.
* ``POST /_emulator/analysis`` with ``{"notification_ids": [...], "bucket_ms": 1000}`` (both optional;
  an empty body means all defaults) -> a benchmark summary of the in-memory messages, computed in
  linear time off the event loop (about a second per million messages; run with
  ``EMULATOR_MAX_MESSAGES=0`` so memory keeps them all)::

      {"total": 3,                                  # messages in memory
       "by_provider": {"twilio": 2, "sendgrid": 1, "fcm": 0, "smtp": 0},
       "by_account": {"AC00…00": 2, "": 1},         # "" = no account (SendGrid, SMTP)
       "unique_notification_ids": 2,                # distinct non-null notification ids
       "duplicates": {"messages": 1,                # messages beyond the first per notification id
                      "ids": 1,                     # notification ids received more than once
                      "examples": ["n1"]},          # up to 20 of them, in order of first arrival
       "received_at_ms": {"n1": [1700000000123, 1700000000456]},  # requested ids that arrived, each
                                                    #   with its arrival times (epoch ms UTC, in order)
       "per_bucket": {"twilio": [[1700000000000, 2]], "sendgrid": [[1700000000000, 1]],
                      "fcm": [], "smtp": []},       # [bucket start ms (multiple of bucket_ms), count]
       "first_ms": 1700000000123, "last_ms": 1700000000456}   # null when there are no messages

  A bad body answers 400 ``{"error": "..."}`` naming the key (unknown keys are refused too).
* ``POST /_emulator/faults`` (rule JSON, see ``faults.py``) -> 201 rule with ``id``;
  ``GET /_emulator/faults``; ``DELETE /_emulator/faults``; ``DELETE /_emulator/faults/{id}``.
* ``GET /_emulator/stats`` -> ``{provider: {"requests", "accepted", "rejected", "messages"}}``
  counting sends (fcm adds ``token_requests``, twilio ``list_requests``: reads of its message list);
  ``DELETE /_emulator/stats`` resets the counters.
* ``POST /_emulator/receipts`` (rule JSON, see ``receipts.py``) -> 201 rule with ``id``;
  ``GET /_emulator/receipts``; ``DELETE /_emulator/receipts`` (back to the defaults);
  ``DELETE /_emulator/receipts/{id}``.
* ``GET /_emulator/webhooks[?provider=&kind=&notification_id=]`` -> every webhook attempt (see
  ``webhooks.py``), oldest first; ``DELETE /_emulator/webhooks`` forgets them and zeroes the counters;
  ``GET /_emulator/webhooks/stats`` -> ``{"enabled", "sendgrid_events_url", "pending", "attempts",
  "succeeded", "failed_attempts", "retries", "dropped", "refused", "events_delivered",
  "events_dropped"}`` (the last two: events answered 2xx / given up, per ``"<provider>:<kind>"``).
* ``POST /_emulator/engagement`` (model JSON, see ``engagement.py``) -> 200 the model, replacing any
  (its counters from zero); ``GET /_emulator/engagement`` -> the model with ``opened`` and ``unopened``
  (how many messages it opened and did not), or ``{"enabled": false}``; ``DELETE`` turns it off.
* ``GET /_emulator/sendgrid/public-key`` -> ``{"public_key": "<base64 DER SubjectPublicKeyInfo>"}``,
  the Event Webhook verification key.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from providers.emulator.context import emulator_of
from providers.emulator.engagement import Engagement
from providers.emulator.faults import FaultRuleError
from providers.emulator.receipts import ReceiptRuleError
from providers.emulator.store import FILTERS, analyse

WEBHOOK_FILTERS = ("provider", "kind", "notification_id")
ANALYSIS_KEYS = ("notification_ids", "bucket_ms")
DEFAULT_BUCKET_MS = 1000


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def list_messages(request: web.Request) -> web.Response:
    return web.json_response(emulator_of(request).store.query(_filters(request)))


async def count_messages(request: web.Request) -> web.Response:
    return web.json_response({"count": emulator_of(request).store.count(_filters(request))})


async def clear_messages(request: web.Request) -> web.Response:
    emulator_of(request).store.clear()
    return web.Response(status=204)


async def analysis(request: web.Request) -> web.Response:
    """Benchmark summary of the in-memory messages (see the module docstring)."""
    try:
        notification_ids, bucket_ms = _analysis_options(await request.read())
    except ValueError as exc:
        return web.json_response({"error": str(exc)}, status=400)
    items = emulator_of(request).store.snapshot()
    # The pass over a million messages takes about a second: off the event loop, so providers answer meanwhile.
    body = await asyncio.to_thread(lambda: json.dumps(analyse(items, notification_ids, bucket_ms)))
    return web.Response(text=body, content_type="application/json")


def _analysis_options(raw: bytes) -> tuple[list[str], int]:
    """``(notification_ids, bucket_ms)`` of an analysis request body.

    Raises:
        ValueError: not a JSON object, an unknown key, or a value of the wrong type.
    """
    try:
        data: Any = json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise ValueError("the body must be a JSON object") from None
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object")
    unknown = set(data) - set(ANALYSIS_KEYS)
    if unknown:
        raise ValueError(f"unknown key(s): {', '.join(sorted(unknown))}")
    ids = data.get("notification_ids")
    if ids is None:
        ids = []
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        raise ValueError("notification_ids must be a list of strings or null")
    bucket_ms = data.get("bucket_ms")
    if bucket_ms is None:
        bucket_ms = DEFAULT_BUCKET_MS
    if not isinstance(bucket_ms, int) or isinstance(bucket_ms, bool) or bucket_ms < 1:
        raise ValueError("bucket_ms must be a positive integer or null")
    return ids, bucket_ms


async def add_fault(request: web.Request) -> web.Response:
    try:
        rule = emulator_of(request).faults.add(json.loads(await request.read()))
    except (ValueError, FaultRuleError) as exc:
        return web.json_response({"error": str(exc)}, status=400)
    return web.json_response(rule.as_json(), status=201)


async def list_faults(request: web.Request) -> web.Response:
    return web.json_response(emulator_of(request).faults.list())


async def clear_faults(request: web.Request) -> web.Response:
    emulator_of(request).faults.clear()
    return web.Response(status=204)


async def delete_fault(request: web.Request) -> web.Response:
    rule_id = request.match_info["id"]
    if not rule_id.isdigit() or not emulator_of(request).faults.remove(int(rule_id)):
        return web.json_response({"error": f"no fault rule {rule_id}"}, status=404)
    return web.Response(status=204)


async def stats(request: web.Request) -> web.Response:
    return web.json_response(emulator_of(request).stats.as_dict())


async def reset_stats(request: web.Request) -> web.Response:
    emulator_of(request).stats.reset()
    return web.Response(status=204)


async def add_receipt_rule(request: web.Request) -> web.Response:
    try:
        rule = emulator_of(request).receipts.add(json.loads(await request.read()))
    except (ValueError, ReceiptRuleError) as exc:
        return web.json_response({"error": str(exc)}, status=400)
    return web.json_response(rule.as_json(), status=201)


async def list_receipt_rules(request: web.Request) -> web.Response:
    return web.json_response(emulator_of(request).receipts.list())


async def clear_receipt_rules(request: web.Request) -> web.Response:
    emulator_of(request).receipts.clear()
    return web.Response(status=204)


async def delete_receipt_rule(request: web.Request) -> web.Response:
    rule_id = request.match_info["id"]
    if not rule_id.isdigit() or not emulator_of(request).receipts.remove(int(rule_id)):
        return web.json_response({"error": f"no receipts rule {rule_id}"}, status=404)
    return web.Response(status=204)


async def list_webhooks(request: web.Request) -> web.Response:
    unknown = set(request.query) - set(WEBHOOK_FILTERS)
    if unknown:
        return web.json_response({"error": f"unknown filter(s): {', '.join(sorted(unknown))}"}, status=400)
    filters = {k: request.query[k] for k in WEBHOOK_FILTERS if k in request.query}
    return web.json_response(emulator_of(request).webhooks.records(**filters))


async def clear_webhooks(request: web.Request) -> web.Response:
    emulator_of(request).webhooks.clear()
    return web.Response(status=204)


async def webhook_stats(request: web.Request) -> web.Response:
    return web.json_response(emulator_of(request).webhooks.stats())


async def set_engagement(request: web.Request) -> web.Response:
    try:
        model = Engagement.from_json(json.loads(await request.read()))
    except ValueError as exc:  # EngagementError is one
        return web.json_response({"error": str(exc)}, status=400)
    emulator_of(request).engagement = model
    return web.json_response({"enabled": True, **model.as_json()})


async def get_engagement(request: web.Request) -> web.Response:
    model = emulator_of(request).engagement
    return web.json_response({"enabled": False} if model is None else {"enabled": True, **model.as_json()})


async def clear_engagement(request: web.Request) -> web.Response:
    emulator_of(request).engagement = None
    return web.Response(status=204)


async def sendgrid_public_key(request: web.Request) -> web.Response:
    return web.json_response({"public_key": emulator_of(request).webhooks.signer.public_key_b64})


def _filters(request: web.Request) -> dict[str, str]:
    unknown = set(request.query) - set(FILTERS)
    if unknown:
        raise web.HTTPBadRequest(
            text=json.dumps({"error": f"unknown filter(s): {', '.join(sorted(unknown))}"}),
            content_type="application/json",
        )
    return {k: request.query[k] for k in FILTERS if k in request.query}


def add_routes(app: web.Application) -> None:
    r = app.router
    r.add_get("/_emulator/health", health)
    r.add_get("/_emulator/messages", list_messages)
    r.add_get("/_emulator/messages/count", count_messages)
    r.add_delete("/_emulator/messages", clear_messages)
    r.add_post("/_emulator/analysis", analysis)
    r.add_post("/_emulator/faults", add_fault)
    r.add_get("/_emulator/faults", list_faults)
    r.add_delete("/_emulator/faults", clear_faults)
    r.add_delete("/_emulator/faults/{id}", delete_fault)
    r.add_get("/_emulator/stats", stats)
    r.add_delete("/_emulator/stats", reset_stats)
    r.add_post("/_emulator/receipts", add_receipt_rule)
    r.add_get("/_emulator/receipts", list_receipt_rules)
    r.add_delete("/_emulator/receipts", clear_receipt_rules)
    r.add_delete("/_emulator/receipts/{id}", delete_receipt_rule)
    r.add_get("/_emulator/webhooks", list_webhooks)
    r.add_delete("/_emulator/webhooks", clear_webhooks)
    r.add_get("/_emulator/webhooks/stats", webhook_stats)
    r.add_post("/_emulator/engagement", set_engagement)
    r.add_get("/_emulator/engagement", get_engagement)
    r.add_delete("/_emulator/engagement", clear_engagement)
    r.add_get("/_emulator/sendgrid/public-key", sendgrid_public_key)
