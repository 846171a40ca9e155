"""SmtpEmailBackend (Django's SMTP backend) against the emulator's SMTP sink."""

from __future__ import annotations

import time

import pytest

from providers.base import (
    ContactInvalidError,
    OutboundMessage,
    PermanentProviderError,
    ProviderConfigurationError,
    TransientProviderError,
)
from providers.smtp.backend import SmtpEmailBackend
from tests.providers.conftest import free_port, settle_until, smtp_options

pytestmark = pytest.mark.timeout(30)

TO = "grace@example.org"


def mail(notification_id: str, to: str = TO, **kw) -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="email", to=to, title="Your receipt",
                           body="Thanks, Grace", **kw)


def test_send_records_exactly_one_message(smtp, emu, notification_id):
    result = smtp.send(mail(notification_id, html="<p>Thanks, Grace</p>"))

    assert result.provider == "smtp"
    assert result.provider_message_id.startswith("<") and result.provider_message_id.endswith("@example.com>")
    [recorded] = emu.messages()
    details = recorded.pop("details")
    assert recorded == {
        "provider": "smtp", "account": None, "channel": "email", "to": TO, "title": "Your receipt",
        "body": "Thanks, Grace",
        "provider_message_id": result.provider_message_id, "notification_id": notification_id,
        "received_at_ms": recorded["received_at_ms"],
    }
    headers = dict(details["headers"])
    assert details["mail_from"] == "notify@example.com"
    assert [name for name, _ in details["headers"]] == [
        "Content-Type", "MIME-Version", "Subject", "From", "To", "Date", "Message-ID", "X-Notification-Id"]
    assert (headers["From"], headers["To"], headers["Message-ID"], headers["X-Notification-Id"]) == (
        "notify@example.com", TO, result.provider_message_id, notification_id)


def test_session_is_reused_across_sends(smtp, emu):
    ids = [smtp.send(mail(f"n-{i}")).provider_message_id for i in range(3)]

    assert [m["provider_message_id"] for m in emu.messages()] == ids
    assert smtp._connection.connection is not None


def test_recipient_refused_with_550_is_contact_invalid(smtp, emu, notification_id):
    emu.fault(provider="smtp", to=TO, status=550)

    with pytest.raises(ContactInvalidError) as err:
        smtp.send(mail(notification_id))
    smtp.send(mail(notification_id, to="other@example.org"))  # same session still usable

    assert (err.value.code, err.value.reason) == ("550", "invalid_address")
    assert "Thanks" not in str(err.value)
    assert [m["to"] for m in emu.messages()] == ["other@example.org"]


def test_recipient_deferred_with_450_is_transient(smtp, emu, notification_id):
    emu.fault(provider="smtp", to=TO, status=450, times=1)

    with pytest.raises(TransientProviderError) as err:
        smtp.send(mail(notification_id))

    assert err.value.code == "450"
    assert emu.count() == 0


def test_data_rejected_with_554_is_permanent(smtp, emu, notification_id):
    emu.fault(provider="smtp", status=554, smtp_phase="data")

    with pytest.raises(PermanentProviderError) as err:
        smtp.send(mail(notification_id))

    assert not isinstance(err.value, ContactInvalidError)
    assert err.value.code == "554"


def test_server_down_is_transient(emu, notification_id):
    backend = SmtpEmailBackend(options=smtp_options(emu, PORT=free_port()))

    with pytest.raises(TransientProviderError) as err:
        backend.send(mail(notification_id))

    assert err.value.code == "connection_error"


def test_auth_against_a_server_without_auth_support_is_a_configuration_error(emu, notification_id):
    backend = SmtpEmailBackend(options=smtp_options(emu, USE_TLS=True))

    with pytest.raises(ProviderConfigurationError):
        backend.send(mail(notification_id))


def test_login_is_accepted_by_the_sink(emu, notification_id):
    backend = SmtpEmailBackend(options=smtp_options(emu, USERNAME="user", PASSWORD="secret"))

    backend.send(mail(notification_id))
    backend.close()

    assert emu.count(notification_id=notification_id) == 1


def test_a_503_is_one_attempt(smtp, emu, notification_id):
    # The sink answers an HTTP-style 5xx as SMTP 451 (transient) at RCPT.
    rule = emu.fault(provider="smtp", to=TO, status=503)  # times=null: a retry would be refused too

    with pytest.raises(TransientProviderError) as err:
        smtp.send(mail(notification_id))

    assert err.value.code == "451"
    assert emu.fired(rule) == 1
    assert emu.count() == 0


@pytest.mark.timeout(15)
@pytest.mark.parametrize("phase", ["rcpt", "data"])
@pytest.mark.parametrize("reused", [False, True], ids=["new_session", "reused_session"])
def test_a_timeout_is_one_attempt(emu, notification_id, phase, reused):
    timeout, latency = 0.3, 1.5
    backend = SmtpEmailBackend(options=smtp_options(emu, TIMEOUT=timeout))
    if reused:
        backend.send(mail("warm-up"))  # the session stays open for the next send
    rule = emu.fault(provider="smtp", latency_ms=int(latency * 1000), smtp_phase=phase)  # slow success
    started = time.monotonic()

    with pytest.raises(TransientProviderError) as err:
        backend.send(mail(notification_id))
    backend.close()
    settle_until(started + 2 * timeout + latency + 1.0)  # a re-sent message would have reached the rule by now

    # smtplib turns a reply timeout into SMTPServerDisconnected: it was "connection_error", and on a
    # reused session the backend reconnected and sent the message again.
    assert err.value.code == "timeout"
    assert emu.fired(rule) == 1
