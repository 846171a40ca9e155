"""End to end: status webhooks through the real stack (web, send workers, receipts worker, beat and
the webhook worker, Postgres, Redis, the provider emulator) to a receiver in the test, which checks
every delivery with the Standard Webhooks reference library (docs/WEBHOOKS.md)."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from standardwebhooks import Webhook

from bench.stack import wait_until
from tests.conftest import Api, make_client
from tests.e2e import make_user, send, wait_status
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EVENTS = ["notification.sent", "notification.delivered"]


def register(api: Api, url: str) -> str:
    r = api.request("POST", "/v1/webhook-endpoints", json={"url": url, "events": EVENTS})
    assert r.status_code == 201, r.text
    time.sleep(1.2)  # every worker reads subscriptions again within WEBHOOKS_CACHE_SECONDS (1 s here)
    return r.json()["secret"]


def accepted(receiver: Receiver, secret: str) -> list[dict]:
    """The deliveries the receiver answered 2xx, each verified with the reference library (raises
    WebhookVerificationError for any that is not signed with ``secret``)."""
    out = []
    for request in list(receiver.requests):
        body = Webhook(secret).verify(request["body"], request["headers"])
        if 200 <= request["answered"] < 300:
            out.append({"id": request["headers"]["webhook-id"], **body})
    return out


def received(got: list[dict]) -> Counter:
    return Counter((e["type"], e["data"]["notification_id"]) for e in got)


def test_a_send_reaches_its_clients_endpoint_as_sent_and_delivered_exactly_once_each(api, emulator, uid, stack):
    _, other_key = make_client("other")
    other = Api(stack.api, other_key)
    with Receiver() as mine, Receiver() as theirs:
        secret = register(api, mine.url)
        register(other, theirs.url)
        make_user(api, uid, devices=0)
        nid = send(api, uid, "sms")
        wait_status(nid, "delivered")
        wait_until(lambda: len(accepted(mine, secret)) >= 2, 30, message="sent and delivered webhooks")
        time.sleep(3)  # a duplicate would come with the dispatcher's next runs (every second)
        got = accepted(mine, secret)
    assert received(got) == {("notification.sent", nid): 1, ("notification.delivered", nid): 1}
    assert len(mine.requests) == 2 and len({e["id"] for e in got}) == 2
    assert {e["type"]: e["data"]["status"] for e in got} == {"notification.sent": "sent",
                                                            "notification.delivered": "delivered"}
    assert theirs.requests == []  # another client's endpoint hears nothing of this client's sends


def test_a_receiver_down_for_a_while_gets_every_event_later_nothing_lost(api, emulator, uid):
    down_until = time.monotonic() + 4

    def answer(_n):
        return (503, {"Retry-After": "1"}) if time.monotonic() < down_until else (200, {})

    with Receiver(answer) as receiver:
        secret = register(api, receiver.url)
        make_user(api, uid, devices=0)
        ids = [send(api, uid, "sms") for _ in range(3)]
        for nid in ids:
            wait_status(nid, "delivered")
        wanted = {(t, nid): 1 for t in EVENTS for nid in ids}
        wait_until(lambda: set(received(accepted(receiver, secret))) >= set(wanted), 60, interval=0.5,
                   message="every event delivered after the outage")
        time.sleep(3)
        got = accepted(receiver, secret)
    assert any(r["answered"] == 503 for r in receiver.requests), "the receiver was down for the first deliveries"
    assert received(got) == wanted  # each exactly once: none lost, none delivered twice
