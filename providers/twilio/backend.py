"""Twilio SMS backend on the official ``twilio`` SDK (pinned 9.13.0).

Sends go through the SDK's async API (``create_async`` with :class:`AsyncRedirectingHttpClient`) on
this process's provider event loop (providers/event_loop.py), one pooled aiohttp session per backend
instance; :meth:`TwilioSmsBackend.send_batch` has up to ``concurrency`` creates in flight and
:meth:`TwilioSmsBackend.send` is a batch of one. The emulator redirect swaps scheme and host after
the SDK built the URL (``docs/PROVIDERS.md`` §1(a), option B). No retries: one ``send`` is one POST;
Twilio has no idempotency key, so after an unanswered call :meth:`TwilioSmsBackend.find_accepted`
looks for the message first. Errors per docs/PROVIDERS.md §1(c); retries: "No SDK retries".
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import aiohttp
import requests
from twilio.base.exceptions import TwilioException, TwilioRestException, TwilioServiceException
from twilio.http.response import Response
from twilio.rest import Client

from providers import event_loop
from providers.base import (
    BatchGate,
    BatchListener,
    CallSkipped,
    CallTimeouts,
    ContactInvalidError,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    SendResult,
    SmsBackend,
    TransientProviderError,
    UnexpectedProviderError,
    transport_code,
)
from providers.senders import is_messaging_service
from providers.twilio.http import AsyncRedirectingHttpClient, RedirectingHttpClient, last_response

__all__ = ["AsyncRedirectingHttpClient", "RedirectingHttpClient", "TwilioSmsBackend", "clamp_validity_period",
           "status_callback_url"]

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10.0
#: Messages :meth:`TwilioSmsBackend.find_accepted` lists (newest first, one request).
LOOKUP_LIMIT = 20
#: Twilio's accepted ``ValidityPeriod`` range, in seconds.
VALIDITY_PERIOD_MIN_SECONDS = 1
VALIDITY_PERIOD_MAX_SECONDS = 36000

#: Twilio error code -> ContactInvalidError reason (docs/PROVIDERS.md §1(c)).
CONTACT_INVALID_CODES = {21211: "invalid_number", 21610: "opted_out", 21614: "not_mobile"}
#: Codes that mean our account/sender settings are wrong (docs/PROVIDERS.md §1(c)).
CONFIGURATION_CODES = frozenset({20003, 21606, 21659, 21408})
RATE_LIMIT_CODE = 20429


def _error_text(exc: TwilioRestException | TwilioServiceException) -> str:
    if isinstance(exc, TwilioServiceException):
        return exc.detail or exc.title or ""
    return exc.msg or ""


def clamp_validity_period(ttl_seconds: int | None) -> int | None:
    """Map a TTL in seconds to Twilio's ``ValidityPeriod`` (1..36000 s); ``None`` stays ``None``."""
    if ttl_seconds is None:
        return None
    return max(VALIDITY_PERIOD_MIN_SECONDS, min(VALIDITY_PERIOD_MAX_SECONDS, int(ttl_seconds)))


def status_callback_url(base: str | None, notification_id: str) -> str | None:
    """Return ``base`` with ``nid=<notification_id>`` added to its query, or ``None`` without a base."""
    if not base:
        return None
    parts = urlsplit(base)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "nid"]
    query.append(("nid", notification_id))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(query), parts.fragment))


@dataclass
class TwilioSmsBackend(SmsBackend):
    """Send SMS through Twilio's Messages API (``POST /2010-04-01/Accounts/{sid}/Messages.json``).

    Options (``settings.PROVIDERS["sms"][i]["OPTIONS"]``): ACCOUNT_SID, AUTH_TOKEN, FROM_NUMBER
    (E.164; required); BASE_URL (``None`` for real Twilio, else the emulator's URL);
    STATUS_CALLBACK_URL (optional, ``?nid=<notification_id>`` appended); TIMEOUT (read timeout, default
    10), CONNECT_TIMEOUT, TOTAL_TIMEOUT (providers.base.CallTimeouts); POOL_SIZE (default 100; also caps
    ``concurrency``).

    ``send`` returns ``SendResult(provider="twilio", provider_message_id=<"SM…" sid>, raw_status=…)``.
    ``ttl_seconds`` becomes ``ValidityPeriod`` (1..36000 s); ``sender`` replaces FROM_NUMBER
    (:meth:`effective_sender`) and must be this account's. No idempotency key: :meth:`find_accepted`.
    """

    name: ClassVar[str] = "twilio"
    supports_lookup: ClassVar[bool] = True
    required_options: ClassVar[tuple[str, ...]] = ("ACCOUNT_SID", "AUTH_TOKEN", "FROM_NUMBER")

    _client: Client | None = field(default=None, init=False, repr=False)
    _http: RedirectingHttpClient | None = field(default=None, init=False, repr=False)
    _async_client: Client | None = field(default=None, init=False, repr=False)
    _async_http: AsyncRedirectingHttpClient | None = field(default=None, init=False, repr=False)
    _async_loop: tuple[int, int] | None = field(default=None, init=False, repr=False)

    def open(self) -> None:
        """Build the Twilio clients (no network I/O): the async one sends, the sync one looks up.
        Idempotent; after a fork the async client is rebuilt for the child's own event loop.

        Raises:
            ProviderConfigurationError: a required option is missing.
        """
        if self._client is None:
            sid = self.option("ACCOUNT_SID")
            token = self.option("AUTH_TOKEN")
            self.option("FROM_NUMBER")
            self._http = RedirectingHttpClient(self.option("BASE_URL", None), self._timeout())
            self._client = Client(sid, token, http_client=self._http)
        loop = event_loop.loop_id()
        if self._async_client is None or self._async_loop != loop:
            # A client of another loop (a parent process's) is dropped unclosed: its sockets are not ours.
            self._async_http = AsyncRedirectingHttpClient(
                self.option("BASE_URL", None), self.timeouts(), self.pool_size())
            self._async_client = Client(self.option("ACCOUNT_SID"), self.option("AUTH_TOKEN"),
                                        http_client=self._async_http)
            self._async_loop = loop

    def close(self) -> None:
        """Close the pooled HTTP sessions (the async one on its loop, if that loop is this
        process's). Idempotent."""
        if self._http is not None and self._http.session is not None:
            self._http.session.close()
        if self._async_http is not None and self._async_loop == event_loop.loop_id():
            try:
                event_loop.run(self._async_http.close(), timeout=5)
            except Exception:  # closing must never mask the caller's work
                logger.warning("twilio: closing the async session failed", exc_info=True)
        self._client = self._http = self._async_client = self._async_http = self._async_loop = None

    def timeouts(self) -> CallTimeouts:
        """This instance's request timeouts (``TIMEOUT``, ``CONNECT_TIMEOUT``, ``TOTAL_TIMEOUT``)."""
        return CallTimeouts.from_options(self.options, DEFAULT_TIMEOUT_SECONDS)

    def send(self, message: OutboundMessage) -> SendResult:
        """Create one Twilio Message for ``message.to`` (E.164): a batch of one on the async path (why:
        docs/PROVIDERS.md, "Async SDK paths").

        Raises:
            ContactInvalidError: 21211 (``invalid_number``), 21610 (``opted_out``), 21614 (``not_mobile``).
            ProviderConfigurationError: 401/403, 20003, 21606, 21659, 21408, a missing option.
            TransientProviderError: 429 (``retry_after`` from ``Retry-After``, never slept), 5xx,
                ``timeout`` / ``connection_lost`` (outcome unknown), ``connection_error`` (never left).
            PermanentProviderError: any other 4xx.
        """
        [outcome] = self.send_batch([message])
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def send_batch(self, messages: list[OutboundMessage], concurrency: int = 1, *, gate: BatchGate | None = None,
                   on_result: BatchListener | None = None) -> list[SendResult | Exception]:
        """Create one Twilio Message per item on this instance's pooled aiohttp session, as a
        sliding window: at most ``concurrency`` (and ``POOL_SIZE``) creates in flight, the next
        one starting as soon as any ends (a slow answer holds one slot, not a wave). ``gate`` and
        ``on_result``: :meth:`ProviderBackend.send_batch`, called on the provider event loop.

        Returns one ``SendResult`` or exception (as :meth:`send` raises them) per message, in input
        order; never raises. Every message in flight when an answer is lost may have been created
        (the duplicate window is the messages in flight, docs/PROVIDERS.md).
        """
        if not messages:
            return []
        try:
            self.open()
        except ProviderConfigurationError as exc:
            return [exc] * len(messages)
        limit = self.in_flight_limit(concurrency, len(messages))
        waves = -(-len(messages) // limit)
        backstop = waves * self.timeouts().total + 5.0
        try:
            return event_loop.run(self._create_all(messages, limit, gate, on_result), timeout=backstop)
        except TimeoutError:
            return [TransientProviderError(self.name, "timeout", f"batch not answered within {backstop:.0f} s")
                    for _ in messages]

    async def _create_all(self, messages: list[OutboundMessage], limit: int, gate: BatchGate | None,
                          on_result: BatchListener | None) -> list[SendResult | Exception]:
        slots = asyncio.Semaphore(limit)

        async def one(index: int, message: OutboundMessage) -> SendResult | Exception:
            async with slots:
                if gate is not None and not gate(index):
                    return CallSkipped()
                started = time.monotonic()
                outcome = await self._create(message)
                if on_result is not None:
                    on_result(index, outcome, int((time.monotonic() - started) * 1000))
                return outcome

        return list(await asyncio.gather(*(one(i, m) for i, m in enumerate(messages))))

    async def _create(self, message: OutboundMessage) -> SendResult | Exception:
        """One ``messages.create_async``; the outcome is returned, never raised."""
        try:
            created = await self._async_client.messages.create_async(**self._create_params(message))  # type: ignore[union-attr]
        except (TwilioRestException, TwilioServiceException) as exc:
            return _caused(self._classify(exc, last_response()), exc)
        except TimeoutError as exc:  # asyncio's and aiohttp's (ServerTimeoutError, ConnectionTimeoutError)
            return _caused(TransientProviderError(
                self.name, "timeout", f"{self.timeouts().expired(exc)} ({type(exc).__name__})"), exc)
        except aiohttp.ClientError as exc:
            return _caused(TransientProviderError(self.name, transport_code(exc), type(exc).__name__), exc)
        except Exception as exc:
            return UnexpectedProviderError.wrap(self.name, exc, message)
        return SendResult(provider=self.name, provider_message_id=created.sid, raw_status=created.status)

    def effective_sender(self, message: OutboundMessage) -> str:
        """Who ``message`` goes out from: ``message.sender`` (an E.164 number or a Messaging
        Service SID ``MG…``), else ``FROM_NUMBER``. What an SMS STOP is scoped to.

        Raises:
            ProviderConfigurationError: no sender given and FROM_NUMBER is not set.
        """
        return message.sender or self.option("FROM_NUMBER")

    def _create_params(self, message: OutboundMessage) -> dict[str, Any]:
        """``messages.create`` keyword arguments: ``from_`` = :meth:`effective_sender`, or
        ``messaging_service_sid`` when that is a Messaging Service SID (Twilio then picks the
        number from the service's pool, and the message starts ``accepted``, not ``queued``)."""
        sender = self.effective_sender(message)
        params: dict[str, Any] = {"to": message.to, "body": message.body}
        if is_messaging_service(sender):
            params["messaging_service_sid"] = sender
        else:
            params["from_"] = sender
        callback = status_callback_url(self.option("STATUS_CALLBACK_URL", None), message.notification_id)
        if callback:
            params["status_callback"] = callback
        validity = clamp_validity_period(message.ttl_seconds)
        if validity is not None:
            params["validity_period"] = validity
        return params

    def find_accepted(self, message: OutboundMessage, since: datetime,
                      is_taken: Callable[[str], bool] | None = None) -> SendResult | None:
        """The Twilio Message an earlier :meth:`send` of ``message`` may have created without its answer
        reaching us (timeout, worker killed mid-call), or ``None``: one list request filtered by To and
        the sender, matched client-side by body and creation time (how and why: docs/PROVIDERS.md,
        "Duplicate window").

        Args:
            message: the message as given to ``send``.
            since: aware datetime (naive is taken as UTC), the instant before the earlier call started.
            is_taken: ``sid -> bool``, True for a sid already recorded for another notification.

        Returns:
            ``SendResult`` with the message's status now, or ``None`` (not among the 20 newest, or the
            lookup failed, logged): "send again". Raises ProviderConfigurationError for a missing option.
        """
        self.open()
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        not_before = since.astimezone(UTC).replace(microsecond=0)
        sender = self.effective_sender(message)
        service = is_messaging_service(sender)
        try:
            listed = self._client.messages.list(  # type: ignore[union-attr]
                to=message.to, **({} if service else {"from_": sender}), limit=LOOKUP_LIMIT)
        except (TwilioException, requests.exceptions.RequestException, ValueError, KeyError, TypeError) as exc:
            status = getattr(exc, "status", None)
            logger.warning("twilio: lookup of notification %s failed (%s%s); it will be sent again",
                           message.notification_id, type(exc).__name__, f" {status}" if status else "")
            return None
        matches = [
            m for m in listed
            if m.body == message.body and isinstance(m.date_created, datetime) and m.date_created >= not_before
            and (not service or m.messaging_service_sid == sender)
            and not (is_taken is not None and is_taken(m.sid))
        ]
        if not matches:
            return None
        found = matches[-1]  # listed newest first
        return SendResult(provider=self.name, provider_message_id=found.sid,
                          raw_status=str(found.status) if found.status is not None else None)

    def _timeout(self) -> float:
        return float(self.option("TIMEOUT", DEFAULT_TIMEOUT_SECONDS))

    def _classify(self, exc: TwilioRestException | TwilioServiceException,
                  response: Response | None = None) -> Exception:
        """Map a Twilio API error to our hierarchy (docs/PROVIDERS.md §1(c))."""
        status = int(exc.status) if exc.status is not None else None
        try:
            code = int(exc.code)
        except (TypeError, ValueError):
            code = status or 0
        text = str(_error_text(exc))[:300]
        if code in CONTACT_INVALID_CODES:
            return ContactInvalidError(
                self.name, str(code), text, reason=CONTACT_INVALID_CODES[code], http_status=status,
            )
        if code in CONFIGURATION_CODES or status in (401, 403):
            return ProviderConfigurationError(self.name, text, code=str(code), http_status=status)
        if status == 429 or code == RATE_LIMIT_CODE:
            return TransientProviderError(
                self.name, str(code), text, http_status=status, retry_after=_retry_after(response),
            )
        if status is None or status >= 500:
            return TransientProviderError(self.name, str(code), text, http_status=status)
        return PermanentProviderError(self.name, str(code), text, http_status=status)



def _retry_after(response: Response | None) -> float | None:
    """``Retry-After`` (seconds) of ``response``, if it had one."""
    if response is None or not response.headers:
        return None
    value = response.headers.get("Retry-After")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def _caused(error: Exception, cause: BaseException) -> Exception:
    error.__cause__ = cause
    return error
