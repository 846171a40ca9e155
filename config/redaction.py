"""What never reaches a log (DESIGN.md §10): phone numbers and email addresses are masked, and the
content of sensitive notifications is removed, in every log record of every process.

* :func:`mask_contacts` masks E.164 numbers (``+4915112345678`` → ``+49*****78``, also written with
  spaces or dashes, and URL-encoded as in an access log's query string: ``%2B49…``, ``+49+151+…``)
  and email addresses (``alice@example.com`` → ``a***@example.com``, also ``alice%40example.com``).
* :func:`sensitive_content` is the pipeline's way to keep content out of logs: while it is active
  (per thread / context), every text of the given notifications (their ``title``, ``body``, ``html``
  as they are when a record is made, each line of at least 4 characters too) reads ``[sensitive]``
  in any record, exceptions and their tracebacks included.
* Records are redacted when they are made (:func:`install_record_factory`, from
  :func:`configure_logging`, Django's ``LOGGING_CONFIG``): message and arguments become one masked
  string, a traceback becomes masked text (``exc_text``; the exception object is dropped from the
  record, so no handler can format it again). :class:`RedactingFilter` does the same on a handler
  and sits on every handler: Django's (``settings.LOGGING``), Celery's (``config/celery.py``) and
  gunicorn's error and access logs (``config/gunicorn_conf.py``), for records made before the
  factory was installed or by a library's own ``LogRecord``.

Imports nothing of the project: every layer may log, and gunicorn's config loads it before Django.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import logging.config
import re
from collections.abc import Iterator

SENSITIVE = "[sensitive]"
_MIN_LINE = 4

# "+" or its URL encoding, a first digit 1-9, then 6-14 more digits, each optionally after one
# separator (space, dash, dot, "%20", or "+" as a query string's space); not part of a longer number.
# Every repetition is bounded, so a long line costs linear time.
_PHONE = re.compile(r"(\+|%2[bB])([1-9](?:(?:[ .\-]|%20|\+)?\d){6,14})(?!\d)")
_EMAIL = re.compile(r"([A-Za-z0-9._%+\-]{1,64})(@|%40)([A-Za-z0-9\-]{1,63}(?:\.[A-Za-z0-9\-]{1,63}){0,8}"
                    r"\.[A-Za-z]{2,24})")
_sources: contextvars.ContextVar[tuple] = contextvars.ContextVar("notify_sensitive_sources", default=())


def _mask_phone(match: re.Match) -> str:
    digits = re.sub(r"\D", "", match.group(2).replace("%20", " "))
    return f"{match.group(1)}{digits[:2]}*****{digits[-2:]}"


def _mask_email(match: re.Match) -> str:
    local = match.group(1)
    if local.upper().startswith("%2B"):
        local = local[3:]
    return f"{local[:1]}***{match.group(2)}{match.group(3)}"


def mask_contacts(text: str) -> str:
    """``text`` with every E.164 phone number and email address masked (module docstring)."""
    if "@" in text or "%40" in text:
        text = _EMAIL.sub(_mask_email, text)
    if "+" in text or "%2b" in text or "%2B" in text:
        text = _PHONE.sub(_mask_phone, text)
    return text


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
            exc.__notify_sensitive__ = (*getattr(exc, "__notify_sensitive__", ()), *_sensitive_texts())
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
    strings in ``extra``), with contacts masked. Never raises."""
    return mask_contacts(_remove(text if isinstance(text, str) else str(text), _sensitive_texts(extra)))


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

    factory._notify_redacting = True
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
