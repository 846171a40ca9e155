"""SendGrid v3 Mail Send: ``POST /v3/mail/send`` (docs/PROVIDERS.md §2(b)).

Answers 202 with an empty body and ``X-Message-Id``, recording one message per personalization
``to`` address, or an error body ``{"errors": [{"message", "field", "help"}]}``. With an events URL
configured, each accepted recipient later gets signed Event Webhook events (``receipts``, ``webhooks``),
stamped with the emulator's clock (``clock``: the test clock offset applies), and an ``open`` when the
engagement model says so (``engagement``).

A personalization's ``substitutions`` (``{"-name-": "Ada"}``, string values, at most 100 pairs and
10,000 bytes of UTF-8 keys plus values, else 400 on ``personalizations.{i}.substitutions``) are
applied to the subject and the content for that personalization's recipients: the recorded title and
body are the substituted subject and text/plain value (html is not recorded). Keys are replaced one
after the other, in the order given, with plain ``str.replace`` (cheap at 1000 personalizations per
request); a value that itself contains a later key is therefore substituted again.

A personalization may have its own ``from`` (SendGrid, "Personalizations": ``from``, ``subject``,
``headers``, ``custom_args`` and ``send_at`` may be set per personalization, overriding the
message level); ``reply_to`` exists at the message level only. Each recorded message's
``details`` are ``{"from": <its personalization's from, else the request's>, "reply_to": <the
request's, or null>}``, as received (one dict shared by the recipients that have the same), plus
``"headers": {name: value}`` (the personalization's, else the request's) when either has headers.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import time
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from providers.emulator import receipts
from providers.emulator.context import bearer_token, emulator_of
from providers.emulator.faults import Fault

MAX_PERSONALIZATIONS = 1000
MAX_RECIPIENTS = 1000
MAX_SUBSTITUTIONS = 100
MAX_SUBSTITUTIONS_BYTES = 10_000
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
HELP = "https://www.twilio.com/docs/sendgrid/api-reference/mail-send/errors"
#: Default error text per HTTP status for injected faults.
MESSAGES = {
    400: "Bad Request",
    401: "The provided authorization grant is invalid, expired, or revoked",
    403: "access forbidden",
    404: "not found",
    413: "Payload Too Large",
    429: "too many requests",
    500: "internal server error",
    503: "service unavailable",
}
RATE_LIMIT = 600


def error(status: int, errors: list[tuple[str, str | None]], retry_after: float | None = None) -> web.Response:
    """A SendGrid error response; ``errors`` is a list of ``(message, field)``."""
    body = {"errors": [{"message": m, "field": f, "help": HELP if f else None} for m, f in errors]}
    headers: dict[str, str] = {}
    if status == 429 or retry_after is not None:
        wait = retry_after if retry_after is not None else 1.0
        headers["X-RateLimit-Limit"] = str(RATE_LIMIT)
        headers["X-RateLimit-Remaining"] = "0"
        headers["X-RateLimit-Reset"] = str(math.ceil(time.time() + wait))
        if retry_after is not None:
            headers["Retry-After"] = str(math.ceil(retry_after))
    return web.json_response(body, status=status, headers=headers)


def fault_response(fault: Fault) -> web.Response:
    status = fault.status or 400
    message = str(fault.code) if fault.code is not None else MESSAGES.get(status, "error")
    return error(status, [(message, None)], retry_after=fault.retry_after)


async def send_mail(request: web.Request) -> web.Response:
    """Validate one mail/send request and record its recipients."""
    emu = emulator_of(request)
    if bearer_token(request) is None:
        emu.stats.rejected("sendgrid")
        return error(401, [(MESSAGES[401], None)])
    try:
        payload = json.loads(await request.read())
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        emu.stats.rejected("sendgrid")
        return error(400, [("Bad Request", None)])
    personalizations = payload.get("personalizations")
    if not isinstance(personalizations, list):
        personalizations = []
    fault = await emu.fault_for("sendgrid", _addresses(personalizations))
    if fault is not None:
        emu.stats.rejected("sendgrid")
        return fault_response(fault)
    problems = validate(payload, personalizations)
    if problems:
        emu.stats.rejected("sendgrid")
        return error(400, problems)
    message_id = secrets.token_urlsafe(16)[:22]
    text = next(
        (c.get("value") for c in payload.get("content") or [] if isinstance(c, dict) and c.get("type") == "text/plain"),
        None,
    )
    top_subject = payload.get("subject")
    top_args = payload.get("custom_args") or {}
    events = emu.webhooks.enabled and emu.webhooks.sendgrid_url is not None
    categories = [str(c) for c in payload.get("categories") or [] if isinstance(c, str)]
    recorded = 0
    shared_details = {"from": payload.get("from"), "reply_to": payload.get("reply_to")}
    for p in personalizations:
        details = shared_details if p.get("from") is None else {**shared_details, "from": p["from"]}
        headers = p.get("headers") or payload.get("headers")
        if headers:
            details = {**details, "headers": headers}
        subject = p.get("subject") or top_subject
        body = text
        substitutions = p.get("substitutions")
        if substitutions:
            subject, body = _substitute(subject, body, substitutions)
        notification_id = (p.get("custom_args") or {}).get("notification_id") or top_args.get("notification_id")
        for recipient in p["to"]:
            emu.store.add("sendgrid", recipient["email"], subject, body, message_id, notification_id,
                          details=details)
            if events:
                rule = emu.receipts.match("sendgrid", recipient["email"])
                custom_args = {**top_args, **(p.get("custom_args") or {})}
                at = emu.clock.now()
                sent = receipts.sendgrid_events(rule, recipient["email"], message_id, recorded, categories,
                                                custom_args, at=at)
                emu.webhooks.sendgrid(sent, rule.delay_ms / 1000.0, notification_id)
                emu.engage_email(recipient["email"], notification_id or f"{message_id}:{recipient['email']}",
                                 sent, rule.delay_ms / 1000.0, notification_id, at)
            recorded += 1
    emu.stats.accepted("sendgrid", recorded)
    return web.Response(status=202, headers={"X-Message-Id": message_id})


def validate(payload: dict[str, Any], personalizations: list) -> list[tuple[str, str | None]]:
    """SendGrid's documented request limits (docs/PROVIDERS.md §2(b)) as ``(message, field)`` problems."""
    problems: list[tuple[str, str | None]] = []
    sender = payload.get("from")
    if not isinstance(sender, dict) or not EMAIL.match(str(sender.get("email", ""))):
        problems.append(("The from email does not contain a valid address.", "from.email"))
    reply_to = payload.get("reply_to")
    if reply_to is not None and (not isinstance(reply_to, dict) or not EMAIL.match(str(reply_to.get("email", "")))):
        problems.append(("The reply_to email does not contain a valid address.", "reply_to.email"))
    if reply_to is not None and payload.get("reply_to_list") is not None:
        problems.append(("The reply_to and reply_to_list properties are mutually exclusive.", "reply_to"))
    if not personalizations:
        problems.append(("The personalizations field is required and must have at least one "
                         "personalization.", "personalizations"))
    elif len(personalizations) > MAX_PERSONALIZATIONS:
        problems.append((f"The personalizations field must have no more than {MAX_PERSONALIZATIONS} "
                         "items.", "personalizations"))
    recipients = 0
    for i, p in enumerate(personalizations[:MAX_PERSONALIZATIONS]):
        to = p.get("to") if isinstance(p, dict) else None
        if not isinstance(to, list) or not to:
            problems.append(("The to array is required for all personalization objects, and must "
                             "have at least one email object with a valid email address.",
                             f"personalizations.{i}.to"))
            continue
        for j, recipient in enumerate(to):
            if not isinstance(recipient, dict) or not EMAIL.match(str(recipient.get("email", ""))):
                problems.append(("Does not contain a valid address.", f"personalizations.{i}.to.{j}.email"))
        own_from = p.get("from")
        if own_from is not None and (not isinstance(own_from, dict) or not EMAIL.match(str(own_from.get("email", "")))):
            problems.append(("The from email does not contain a valid address.", f"personalizations.{i}.from.email"))
        recipients += len(to) + len(p.get("cc") or []) + len(p.get("bcc") or [])
        args = p.get("custom_args") or {}
        if not isinstance(args, dict) or any(not isinstance(v, str) for v in args.values()):
            problems.append(("Custom args values must be strings.", f"personalizations.{i}.custom_args"))
        substitutions = p.get("substitutions")
        if substitutions is not None:
            problem = _substitutions_problem(substitutions)
            if problem is not None:
                problems.append((problem, f"personalizations.{i}.substitutions"))
    if recipients > MAX_RECIPIENTS:
        problems.append((f"The total number of recipients must be no more than {MAX_RECIPIENTS}.",
                         "personalizations"))
    if not payload.get("template_id"):
        if not payload.get("subject") and not all(
            isinstance(p, dict) and p.get("subject") for p in personalizations or [{}]
        ):
            problems.append(("The subject is required. You can get around this requirement if you "
                             "use a template with a subject defined or if every personalization has "
                             "a subject defined.", "subject"))
        content = payload.get("content")
        if not isinstance(content, list) or not any(isinstance(c, dict) and c.get("value") for c in content):
            problems.append(("Unless a valid template_id is provided, the content parameter is "
                             "required. There must be at least one defined content block.", "content"))
    top_args = payload.get("custom_args") or {}
    if not isinstance(top_args, dict) or any(not isinstance(v, str) for v in top_args.values()):
        problems.append(("Custom args values must be strings.", "custom_args"))
    return problems


def _substitutions_problem(substitutions: Any) -> str | None:
    """Why a personalization's ``substitutions`` breaks SendGrid's limits, else ``None``."""
    if not isinstance(substitutions, dict):
        return "Substitutions must be an object of tag/value strings."
    if len(substitutions) > MAX_SUBSTITUTIONS:
        return f"A personalization may not have more than {MAX_SUBSTITUTIONS} substitutions."
    size = 0
    for key, value in substitutions.items():
        if value.__class__ is not str:
            return "Substitutions values must be strings."
        # UTF-8 size; isascii() is O(1) in CPython, so ASCII text is never encoded.
        size += len(key) if key.isascii() else len(key.encode("utf-8", "surrogatepass"))
        size += len(value) if value.isascii() else len(value.encode("utf-8", "surrogatepass"))
    if size > MAX_SUBSTITUTIONS_BYTES:
        return (f"The total size of a personalization's substitutions may not exceed {MAX_SUBSTITUTIONS_BYTES} "
                f"bytes (got {size}).")
    return None


def _substitute(subject: Any, body: Any, substitutions: dict[str, str]) -> tuple[Any, Any]:
    """``subject`` and ``body`` with every key of ``substitutions`` replaced (strings only; an empty
    key replaces nothing)."""
    subject_is_text, body_is_text = isinstance(subject, str), isinstance(body, str)
    for key, value in substitutions.items():
        if not key:
            continue
        if subject_is_text:
            subject = subject.replace(key, value)
        if body_is_text:
            body = body.replace(key, value)
    return subject, body


def _addresses(personalizations: list) -> Iterable[str]:
    """Every ``to`` address, lazily (only consumed when there are fault rules)."""
    return (
        str(r.get("email", ""))
        for p in personalizations if isinstance(p, dict)
        for r in p.get("to") or [] if isinstance(r, dict)
    )


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v3/mail/send", send_mail)
