"""``send_batch``: SendGrid's personalizations with per-recipient substitutions, and concurrent
single calls for providers without a batch API (Twilio), against the emulator."""

from __future__ import annotations

import uuid

import pytest

from providers.base import OutboundMessage, PermanentProviderError, SendResult
from providers.sendgrid.backend import MAX_SUBSTITUTION_BYTES

pytestmark = pytest.mark.timeout(60)


def mail(i: int, **kw) -> OutboundMessage:
    fields = {"to": f"user{i}@example.org", "title": f"Hi {i}", "body": f"Hello user {i}", **kw}
    return OutboundMessage(notification_id=str(uuid.uuid4()), channel="email", **fields)


def test_sendgrid_batch_is_one_request_with_each_recipients_own_subject_and_body(sendgrid, emu):
    messages = [mail(i) for i in range(3)]
    results = sendgrid.send_batch(messages)

    assert [type(r) for r in results] == [SendResult] * 3
    assert len({r.provider_message_id for r in results}) == 1  # one request, one X-Message-Id
    assert emu.stats("sendgrid") == {"requests": 1, "accepted": 1, "rejected": 0, "messages": 3}
    got = {m["to"]: (m["title"], m["body"], m["notification_id"]) for m in emu.messages()}
    assert got == {m.to: (m.title, m.body, m.notification_id) for m in messages}


def test_sendgrid_batch_splits_html_and_oversized_messages_into_their_own_requests(sendgrid, emu):
    plain, html = mail(0), mail(1, html="<p>Hello</p>")
    big = mail(2, body="x" * (MAX_SUBSTITUTION_BYTES + 1))  # over SendGrid's substitution limit
    results = sendgrid.send_batch([plain, html, big])

    assert all(isinstance(r, SendResult) for r in results)
    assert emu.stats("sendgrid")["requests"] == 3
    assert {m["to"]: m["body"] for m in emu.messages()} == {plain.to: plain.body, html.to: html.body,
                                                             big.to: big.body}


def test_sendgrid_batch_refused_for_one_bad_address_fails_only_that_message(sendgrid, emu):
    messages = [mail(0), mail(1, to="not-an-address"), mail(2)]
    results = sendgrid.send_batch(messages)

    assert isinstance(results[0], SendResult) and isinstance(results[2], SendResult)
    assert isinstance(results[1], PermanentProviderError) and results[1].code == "400"
    # The batch (refused), then halves: [0] accepted, [bad, 2] refused, then [bad] refused, [2] accepted.
    assert emu.stats("sendgrid") == {"requests": 5, "accepted": 2, "rejected": 3, "messages": 2}
    assert sorted(m["to"] for m in emu.messages()) == [messages[0].to, messages[2].to]


def test_one_bad_address_among_500_costs_a_few_requests_not_500(sendgrid, emu):
    """Adversarial finding: a refused 500-recipient request was re-sent one message at a time (500
    requests: 6 minutes behind a slow SendGrid, past the task's time limit, so the batch was killed
    unrecorded and sent again). Halving finds the bad address in about 2·log2(500) requests."""
    messages = [mail(i) for i in range(500)]
    messages[137] = mail(137, to="not-an-address")
    results = sendgrid.send_batch(messages)

    assert [i for i, r in enumerate(results) if not isinstance(r, SendResult)] == [137]
    assert emu.stats("sendgrid")["requests"] == 1 + 2 * 9  # the batch, then two halves per level (9 levels)
    assert emu.count() == 499


def test_sendgrid_batch_outage_gives_every_message_the_same_transient_error(sendgrid, emu):
    emu.fault(provider="sendgrid", status=503)
    results = sendgrid.send_batch([mail(0), mail(1)])

    assert [(type(r).__name__, r.code) for r in results] == [("TransientProviderError", "503")] * 2
    assert emu.count() == 0


def test_concurrent_batch_sends_each_message_once_in_input_order(settings, emu):
    from providers.registry import get_backend, reset_backends
    from tests.providers.conftest import twilio_options

    settings.PROVIDERS = {**settings.PROVIDERS, "sms": [
        {"NAME": "twilio", "BACKEND": "providers.twilio.backend.TwilioSmsBackend", "OPTIONS": twilio_options(emu)}]}
    reset_backends()
    messages = [OutboundMessage(notification_id=str(uuid.uuid4()), channel="sms", to=f"+1555000{i:04d}",
                                body=f"code {i}") for i in range(20)]
    emu.fault(provider="twilio", to=messages[7].to, status=400, code=21211)
    try:
        results = get_backend("sms").send_batch(messages, concurrency=4)
    finally:
        reset_backends()

    assert [r.code if isinstance(r, Exception) else "ok" for r in results] == ["ok"] * 7 + ["21211"] + ["ok"] * 12
    recorded = sorted((m["to"], m["notification_id"]) for m in emu.messages())
    assert recorded == sorted((m.to, m.notification_id) for i, m in enumerate(messages) if i != 7)
