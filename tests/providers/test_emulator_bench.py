"""Emulator features for benchmarks: per-account fault rules, the recorded account, SendGrid
substitutions and ``POST /_emulator/analysis``."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections import Counter

import pytest
import requests
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from providers.base import ContactInvalidError, OutboundMessage, TransientProviderError
from providers.emulator import store as store_module
from providers.emulator.context import Emulator
from providers.emulator.server import build_app
from providers.emulator.store import MessageStore
from providers.emulator.webhooks import Webhooks
from providers.sendgrid.backend import SendGridEmailBackend
from providers.smtp.backend import SmtpEmailBackend
from providers.twilio.backend import TwilioSmsBackend
from tests.providers.conftest import PROJECT_ID, sendgrid_options, smtp_options, twilio_options

pytestmark = pytest.mark.timeout(30)

PRIMARY = "AC" + "0" * 32
BACKUP = "AC" + "1" * 32
JSON = {"Authorization": "Bearer SG.x", "Content-Type": "application/json"}
EMPTY_ANALYSIS = {
    "total": 0,
    "by_provider": {"twilio": 0, "sendgrid": 0, "fcm": 0, "smtp": 0},
    "by_account": {},
    "unique_notification_ids": 0,
    "duplicates": {"messages": 0, "ids": 0, "examples": []},
    "received_at_ms": {},
    "per_bucket": {"twilio": [], "sendgrid": [], "fcm": [], "smtp": []},
    "first_ms": None,
    "last_ms": None,
}


def sms(notification_id: str, to: str = "+15551230001") -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="sms", to=to, body="hi")


def mail(notification_id: str, to: str = "ada@example.org") -> OutboundMessage:
    return OutboundMessage(notification_id=notification_id, channel="email", to=to, title="t", body="b")


def twilio_backend(emu, account: str) -> TwilioSmsBackend:
    return TwilioSmsBackend(options=twilio_options(emu, ACCOUNT_SID=account))


def fcm_send(emu, project: str, notification_id: str) -> requests.Response:
    message = {"message": {"token": "tok-1", "notification": {"title": "T", "body": "B"},
                           "data": {"notification_id": notification_id}}}
    return requests.post(f"{emu.url}/v1/projects/{project}/messages:send", json=message,
                         headers={"Authorization": "Bearer t"}, timeout=5)


def sendgrid_send(emu, payload: dict) -> requests.Response:
    body = {"from": {"email": "n@example.com"}, **payload}
    return requests.post(f"{emu.url}/v3/mail/send", data=json.dumps(body), headers=JSON, timeout=5)


def analysis(emu, body: object = None, raw: bytes | None = None) -> requests.Response:
    data = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
    return requests.post(f"{emu.url}/_emulator/analysis", data=data, timeout=30)


def rule(emu, rule_id: int) -> dict:
    return next(r for r in emu.call("GET", "/_emulator/faults") if r["id"] == rule_id)


# --- 1. fault rules per account -------------------------------------------------------------------


def test_account_rule_browns_out_only_that_twilio_account(emu):
    fault = emu.fault(provider="twilio", account=PRIMARY, status=503)
    primary, backup = twilio_backend(emu, PRIMARY), twilio_backend(emu, BACKUP)

    with pytest.raises(TransientProviderError) as err:
        primary.send(sms("n-primary"))
    result = backup.send(sms("n-backup"))

    assert (err.value.code, err.value.http_status) == ("503", 503)
    assert [(m["account"], m["notification_id"], m["provider_message_id"]) for m in emu.messages()] == [
        (BACKUP, "n-backup", result.provider_message_id)]
    assert rule(emu, fault["id"])["fired"] == 1
    assert fault["account"] == PRIMARY
    primary.close()
    backup.close()


def test_account_latency_rule_slows_only_that_account(emu):
    fault = emu.fault(provider="twilio", account=PRIMARY, latency_ms=700)
    primary, backup = twilio_backend(emu, PRIMARY), twilio_backend(emu, BACKUP)

    backup.send(sms("n-backup"))
    assert rule(emu, fault["id"])["fired"] == 0
    started = time.monotonic()
    primary.send(sms("n-primary"))  # slow success

    assert time.monotonic() - started >= 0.7
    assert rule(emu, fault["id"])["fired"] == 1
    assert [(m["account"], m["notification_id"]) for m in emu.messages()] == [
        (BACKUP, "n-backup"), (PRIMARY, "n-primary")]
    primary.close()
    backup.close()


def test_account_rule_matches_the_fcm_project(emu, fcm):
    fault = emu.fault(provider="fcm", account=PROJECT_ID, code="UNREGISTERED")

    with pytest.raises(ContactInvalidError):
        fcm.send(OutboundMessage(notification_id="n1", channel="push", to="tok-1", title="T", body="B"))
    other = fcm_send(emu, "other-project", "n2")

    assert other.status_code == 200
    assert [(m["account"], m["notification_id"]) for m in emu.messages()] == [("other-project", "n2")]
    assert rule(emu, fault["id"])["fired"] == 1


def test_account_rule_never_matches_sendgrid_or_smtp(emu):
    fault = emu.fault(provider="*", account=PRIMARY, status=503)
    sendgrid = SendGridEmailBackend(options=sendgrid_options(emu))
    smtp = SmtpEmailBackend(options=smtp_options(emu))

    sendgrid.send(mail("n-sendgrid"))
    smtp.send(mail("n-smtp"))
    with pytest.raises(TransientProviderError):  # the same "*" rule still applies to that Twilio account
        twilio_backend(emu, PRIMARY).send(sms("n-twilio"))

    assert [(m["provider"], m["account"], m["notification_id"]) for m in emu.messages()] == [
        ("sendgrid", None, "n-sendgrid"), ("smtp", None, "n-smtp")]
    assert rule(emu, fault["id"])["fired"] == 1
    sendgrid.close()
    smtp.close()


def test_a_rule_without_account_matches_every_account(emu):
    emu.fault(provider="twilio", status=503, times=2)

    for account in (PRIMARY, BACKUP):
        with pytest.raises(TransientProviderError):
            twilio_backend(emu, account).send(sms("n"))

    assert emu.count() == 0


@pytest.mark.parametrize(("value", "status", "expected"), [
    (None, 201, None), (PRIMARY, 201, PRIMARY), (5, 400, "account must be str or null"),
    (["AC1"], 400, "account must be str or null"),
])
def test_account_key_is_validated(emu, value, status, expected):
    response = requests.post(f"{emu.url}/_emulator/faults", json={"provider": "twilio", "account": value}, timeout=5)

    assert response.status_code == status
    assert response.json()["account" if status == 201 else "error"] == expected


# --- 2. the recorded account ----------------------------------------------------------------------


def test_messages_record_the_account_and_filter_by_it(emu):
    twilio_backend(emu, PRIMARY).send(sms("n1"))
    twilio_backend(emu, BACKUP).send(sms("n2"))
    assert fcm_send(emu, "proj-a", "n3").status_code == 200
    SendGridEmailBackend(options=sendgrid_options(emu)).send(mail("n4"))
    SmtpEmailBackend(options=smtp_options(emu)).send(mail("n5"))

    assert [(m["provider"], m["account"]) for m in emu.messages()] == [
        ("twilio", PRIMARY), ("twilio", BACKUP), ("fcm", "proj-a"), ("sendgrid", None), ("smtp", None)]
    assert [m["notification_id"] for m in emu.messages(account=BACKUP)] == ["n2"]
    assert emu.count(account=PRIMARY) == 1
    assert emu.count(account="proj-a", provider="fcm") == 1
    assert emu.count(account="") == 0  # a filter never matches a null account
    assert list(emu.messages()[0]) == ["provider", "account", "channel", "to", "title", "body",
                                       "provider_message_id", "notification_id", "received_at_ms", "details"]


# --- 3. SendGrid substitutions --------------------------------------------------------------------


def test_substitutions_are_recorded_per_recipient(emu):
    response = sendgrid_send(emu, {
        "subject": "-subject-",
        "content": [{"type": "text/plain", "value": "-body-"}, {"type": "text/html", "value": "<p>-html-</p>"}],
        "personalizations": [
            {"to": [{"email": "a@example.org"}], "custom_args": {"notification_id": "n-a"},
             "substitutions": {"-body-": "Hello Ada", "-subject-": "For Ada", "-html-": "<b>Ada</b>"}},
            {"to": [{"email": "b@example.org"}, {"email": "c@example.org"}], "subject": "Own -name- subject",
             "custom_args": {"notification_id": "n-bc"},
             "substitutions": {"-name-": "B&C", "-body-": "Hi -name-, é ünïcode"}},
            {"to": [{"email": "d@example.org"}], "custom_args": {"notification_id": "n-d"}},
        ],
    })

    assert response.status_code == 202
    assert [(m["to"], m["title"], m["body"], m["notification_id"]) for m in emu.messages()] == [
        ("a@example.org", "For Ada", "Hello Ada", "n-a"),
        ("b@example.org", "Own B&C subject", "Hi -name-, é ünïcode", "n-bc"),  # keys apply in the order given
        ("c@example.org", "Own B&C subject", "Hi -name-, é ünïcode", "n-bc"),
        ("d@example.org", "-subject-", "-body-", "n-d"),
    ]


def test_substitutions_with_the_real_sdk(emu):
    from sendgrid import SendGridAPIClient
    from sendgrid.helpers.mail import Content, CustomArg, Mail, Personalization, Substitution, To

    message = Mail(from_email="n@example.com", subject="Order -order-")
    for i in range(3):
        p = Personalization()
        p.add_to(To(f"u{i}@example.org"))
        p.add_substitution(Substitution("-order-", f"#{i}"))
        p.add_substitution(Substitution("-body-", f"Order #{i} shipped"))
        p.add_custom_arg(CustomArg("notification_id", f"n{i}"))
        message.add_personalization(p)
    message.add_content(Content("text/plain", "-body-"))

    response = SendGridAPIClient(api_key="SG.x", host=emu.url).send(message)

    assert response.status_code == 202
    # add_personalization inserts at index 0: the request lists them in reverse.
    assert [(m["to"], m["title"], m["body"], m["notification_id"]) for m in emu.messages()] == [
        (f"u{i}@example.org", f"Order #{i}", f"Order #{i} shipped", f"n{i}") for i in (2, 1, 0)]


def test_substitutions_of_exactly_10000_bytes_are_accepted(emu):
    value = "é" * ((10_000 - len("-k-")) // 2) + "x"  # 3 + 2 * 4998 + 1 = 10,000 bytes of UTF-8
    response = sendgrid_send(emu, {
        "subject": "s", "content": [{"type": "text/plain", "value": "-k-"}],
        "personalizations": [{"to": [{"email": "a@example.org"}], "substitutions": {"-k-": value}}],
    })

    assert response.status_code == 202
    assert [m["body"] for m in emu.messages()] == [value]


@pytest.mark.parametrize(("substitutions", "message"), [
    ({"-k-": "é" * 4998 + "xy"},
     "The total size of a personalization's substitutions may not exceed 10000 bytes (got 10001)."),
    ({"-k-": 5}, "Substitutions values must be strings."),
    ({"-k-": None}, "Substitutions values must be strings."),
    (["-k-", "v"], "Substitutions must be an object of tag/value strings."),
    ({f"-k{i}-": "v" for i in range(101)}, "A personalization may not have more than 100 substitutions."),
])
def test_bad_substitutions_are_refused(emu, substitutions, message):
    response = sendgrid_send(emu, {
        "subject": "s", "content": [{"type": "text/plain", "value": "-k-"}],
        "personalizations": [{"to": [{"email": "a@example.org"}], "substitutions": {"-k-": "fine"}},
                             {"to": [{"email": "b@example.org"}], "substitutions": substitutions}],
    })

    assert response.status_code == 400
    assert response.json() == {"errors": [{
        "message": message, "field": "personalizations.1.substitutions",
        "help": "https://www.twilio.com/docs/sendgrid/api-reference/mail-send/errors"}]}
    assert emu.count() == 0
    assert emu.stats("sendgrid")["rejected"] == 1


def test_a_thousand_personalizations_in_one_request(emu):
    personalizations = [
        {"to": [{"email": f"u{i}@example.org"}], "custom_args": {"notification_id": f"n{i}"},
         "substitutions": {"-body-": f"Body {i}", "-subject-": f"Subject {i}", "-html-": f"<p>{i}</p>"}}
        for i in range(1000)
    ]
    response = sendgrid_send(emu, {"subject": "-subject-", "personalizations": personalizations,
                                   "content": [{"type": "text/plain", "value": "-body-"},
                                               {"type": "text/html", "value": "-html-"}]})

    assert response.status_code == 202
    assert [(m["to"], m["title"], m["body"], m["notification_id"]) for m in emu.messages()] == [
        (f"u{i}@example.org", f"Subject {i}", f"Body {i}", f"n{i}") for i in range(1000)]
    assert emu.stats("sendgrid") == {"requests": 1, "accepted": 1, "rejected": 0, "messages": 1000}


# --- 4. POST /_emulator/analysis ------------------------------------------------------------------


def test_analysis_of_an_empty_store(emu):
    for body in (None, {}, {"notification_ids": None, "bucket_ms": None}, {"notification_ids": ["x"]}):
        response = analysis(emu, body)
        assert (response.status_code, response.json()) == (200, EMPTY_ANALYSIS)


def test_analysis_counts_accounts_duplicates_and_buckets(emu):
    primary, backup = twilio_backend(emu, PRIMARY), twilio_backend(emu, BACKUP)
    primary.send(sms("n1"))
    primary.send(sms("n2"))
    backup.send(sms("n1"))  # n1 a second time: a duplicate
    assert sendgrid_send(emu, {
        "subject": "s", "content": [{"type": "text/plain", "value": "b"}],
        "personalizations": [{"to": [{"email": "a@example.org"}, {"email": "b@example.org"}],
                              "custom_args": {"notification_id": "n3"}},   # two messages for n3
                             {"to": [{"email": "c@example.org"}]}],         # no notification id
    }).status_code == 202
    assert fcm_send(emu, "proj-a", "n4").status_code == 200
    SmtpEmailBackend(options=smtp_options(emu)).send(mail("n5"))
    messages = emu.messages()
    times = {nid: [m["received_at_ms"] for m in messages if m["notification_id"] == nid] for nid in ("n1", "n3")}

    for bucket_ms in (1000, 1, 60_000):
        response = analysis(emu, {"notification_ids": ["n1", "n3", "never-sent"], "bucket_ms": bucket_ms})

        per_bucket: dict[str, list[list[int]]] = {"twilio": [], "sendgrid": [], "fcm": [], "smtp": []}
        for (provider, start), n in sorted(Counter(
                (m["provider"], m["received_at_ms"] // bucket_ms * bucket_ms) for m in messages).items()):
            per_bucket[provider].append([start, n])
        assert response.status_code == 200
        assert response.json() == {
            "total": 8,
            "by_provider": {"twilio": 3, "sendgrid": 3, "fcm": 1, "smtp": 1},
            "by_account": {PRIMARY: 2, BACKUP: 1, "": 4, "proj-a": 1},
            "unique_notification_ids": 5,
            "duplicates": {"messages": 2, "ids": 2, "examples": ["n1", "n3"]},
            "received_at_ms": {"n1": times["n1"], "n3": times["n3"]},
            "per_bucket": per_bucket,
            "first_ms": messages[0]["received_at_ms"],
            "last_ms": messages[-1]["received_at_ms"],
        }
    assert len(times["n1"]) == 2 and len(times["n3"]) == 2
    primary.close()
    backup.close()


def test_analysis_lists_at_most_20_duplicate_examples(emu):
    personalizations = [{"to": [{"email": f"a{i}@example.org"}, {"email": f"b{i}@example.org"}],
                         "custom_args": {"notification_id": f"d{i:02}"}} for i in range(25)]
    assert sendgrid_send(emu, {"subject": "s", "content": [{"type": "text/plain", "value": "b"}],
                               "personalizations": personalizations}).status_code == 202

    result = analysis(emu, {}).json()

    assert result["duplicates"] == {"messages": 25, "ids": 25, "examples": [f"d{i:02}" for i in range(20)]}
    assert (result["total"], result["unique_notification_ids"]) == (50, 25)


@pytest.mark.parametrize(("raw", "error"), [
    (b"[]", "the body must be a JSON object"),
    (b"{not json", "the body must be a JSON object"),
    (b'"x"', "the body must be a JSON object"),
    (b'{"colour": 1, "bucket_ms": 5}', "unknown key(s): colour"),
    (b'{"notification_ids": "n1"}', "notification_ids must be a list of strings or null"),
    (b'{"notification_ids": ["n1", 2]}', "notification_ids must be a list of strings or null"),
    (b'{"bucket_ms": 0}', "bucket_ms must be a positive integer or null"),
    (b'{"bucket_ms": -5}', "bucket_ms must be a positive integer or null"),
    (b'{"bucket_ms": "1000"}', "bucket_ms must be a positive integer or null"),
    (b'{"bucket_ms": 1.5}', "bucket_ms must be a positive integer or null"),
    (b'{"bucket_ms": true}', "bucket_ms must be a positive integer or null"),
])
def test_analysis_refuses_a_bad_body(emu, raw, error):
    response = analysis(emu, raw=raw)

    assert (response.status_code, response.json()) == (400, {"error": error})


@pytest.mark.timeout(120)
def test_analysis_of_a_million_messages_takes_seconds(monkeypatch):
    """1,000,000 messages over 1 s of (fake) clock: 1000 per ms, each tenth one a duplicate."""
    base = 1_700_000_000_000
    clock = iter(range(1_000_000))
    monkeypatch.setattr(store_module, "now_ms", lambda: base + next(clock) // 1000)
    store = MessageStore(max_messages=0)
    providers = ("twilio", "sendgrid", "fcm", "smtp")
    for i in range(1_000_000):
        provider = providers[i % 4]
        account = {"twilio": PRIMARY if i % 8 == 0 else BACKUP, "fcm": "proj"}.get(provider)
        store.add(provider, "to", None, "b", "pm", f"n{i - 1 if i % 10 == 9 else i}", account)

    async def post() -> tuple[int, dict, float]:
        server = TestServer(build_app(Emulator(store=store, webhooks=Webhooks(enabled=False))), host="127.0.0.1")
        await server.start_server()
        try:
            async with ClientSession() as session:
                started = time.monotonic()
                async with session.post(f"http://127.0.0.1:{server.port}/_emulator/analysis",
                                        json={"notification_ids": ["n0", "n8", "n999998", "n9", "none"],
                                              "bucket_ms": 100}) as response:
                    return response.status, await response.json(), time.monotonic() - started
        finally:
            await server.close()

    status, result, elapsed = asyncio.run(post())

    assert status == 200
    assert elapsed < 10, f"analysis of 1,000,000 messages took {elapsed:.1f} s"
    buckets = [[base + b * 100, 25_000] for b in range(10)]
    assert result == {
        "total": 1_000_000,
        "by_provider": {"twilio": 250_000, "sendgrid": 250_000, "fcm": 250_000, "smtp": 250_000},
        "by_account": {PRIMARY: 125_000, "": 500_000, "proj": 250_000, BACKUP: 125_000},
        "unique_notification_ids": 900_000,
        "duplicates": {"messages": 100_000, "ids": 100_000, "examples": [f"n{10 * k + 8}" for k in range(20)]},
        "received_at_ms": {"n0": [base], "n8": [base, base], "n999998": [base + 999, base + 999]},
        "per_bucket": {p: buckets for p in providers},
        "first_ms": base,
        "last_ms": base + 999,
    }


def test_analysis_reads_what_the_emulator_was_sent_over_http(emu):
    """Arrival times in the analysis are the ones of ``/_emulator/messages``, in arrival order."""
    backend = twilio_backend(emu, PRIMARY)
    for _ in range(3):
        backend.send(sms("same"))
    form = urllib.parse.urlencode({"notification_ids": "same"})  # not JSON: refused, names the problem
    assert analysis(emu, raw=form.encode()).json() == {"error": "the body must be a JSON object"}

    result = analysis(emu, {"notification_ids": ["same"]}).json()

    assert result["received_at_ms"] == {"same": [m["received_at_ms"] for m in emu.messages()]}
    assert result["duplicates"] == {"messages": 2, "ids": 1, "examples": ["same"]}
    backend.close()
