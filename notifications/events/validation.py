"""The rules of a notification type and its templates, checked when it is saved (API ``PUT
/v1/notification-types/{key}`` and the admin form alike, both through
``notifications.api.types.NotificationTypeSerializer``): one function, :func:`type_problems`,
answering ``{field path: Problem}`` (``{}`` = valid), for what goes beyond one field's shape.

Templates are checked as sources: each part must compile in the sandbox and pass a dry render on
sample recipients (:func:`notifications.rendering.check_parts`), an error naming the variant
(``push [de] body``) and the line; each channel allows its own parts. docs/TYPES.md, "Templates",
explains each rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.identifiers import text_problem
from notifications.content_limits import inbox_data_problems
from notifications.events.models import QuietHoursPolicy, Routing
from notifications.models import Priority
from notifications.quiet_hours_policy import MARKETING
from notifications.rendering import check_parts, template_variables
from notifications.rendering.checking import MAX_TYPE_TEMPLATES, MAX_VARIANTS, CheckBudgetSpent, check_budget
from providers.fcm.data_keys import data_key_problem
from providers.senders import email_address_problem, sms_sender_problem

#: A data key an event must carry (``required_data``): an identifier.
DATA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
#: Which template parts each channel uses.
PARTS = {"push": ("title", "body", "data"), "email": ("title", "body", "html"), "sms": ("body",),
         "in_app": ("title", "body", "data")}


@dataclass(frozen=True)
class Problem:
    code: str
    message: str


def type_problems(fields: dict, templates: list[dict]) -> dict[str, Problem]:
    """Every problem of a type definition whose fields each have the right shape: ``fields``
    (``name``, ``description``, ``required_data``, ``category``, ``priority``, ``channels``,
    ``routing``, ``quiet_hours``, ``required``, ``collapse_key``, ``sms_from``, ``email_from``,
    ``email_reply_to``, ``digest``; missing ones take the
    model's defaults) and ``templates`` (``[{channel, locale, title, body, html, data}]``). Returns
    ``{path: Problem}``: paths are the API's (``channels``, ``templates.2.body``,
    ``templates.0.data.from``). Every template check of the type (collapse key, digest key,
    templates) shares one check budget; past it, ``templates`` is ``render_budget``."""
    try:
        with check_budget():
            return _type_problems(fields, templates)
    except CheckBudgetSpent as exc:
        return {"templates": Problem(exc.code, str(exc))}


def _type_problems(fields: dict, templates: list[dict]) -> dict[str, Problem]:
    problems: dict[str, Problem] = _text_problems(fields)
    category = fields.get("category", "")
    priority = fields.get("priority", Priority.STANDARD)
    quiet = fields.get("quiet_hours", QuietHoursPolicy.DEFER)
    if category == MARKETING:
        if priority == Priority.HIGH:
            problems["priority"] = Problem("marketing_not_high", "marketing is never high priority")
        if quiet == QuietHoursPolicy.BYPASS:
            problems["quiet_hours"] = Problem("marketing_bypass", "marketing never bypasses quiet hours; use defer "
                                                                  "or silent")
        if fields.get("required"):
            problems["required"] = Problem("marketing_required", "users can always opt out of marketing")
    channels = list(fields.get("channels") or [])
    problems.update(_channel_problems(channels, fields.get("routing", Routing.ALL)))
    if fields.get("sensitive") and "in_app" in channels:
        problems["channels"] = Problem("sensitive_not_in_app", "a sensitive type cannot use in_app: an inbox item is "
                                                               "kept and listed for weeks (docs/APP.md); send it by "
                                                               "sms, email or push")
    problems.update(_sender_problems(fields))
    collapse = fields.get("collapse_key") or ""
    for error in check_parts({"body": collapse}, content=False).values() if collapse else ():
        problems["collapse_key"] = Problem("render_bound" if error.bound else "template_syntax", str(error))
    problems.update(_digest_problems(fields.get("digest"), priority))
    problems.update(template_problems(templates, channels))
    return problems


def _text_problems(fields: dict) -> dict[str, Problem]:
    """A name with an invisible character, or a description with one other than a line break or a
    tab (:func:`core.identifiers.text_problem`: both end up in admin pages and logs); a
    ``required_data`` key listed twice."""
    problems = {}
    texts = {"name": text_problem(fields.get("name") or ""),
             "description": text_problem(fields.get("description") or "", multiline=True)}
    for part, problem in texts.items():
        if problem:
            problems[part] = Problem("control_character", f"{part} {problem}")
    seen: set = set()
    for i, key in enumerate(fields.get("required_data") or []):
        if key in seen:
            problems[f"required_data.{i}"] = Problem("duplicate", f"required_data lists {key!r} twice")
        seen.add(key)
    return problems


def _digest_problems(digest: dict | None, priority: str) -> dict[str, Problem]:
    """A digest (``{window_seconds, key}``, shapes and range checked by the serializer): not for a
    ``high`` type (sent one at a time, now: batching it would delay what must not wait); ``key`` a
    template that compiles in the sandbox (rendered with ``{{ data.* }}``)."""
    if not digest:
        return {}
    if priority == Priority.HIGH:
        return {"digest": Problem("high_not_digest", "a high priority type is sent at once, one at a time; it "
                                                     "cannot be a digest")}
    key = digest.get("key") or ""
    for error in check_parts({"body": key}, content=False).values() if key else ():
        return {"digest.key": Problem("render_bound" if error.bound else "template_syntax", f"digest key: {error}")}
    others = sorted(template_variables(key) - {"data"}) if key else []
    if others:
        return {"digest.key": Problem("unknown_variable", f"digest key: it sees only the event's data "
                                                          f"({{{{ data.post_id }}}}), not {', '.join(others)}")}
    return {}


def _channel_problems(channels: list, routing: str) -> dict[str, Problem]:
    if not channels:
        return {"channels": Problem("empty", "at least one channel")}
    problems = {}
    seen = set()
    for index, channel in enumerate(channels):
        if channel in seen:
            problems[f"channels.{index}"] = Problem("duplicate", f"{channel} is listed twice")
        seen.add(channel)
    if routing == Routing.FALLBACK and len(channels) < 2 and not problems:
        problems["routing"] = Problem("fallback_needs_two", "fallback routing needs at least two channels, in order")
    return problems


def _sender_problems(fields: dict) -> dict[str, Problem]:
    """Each sender well formed, by the backends' rule (:mod:`providers.senders`): ``sms_from`` one
    E.164 number or Messaging Service SID, ``email_from`` and ``email_reply_to`` exactly one mailbox
    (no list, no group, no line break). Whether it is *allowed* is :mod:`notifications.senders`'."""
    problems = {}
    for name, rule in (("sms_from", sms_sender_problem), ("email_from", email_address_problem),
                       ("email_reply_to", email_address_problem)):
        value = fields.get(name) or ""
        problem = rule(value) if value else None
        if problem:
            problems[name] = Problem("invalid", f"{name}: {problem}")
    return problems


def template_problems(templates: list[dict], channels: list[str]) -> dict[str, Problem]:
    """The rules of a type's templates (module docstring): ``{templates.<i>.<part>: Problem}``, and
    ``templates`` itself when a channel of the type has no template or there are too many."""
    problems: dict[str, Problem] = {}
    if len(templates) > MAX_TYPE_TEMPLATES:
        return {"templates": Problem("max_length", f"{len(templates)} templates; at most {MAX_TYPE_TEMPLATES}: each of "
                                                   f"the 4 channels in at most {MAX_VARIANTS} locales (docs/TYPES.md)")}
    seen = set()
    for index, template in enumerate(templates):
        path = f"templates.{index}"
        channel, locale = template.get("channel", ""), template.get("locale", "")
        if channel not in channels:
            problems[f"{path}.channel"] = Problem("not_in_channels", f"{channel!r} is not one of the type's channels "
                                                                     f"({', '.join(channels) or 'none'})")
            continue
        if (channel, locale.lower()) in seen:
            problems[f"{path}.locale"] = Problem("duplicate", f"a second {channel} template for {locale}")
            continue
        seen.add((channel, locale.lower()))
        problems.update(_variant_problems(path, template, channel, locale))
    missing = [c for c in channels if not any(t.get("channel") == c for t in templates)]
    if missing:
        problems["templates"] = Problem("missing_channel", f"no template for {', '.join(missing)}: every channel of "
                                                           "the type needs one (at least in the default locale)")
    return problems


def _variant_problems(path: str, template: dict, channel: str, locale: str) -> dict[str, Problem]:
    problems = {}
    name = f"{channel} [{locale}]"
    for part in ("title", "body", "html", "data"):
        if template.get(part) and part not in PARTS[channel]:
            problems[f"{path}.{part}"] = Problem("not_allowed_for_channel", f"{name}: {channel} has no {part}")
    if not (template.get("body") or "").strip():
        problems[f"{path}.body"] = Problem("blank", f"{name}: body must not be blank")
    title = template.get("title") or ""
    if channel == "email":
        if not title.strip():
            problems[f"{path}.title"] = Problem("required", f"{name}: an email needs a subject in title")
        elif "\r" in title or "\n" in title:
            problems[f"{path}.title"] = Problem("line_break", f"{name}: an email subject is one line")
    data = template.get("data") or {}
    if channel in ("push", "in_app"):
        if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
            problems[f"{path}.data"] = Problem("invalid", f"{name}: data is an object of string templates")
            data = {}
        for key in data if channel == "push" else ():
            problem = data_key_problem(key)
            if problem:
                problems[f"{path}.data.{key}"] = Problem("reserved_key", f"{name}: {problem}")
        for part, problem in inbox_data_problems(data).items() if channel == "in_app" else ():
            problems[f"{path}.{part}"] = Problem("control_character", f"{name} {part} {problem}")
    if problems:
        return problems
    parts: dict[str, str] = {p: template.get(p) or "" for p in ("title", "body", "html") if p in PARTS[channel]}
    parts.update({f"data.{k}": v for k, v in data.items()} if channel in ("push", "in_app") else {})
    for part, error in check_parts(parts, channel=channel).items():
        problems[f"{path}.{part}"] = Problem(error.code, f"{name} {part}: {error}")
    return problems
