"""Per-message senders (``OutboundMessage.sender`` / ``reply_to``) on every SMS and email backend,
through the real SDKs against the emulator, and the rules of ``providers.senders``
(docs/PROVIDERS.md "Silent pushes and sender overrides")."""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from providers.base import OutboundMessage, ProviderConfigurationError, SendResult
from providers.senders import (
    email_address_problem,
    is_messaging_service,
    parse_sender,
    sender_address,
    sms_sender_problem,
)
from providers.sendgrid.backend import SendGridEmailBackend, batch_key, sender
from providers.twilio.backend import TwilioSmsBackend

pytestmark = pytest.mark.timeout(30)

PHONE = "+15551230001"
DEFAULT_NUMBER = "+15005550006"  # conftest.twilio_options FROM_NUMBER
OTHER_NUMBER = "+15005550007"
SERVICE = "MG" + "a1" * 16
DEFAULT_FROM = {"email": "notify@example.com", "name": "Notify"}  # conftest.sendgrid_options FROM_EMAIL
SHOP = "Shop <shop@example.com>"
HELP = "help@example.com"


def sms(notification_id: str, **kw) -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="sms", to=PHONE, body="Your order shipped",
                           **kw)


def mail(notification_id: str, to: str = "ada@example.org", **kw) -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="email", to=to, title="Shipped",
                           body="On its way", **kw)


# --- Twilio ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sender", "details", "status"), [
    (None, {"from": DEFAULT_NUMBER, "messaging_service_sid": None}, "queued"),
    (OTHER_NUMBER, {"from": OTHER_NUMBER, "messaging_service_sid": None}, "queued"),
    # A Messaging Service: no From at all (Twilio picks a number of the service), status accepted.
    (SERVICE, {"from": None, "messaging_service_sid": SERVICE}, "accepted"),
])
def test_an_sms_goes_from_its_sender_else_from_number(twilio, emu, notification_id, sender, details, status):
    result = twilio.send(sms(notification_id, sender=sender))

    [recorded] = emu.messages()
    assert (recorded["details"], recorded["notification_id"]) == (details, notification_id)
    assert result.raw_status == status
    assert emu.stats("twilio")["requests"] == 1
    assert twilio.effective_sender(sms(notification_id, sender=sender)) == (sender or DEFAULT_NUMBER)


def test_the_lookup_of_a_call_in_doubt_filters_by_its_sender(twilio, emu, notification_id):
    since = datetime.now(UTC) - timedelta(seconds=1)
    own = sms(notification_id, sender=OTHER_NUMBER)
    sent = twilio.send(own)

    assert twilio.find_accepted(own, since) == SendResult(
        provider="twilio", provider_message_id=sent.provider_message_id, raw_status="queued")
    # The same text to the same number from FROM_NUMBER or from a service is another message.
    assert twilio.find_accepted(dataclasses.replace(own, sender=None), since) is None
    assert twilio.find_accepted(dataclasses.replace(own, sender=SERVICE), since) is None
    assert emu.stats("twilio")["list_requests"] == 3


def test_the_lookup_of_a_messaging_service_message_matches_the_service(twilio, emu, notification_id):
    since = datetime.now(UTC) - timedelta(seconds=1)
    via_service = sms(notification_id, sender=SERVICE)
    twilio.send(dataclasses.replace(via_service, sender=None))  # same text and number, from FROM_NUMBER
    sent = twilio.send(via_service)

    found = twilio.find_accepted(via_service, since)

    assert found == SendResult(provider="twilio", provider_message_id=sent.provider_message_id, raw_status="accepted")
    other_service = "MG" + "b2" * 16
    assert twilio.find_accepted(dataclasses.replace(via_service, sender=other_service), since) is None


def test_without_a_sender_from_number_is_required(notification_id):
    backend = TwilioSmsBackend(options={"ACCOUNT_SID": "AC" + "0" * 32, "AUTH_TOKEN": "t"})

    assert backend.effective_sender(sms(notification_id, sender=OTHER_NUMBER)) == OTHER_NUMBER
    with pytest.raises(ProviderConfigurationError) as err:
        backend.effective_sender(sms(notification_id))
    assert 'OPTIONS["FROM_NUMBER"] is required' in err.value.message


# --- SendGrid --------------------------------------------------------------------------------------


def test_one_email_goes_from_its_sender_with_its_reply_to(sendgrid, emu, notification_id):
    sendgrid.send(mail(notification_id, sender=SHOP, reply_to=HELP))
    sendgrid.send(mail(notification_id + "-2"))

    assert [m["details"] for m in emu.messages()] == [
        {"from": {"email": "shop@example.com", "name": "Shop"}, "reply_to": {"email": HELP}},
        {"from": DEFAULT_FROM, "reply_to": None},
    ]


@pytest.mark.parametrize("value", ["Shop <Shop@Example.com>", '"Shop, Inc." <shop@example.com>',
                                   "Bücher Café <info@example.com>", "shop@example.com", '"O\'Brien" <ob@example.com>'])
def test_sendgrid_sends_the_sender_that_was_checked(sendgrid, emu, notification_id, value):
    """Issue hfix2 #1: the check and the backend read a sender with one parse (parse_sender)."""
    assert email_address_problem(value) is None
    name, address = parse_sender(value)
    sendgrid.send(mail(notification_id, sender=value, reply_to=value))

    [recorded] = emu.messages()
    expected = {"email": address, **({"name": name} if name else {})}
    assert recorded["details"] == {"from": expected, "reply_to": expected}
    assert recorded["details"]["from"]["email"].lower() == sender_address("email", value)


def test_a_batch_mixing_senders_gives_each_message_its_own_from_and_reply_to(sendgrid, emu):
    messages = [
        mail("n1", "a@example.org"),
        mail("n2", "b@example.org", sender=SHOP, reply_to=HELP),
        mail("n3", "c@example.org"),
        mail("n4", "d@example.org", sender=SHOP, reply_to=HELP),
        mail("n5", "e@example.org", sender=SHOP),
    ]

    results = sendgrid.send_batch(messages)

    got = {m["notification_id"]: m for m in emu.messages()}
    shop = {"email": "shop@example.com", "name": "Shop"}
    assert {nid: m["details"] for nid, m in got.items()} == {
        "n1": {"from": DEFAULT_FROM, "reply_to": None},
        "n2": {"from": shop, "reply_to": {"email": HELP}},
        "n3": {"from": DEFAULT_FROM, "reply_to": None},
        "n4": {"from": shop, "reply_to": {"email": HELP}},
        "n5": {"from": shop, "reply_to": None},
    }
    # One request per (From, Reply-To): three, each message answered with its request's id.
    assert emu.stats("sendgrid") == {"requests": 3, "accepted": 3, "rejected": 0, "messages": 5}
    ids = [r.provider_message_id for r in results]
    assert ids[0] == ids[2] and ids[1] == ids[3] and len(set(ids)) == 3
    assert [got[f"n{i}"]["provider_message_id"] for i in range(1, 6)] == ids


def test_the_emulator_takes_a_personalizations_own_from(emu):
    import requests

    body = {"from": {"email": "notify@example.com"}, "subject": "s", "content": [{"type": "text/plain", "value": "b"}],
            "personalizations": [{"to": [{"email": "a@example.org"}], "from": {"email": "shop@example.com"}},
                                 {"to": [{"email": "b@example.org"}]}],
            "reply_to": {"email": HELP}}

    answer = requests.post(f"{emu.url}/v3/mail/send", json=body, headers={"Authorization": "Bearer SG.x"}, timeout=5)

    assert answer.status_code == 202
    assert [m["details"] for m in emu.messages()] == [
        {"from": {"email": "shop@example.com"}, "reply_to": {"email": HELP}},
        {"from": {"email": "notify@example.com"}, "reply_to": {"email": HELP}},
    ]


class RecordingSendGrid(SendGridEmailBackend):
    """SendGrid backend whose requests are kept, not posted (for the batch-split rule)."""

    def _post(self, body, what):
        self.bodies.append(body)
        return SendResult(provider="sendgrid", provider_message_id=f"req-{len(self.bodies)}", raw_status="accepted")


senders = st.sampled_from([None, SHOP, "billing@example.com"])
reply_tos = st.sampled_from([None, HELP, "Support <support@example.com>"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(senders, reply_tos, st.booleans()), min_size=1, max_size=12))
def test_a_batch_never_gives_one_message_another_ones_from_or_reply_to(specs):
    backend = RecordingSendGrid(options={"API_KEY": "SG.x", "FROM_EMAIL": "Notify <notify@example.com>"})
    backend.bodies = []
    messages = [mail(f"n{i}", f"u{i}@example.org", sender=s, reply_to=r, html="<p>x</p>" if h else None)
                for i, (s, r, h) in enumerate(specs)]

    results = backend.send_batch(messages)

    where = {}
    for number, body in enumerate(backend.bodies, 1):
        for p in body["personalizations"]:
            where[p["custom_args"]["notification_id"]] = (number, body)
    assert sorted(where) == sorted(m.notification_id for m in messages)  # each message in one request
    for m, result in zip(messages, results, strict=True):
        number, body = where[m.notification_id]
        assert body["from"] == sender(m.sender or "Notify <notify@example.com>")
        assert body.get("reply_to") == (sender(m.reply_to) if m.reply_to else None)
        assert ("text/html" in [c["type"] for c in body["content"]]) == bool(m.html)
        assert result.provider_message_id == f"req-{number}"
    assert len(backend.bodies) == len(set(map(batch_key, messages)))


# --- SMTP ------------------------------------------------------------------------------------------


def test_an_smtp_email_has_its_from_and_reply_to_headers(smtp, emu, notification_id):
    result = smtp.send(mail(notification_id, sender=SHOP, reply_to=HELP))

    [recorded] = emu.messages()
    headers = recorded["details"]["headers"]
    names = Counter(name for name, _ in headers)
    assert (names["From"], names["Reply-To"]) == (1, 1)
    assert (dict(headers)["From"], dict(headers)["Reply-To"]) == (SHOP, HELP)
    # Bounces still go to the configured FROM_EMAIL (the envelope sender).
    assert recorded["details"]["mail_from"] == "notify@example.com"
    assert result.provider_message_id.endswith("@example.com>")


@pytest.mark.parametrize(("value", "header"), [
    ('"Shop, Inc." <shop@example.com>', '"Shop, Inc." <shop@example.com>'),
    ("Shop   <shop@example.com>", "Shop <shop@example.com>"),
])
def test_an_smtp_email_sends_the_sender_that_was_checked(smtp, emu, notification_id, value, header):
    """Issue hfix2 #1: the headers are rebuilt from parse_sender, the parse the check used."""
    assert email_address_problem(value) is None
    smtp.send(mail(notification_id, sender=value, reply_to=value))

    [recorded] = emu.messages()
    headers = dict(recorded["details"]["headers"])
    assert (headers["From"], headers["Reply-To"]) == (header, header)


def test_an_smtp_email_without_overrides_is_from_from_email_with_no_reply_to(smtp, emu, notification_id):
    smtp.send(mail(notification_id))

    [recorded] = emu.messages()
    headers = recorded["details"]["headers"]
    assert [value for name, value in headers if name in ("From", "Reply-To")] == ["notify@example.com"]
    assert recorded["details"]["mail_from"] == "notify@example.com"


def test_the_message_id_is_on_the_senders_domain(emu, smtp, notification_id):
    result = smtp.send(mail(notification_id, sender="Shop <shop@shop.example>"))

    assert result.provider_message_id.endswith("@shop.example>")


# --- providers.senders -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["+15005550006", "+4915123456789", SERVICE, "MG" + "A" * 32])
def test_good_sms_senders(value):
    assert sms_sender_problem(value) is None


@pytest.mark.parametrize(("value", "words"), [
    ("", "E.164"),
    ("15005550006", "not an E.164 number"),
    ("+1 500 555 0006", "not an E.164 number"),
    ("+1", "not an E.164 number"),
    ("MG123", "32 hexadecimal digits"),
    ("MG" + "g" * 32, "32 hexadecimal digits"),
    ("ShopName", "not an E.164 number"),
])
def test_bad_sms_senders_name_the_rule(value, words):
    assert words in sms_sender_problem(value)


def test_a_messaging_service_is_told_apart_from_a_number():
    assert (is_messaging_service(SERVICE), is_messaging_service(DEFAULT_NUMBER), is_messaging_service(None)) == (
        True, False, False)


@pytest.mark.parametrize("value", ["shop@example.com", "Shop <shop@example.com>", '"Shop, Inc." <shop@example.com>',
                                   "Bücher <info@xn--bcher-kva.de>"])
def test_good_email_senders(value):
    assert email_address_problem(value) is None


@pytest.mark.parametrize(("value", "words"), [
    ("", "must be an address"),
    ("shop", "not an email address"),
    ("Shop <shop@>", "not an email address"),
    ("a@example.com, b@example.com", "more than one address"),
    ("Shop <shop@example.com>\nBcc: x@example.com", "line break"),
    ("x" * 250 + "@example.com", "at most 254"),
    ("=?utf-8?q?<security@paypal.com>?= <notifications@example.com>", "encoded word"),
    ("=?utf-8?q?x@evil.com,_?= <notifications@example.com>", "encoded word"),
    ("=?utf-8?b?U2hvcOKArg==?= <shop@example.com>", "encoded word"),
    ('"a@b.example" <shop@example.com>', "may not contain @, < or >"),
    ('"Shop >" <shop@example.com>', "may not contain @, < or >"),
])
def test_bad_email_senders_name_the_rule(value, words):
    assert words in email_address_problem(value)
