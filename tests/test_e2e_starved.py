"""A slow machine makes delivery slower, never duplicated (issue 10 finding 3).

The whole stack with its workers starved: every provider call takes longer than a row's lease
(emulator latency 5 s, lease 3 s), and a busy neighbour process spins on a core. Campaigns on push
and SMS must still complete with every eligible member sent to exactly once, and no lease may run
out (the heartbeat and the per-call lease extension keep them; notifications/delivery/leases.py). Before
leases were renewed while calls were in flight, the reconciler re-drove the rows of such batches
and another worker sent them a second time."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from notifications.models import DeliveryEvent, Notification
from tests.e2e import make_segment
from tests.test_e2e_campaigns import content_for, create_campaign, sent, wait_campaign

# Serial: the busy neighbour takes one core and the stack needs the other; beside a second pytest-xdist
# worker the heartbeats starved and leases ran out (`make test` runs these alone, after the rest).
pytestmark = [pytest.mark.e2e, pytest.mark.serial, pytest.mark.timeout(600)]

#: The stack runs with this for this module's tests (tests/conftest.py: stack_env).
STACK_ENV = STARVED_ENV = {
    "LEASE_SECONDS": "3",
    "PROVIDER_TIMEOUT_SECONDS": "10",  # calls of 5 s succeed, slowly
    "BATCH_SIZE_PUSH": "25",
    "BATCH_SIZE_SMS": "25",
}


@pytest.fixture(scope="module")
def starved(stack):
    """The stack with its workers starved: restarted with :data:`STARVED_ENV` (once for this module's
    tests: ``stack_env``, tests/conftest.py), a busy neighbour, slow providers."""
    from tests.conftest import reset_isolation

    stack.use_env(STARVED_ENV)  # a fresh emulator: no faults
    stack.set_clock_offset(0)
    reset_isolation()
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a busy neighbour on one core
    try:
        for provider in ("fcm", "twilio"):
            stack.add_fault(provider=provider, latency_ms=5000)
        yield stack
    finally:
        neighbour.kill()
        neighbour.wait()
        stack.clear_faults()
        reset_isolation()


def test_starved_workers_send_every_member_exactly_once(api, starved):
    runs = {}
    for channel in ("sms", "push"):
        segment_id, _users, _opted = make_segment(api, 100, channel=channel, opted_out_every=10)
        runs[channel] = create_campaign(api, {"segment_id": segment_id, "channel": channel,
                                              "content": content_for(channel)})
    for channel, cid in runs.items():
        body = wait_campaign(api, cid, "completed", timeout=300)
        assert sent(body["counts"]) == 90 and body["counts"]["by_status"]["suppressed"] == 10
        ids = {str(i) for i in Notification.objects.filter(campaign_id=cid).values_list("id", flat=True)}
        received = Counter(m["notification_id"] for m in starved.messages(channel=channel)
                           if m["notification_id"] in ids)
        assert len(received) == 90, channel
        assert set(received.values()) == {1}, (channel, Counter(received.values()))
        assert not DeliveryEvent.objects.filter(notification_id__in=ids, kind="lease_expired").exists(), channel
        attempts = Notification.objects.filter(campaign_id=cid, status__in=("sent", "delivered"))
        assert set(attempts.values_list("attempts", flat=True)) == {1}, channel


def test_starved_workers_send_a_fallback_event_once_per_user_on_one_channel(api, starved):
    """An event of a fallback type (push, then SMS) for 60 users, 20 of them without a device: each
    user gets exactly one message, by push when they have a device, else by SMS; never both."""
    from datetime import UTC, datetime

    from preferences.models import Device, Recipient

    kind = f"starved_{datetime.now(UTC):%H%M%S%f}"
    r = api.request("PUT", f"/v1/notification-types/{kind}", json={
        "name": "Starved", "category": "account", "channels": ["push", "sms"], "routing": "fallback",
        "templates": [{"channel": "push", "locale": "en", "title": "Hi", "body": "Hi {{ data.n }}"},
                      {"channel": "sms", "locale": "en", "body": "Hi {{ data.n }}"}]})
    assert r.status_code == 201, r.text
    users = [f"{kind}-{i:03d}" for i in range(60)]
    Recipient.objects.bulk_create([Recipient(user_id=u, phone=f"+49151{i:08d}") for i, u in enumerate(users)])
    Device.objects.bulk_create([Device(recipient_id=u, platform="android", push_token=f"tok-{u}")
                                for u in users[:40]])
    resp = api.request("POST", "/v1/events", json={"type": kind, "user_ids": users, "data": {"n": "1"}},
                       key=kind)
    assert resp.status_code == 202, resp.text
    ids = {n["id"]: (n["user_id"], n["channel"]) for n in resp.json()["notifications"]}

    def settled():
        rows = Notification.objects.filter(pk__in=list(ids))
        return rows.exclude(status__in=("sent", "delivered", "suppressed")).count() == 0

    from bench.stack import wait_until

    wait_until(settled, 300, message="every channel of the event settled")
    received = Counter(m["notification_id"] for m in starved.messages() if m["notification_id"] in ids)
    by_user = Counter(ids[nid][0] for nid in received)
    assert set(received.values()) == {1} and set(by_user.values()) == {1} and len(by_user) == 60
    assert {ids[nid][1] for nid in received if ids[nid][0] in users[:40]} == {"push"}
    assert {ids[nid][1] for nid in received if ids[nid][0] in users[40:]} == {"sms"}
