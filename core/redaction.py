"""What never reaches a log (docs/ARCHITECTURE.md §10): contacts masked, sensitive content removed,
in every log record of every process.

:func:`mask_contacts` (phone numbers, email addresses, URL-encoded ones too), :func:`mask_capabilities`
(the one-click unsubscribe token: ``/u/[token]``), :func:`erase_contacts` (an erased user's, in
stored text), :func:`sensitive_content` (a notification's texts
read ``[sensitive]`` while active, tracebacks included). Records are redacted when made
(:func:`install_record_factory`, via :func:`configure_logging`) and again by :class:`RedactingFilter`
on every handler (Django's, Celery's, gunicorn's). What is masked and how: docs/SECURITY.md.
Imports nothing of the project: every layer may log, and gunicorn's config loads it before Django.
"""

from __future__ import annotations

import codecs
import contextlib
import contextvars
import logging
import logging.config
import re
from collections.abc import Iterator

SENSITIVE = "[sensitive]"
#: What an erased user's contact becomes where a record keeps text around it (:func:`erase_contacts`).
ERASED = "[erased]"
_MIN_LINE = 4

# Phone-like digit runs. Between two digits at most three separators: space, no-break space, dot,
# dash, slash, parentheses, or "+" (a query string's space); so "+1 (415) 555-0100", "+49 (0)151
# 12345678" and "0151 1234 5678" are one run each. Every repetition is bounded, so a long line costs
# linear time.
_SEP = r"[ \u00a0.\-/()+]{0,3}"
# With "+" (international): a first digit 1-9 and 8-15 digits in all, not followed by another digit.
_PLUS_PHONE = re.compile(rf"\+([1-9](?:{_SEP}\d){{7,14}})(?!\d)")
# Without "+": 9-15 digits that are one run ("015112345678", "4915112345678"); or start with a
# national trunk "0" or an area code in parentheses ("0151 1234 5678", "0049 151 12345678", "(415)
# 555-0100"), any separators; or groups joined by dashes, dots or slashes ("415-555-0100"). Space-
# separated small numbers ("sizes 500 200 200") are not a phone. Never glued to a word, an id
# ("a456-426614174000"), a decimal, a path or an escape before it, nor to a word or id group after it.
_BARE_PHONE = re.compile(r"(?<![\w\-.:/+%])(\d{9,15}|(?:\(\d{1,5}\)|0\d{0,4})(?:" + _SEP + r"\d{1,8}){1,6}"
                         r"|\d{2,4}(?:[.\-/]\d{2,8}){1,5})(?![\w]|[\-.]\w)")
# Digit runs a bare match may be that are not phone numbers: dates (with an hour), IPv4, decimals.
_NOT_A_PHONE = re.compile(r"\(?\d{1,4}[-./]\d{1,2}[-./]\d{1,4}(?:[ T]\d{1,2})?|\d{1,3}(?:\.\d{1,3}){3}|\d+\.\d+")
# Email addresses, internationalised ones too: Unicode local parts and domain labels ("bücher.de",
# "пример.рф"), punycode ("xn--bcher-kva.de").
_EMAIL = re.compile(r"([\w.!#$'*+^`{|}~\-]{1,64})@((?:[^\W_](?:[\w\-]{0,61}[^\W_])?\.){1,8}"
                    r"(?:[^\W\d_]{2,24}|(?i:xn--)[a-z0-9\-]{1,59}))(?![\w\-])")
# Runs of non-space text that may be URL-encoded: decoded for matching (module docstring).
_TOKEN = re.compile(r"[^\s\"'<>\[\]]+")
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
_URL_DELIMITERS = re.compile(r"([?&=/;,])")
# The one-click unsubscribe path (config/urls.py, ``u/<str:token>``) and its token: one path segment.
# At the start of a path: after a space, a quote, "=" or "(" (a log line, a Referer), or a URL's host.
# Any spelling that routes there or names it: slashes repeated or escaped (%2F), ``u`` escaped (%75), any case.
_SLASH = r"(?:/|%2[Ff])"
_CAPABILITY_PATH = re.compile(r"((?:^|[\s\"'=(])(?:[A-Za-z][A-Za-z0-9+.\-]{0,20}://[^\s/?#\"'<>]{1,255})?"
                              rf"{_SLASH}+(?:[uU]|%75){_SLASH}+)"
                              r"[^\s/?#\"'<>%]+(?:%[0-9A-Fa-f]{2}[^\s/?#\"'<>%]*)*")
_CAPABILITY_HINT = re.compile(r"/[uU]/|%75|%2[Ff]")
CAPABILITY_MASK = "[token]"
_sources: contextvars.ContextVar[tuple] = contextvars.ContextVar("notify_sensitive_sources", default=())


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


# A replacement: (start, end, pieces) over a text, each piece a literal or a (start, end) span of
# the text kept as it was written (in a URL-encoded text: its encoded form, "%2B" or "%40").
_Replacement = tuple[int, int, list]


def _replacements(text: str) -> list[_Replacement]:
    """Where ``text`` holds contacts, and what each becomes (emails first; a number inside one is
    part of it)."""
    found: list[_Replacement] = []
    if "@" in text:
        for m in _EMAIL.finditer(text):
            found.append((m.start(), m.end(), [(m.start(1), m.start(1) + 1), "***", (m.end(1), m.start(2)),
                                               (m.start(2), m.end(2))]))
    if "+" in text:
        for m in _PLUS_PHONE.finditer(text):
            digits = _digits(m.group(1))
            found.append((m.start(), m.end(), [(m.start(), m.start() + 1), f"{digits[:2]}*****{digits[-2:]}"]))
    for m in _BARE_PHONE.finditer(text):
        digits = _digits(m.group(1))
        if 9 <= len(digits) <= 15 and not _NOT_A_PHONE.fullmatch(m.group(1)):
            found.append((m.start(1), m.end(1), [f"*****{digits[-2:]}"]))
    kept: list[_Replacement] = []
    for rep in found:  # in order of precedence: a later one overlapping an earlier one is dropped
        if all(rep[1] <= k[0] or rep[0] >= k[1] for k in kept):
            kept.append(rep)
    return sorted(kept)


def _rebuild(text: str, replacements: list[_Replacement], source) -> str:
    """The source form of ``text`` with ``replacements`` applied; ``source(i, j)`` is how
    ``text[i:j]`` was written."""
    out, at = [], 0
    for start, end, pieces in replacements:
        out.append(source(at, start))
        out.extend(source(*p) if isinstance(p, tuple) else p for p in pieces)
        at = end
    out.append(source(at, len(text)))
    return "".join(out)


def _decode(part: str) -> tuple[str, list[int]]:
    """``part`` URL-decoded (``%XX`` as UTF-8, undecodable bytes as U+FFFD; ``+`` left as it is, a
    separator to the rules either way), and for each decoded character the offset in ``part`` where
    its encoding starts (one more at the end)."""
    decoded: list[str] = []
    offsets: list[int] = []
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    i, pending = 0, None  # pending: where the escape run of a not yet completed character starts
    while i < len(part):
        escape = _ESCAPE.match(part, i)
        if escape is None:
            tail = decoder.decode(b"", final=True)  # an incomplete sequence before a plain character
            decoded.extend(tail)
            offsets.extend([pending] * len(tail))  # type: ignore[list-item]
            decoder.reset()
            decoded.append(part[i])
            offsets.append(i)
            pending, i = None, i + 1
            continue
        pending = i if pending is None else pending
        chars = decoder.decode(bytes([int(escape.group(1), 16)]))
        decoded.extend(chars)
        offsets.extend([pending] * len(chars))
        if chars:
            pending = None
        i = escape.end()
    tail = decoder.decode(b"", final=True)
    decoded.extend(tail)
    offsets.extend([pending] * len(tail))  # type: ignore[list-item]
    offsets.append(len(part))
    return "".join(decoded), offsets


def _mask_encoded(token: str) -> str:
    """``token`` (no spaces) with each URL component that holds an escape decoded for matching and
    masked in its encoded form: ``q=%2B1+%28415%29+555-0100`` → ``q=%2B14*****00``."""
    parts = _URL_DELIMITERS.split(token)
    for index in range(0, len(parts), 2):
        part = parts[index]
        if "%" not in part:
            continue
        decoded, offsets = _decode(part)
        replacements = _replacements(decoded)
        if replacements:
            parts[index] = _rebuild(decoded, replacements, lambda i, j, p=part, o=offsets: p[o[i]:o[j]])
    return "".join(parts)


def mask_contacts(text: str) -> str:
    """``text`` with every phone number and email address masked (module docstring): a number keeps
    its last two digits (and after ``+`` its first two: ``+49*****78``; ``*****78`` without), an
    address its first character and its domain (``a***@example.com``). URL-encoded text (an access
    log's query string or path) is decoded for matching and stays encoded: ``q=%2B49*****78``,
    ``c***%40b%C3%BCcher.de``."""
    if "%" in text:
        text = _TOKEN.sub(lambda m: _mask_encoded(m.group()) if "%" in m.group() else m.group(), text)
    replacements = _replacements(text)
    return _rebuild(text, replacements, lambda i, j: text[i:j]) if replacements else text


def erase_contacts(text: str, contacts=()) -> str:
    """``text`` as an erased user's records may keep it (docs/SECURITY.md, erasure): each of
    ``contacts`` in any case, and every other email address or phone number :func:`mask_contacts`
    finds (an address the user had before, one a provider echoed in its own spelling), become
    :data:`ERASED` whole."""
    for contact in sorted({c.strip() for c in contacts if c and c.strip()}, key=len, reverse=True):
        text = re.sub(re.escape(contact), ERASED, text, flags=re.IGNORECASE)
    found = _replacements(text)
    return _rebuild(text, [(i, j, [ERASED]) for i, j, _p in found], lambda i, j: text[i:j]) if found else text


def mask_capabilities(text: str) -> str:
    """``text`` with the token of every one-click unsubscribe path masked: ``/u/[token]``."""
    return _CAPABILITY_PATH.sub(r"\1" + CAPABILITY_MASK, text) if _CAPABILITY_HINT.search(text) else text


@contextlib.contextmanager
def sensitive_content(sources) -> Iterator[None]:
    """While active, the content of every object in ``sources`` (anything with ``title``, ``body``,
    ``html`` attributes, e.g. sensitive ``Notification`` rows; read when a record is made, so content
    rendered later counts too) or string in it is ``[sensitive]`` in every log record of this
    thread. An exception raised out of the scope carries these texts along, so it is redacted too
    when it is logged after the scope ended (Celery's task failure, Django's 500). Nests; costs
    nothing until something is logged."""
    sources = tuple(sources)
    if not sources:
        yield
        return
    token = _sources.set(_sources.get() + sources)
    try:
        yield
    except BaseException as exc:
        # Logged later, outside this scope (Celery's task failure, Django's 500): the exception
        # carries the texts it must not show.
        with contextlib.suppress(AttributeError, TypeError):
            exc.__notify_sensitive__ = (*getattr(exc, "__notify_sensitive__", ()), *_sensitive_texts())  # type: ignore[attr-defined]
        raise
    finally:
        _sources.reset(token)


def _sensitive_texts(extra: tuple = ()) -> list[str]:
    texts: set[str] = set()
    for source in (*_sources.get(), *extra):
        parts = [source] if isinstance(source, str) else [getattr(source, a, None) for a in ("title", "body", "html")]
        for part in parts:
            if isinstance(part, str) and len(part.strip()) >= _MIN_LINE:
                texts.add(part)
                texts.update(line for line in part.splitlines() if len(line.strip()) >= _MIN_LINE)
                texts.update(line.strip() for line in part.splitlines() if len(line.strip()) >= _MIN_LINE)
    return sorted(texts, key=len, reverse=True)  # the whole text before its lines


def _carried(exc: BaseException | None) -> tuple:
    """The sensitive texts attached to ``exc`` or an exception in its cause/context chain."""
    carried: list[str] = []
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen and len(seen) < 20:
        seen.add(id(exc))
        carried.extend(getattr(exc, "__notify_sensitive__", ()))
        exc = exc.__cause__ or exc.__context__
    return tuple(carried)


def redact(text: str, extra: tuple = ()) -> str:
    """``text`` without the content of the active :func:`sensitive_content` sources (and the
    strings in ``extra``), with contacts and unsubscribe tokens masked. Never raises."""
    text = _remove(text if isinstance(text, str) else str(text), _sensitive_texts(extra))
    return mask_contacts(mask_capabilities(text))


def _remove(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, SENSITIVE)
        escaped = secret.encode("unicode_escape").decode("ascii")  # as repr() shows it in a message
        if escaped != secret:
            text = text.replace(escaped, SENSITIVE)
    return text


def without_sensitive(text: str) -> str:
    """``text`` without the content of the active :func:`sensitive_content` sources (contacts left
    as they are): for error details that are stored and shown, such as a notification's reason."""
    return _remove(text, _sensitive_texts())


def redact_record(record: logging.LogRecord) -> logging.LogRecord:
    """Redact ``record`` in place, once: its message (with the arguments merged in), its traceback
    (kept as text in ``exc_text``, the exception itself dropped) and its stack. Returns it."""
    if getattr(record, "_notify_redacted", False):
        return record
    try:
        message = record.getMessage()
    except Exception:  # a format/arguments mismatch: keep both, as text, masked
        message = f"{record.msg!r} % {record.args!r}"
    record.msg, record.args = redact(message), ()
    carried = _carried(record.exc_info[1]) if record.exc_info else ()
    if carried:
        record.msg = redact(record.msg, carried)
    if record.exc_info:
        if record.exc_info[0] is not None and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.exc_info = None
    if record.exc_text:
        record.exc_text = redact(record.exc_text, carried)
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
    record._notify_redacted = True
    return record


class RedactingFilter(logging.Filter):
    """A handler filter that redacts each record (:func:`redact_record`) and lets it through."""

    def filter(self, record: logging.LogRecord) -> bool:
        redact_record(record)
        return True


def install_record_factory() -> None:
    """Make every ``LogRecord`` of this process redacted when it is created. Idempotent."""
    current = logging.getLogRecordFactory()
    if getattr(current, "_notify_redacting", False):
        return

    def factory(*args, **kwargs):
        return redact_record(current(*args, **kwargs))

    factory._notify_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def add_filter(handlers) -> None:
    """Put a :class:`RedactingFilter` on each of ``handlers`` that has none yet."""
    for handler in handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def configure_logging(logging_settings: dict | None) -> None:
    """Django's ``LOGGING_CONFIG``: redact every record (:func:`install_record_factory`), then apply
    ``settings.LOGGING`` with ``logging.config.dictConfig``."""
    install_record_factory()
    if logging_settings:
        logging.config.dictConfig(logging_settings)
