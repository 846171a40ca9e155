"""SendGrid email backend on the official ``sendgrid`` SDK (pinned 6.12.5, python-http-client 3.3.7).

Requests are plain dict bodies posted with ``sg.client.mail.send.post(request_body=..., timeout=...)``
(the ``Mail`` helper classes cost about twice as much and reverse personalizations). Redirect to the
emulator uses the documented ``host`` parameter (docs/PROVIDERS.md §2(a)). Errors are classified per
docs/PROVIDERS.md §2(c).
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
from dataclasses import dataclass, field
from typing import Any, ClassVar

from python_http_client.exceptions import HTTPError
from sendgrid import SendGridAPIClient

from providers.base import (
    NOTIFICATION_ID_KEY,
    BatchGate,
    BatchListener,
    CallSkipped,
    EmailBackend,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    SendResult,
    TransientProviderError,
    transport_code,
    unsubscribe_headers,
)
from providers.senders import parse_sender

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10.0


def sender(from_email: str) -> dict[str, str]:
    """``"Name <addr@example.com>"`` or ``"addr@example.com"`` -> SendGrid's ``{"email", "name"?}``,
    by the one parse the sender check used (:func:`providers.senders.parse_sender`)."""
    name, address = parse_sender(from_email)
    result = {"email": address}
    if name:
        result["name"] = name
    return result


def build_request_body(message: OutboundMessage, from_email: str) -> dict[str, Any]:
    """The v3 ``/mail/send`` JSON body for one recipient (docs/PROVIDERS.md §2(b)).

    ``from`` = ``message.sender``, else ``from_email`` (the backend's FROM_EMAIL); ``reply_to``
    when ``message.reply_to`` is set. ``custom_args`` carries ``message.data`` plus
    ``notification_id`` (SendGrid merges custom args into every event, which is how webhooks are
    correlated). Content is text/plain, then text/html. A message with an ``unsubscribe_url`` gets
    the RFC 8058 headers in its personalization's ``headers`` (:func:`providers.base.unsubscribe_headers`).
    """
    content = [{"type": "text/plain", "value": message.body}]
    if message.html:
        content.append({"type": "text/html", "value": message.html})
    custom_args = {str(k): str(v) for k, v in (message.data or {}).items()}
    custom_args[NOTIFICATION_ID_KEY] = message.notification_id
    personalization: dict[str, Any] = {"to": [{"email": message.to}]}
    headers = unsubscribe_headers(message)
    if headers:
        personalization["headers"] = headers
    body: dict[str, Any] = {
        "personalizations": [personalization],
        "from": sender(message.sender or from_email),
        "subject": message.title or "",
        "content": content,
        "custom_args": custom_args,
    }
    if message.reply_to:
        body["reply_to"] = sender(message.reply_to)
    return body


#: SendGrid v3 mail/send: at most 1,000 personalizations (recipients) per request.
MAX_PERSONALIZATIONS = 1000
#: SendGrid v3 mail/send: substitutions of one personalization total at most 10,000 bytes.
MAX_SUBSTITUTION_BYTES = 10_000
#: Substitution tags the batch body uses for each recipient's rendered text and HTML.
BODY_TAG = "-notify-body-"
HTML_TAG = "-notify-html-"


def substitution_bytes(message: OutboundMessage) -> int:
    """Bytes the message's per-recipient substitutions take (SendGrid counts keys and values)."""
    size = len(BODY_TAG) + len(message.body.encode("utf-8"))
    if message.html:
        size += len(HTML_TAG) + len(message.html.encode("utf-8"))
    return size


def build_batch_body(messages: list[OutboundMessage], from_email: str, with_html: bool,
                     reply_to: str | None = None) -> dict[str, Any]:
    """One ``/mail/send`` body for several recipients (docs/PROVIDERS.md §2(b); SendGrid's "Mail Send:
    personalizations" and "substitutions").

    Each message is one personalization: its ``to``, ``subject``, ``custom_args`` (data +
    ``notification_id``), ``headers`` (the RFC 8058 pair with an ``unsubscribe_url``) and
    ``substitutions`` carrying its rendered bodies in place of :data:`BODY_TAG` / :data:`HTML_TAG`.
    Plain dicts: the SDK's helpers cost twice as much (docs/PERFORMANCE.md, "Calibration"). All
    messages have an HTML body or none (``with_html``), at most :data:`MAX_PERSONALIZATIONS`;
    ``from_email`` and ``reply_to`` are shared, so the caller groups messages by :func:`batch_key`.
    """
    personalizations = []
    for m in messages:
        substitutions = {BODY_TAG: m.body}
        if with_html:
            substitutions[HTML_TAG] = m.html or ""
        custom_args = {str(k): str(v) for k, v in (m.data or {}).items()} if m.data else {}
        custom_args[NOTIFICATION_ID_KEY] = m.notification_id
        personalization = {"to": [{"email": m.to}], "subject": m.title or "",
                           "substitutions": substitutions, "custom_args": custom_args}
        headers = unsubscribe_headers(m)
        if headers:
            personalization["headers"] = headers
        personalizations.append(personalization)
    content = [{"type": "text/plain", "value": BODY_TAG}]
    if with_html:
        content.append({"type": "text/html", "value": HTML_TAG})
    body = {"personalizations": personalizations, "from": sender(from_email),
            "subject": messages[0].title or "", "content": content}
    if reply_to:
        body["reply_to"] = sender(reply_to)
    return body


#: ``(has HTML, From or None for FROM_EMAIL, Reply-To or None)``: see :func:`batch_key`.
BatchKey = tuple[bool, str | None, str | None]


def batch_key(message: OutboundMessage) -> BatchKey:
    """``(has HTML, From, Reply-To)``: messages with the same key may share one request; From is
    ``None`` for the backend's FROM_EMAIL, Reply-To ``None`` for none.

    Why From and Reply-To split a batch although SendGrid allows a ``from`` per personalization
    (docs/PROVIDERS.md "Silent pushes and sender overrides"): ``reply_to`` exists at the message
    level only (and ``Reply-To`` is a reserved header a personalization's ``headers`` may not
    set), and a sender SendGrid refuses (403, not a verified Sender Identity) refuses the whole
    request, which would fail every other message in it with a configuration error. One request
    per (From, Reply-To) keeps a misconfigured type's sender to its own messages.
    """
    return bool(message.html), message.sender or None, message.reply_to or None


@dataclass
class SendGridEmailBackend(EmailBackend):
    """Send email through SendGrid's v3 Mail Send API.

    Options (``settings.PROVIDERS["email"][i]["OPTIONS"]``): API_KEY, FROM_EMAIL (required; may be
    ``"Name <addr>"``); HOST (``None`` for real SendGrid, else the emulator's URL); TIMEOUT (seconds
    per call, default 10: the SDK's own default is none). A message's ``sender`` replaces FROM_EMAIL
    and its ``reply_to`` is the request's (:meth:`effective_sender`, :func:`batch_key`); an
    unverified From is 403 (ProviderConfigurationError).

    ``send`` returns ``SendResult(provider="sendgrid", provider_message_id=<X-Message-Id>,
    raw_status="accepted")``; one TCP connection per request, no retries, so a timeout may hide an
    accepted message.
    """

    name: ClassVar[str] = "sendgrid"
    #: send_batch sends many recipients in one request (the breaker counts requests).
    batch_api: ClassVar[bool] = True
    required_options: ClassVar[tuple[str, ...]] = ("API_KEY", "FROM_EMAIL")

    _client: SendGridAPIClient | None = field(default=None, init=False, repr=False)

    def open(self) -> None:
        """Build the SDK client (no network I/O). Idempotent.

        Raises:
            ProviderConfigurationError: a required option is missing.
        """
        if self._client is not None:
            return
        kwargs: dict[str, Any] = {"api_key": self.option("API_KEY")}
        host = self.option("HOST", None)
        if host:
            kwargs["host"] = host.rstrip("/")
        self.option("FROM_EMAIL")
        self._client = SendGridAPIClient(**kwargs)

    def close(self) -> None:
        """Drop the client (urllib keeps no connection open). Idempotent."""
        self._client = None

    def effective_sender(self, message: OutboundMessage) -> str:
        """The From ``message`` goes out with: its ``sender``, else FROM_EMAIL.

        Raises:
            ProviderConfigurationError: no sender given and FROM_EMAIL is not set.
        """
        return message.sender or self.option("FROM_EMAIL")

    def send(self, message: OutboundMessage) -> SendResult:
        """Post one message to ``/v3/mail/send`` for ``message.to``.

        Raises:
            PermanentProviderError: 400/413 (payload bug) and other 4xx; ``code`` is the HTTP status.
            ProviderConfigurationError: 401/403.
            TransientProviderError: 429 (``retry_after`` = ``X-RateLimit-Reset`` epoch s minus now,
                else ``Retry-After``), 5xx, ``code="timeout"``, ``code="connection_error"``.
        """
        self.open()
        body = build_request_body(message, self.option("FROM_EMAIL"))
        return self._post(body, f"notification {message.notification_id}")

    def send_batch(self, messages: list[OutboundMessage], concurrency: int = 1, *, gate: BatchGate | None = None,
                   on_result: BatchListener | None = None) -> list[SendResult | Exception]:
        """Send up to 1,000 recipients per request with per-recipient substitutions.

        One request per (HTML or not, From, Reply-To) (:func:`batch_key`: no message gets another's
        sender, and a refused sender fails only its own messages); a message over SendGrid's 10,000
        substitution bytes goes alone through :meth:`send`. Every message of an accepted request gets its
        ``X-Message-Id``. A 4xx refusal is retried in halves (:meth:`_send_halving`), so one bad address
        fails only itself; a transient or configuration error applies to the whole request.
        ``concurrency`` is unused; ``gate`` is asked per message before the requests (refused:
        :class:`CallSkipped`), ``on_result`` hears each outcome when its request ends. Returns one result
        or exception per message, in order.
        """
        results: list[SendResult | Exception | None] = [None] * len(messages)
        groups: dict[BatchKey, list[int]] = {}
        for index, m in enumerate(messages):
            if gate is not None and not gate(index):
                results[index] = CallSkipped()
            elif substitution_bytes(m) > MAX_SUBSTITUTION_BYTES:
                started = time.monotonic()
                results[index] = self.send_or_error(m)
                if on_result is not None:
                    on_result(index, results[index], int((time.monotonic() - started) * 1000))
            else:
                groups.setdefault(batch_key(m), []).append(index)
        for key, indexes in groups.items():
            for start in range(0, len(indexes), MAX_PERSONALIZATIONS):
                chunk = indexes[start:start + MAX_PERSONALIZATIONS]
                started = time.monotonic()
                self._send_halving(messages, chunk, key, results)
                if on_result is not None:
                    latency_ms = int((time.monotonic() - started) * 1000)
                    for i in chunk:
                        on_result(i, results[i], latency_ms)
        return results  # type: ignore[return-value]

    def _send_halving(self, messages: list[OutboundMessage], chunk: list[int],
                      key: BatchKey, results: list) -> None:
        """One request for ``chunk``; a permanent refusal (one bad address refuses the whole request)
        is retried as two halves, recursively, so ``k`` bad addresses among ``n`` cost about
        ``2·k·log2(n)`` requests instead of ``n`` one-by-one sends (500 sends took 6 minutes behind
        a slow SendGrid and outlived the task's time limit)."""
        outcome = self._post_batch([messages[i] for i in chunk], key)
        if isinstance(outcome, PermanentProviderError) and len(chunk) > 1:
            middle = len(chunk) // 2
            self._send_halving(messages, chunk[:middle], key, results)
            self._send_halving(messages, chunk[middle:], key, results)
            return
        for i in chunk:
            results[i] = outcome

    def _post_batch(self, messages: list[OutboundMessage], key: BatchKey) -> SendResult | Exception:
        """One request for ``messages`` (all with ``key``, :func:`batch_key`): the shared
        SendResult, or the error for all of them."""
        with_html, from_email, reply_to = key
        try:
            self.open()
            body = build_batch_body(messages, from_email or self.option("FROM_EMAIL"), with_html, reply_to)
            return self._post(body, f"a batch of {len(messages)}")
        except Exception as exc:  # applies to every message of the request
            return exc

    def _post(self, body: dict[str, Any], what: str) -> SendResult:
        """POST ``body`` to ``/v3/mail/send``; SendResult with ``X-Message-Id``, or raise (see send)."""
        timeout = float(self.option("TIMEOUT", DEFAULT_TIMEOUT_SECONDS))
        try:
            response = self._client.client.mail.send.post(request_body=body, timeout=timeout)  # type: ignore[union-attr]
        except HTTPError as exc:
            raise self._classify(exc) from exc
        except TimeoutError as exc:
            raise TransientProviderError(self.name, "timeout", f"no answer within {timeout} s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise TransientProviderError(self.name, "timeout", f"no answer within {timeout} s") from exc
            raise TransientProviderError(self.name, transport_code(exc), str(exc.reason)[:200]) from exc
        except (http.client.HTTPException, OSError) as exc:
            raise TransientProviderError(self.name, transport_code(exc), type(exc).__name__) from exc
        message_id = response.headers.get("X-Message-Id") if response.headers else None
        if not message_id:
            # Accepted anyway: raising would make the caller retry and send a duplicate.
            logger.warning("sendgrid accepted %s without X-Message-Id", what)
            message_id = ""
        return SendResult(provider=self.name, provider_message_id=message_id, raw_status="accepted")

    def _classify(self, exc: HTTPError) -> Exception:
        """Map an HTTP error answer to our hierarchy (docs/PROVIDERS.md §2(c))."""
        status = int(exc.status_code)
        text = _error_text(exc)
        if status in (401, 403):
            return ProviderConfigurationError(self.name, text, code=str(status), http_status=status)
        if status == 429:
            return TransientProviderError(
                self.name, "429", text, http_status=status, retry_after=_retry_after(exc.headers),
            )
        if status >= 500:
            return TransientProviderError(self.name, str(status), text, http_status=status)
        return PermanentProviderError(self.name, str(status), text, http_status=status)


def _error_text(exc: HTTPError) -> str:
    """``"field: message; …"`` from SendGrid's ``{"errors": [...]}`` body, else the HTTP reason."""
    try:
        errors = json.loads(exc.body.decode("utf-8"))["errors"]
        parts = [
            f"{e['field']}: {e.get('message', '')}" if e.get("field") else str(e.get("message", ""))
            for e in errors
        ]
        return "; ".join(parts)[:300]
    except (ValueError, KeyError, TypeError, AttributeError):
        return str(exc.reason or "")[:300]


def _retry_after(headers: Any) -> float | None:
    """Seconds to wait: ``X-RateLimit-Reset`` (epoch seconds, UTC) minus now, else ``Retry-After``."""
    if not headers:
        return None
    reset = headers.get("X-RateLimit-Reset")
    if reset is not None:
        try:
            return max(0.0, float(reset) - time.time())
        except ValueError:
            pass
    retry_after = headers.get("Retry-After")
    try:
        return max(0.0, float(retry_after)) if retry_after is not None else None
    except ValueError:
        return None
