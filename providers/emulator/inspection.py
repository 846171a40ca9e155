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
"""

from __future__ import annotations

import json

from aiohttp import web

from providers.emulator.context import emulator_of
from providers.emulator.faults import FaultRuleError
from providers.emulator.store import FILTERS


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
