"""SMTP email backend on Django's ``django.core.mail.backends.smtp.EmailBackend``.

One recipient per message: with several recipients Django silently drops refused ones
(docs/PROVIDERS.md §5). The SMTP session is kept open between sends and re-opened once if the server
dropped it while idle. Errors are classified per docs/PROVIDERS.md §5.
"""

from __future__ import annotations

import contextlib
import smtplib
import ssl
from dataclasses import dataclass, field
from typing import ClassVar

from django.core.mail import EmailMultiAlternatives, make_msgid
from django.core.mail.backends.smtp import EmailBackend as DjangoSmtpBackend
from django.core.mail.utils import DNS_NAME

from providers.base import (
    ContactInvalidError,
    EmailBackend,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    SendResult,
    TransientProviderError,
    unsubscribe_headers,
)
from providers.senders import parse_sender, sender_header

DEFAULT_TIMEOUT_SECONDS = 10.0
NOTIFICATION_ID_HEADER = "X-Notification-Id"


@dataclass
class SmtpEmailBackend(EmailBackend):
    """Send email to any SMTP relay.

    Options (``settings.PROVIDERS["email"][i]["OPTIONS"]``): HOST, PORT, FROM_EMAIL (required);
    USE_TLS (STARTTLS, default False), USERNAME and PASSWORD (AUTH when both are set), TIMEOUT
    (seconds per socket operation, default 10).

    Each message gets a ``Message-ID`` (``make_msgid``, the From's domain), ``X-Notification-Id`` and,
    with an ``unsubscribe_url``, the RFC 8058 headers. ``sender`` is the ``From`` header and
    ``reply_to`` the ``Reply-To``; the envelope sender stays FROM_EMAIL, so bounces reach the address
    the relay authorises (docs/PROVIDERS.md, "Silent pushes and sender overrides"). ``send`` returns
    ``SendResult(provider="smtp", provider_message_id=<that Message-ID>, raw_status="250")``.
    """

    name: ClassVar[str] = "smtp"
    required_options: ClassVar[tuple[str, ...]] = ("HOST", "PORT", "FROM_EMAIL")

    _connection: DjangoSmtpBackend | None = field(default=None, init=False, repr=False)

    def open(self) -> None:
        """Build Django's SMTP backend; the TCP session is opened on first send. Idempotent.

        Raises:
            ProviderConfigurationError: a required option is missing.
        """
        if self._connection is not None:
            return
        self.option("FROM_EMAIL")
        self._connection = DjangoSmtpBackend(
            host=self.option("HOST"),
            port=int(self.option("PORT")),
            username=self.option("USERNAME", ""),
            password=self.option("PASSWORD", ""),
            use_tls=bool(self.option("USE_TLS", False)),
            use_ssl=False,
            timeout=float(self.option("TIMEOUT", DEFAULT_TIMEOUT_SECONDS)),
            fail_silently=False,
        )

    def close(self) -> None:
        """QUIT the SMTP session if one is open. Idempotent; never raises on a dead session."""
        if self._connection is not None:
            with contextlib.suppress(smtplib.SMTPException, OSError):
                self._connection.close()
            self._connection = None

    def effective_sender(self, message: OutboundMessage) -> str:
        """The ``From`` header ``message`` goes out with: its ``sender``, else FROM_EMAIL.

        Raises:
            ProviderConfigurationError: no sender given and FROM_EMAIL is not set.
        """
        return message.sender or self.option("FROM_EMAIL")

    def send(self, message: OutboundMessage) -> SendResult:
        """Send one email to ``message.to`` (subject = title, text body, optional HTML alternative;
        From and Reply-To headers as the class docstring says).

        Raises:
            ContactInvalidError: RCPT refused with 5xx (``reason="invalid_address"``, code e.g. "550").
            TransientProviderError: any 4xx reply, connection refused/dropped
                (``code="connection_error"``), ``code="timeout"`` (no reply within TIMEOUT: the
                message may have been accepted; never resent here).
            PermanentProviderError: DATA or other commands refused with 5xx.
            ProviderConfigurationError: AUTH failed, sender refused with 5xx, TLS/AUTH unsupported
                or certificate rejected.
        """
        self.open()
        envelope_from = self.option("FROM_EMAIL")
        header_from = self.effective_sender(message)
        message_id = make_msgid(domain=_domain(header_from))
        headers = {"Message-ID": message_id, NOTIFICATION_ID_HEADER: message.notification_id,
                   **unsubscribe_headers(message)}
        if header_from != envelope_from:
            headers["From"] = sender_header(header_from)  # Django: the From header; from_email stays the envelope's
        email = EmailMultiAlternatives(
            subject=message.title or "",
            body=message.body,
            from_email=envelope_from,
            to=[message.to],
            reply_to=[sender_header(message.reply_to)] if message.reply_to else None,
            headers=headers,
            connection=self._connection,
        )
        if message.html:
            email.attach_alternative(message.html, "text/html")
        try:
            sent = self._send_once_reconnecting(email)
        except (smtplib.SMTPRecipientsRefused, smtplib.SMTPResponseException) as exc:
            # The server answered and smtplib sent RSET: the session stays usable.
            raise self._classify(exc) from exc
        except smtplib.SMTPException as exc:
            self._drop_session()
            raise self._classify(exc) from exc
        except TimeoutError as exc:
            self._drop_session()
            raise TransientProviderError(self.name, "timeout", "SMTP server did not answer in time") from exc
        except ssl.SSLCertVerificationError as exc:
            self._drop_session()
            raise ProviderConfigurationError(self.name, f"TLS certificate rejected: {exc.reason}") from exc
        except OSError as exc:
            self._drop_session()
            raise TransientProviderError(self.name, "connection_error", type(exc).__name__) from exc
        if sent != 1:
            raise PermanentProviderError(self.name, "not_sent", "the SMTP backend sent nothing")
        return SendResult(provider=self.name, provider_message_id=message_id, raw_status="250")

    def _send_once_reconnecting(self, email: EmailMultiAlternatives) -> int:
        """Send on the open session; if the server had dropped it, reconnect once and resend.

        A session the server dropped while idle fails on the first command (before DATA), so that
        resend cannot duplicate. A timeout is never resent: smtplib reports a reply that did not
        come within TIMEOUT as ``SMTPServerDisconnected`` too, and by then the server may have
        accepted the message (the pipeline reconciles or re-sends it, counted as an attempt).
        """
        reused = self._connection.connection is not None  # type: ignore[union-attr]
        self._connection.open()  # type: ignore[union-attr]
        try:
            return self._connection.send_messages([email])  # type: ignore[union-attr]
        except smtplib.SMTPServerDisconnected as exc:
            self._connection.close()  # type: ignore[union-attr]
            if not reused or _timed_out(exc):
                raise
            self._connection.open()  # type: ignore[union-attr]
            return self._connection.send_messages([email])  # type: ignore[union-attr]

    def _drop_session(self) -> None:
        """Forget a session in an unknown state so the next send reconnects."""
        if self._connection is not None:
            # Django drops its session object even when QUIT fails.
            with contextlib.suppress(smtplib.SMTPException, OSError):
                self._connection.close()

    def _classify(self, exc: smtplib.SMTPException) -> Exception:
        """Map an SMTP error to our hierarchy (docs/PROVIDERS.md §5)."""
        if isinstance(exc, smtplib.SMTPRecipientsRefused):
            code, reply = next(iter(exc.recipients.values()), (0, b""))
            return self._reply_error(int(code), _text(reply), contact_invalid=True)
        if isinstance(exc, smtplib.SMTPAuthenticationError):
            return ProviderConfigurationError(
                self.name, f"authentication failed: {_text(exc.smtp_error)}", code=str(exc.smtp_code),
            )
        if isinstance(exc, smtplib.SMTPSenderRefused):
            if 400 <= exc.smtp_code < 500:
                return TransientProviderError(self.name, str(exc.smtp_code), _text(exc.smtp_error))
            return ProviderConfigurationError(
                self.name, f"sender refused: {_text(exc.smtp_error)}", code=str(exc.smtp_code),
            )
        if isinstance(exc, smtplib.SMTPNotSupportedError):
            return ProviderConfigurationError(self.name, str(exc)[:200], code="not_supported")
        if isinstance(exc, smtplib.SMTPResponseException):
            return self._reply_error(exc.smtp_code, _text(exc.smtp_error), contact_invalid=False)
        if _timed_out(exc):
            # smtplib turns a socket timeout while waiting for a reply into SMTPServerDisconnected.
            return TransientProviderError(self.name, "timeout", "SMTP server did not answer in time")
        # SMTPServerDisconnected and other protocol-level failures.
        return TransientProviderError(self.name, "connection_error", type(exc).__name__)

    def _reply_error(self, code: int, text: str, *, contact_invalid: bool) -> Exception:
        if 400 <= code < 500:
            return TransientProviderError(self.name, str(code), text)
        if contact_invalid:
            return ContactInvalidError(self.name, str(code), text, reason="invalid_address")
        return PermanentProviderError(self.name, str(code), text)


def _timed_out(exc: BaseException) -> bool:
    """Whether a socket timeout is in ``exc``'s cause/context chain (smtplib raises
    ``SMTPServerDisconnected`` while handling the ``TimeoutError`` of a reply or a send)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, TimeoutError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def _domain(from_email: str) -> str:
    """Domain for the Message-ID: the sender's, else Django's cached FQDN (never a fresh DNS lookup)."""
    address = parse_sender(from_email)[1]
    return address.rpartition("@")[2] or str(DNS_NAME)


def _text(reply: bytes | str) -> str:
    if isinstance(reply, bytes):
        reply = reply.decode("utf-8", "replace")
    return reply[:300]
