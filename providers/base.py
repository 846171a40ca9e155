"""Provider contract: the message shape handed to a provider backend, its result, and the errors.

Every backend (``providers/<name>/backend.py``) subclasses a channel base class below and implements
:meth:`ProviderBackend.send` (and :meth:`ProviderBackend.send_batch` where the provider has a batch
or async path). The delivery pipeline only ever talks to these types, so a new provider is a new
package and a line in settings. Errors: :class:`TransientProviderError` (retry),
:class:`PermanentProviderError` (never retry; :class:`ContactInvalidError`: the contact is dead),
and :class:`ProviderConfigurationError` outside that tree, so no ``except ProviderError`` swallows a
misconfiguration (docs/PROVIDERS.md, "Errors").
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

import aiohttp

_REQUIRED: Any = object()


@dataclass(frozen=True)
class OutboundMessage:
    """One message to one address, as handed to a backend.

    Attributes:
        notification_id: our notification UUID, sent to the provider as correlation id.
        channel: ``"sms"``, ``"email"`` or ``"push"``.
        to: E.164 phone number (sms), email address (email) or push token (push).
        body: plain-text body.
        title: email subject / push title; ``None`` for SMS.
        html: optional HTML body (email only).
        data: optional ``str -> str`` mapping (push data payload; email custom args).
        platform: push only: ``"ios"``, ``"android"`` or ``"web"``.
        ttl_seconds: how long the provider may keep trying; ``None``: the provider's default.
        priority: ``"high"`` or ``"standard"``.
        collapse_key: push collapse key (the notification id, so a duplicate shows once).
        silent: push only: data-only, no alert or sound (docs/PROVIDERS.md, "Silent pushes …").
        sender: SMS From / Messaging Service SID or email From; ``None``: the default (:mod:`providers.senders`).
        reply_to: email only: the Reply-To address; ``None``: no Reply-To header.
        unsubscribe_url: email only: the one-click link (:func:`unsubscribe_headers`); ``None``: none.
    """

    notification_id: str
    channel: str
    to: str
    body: str
    title: str | None = None
    html: str | None = None
    data: dict[str, str] | None = None
    platform: str | None = None
    ttl_seconds: int | None = None
    priority: str = "standard"
    collapse_key: str | None = None
    silent: bool = False
    sender: str | None = None
    reply_to: str | None = None
    unsubscribe_url: str | None = None


#: RFC 2369 / RFC 8058 header names and the one-click POST body's value.
LIST_UNSUBSCRIBE = "List-Unsubscribe"
LIST_UNSUBSCRIBE_POST = "List-Unsubscribe-Post"
ONE_CLICK = "List-Unsubscribe=One-Click"


def unsubscribe_headers(message: OutboundMessage) -> dict[str, str]:
    """``{"List-Unsubscribe": "<url>", "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}`` for
    an email with an ``unsubscribe_url``, else ``{}`` (the headers every email backend sends)."""
    if message.channel != "email" or not message.unsubscribe_url:
        return {}
    return {LIST_UNSUBSCRIBE: f"<{message.unsubscribe_url}>", LIST_UNSUBSCRIBE_POST: ONE_CLICK}


@dataclass(frozen=True)
class SendResult:
    """What the provider answered when it accepted a message.

    Attributes:
        provider: the backend's ``name`` (e.g. ``"twilio"``).
        provider_message_id: the provider's id for the accepted message (Twilio ``SM…`` sid,
            SendGrid ``X-Message-Id``, FCM ``projects/…/messages/…``).
        raw_status: the provider's own status word at acceptance, if any (Twilio ``queued``).
    """

    provider: str
    provider_message_id: str
    raw_status: str | None = None


class ProviderError(Exception):
    """A provider refused the message or could not be reached.

    Attributes:
        provider: backend name.
        code: the provider's error code as a string (Twilio ``"21211"``, FCM ``"UNREGISTERED"``,
            SendGrid/SMTP status such as ``"400"``/``"550"``), or a short word of ours
            (``"timeout"``, ``"connection_error"``).
        message: human-readable detail from the provider (never contains message content).
        http_status: HTTP status if there was an HTTP response, else ``None``.
        retry_after: seconds the provider asked us to wait (``Retry-After`` / rate-limit reset),
            else ``None``.
    """

    def __init__(
        self,
        provider: str,
        code: str,
        message: str = "",
        *,
        http_status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{provider} error {code}: {message}")
        self.provider = provider
        self.code = str(code)
        self.message = message
        self.http_status = http_status
        self.retry_after = retry_after


class TransientProviderError(ProviderError):
    """Retry later with backoff (timeouts, connection errors, 5xx, 429)."""


def transport_code(exc: BaseException | None) -> str:
    """The code of a failure to get an answer, from anywhere in ``exc``'s chain (``__cause__``,
    ``__context__``, ``reason`` and ``args``, which is where requests, urllib3, urllib and
    google-auth keep the original):

    * ``"timeout"``: no answer in time (the provider may have accepted the message);
    * ``"connection_lost"``: the connection broke after it was made (reset, closed without an
      answer, a protocol error): the request may have reached the provider, so also unknown;
    * ``"connection_error"``: anything else (refused, DNS): the request never left.

    Covers requests/urllib3, urllib, httpx/httpcore (``RemoteProtocolError``, ``ReadError``…) and
    aiohttp (``ServerDisconnectedError``, ``ServerTimeoutError``, ``ClientPayloadError``).
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    lost = False
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        name = type(current).__name__
        if isinstance(current, TimeoutError) or "Timeout" in name:
            return "timeout"
        if isinstance(current, (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)) or name in (
                "RemoteDisconnected", "ProtocolError", "IncompleteRead", "ChunkedEncodingError",
                # httpx / httpcore (FCM async path) and aiohttp (Twilio async path)
                "RemoteProtocolError", "ReadError", "WriteError", "ServerDisconnectedError",
                "ClientPayloadError"):
            lost = True
        linked = [current.__cause__, current.__context__, getattr(current, "reason", None), *current.args]
        pending.extend(e for e in linked if isinstance(e, BaseException))
    return "connection_lost" if lost else "connection_error"


class UnexpectedProviderError(TransientProviderError):
    """A send raised something outside the provider contract (a bug, an SDK surprise). Transient,
    so it is retried within the attempt budget and then dead-lettered; ``code`` is the exception's
    class name and ``message`` its text with the message's content blanked out."""

    @classmethod
    def wrap(cls, provider: str, exc: Exception, message: OutboundMessage) -> UnexpectedProviderError:
        text = str(exc)
        for part in (message.title, message.body, message.html):
            if part:
                text = text.replace(part, "[content]")
                for line in part.splitlines():
                    if len(line) >= 4:
                        text = text.replace(line, "[content]")
        wrapped = cls(provider, type(exc).__name__[:64], f"unexpected error: {text}"[:300])
        wrapped.__cause__ = exc
        return wrapped


class PermanentProviderError(ProviderError):
    """Do not retry this message (bad payload, content rejected, unsupported destination)."""


class ContactInvalidError(PermanentProviderError):
    """The destination itself is dead: deactivate the token / mark the number or address invalid.

    ``reason`` is one of ``"invalid_number"``, ``"opted_out"``, ``"not_mobile"``,
    ``"unregistered_token"``, ``"invalid_token"``, ``"invalid_address"``.
    """

    def __init__(self, provider: str, code: str, message: str = "", *, reason: str, **kw) -> None:
        super().__init__(provider, code, message, **kw)
        self.reason = reason


#: The key the platform adds to every message's provider data (FCM ``data``, SendGrid
#: ``custom_args``): the notification's id, which receipts and duplicates are matched by.
NOTIFICATION_ID_KEY = "notification_id"


def platform_key_problem(key: str, where: str) -> str | None:
    """Why ``key`` may not be a caller's data key because the platform sets it in ``where`` (e.g.
    ``"every push"``): a caller's value would be silently overwritten. ``None`` for other keys."""
    if key.casefold() != NOTIFICATION_ID_KEY:
        return None
    return (f"data key {key!r}: {NOTIFICATION_ID_KEY!r} is set by the platform in {where} (the "
            "notification's id); use another key")


class CallSkipped(Exception):
    """The outcome of a batch message the caller's ``gate`` refused just before its call: no
    request was made for it (e.g. its row's lease no longer covers a call, or the batch stopped
    after a rate limit). Not a provider error: never an attempt, never counted by a breaker."""

    def __init__(self, why: str = "") -> None:
        super().__init__(why or "not called")


#: ``gate(index) -> bool``: asked right before message ``index`` of a batch is sent (on the
#: thread making the call: the provider event loop for Twilio and FCM). False: no call
#: (:class:`CallSkipped`). Must be quick and never block (an in-memory check).
BatchGate = Callable[[int], bool]
#: ``on_result(index, outcome, latency_ms)``: called as soon as message ``index``'s outcome is
#: known (same thread as the gate); ``latency_ms`` is that call's own duration. Must not block.
BatchListener = Callable[[int, Any, int], None]


class ProviderConfigurationError(Exception):
    """Our settings or credentials are wrong (401/403, missing sender). Not a ProviderError."""

    def __init__(
        self,
        provider: str,
        message: str,
        code: str = "configuration",
        *,
        http_status: int | None = None,
    ) -> None:
        super().__init__(f"{provider} configuration error: {message}")
        self.provider = provider
        self.code = code
        self.message = message
        #: HTTP status of the provider's answer (401/403...), ``None`` if there was no HTTP exchange.
        self.http_status = http_status


#: Default connect timeout (seconds) when a backend's options give only ``TIMEOUT``.
DEFAULT_CONNECT_TIMEOUT_SECONDS = 3.0


@dataclass(frozen=True)
class CallTimeouts:
    """Timeouts of one provider HTTP request, in seconds (docs/PROVIDERS.md, "Async SDK paths").

    Attributes:
        connect: TCP connect (``CONNECT_TIMEOUT``, default ``min(TIMEOUT, 3)``).
        read: between bytes of the answer (``TIMEOUT``, default 10).
        total: the whole request, connect to last byte (``TOTAL_TIMEOUT``, default ``2 × TIMEOUT``,
            which stays inside the lease a row gets before each call).
    """

    connect: float
    read: float
    total: float

    @classmethod
    def from_options(cls, options: dict, default_read: float = 10.0) -> CallTimeouts:
        read = float(options.get("TIMEOUT") or default_read)
        connect = float(options.get("CONNECT_TIMEOUT") or min(read, DEFAULT_CONNECT_TIMEOUT_SECONDS))
        total = float(options.get("TOTAL_TIMEOUT") or 2 * read)
        return cls(connect=connect, read=read, total=max(total, connect, read))

    def expired(self, exc: BaseException) -> str:
        """What ran out, for a timeout ``exc`` of an aiohttp session built with these timeouts: the
        attempt's reason names the option that applied and its configured value. aiohttp raises
        ``ConnectionTimeoutError`` for the connect timeout, ``SocketTimeoutError`` for the read
        timeout and a plain ``TimeoutError`` for the whole request's."""
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            return f"no connection within {self.connect:g} s (CONNECT_TIMEOUT)"
        if isinstance(exc, aiohttp.ServerTimeoutError):
            return f"no answer within {self.read:g} s (TIMEOUT)"
        return f"no complete answer within {self.total:g} s (TOTAL_TIMEOUT)"


#: Connections one backend instance's pooled async client keeps at most (``POOL_SIZE`` option).
DEFAULT_POOL_SIZE = 100


@dataclass
class ProviderBackend:
    """Base of every provider backend. Subclasses set ``name`` and ``channel``.

    Lifecycle mirrors Django's ``BaseEmailBackend``: ``open()`` builds the SDK client lazily (never
    at import time), ``send()`` may be called many times, ``close()`` releases connections. A
    backend instance is used by one thread at a time.

    ``options`` come from ``settings.PROVIDERS[channel]["OPTIONS"]`` merged with kwargs.
    """

    name: ClassVar[str] = ""
    channel: ClassVar[str] = ""
    options: dict = field(default_factory=dict)

    def option(self, key: str, default: Any = _REQUIRED) -> Any:
        """Return ``options[key]``.

        Without ``default`` the key is required: a missing, ``None`` or empty value raises
        ProviderConfigurationError naming the setting (``PROVIDERS[<channel>][…]["OPTIONS"]["KEY"]``).
        """
        value = self.options.get(key)
        if value is None or value == "":
            if default is _REQUIRED:
                raise ProviderConfigurationError(
                    self.name,
                    f'settings.PROVIDERS["{self.channel}"] entry "{self.name}": '
                    f'OPTIONS["{key}"] is required',
                    code="missing_option",
                )
            return default
        return value

    def open(self) -> None:  # pragma: no cover - trivial default
        """Create SDK clients. Idempotent."""

    def close(self) -> None:  # pragma: no cover - trivial default
        """Release connections. Idempotent."""

    def send(self, message: OutboundMessage) -> SendResult:
        """Send one message.

        Returns:
            SendResult on acceptance.

        Raises:
            TransientProviderError, PermanentProviderError, ContactInvalidError,
            ProviderConfigurationError. Never returns silently on failure.
        """
        raise NotImplementedError


    def find_accepted(self, message: OutboundMessage, since: datetime,
                      is_taken: Callable[[str], bool] | None = None) -> SendResult | None:
        """Look up, at the provider, a message an earlier call for ``message`` may have created
        although its answer never reached us (a timeout, a worker killed mid-call): the provider's
        record of the same destination and content created at or after ``since`` (UTC), that
        ``is_taken(provider_message_id)`` does not claim for another notification.

        Returns its ``SendResult`` if found, ``None`` if not found *or* if this provider offers no
        lookup (this default; :attr:`supports_lookup` says which). Never raises for the provider's
        errors: a failed lookup is ``None`` (the caller then sends again: at-least-once).
        """
        return None

    #: Whether :meth:`find_accepted` can find anything (Twilio's message list can; SendGrid, SMTP
    #: and FCM offer no lookup by destination and content).
    supports_lookup: ClassVar[bool] = False

    def send_batch(self, messages: list[OutboundMessage], concurrency: int = 1, *, gate: BatchGate | None = None,
                   on_result: BatchListener | None = None) -> list[SendResult | Exception]:
        """Send several messages; the delivery pipeline's calls stage and the benchmark's SDK ceiling.

        Returns one ``SendResult`` or the exception ``send`` raised, per message, in input order;
        never raises for a single message's failure. ``gate`` (optional) is asked right before each
        message's call (False: :class:`CallSkipped`, nothing sent); ``on_result`` (optional) hears
        each outcome as soon as it is known, so the caller can record a long batch as it goes. This
        default makes one ``send`` after the other (SMTP); Twilio and FCM override it with their
        SDK's async API as a sliding window of at most ``concurrency`` calls in flight, and SendGrid
        with its personalizations (docs/PROVIDERS.md).
        """
        results: list[SendResult | Exception] = []
        for index, message in enumerate(messages):
            if gate is not None and not gate(index):
                results.append(CallSkipped())
                continue
            started = time.monotonic()
            outcome = self.send_or_error(message)
            if on_result is not None:
                on_result(index, outcome, int((time.monotonic() - started) * 1000))
            results.append(outcome)
        return results

    def pool_size(self) -> int:
        """Connections this instance's pooled async client keeps at most (``POOL_SIZE`` option)."""
        return int(self.option("POOL_SIZE", DEFAULT_POOL_SIZE))

    def in_flight_limit(self, concurrency: int, count: int) -> int:
        """Requests in flight at most for a batch of ``count`` messages: ``concurrency``, capped by
        :meth:`pool_size`, at least 1."""
        return max(1, min(int(concurrency), self.pool_size(), count))

    def send_or_error(self, message: OutboundMessage) -> SendResult | Exception:
        """:meth:`send`, with the exception it raised returned instead (batch results are per message).

        An exception outside the provider contract (a bug in an adapter or the SDK, e.g. Django's
        ``BadHeaderError`` for a subject with a line break) comes back as
        :class:`UnexpectedProviderError`, so it is an attempt like any other: recorded, retried
        with backoff, dead-lettered when the attempt budget is spent.
        """
        try:
            return self.send(message)
        except (ProviderError, ProviderConfigurationError) as exc:
            return exc
        except Exception as exc:
            return UnexpectedProviderError.wrap(self.name, exc, message)


class SmsBackend(ProviderBackend):
    channel = "sms"


class EmailBackend(ProviderBackend):
    channel = "email"


class PushBackend(ProviderBackend):
    channel = "push"
