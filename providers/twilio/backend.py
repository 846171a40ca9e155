"""Twilio SMS backend on the official ``twilio`` SDK (pinned 9.13.0).

Redirect to a local server (the provider emulator) uses option B of
``docs/PROVIDERS.md`` §1(a): an ``HttpClient`` subclass that swaps scheme and host of every
request after the SDK has built the URL (so ``TWILIO_EDGE``/``TWILIO_REGION`` rewriting cannot corrupt a
localhost URL). Errors are classified per docs/PROVIDERS.md §1(c).

No retries: neither ``TwilioHttpClient`` nor the requests session under it retries on ``http://`` or
``https://`` (docs/PROVIDERS.md §1(a), "The SDKs' own retries and async paths"; requests' default adapter
is ``Retry(0, read=False)``), so one ``send`` is one POST. Twilio has no idempotency key, so after a
call that got no answer :meth:`TwilioSmsBackend.find_accepted` looks for the message it may have
created before the pipeline sends again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import requests
from twilio.base.exceptions import TwilioException, TwilioRestException, TwilioServiceException
from twilio.http.http_client import TwilioHttpClient
from twilio.http.response import Response
from twilio.rest import Client

from providers.base import (
    ContactInvalidError,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    SendResult,
    SmsBackend,
    TransientProviderError,
    transport_code,
)

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


class RedirectingHttpClient(TwilioHttpClient):
    """``TwilioHttpClient`` that sends every request to ``base_url`` (scheme + host[:port]) instead.

    Path and query are kept, so every Twilio domain works. With ``base_url=None`` nothing is
    rewritten (real Twilio). The requests session ignores proxy/netrc environment variables
    (``trust_env=False``). The last response is kept in ``last_response`` so the backend can read
    ``Retry-After`` after an error (``TwilioRestException`` does not carry headers). The SDK's
    ~10 INFO log lines per request are reduced to one DEBUG line each way.
    """

    def __init__(self, base_url: str | None, timeout: float) -> None:
        super().__init__(timeout=timeout)
        if self.session is not None:
            self.session.trust_env = False
        self._target = urlsplit(base_url) if base_url else None
        self.last_response: Response | None = None

    def request(
        self,
        method: str,
        url: str,
        params: dict[str, object] | None = None,
        data: dict[str, object] | None = None,
        headers: dict[str, str] | None = None,
        auth: tuple[str, str] | None = None,
        timeout: float | None = None,
        allow_redirects: bool = False,
    ) -> Response:
        """Same contract as ``TwilioHttpClient.request``; only scheme and host are swapped."""
        if self._target is not None:
            parts = urlsplit(url)
            url = urlunsplit((self._target.scheme, self._target.netloc, parts.path, parts.query, ""))
        self.last_response = None
        response = super().request(
            method, url, params=params, data=data, headers=headers, auth=auth,
            timeout=timeout, allow_redirects=allow_redirects,
        )
        self.last_response = response
        return response

    def log_request(self, kwargs: dict[str, Any]) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("twilio request: %s %s", kwargs["method"], kwargs["url"])

    def log_response(self, status_code: int, response: Any) -> None:
        if self.logger.isEnabledFor(logging.DEBUG):
            self.logger.debug("twilio response: %s", status_code)


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

    Options (``settings.PROVIDERS["sms"][i]["OPTIONS"]``):
        ACCOUNT_SID, AUTH_TOKEN, FROM_NUMBER (E.164): required.
        BASE_URL: ``None`` for real Twilio, else e.g. ``"http://127.0.0.1:8900"`` (the emulator).
        STATUS_CALLBACK_URL: optional; ``?nid=<notification_id>`` is appended and sent as
            ``StatusCallback``.
        TIMEOUT: seconds per HTTP call (connect and read), default 10.

    ``send`` returns ``SendResult(provider="twilio", provider_message_id=<"SM…" sid>,
    raw_status=<"queued"/"accepted">)``. The message's ``ttl_seconds`` becomes ``ValidityPeriod``
    clamped to 1..36000 s. Twilio has no idempotency key: a timeout may hide an accepted message,
    so a retry can duplicate it (docs/PROVIDERS.md §1(c)) unless :meth:`find_accepted` finds it first.
    """

    name: ClassVar[str] = "twilio"
    supports_lookup: ClassVar[bool] = True
    required_options: ClassVar[tuple[str, ...]] = ("ACCOUNT_SID", "AUTH_TOKEN", "FROM_NUMBER")

    _client: Client | None = field(default=None, init=False, repr=False)
    _http: RedirectingHttpClient | None = field(default=None, init=False, repr=False)

    def open(self) -> None:
        """Build the Twilio client (no network I/O). Idempotent.

        Raises:
            ProviderConfigurationError: a required option is missing.
        """
        if self._client is not None:
            return
        sid = self.option("ACCOUNT_SID")
        token = self.option("AUTH_TOKEN")
        self.option("FROM_NUMBER")
        self._http = RedirectingHttpClient(self.option("BASE_URL", None), self._timeout())
        self._client = Client(sid, token, http_client=self._http)

    def close(self) -> None:
        """Close the pooled HTTP session. Idempotent."""
        if self._http is not None and self._http.session is not None:
            self._http.session.close()
        self._client = None
        self._http = None

    def send(self, message: OutboundMessage) -> SendResult:
        """Create one Twilio Message for ``message.to`` (E.164).

        Raises:
            ContactInvalidError: 21211 (``invalid_number``), 21610 (``opted_out``),
                21614 (``not_mobile``).
            ProviderConfigurationError: 401/403, 20003, 21606, 21659, 21408.
            TransientProviderError: 429 (``retry_after`` from ``Retry-After`` when present), 5xx,
                ``code="timeout"``, ``code="connection_error"``.
            PermanentProviderError: any other 4xx.
        """
        self.open()
        params: dict[str, Any] = {
            "to": message.to,
            "from_": self.option("FROM_NUMBER"),
            "body": message.body,
        }
        callback = status_callback_url(self.option("STATUS_CALLBACK_URL", None), message.notification_id)
        if callback:
            params["status_callback"] = callback
        validity = clamp_validity_period(message.ttl_seconds)
        if validity is not None:
            params["validity_period"] = validity
        try:
            created = self._client.messages.create(**params)  # type: ignore[union-attr]
        except (TwilioRestException, TwilioServiceException) as exc:
            raise self._classify(exc) from exc
        except requests.exceptions.Timeout as exc:
            raise TransientProviderError(self.name, "timeout", f"no answer within {self._timeout()} s") from exc
        except requests.exceptions.RequestException as exc:
            raise TransientProviderError(self.name, transport_code(exc), type(exc).__name__) from exc
        return SendResult(provider=self.name, provider_message_id=created.sid, raw_status=created.status)

    def find_accepted(self, message: OutboundMessage, since: datetime,
                      is_taken: Callable[[str], bool] | None = None) -> SendResult | None:
        """The Twilio Message an earlier :meth:`send` of ``message`` may have created without its
        answer reaching us (timeout, worker killed mid-call), or ``None``.

        One ``GET /2010-04-01/Accounts/{ACCOUNT_SID}/Messages.json?To=<message.to>&From=<FROM_NUMBER>
        &PageSize=20`` (SDK ``messages.list(to=, from_=, limit=20)``; Twilio lists newest first),
        then, client-side, the messages whose ``body`` equals ``message.body`` exactly and whose
        ``date_created`` is at or after ``since``. Why not Twilio's ``DateSent`` filter: ``date_sent``
        is null until the message has actually left Twilio, so a message still ``queued`` or
        ``accepted`` (the likely state seconds after the lost answer) would be missed; To/From
        narrow the list at the API instead. ``date_created`` is RFC 2822, whole seconds, so ``since``
        is compared truncated to its second; the clocks of Twilio and this host are assumed to
        agree within that. A message ``is_taken`` says belongs to another notification (the same text
        sent to the same number for another reason, e.g. an earlier OTP or campaign) never counts.
        If several match (an earlier duplicate), the oldest is returned.

        Args:
            message: the message as given to ``send``.
            since: aware datetime (UTC; a naive one is taken as UTC), the instant before the
                earlier call started.
            is_taken: ``sid -> bool``, True for a message already recorded for another
                notification; ``None``: none is.

        Returns:
            ``SendResult(provider="twilio", provider_message_id=<"SM…" sid>, raw_status=<its status
            now, e.g. "queued", "sent">)`` or ``None``: not found among the 20 newest messages to
            that number from FROM_NUMBER, or the lookup failed (any SDK or HTTP error, or no answer
            within TIMEOUT; logged as a warning). ``None`` means "send again" (at-least-once).

        Raises:
            ProviderConfigurationError: a required option is missing (never for Twilio's answers).
        """
        self.open()
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        not_before = since.astimezone(UTC).replace(microsecond=0)
        try:
            listed = self._client.messages.list(to=message.to, from_=self.option("FROM_NUMBER"), limit=LOOKUP_LIMIT)  # type: ignore[union-attr]
        except (TwilioException, requests.exceptions.RequestException, ValueError, KeyError, TypeError) as exc:
            status = getattr(exc, "status", None)
            logger.warning("twilio: lookup of notification %s failed (%s%s); it will be sent again",
                           message.notification_id, type(exc).__name__, f" {status}" if status else "")
            return None
        matches = [
            m for m in listed
            if m.body == message.body and isinstance(m.date_created, datetime) and m.date_created >= not_before
            and not (is_taken is not None and is_taken(m.sid))
        ]
        if not matches:
            return None
        found = matches[-1]  # listed newest first
        return SendResult(provider=self.name, provider_message_id=found.sid,
                          raw_status=str(found.status) if found.status is not None else None)

    def _timeout(self) -> float:
        return float(self.option("TIMEOUT", DEFAULT_TIMEOUT_SECONDS))

    def _classify(self, exc: TwilioRestException | TwilioServiceException) -> Exception:
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
                self.name, str(code), text, http_status=status, retry_after=self._retry_after(),
            )
        if status is None or status >= 500:
            return TransientProviderError(self.name, str(code), text, http_status=status)
        return PermanentProviderError(self.name, str(code), text, http_status=status)

    def _retry_after(self) -> float | None:
        """``Retry-After`` (seconds) of the last response, if it had one."""
        response = self._http.last_response if self._http is not None else None
        if response is None or not response.headers:
            return None
        value = response.headers.get("Retry-After")
        try:
            return max(0.0, float(value)) if value is not None else None
        except ValueError:
            return None
