"""SendGrid email backend on the official ``sendgrid`` SDK (pinned 6.12.5, python-http-client 3.3.7).

Requests are plain dict bodies posted with ``sg.client.mail.send.post(request_body=..., timeout=...)``
(the ``Mail`` helper classes cost about twice as much and reverse personalizations). Redirect to the
emulator uses the documented ``host`` parameter (providers.md §2(a)). Errors are classified per
providers.md §2(c).
"""

from __future__ import annotations

import http.client
import json
import logging
import time
import urllib.error
from dataclasses import dataclass, field
from email.utils import parseaddr
from typing import Any, ClassVar

from python_http_client.exceptions import HTTPError
from sendgrid import SendGridAPIClient

from providers.base import (
    EmailBackend,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    SendResult,
    TransientProviderError,
)

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_SECONDS = 10.0


def sender(from_email: str) -> dict[str, str]:
    """``"Name <addr@example.com>"`` or ``"addr@example.com"`` -> SendGrid's ``{"email", "name"?}``."""
    name, address = parseaddr(from_email)
    result = {"email": address or from_email}
    if name:
        result["name"] = name
    return result


def build_request_body(message: OutboundMessage, from_email: str) -> dict[str, Any]:
    """The v3 ``/mail/send`` JSON body for one recipient (providers.md §2(b)).

    ``custom_args`` carries ``message.data`` plus ``notification_id`` (SendGrid merges custom args
    into every event, which is how webhooks are correlated). Content is text/plain, then text/html.
    """
    content = [{"type": "text/plain", "value": message.body}]
    if message.html:
        content.append({"type": "text/html", "value": message.html})
    custom_args = {str(k): str(v) for k, v in (message.data or {}).items()}
    custom_args["notification_id"] = message.notification_id
    return {
        "personalizations": [{"to": [{"email": message.to}]}],
        "from": sender(from_email),
        "subject": message.title or "",
        "content": content,
        "custom_args": custom_args,
    }


@dataclass
class SendGridEmailBackend(EmailBackend):
    """Send email through SendGrid's v3 Mail Send API.

    Options (``settings.PROVIDERS["email"][i]["OPTIONS"]``):
        API_KEY, FROM_EMAIL: required (FROM_EMAIL may be ``"Name <addr>"``).
        HOST: ``None`` for real SendGrid, else e.g. ``"http://127.0.0.1:8900"`` (the emulator).
        TIMEOUT: seconds per HTTP call, default 10 (the SDK's own default is none: it can hang).

    ``send`` returns ``SendResult(provider="sendgrid", provider_message_id=<X-Message-Id>,
    raw_status="accepted")``. The transport (urllib) opens one TCP connection per request and never
    retries; a timeout may hide an accepted message (duplicates possible).
    """

    name: ClassVar[str] = "sendgrid"
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
        timeout = float(self.option("TIMEOUT", DEFAULT_TIMEOUT_SECONDS))
        try:
            response = self._client.client.mail.send.post(request_body=body, timeout=timeout)
        except HTTPError as exc:
            raise self._classify(exc) from exc
        except TimeoutError as exc:
            raise TransientProviderError(self.name, "timeout", f"no answer within {timeout} s") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise TransientProviderError(self.name, "timeout", f"no answer within {timeout} s") from exc
            raise TransientProviderError(self.name, "connection_error", str(exc.reason)[:200]) from exc
        except (http.client.HTTPException, OSError) as exc:
            raise TransientProviderError(self.name, "connection_error", type(exc).__name__) from exc
        message_id = response.headers.get("X-Message-Id") if response.headers else None
        if not message_id:
            # Accepted anyway: raising would make the caller retry and send a duplicate.
            logger.warning("sendgrid accepted notification %s without X-Message-Id", message.notification_id)
            message_id = ""
        return SendResult(provider=self.name, provider_message_id=message_id, raw_status="accepted")

    def _classify(self, exc: HTTPError) -> Exception:
        """Map an HTTP error answer to our hierarchy (providers.md §2(c))."""
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
