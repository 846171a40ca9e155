"""What a message's content must keep to on each channel, however it was made: checked on the
request for inline content (:mod:`notifications.api.serializers`) and on the rendered text for
content made at send time from templates (notification types, campaigns: the pipeline's load
stage, :func:`rendered_problem`). Sources: Twilio Messages API (a body of at most 1,600
characters), FCM HTTP v1 (a message's payload at most 4,096 bytes), RFC 5322 §2.1.1 (a line, so a
subject, at most 998 characters), SendGrid (custom arguments at most 10,000 bytes);
docs/PROVIDERS.md."""

from __future__ import annotations

import json

from core.identifiers import control_character_problem, shows_nothing, text_problem

SMS_MAX_CHARS = 1600
PUSH_MAX_BYTES = 4096
EMAIL_DATA_MAX_BYTES = 10_000
#: Also the column's size for every title (``Notification.title``).
EMAIL_SUBJECT_MAX = 998
#: A body (an email's text part; every channel's body, inline or a template's source) and an email's
#: html part, in characters: far above any real message, below what a provider accepts.
BODY_MAX_CHARS = 100_000
HTML_MAX_CHARS = 1_000_000
#: An inbox item (``in_app``, docs/APP.md): its body in characters, its data as JSON in bytes.
INBOX_BODY_MAX_CHARS = 5000
INBOX_DATA_MAX_BYTES = 4096
#: The longest time to live of any message: FCM's maximum TTL (4 weeks).
MAX_TTL_SECONDS = 28 * 24 * 3600


def inbox_text_problem(part: str, text: str) -> str:
    """Why ``text`` cannot be an inbox item's ``part`` (``"title"``, ``"body"``, or a ``data`` value
    or key: ``"data"``, ``"data key"``), or ``""``: the platform's one rule of invisible characters
    (:func:`core.identifiers.text_problem`; a line break or a tab only in the body and data values,
    none at all in a data key), code ``control_character``: ``"contains a control character (U+202E
    RIGHT-TO-LEFT OVERRIDE)"``."""
    if part == "data key":
        return control_character_problem(text or "")
    return text_problem(text or "", multiline=part in ("body", "data"))


def inbox_data_problems(data: dict | None) -> dict[str, str]:
    """``{"data.<key>": problem}`` for each key or string value of an inbox item's ``data`` that
    breaks :func:`inbox_text_problem` (the app shows them; ``admin\u202egpj.exe`` would read as
    ``adminexe.jpg``). Values that are not strings are the app's and are left alone."""
    problems = {}
    for key, value in (data or {}).items():
        problem = inbox_text_problem("data key", str(key)) or (
            inbox_text_problem("data", value) if isinstance(value, str) else "")
        if problem:
            problems[f"data.{key}"] = problem
    return problems


def json_bytes(value) -> int:
    """Size in bytes of ``value`` as compact UTF-8 JSON (how the providers receive it)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def empty_body_problem(body: str) -> str:
    """``"the rendered body is empty"`` when ``body`` shows nothing: no letter, digit, punctuation
    or symbol that is not default-ignorable (whitespace, zero-width and bidi characters, a Hangul
    filler or a braille blank alone read as empty; no channel sends that), else ``""``: the send
    path's rule (:func:`rendered_problem`) and the save-time dry render's
    (:func:`notifications.rendering.check_parts`)."""
    return "the rendered body is empty" if shows_nothing(body) else ""


def rendered_problem(channel: str, title: str, body: str, html: str, data: dict | None) -> str:
    """Why rendered content cannot go out on ``channel`` (a sentence naming the rule), or ``""``.
    The send path makes such a notification a dead letter ``template_error`` with it: the same
    template would render the same text on a retry."""
    title, body = title or "", body or ""
    if empty := empty_body_problem(body):
        return empty
    if len(title) > EMAIL_SUBJECT_MAX:
        return f"the rendered title is {len(title)} characters; at most {EMAIL_SUBJECT_MAX}"
    if channel == "sms" and len(body) > SMS_MAX_CHARS:
        return f"the rendered SMS body is {len(body)} characters; at most {SMS_MAX_CHARS} (Twilio)"
    if channel == "email":
        if shows_nothing(title):
            return "the rendered email subject is empty"
        if "\r" in title or "\n" in title:
            return "the rendered email subject has a line break; a subject is one line"
        if data and json_bytes(data) > EMAIL_DATA_MAX_BYTES:
            return f"the email's data is {json_bytes(data)} bytes as JSON; at most {EMAIL_DATA_MAX_BYTES}"
    if channel == "in_app":
        for part, text in (("title", title), ("body", body)):
            if inbox_text_problem(part, text):
                return f"the rendered inbox {part} {inbox_text_problem(part, text)}"
        for path, problem in inbox_data_problems(data).items():
            return f"the rendered inbox {path} {problem}"
        if len(body) > INBOX_BODY_MAX_CHARS:
            return f"the rendered inbox body is {len(body)} characters; at most {INBOX_BODY_MAX_CHARS}"
        if data and json_bytes(data) > INBOX_DATA_MAX_BYTES:
            return f"the inbox item's data is {json_bytes(data)} bytes as JSON; at most {INBOX_DATA_MAX_BYTES}"
    if channel == "push":
        payload = {k: v for k, v in (("title", title), ("body", body), ("data", data)) if v}
        size = json_bytes(payload)
        if size > PUSH_MAX_BYTES:
            return f"the rendered push (title + body + data as JSON) is {size} bytes; at most {PUSH_MAX_BYTES} (FCM)"
    return ""
