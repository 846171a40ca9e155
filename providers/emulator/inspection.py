"""Inspection and control API of the emulator, under ``/_emulator/``.

* ``GET /_emulator/health`` -> ``{"status": "ok"}``
* ``GET /_emulator/messages[?to=&channel=&provider=&notification_id=]`` -> list of
  ``{"provider", "channel", "to", "title", "body", "provider_message_id", "notification_id",
  "received_at_ms"}`` (UTC epoch ms), oldest first; ``GET /_emulator/messages/count`` ->
  ``{"count": n}`` with the same filters; ``DELETE /_emulator/messages`` clears memory only.
* ``POST /_emulator/faults`` (rule JSON, see ``faults.py``) -> 201 rule with ``id``;
  ``GET /_emulator/faults``; ``DELETE /_emulator/faults``; ``DELETE /_emulator/faults/{id}``.
* ``GET /_emulator/stats`` -> ``{provider: {"requests", "accepted", "rejected", "messages"}}``
  (fcm adds ``token_requests``); ``DELETE /_emulator/stats`` resets the counters.
* ``POST /_emulator/receipts`` (rule JSON, see ``receipts.py``) -> 201 rule with ``id``;
  ``GET /_emulator/receipts``; ``DELETE /_emulator/receipts`` (back to the defaults);
  ``DELETE /_emulator/receipts/{id}``.
* ``GET /_emulator/webhooks[?provider=&kind=&notification_id=]`` -> every webhook attempt (see
  ``webhooks.py``), oldest first; ``DELETE /_emulator/webhooks`` forgets them and zeroes the counters;
  ``GET /_emulator/webhooks/stats`` -> ``{"enabled", "sendgrid_events_url", "pending", "attempts",
  "succeeded", "failed_attempts", "retries", "dropped", "refused"}``.
* ``GET /_emulator/sendgrid/public-key`` -> ``{"public_key": "<base64 DER SubjectPublicKeyInfo>"}``,
  the Event Webhook verification key.
"""

from __future__ import annotations

import json

from aiohttp import web

from providers.emulator.context import emulator_of
from providers.emulator.faults import FaultRuleError
from providers.emulator.receipts import ReceiptRuleError
from providers.emulator.store import FILTERS

WEBHOOK_FILTERS = ("provider", "kind", "notification_id")


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def list_messages(request: web.Request) -> web.Response:
    return web.json_response(emulator_of(request).store.query(_filters(request)))


async def count_messages(request: web.Request) -> web.Response:
    return web.json_response({"count": emulator_of(request).store.count(_filters(request))})


async def clear_messages(request: web.Request) -> web.Response:
    emulator_of(request).store.clear()
    return web.Response(status=204)


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
    r.add_get("/_emulator/sendgrid/public-key", sendgrid_public_key)
