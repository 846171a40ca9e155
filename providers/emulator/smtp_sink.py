"""SMTP sink (aiosmtpd handler): accepts mail and records one message per accepted RCPT.

Recorded fields: title = ``Subject``, body = the text/plain part, notification id =
``X-Notification-Id``, provider message id = ``Message-ID`` (as sent, angle brackets included),
details = ``{"mail_from": <the envelope sender of MAIL FROM>, "headers": [[name, value], …]}``: the
message's top-level headers in the order received, repeated names repeated, values decoded
(RFC 2047 words as text) and unfolded.

Fault rules with provider ``"smtp"`` (or ``"*"``) answer at RCPT (default) or DATA
(``"smtp_phase": "data"``) with ``"<status> <code or default text>"``. Statuses outside the SMTP
vocabulary are translated: 429 and 5xx HTTP statuses become ``451``, other 4xx become ``550``.
AUTH is offered without TLS and accepts any credentials.
"""

from __future__ import annotations

import email
import email.policy
import logging
from email.message import EmailMessage

from aiosmtpd.smtp import SMTP, AuthResult, Envelope, Session

from providers.emulator.context import Emulator
from providers.emulator.faults import Fault

logger = logging.getLogger(__name__)

SMTP_REPLIES = {
    421: "4.3.2 Service not available, closing transmission channel",
    450: "4.2.1 Mailbox unavailable, try again later",
    451: "4.3.0 Local error in processing, try again later",
    452: "4.5.3 Too many recipients",
    550: "5.1.1 Mailbox does not exist",
    551: "5.1.6 User not local",
    552: "5.2.2 Mailbox full",
    553: "5.1.3 Mailbox name not allowed",
    554: "5.7.1 Message rejected",
}


def fault_reply(fault: Fault) -> str:
    """The SMTP reply line for an injected fault."""
    status = fault.status or 550
    if status not in SMTP_REPLIES:
        status = 451 if status == 429 or status >= 500 else 550
    text = str(fault.code) if fault.code is not None else SMTP_REPLIES[status]
    return f"{status} {text}"


class SmtpSink:
    """aiosmtpd handler recording into the shared :class:`Emulator`."""

    def __init__(self, emulator: Emulator) -> None:
        self._emu = emulator

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, rcpt_options: list[str],
    ) -> str:
        fault = await self._emu.fault_for("smtp", (address,), smtp_phase="rcpt")
        if fault is not None:
            self._emu.stats.rejected("smtp")
            return fault_reply(fault)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        fault = await self._emu.fault_for("smtp", envelope.rcpt_tos, smtp_phase="data")
        if fault is not None:
            self._emu.stats.rejected("smtp")
            return fault_reply(fault)
        try:
            message = email.message_from_bytes(envelope.original_content or b"", policy=email.policy.default)
            title, body = message.get("Subject"), _text_body(message)
            notification_id, message_id = message.get("X-Notification-Id"), message.get("Message-ID")
            details = {"mail_from": envelope.mail_from,
                       "headers": [[name, str(value)] for name, value in message.items()]}
        except Exception:  # a malformed message must not kill the session
            logger.warning("smtp sink: unparsable message from %s", envelope.mail_from, exc_info=True)
            self._emu.stats.rejected("smtp")
            return "554 5.6.0 Message could not be parsed"
        for rcpt in envelope.rcpt_tos:
            self._emu.store.add("smtp", rcpt, _str(title), body, _str(message_id) or "", _str(notification_id),
                                details=details)
        self._emu.stats.accepted("smtp", len(envelope.rcpt_tos))
        return "250 Message accepted for delivery"


def authenticate_any(server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data) -> AuthResult:
    """aiosmtpd authenticator accepting every login (the emulator checks no credentials)."""
    return AuthResult(success=True)


def _text_body(message: EmailMessage) -> str | None:
    part = message.get_body(preferencelist=("plain",))
    return part.get_content() if part is not None else None


def _str(value: object) -> str | None:
    return str(value).strip() if value is not None else None
