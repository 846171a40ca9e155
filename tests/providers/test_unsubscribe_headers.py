"""The RFC 8058 one-click unsubscribe headers (``OutboundMessage.unsubscribe_url``) through the real
SendGrid SDK and Django's SMTP backend, as the emulator receives them (docs/TYPES.md, "Unsubscribe")."""

from __future__ import annotations

import pytest

from providers.base import OutboundMessage, unsubscribe_headers

pytestmark = pytest.mark.timeout(30)

URL = "https://notify.example.com/u/abc.def:ghi"
HEADERS = {"List-Unsubscribe": f"<{URL}>", "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"}


def mail(notification_id: str, to: str = "ada@example.org", **kw) -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="email", to=to, title="Sale",
                           body="50 % off", **kw)


def test_the_headers_of_a_message():
    assert unsubscribe_headers(mail("n1", unsubscribe_url=URL)) == HEADERS
    assert unsubscribe_headers(mail("n1")) == {}
    sms = OutboundMessage(notification_id="n1", channel="sms", to="+15551230001", body="x", unsubscribe_url=URL)
    assert unsubscribe_headers(sms) == {}


def test_sendgrid_one_email_carries_both_headers(sendgrid, emu, notification_id):
    sendgrid.send(mail(notification_id, unsubscribe_url=URL))

    [recorded] = emu.messages()
    assert recorded["details"]["headers"] == HEADERS
    assert recorded["notification_id"] == notification_id


def test_sendgrid_a_batch_gives_each_personalization_its_own_link_and_none_to_the_others(sendgrid, emu):
    messages = [mail("n1", "a@example.org", unsubscribe_url=URL + "1"), mail("n2", "b@example.org"),
                mail("n3", "c@example.org", unsubscribe_url=URL + "3")]

    sendgrid.send_batch(messages)

    got = {m["notification_id"]: m["details"].get("headers") for m in emu.messages()}
    assert got == {
        "n1": {"List-Unsubscribe": f"<{URL}1>", "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"},
        "n2": None,
        "n3": {"List-Unsubscribe": f"<{URL}3>", "List-Unsubscribe-Post": "List-Unsubscribe=One-Click"},
    }
    # The link is per personalization: it does not split the request.
    assert emu.stats("sendgrid")["requests"] == 1


def test_smtp_carries_both_headers_once(smtp, emu, notification_id):
    smtp.send(mail(notification_id, unsubscribe_url=URL))

    [recorded] = emu.messages()
    headers = recorded["details"]["headers"]
    assert [(n, v) for n, v in headers if n.startswith("List-")] == list(HEADERS.items())


def test_smtp_without_a_link_has_no_list_headers(smtp, emu, notification_id):
    smtp.send(mail(notification_id))

    [recorded] = emu.messages()
    assert [n for n, _ in recorded["details"]["headers"] if n.startswith("List-")] == []
