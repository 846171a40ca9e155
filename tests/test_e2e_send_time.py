"""End to end: send-time optimisation (docs/SEND_TIME.md) through real workers, beat, Postgres, Redis
and the emulator's simulated engagement (providers/emulator/engagement.py).

Eight email recipients in Tokyo (UTC+9) and São Paulo (UTC-3), each with a preferred local hour the
emulator knows; the emulator opens an email exactly when it arrives in that hour (peak 1, floor 0,
spread 1). History: three days of one email to everyone at 09:00, 11:00 and 13:00 UTC (the platform
clock moved to each), so six recipients open three each and two never do. ``manage.py
compute_send_times`` learns their hours; a local-time campaign with the option then sends the
optimised at their hour, the holdout and those without history at the campaign's 12:00, and its
comparison shows the optimised group opening, the holdout not."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest
import requests

from bench.stack import ROOT, wait_until
from campaigns.models import CAMPAIGN_ID_NAMESPACE, Campaign, SendTimeMember
from notifications.models import DeliveryEvent, Notification
from notifications.send_time.models import SendTimeProfile
from notifications.send_time.rule import in_holdout
from tests.conftest import Api, make_client
from tests.e2e import SENT, make_segment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

#: Member index → (platform zone (neither has DST), the emulator's zone for them, preferred local hour). Pairs 0/1, 2/3,
#: 4/5 share a preferred hour one history slot hits (09, 11 and 13 UTC); 6 and 7 prefer hours no slot
#: hits (03:00 JST is 18 UTC, 02:00 BRT is 05 UTC), so they never open and have no history.
MEMBERS = [("Asia/Tokyo", "+09:00", 18), ("Asia/Tokyo", "+09:00", 18),
           ("Asia/Tokyo", "Asia/Tokyo", 20), ("Asia/Tokyo", "Asia/Tokyo", 20),
           ("America/Sao_Paulo", "America/Sao_Paulo", 10), ("America/Sao_Paulo", "-03:00", 10),
           ("Asia/Tokyo", "+09:00", 3), ("America/Sao_Paulo", "America/Sao_Paulo", 2)]
HISTORY_HOURS_UTC = (9, 11, 13)
WINDOW = {"start": "08:00", "end": "22:00"}
HOLDOUT_PERCENT = 50


def clock_to(stack, at: datetime) -> None:
    stack.set_clock_offset((at - datetime.now(UTC)).total_seconds())


def engagement(users: list[str]) -> dict:
    return {"peak": 1, "floor": 0, "spread": 1, "delay_ms": 200,
            "recipients": {f"{u}@example.com": {"hour": hour, "zone": zone}
                           for u, (_, zone, hour) in zip(users, MEMBERS, strict=True)}}


def opens(ids) -> dict[str, int]:
    """Open receipts stored per notification id (each once: a reader opening twice counts once)."""
    return dict(Counter(str(i) for i in DeliveryEvent.objects.filter(notification_id__in=list(ids),
                                                                     kind="receipt:open")
                        .values_list("notification_id", flat=True)))


def campaign_key(client_pk, users: list[str]) -> str:
    """An Idempotency-Key whose campaign id (uuid5 of client and key) holds out exactly one member of
    each pair, the first of one pair and the second of the next: the draw is a hash, the test picks it."""
    for i in range(10_000):
        key = f"send-time-{i}"
        cid = uuid.uuid5(CAMPAIGN_ID_NAMESPACE, f"{client_pk}:{key}")
        held = [in_holdout(cid, u, HOLDOUT_PERCENT) for u in users]
        if held == [False, True, True, False, False, True, True, False]:
            return key
    raise AssertionError("no key draws the wanted holdout")


def test_optimised_members_are_sent_at_their_learned_hour_and_open_more_than_the_holdout(emulator, stack, live_db):
    client, api_key = make_client("send-time")
    api = Api(stack.api, api_key)
    segment_id, users, _ = make_segment(api, len(MEMBERS), channel="email", zones=[m[0] for m in MEMBERS])
    r = requests.post(f"{stack.emulator}/_emulator/engagement", json=engagement(users), timeout=5)
    assert r.status_code == 200, r.text
    day0 = (datetime.now(UTC) + timedelta(days=2)).date()

    # --- history: 3 days × 3 slots, one email to everyone per slot -------------------------------
    for d in range(3):
        day = day0 + timedelta(days=d)
        for hour in HISTORY_HOURS_UTC:
            clock_to(stack, datetime.combine(day, time(hour, 0, 5), tzinfo=UTC))
            ids = [api.send({"user_id": u, "channel": "email", "content": {"title": "News", "body": "Hi"}},
                            key=uuid.uuid4().hex).json()["id"] for u in users]
            slot = datetime.combine(day, time(hour), tzinfo=UTC)
            openers = [ids[i] for i, (zone, _, pref) in enumerate(MEMBERS)
                       if slot.astimezone(ZoneInfo(zone)).hour == pref]
            assert len(openers) == 2
            wait_until(lambda ids=ids: Notification.objects.filter(pk__in=ids, status__in=SENT).count() == 8, 60,
                       interval=0.2, message=f"history {day} {hour}:00 sent")
            wait_until(lambda ids=ids, o=openers: opens(ids) == dict.fromkeys(o, 1), 30, interval=0.2,
                       message=f"history {day} {hour}:00 opened")
    state = requests.get(f"{stack.emulator}/_emulator/engagement", timeout=5).json()
    assert (state["opened"], state["unopened"]) == (18, 54)  # 72 emails, each decided once

    # --- learn -------------------------------------------------------------------------------------
    last = day0 + timedelta(days=2)
    clock_to(stack, datetime.combine(last, time(13, 30), tzinfo=UTC))
    out = subprocess.run([sys.executable, "manage.py", "compute_send_times"], cwd=ROOT, env=stack.env(),
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert re.fullmatch(r"profiles \d+ dropped \d+\n", out), out
    profiles = {p.recipient_id: (p.best_hour, p.events) for p in SendTimeProfile.objects.filter(recipient_id__in=users)}
    assert profiles == {users[0]: (18, 3), users[1]: (18, 3), users[2]: (20, 3), users[3]: (20, 3),
                        users[4]: (10, 3), users[5]: (10, 3)}

    # --- the campaign: 12:00 local on the next day, best hour within 08:00–22:00, 50 % held out ----
    campaign_day = last + timedelta(days=1)
    r = api.request("POST", "/v1/campaigns", key=campaign_key(client.pk, users), json={
        "segment_id": segment_id, "channel": "email", "content": {"title": "Sale", "body": "20% off"},
        "local_time": {"date": campaign_day.isoformat(), "time": "12:00"},
        "send_time": {"optimise": True, "window": WINDOW, "holdout_percent": HOLDOUT_PERCENT}})
    assert r.status_code == 202, r.text
    cid = r.json()["id"]
    at = datetime.combine(campaign_day, time(0), tzinfo=UTC)
    campaign = Campaign.objects.get(pk=cid)
    assert campaign.fanout_at == at - timedelta(hours=6)  # 08:00 (the window's first hour) at UTC+14
    clock_to(stack, campaign.fanout_at + timedelta(seconds=3))
    wait_until(lambda: SendTimeMember.objects.filter(campaign_id=cid).count() == 8, 60, interval=0.3,
               message="fan-out recorded every member")
    groups = {m.recipient_id: (m.group, m.hour) for m in SendTimeMember.objects.filter(campaign_id=cid)}
    assert groups == {users[0]: ("optimised", 18), users[1]: ("holdout", None),
                      users[2]: ("holdout", None), users[3]: ("optimised", 20),
                      users[4]: ("optimised", 10), users[5]: ("holdout", None),
                      users[6]: ("holdout", None), users[7]: ("no_history", None)}
    rows = {n.recipient_id: n for n in Notification.objects.filter(campaign_id=cid)}
    tokyo_noon, sao_paulo_noon = at + timedelta(hours=3), at + timedelta(hours=15)
    expected_due = {users[0]: at + timedelta(hours=9),    # 18:00 JST
                    users[3]: at + timedelta(hours=11),   # 20:00 JST
                    users[4]: at + timedelta(hours=13),   # 10:00 BRT
                    users[1]: tokyo_noon, users[2]: tokyo_noon, users[6]: tokyo_noon,  # holdout: 12:00 JST
                    users[5]: sao_paulo_noon, users[7]: sao_paulo_noon}  # holdout, no history: 12:00 BRT
    assert {u: n.due_at for u, n in rows.items()} == expected_due
    assert {n.status for n in rows.values()} == {"scheduled"}
    nid = {u: str(n.pk) for u, n in rows.items()}

    # --- each instant in turn: exactly the members due then reach the emulator, once each ----------
    received: set[str] = set()
    for instant in sorted(set(expected_due.values())):
        clock_to(stack, instant + timedelta(seconds=2))
        due_now = {nid[u] for u, when in expected_due.items() if when == instant}
        received |= due_now
        wait_until(lambda r=received: Notification.objects.filter(pk__in=r, status__in=SENT).count() == len(r), 60,
                   interval=0.2, message=f"campaign rows due at {instant} sent")
        got = Counter(m["notification_id"] for m in emulator.messages(channel="email")
                      if m["notification_id"] in nid.values())
        assert got == dict.fromkeys(received, 1)
        assert Notification.objects.filter(campaign_id=cid, status="scheduled").count() == 8 - len(received)
    optimised = {nid[users[i]] for i in (0, 3, 4)}
    wait_until(lambda: opens(nid.values()) == dict.fromkeys(optimised, 1), 30, interval=0.2,
               message="the optimised members' opens stored")
    wait_until(lambda: requests.get(f"{stack.emulator}/_emulator/webhooks/stats", timeout=5).json()["pending"] == 0,
               30, interval=0.2, message="the emulator's webhooks all posted")
    assert opens(nid.values()) == dict.fromkeys(optimised, 1)
    state = requests.get(f"{stack.emulator}/_emulator/engagement", timeout=5).json()
    assert (state["opened"], state["unopened"]) == (18 + 3, 54 + 5)

    # --- the comparison, in the API and on the admin page -----------------------------------------
    body = api.request("GET", f"/v1/campaigns/{cid}").json()
    assert body["send_time"] == {"window": WINDOW, "holdout_percent": HOLDOUT_PERCENT, "groups": [
        {"group": "optimised", "members": 3, "sent": 3, "opened": 3, "open_rate": 1.0},
        {"group": "holdout", "members": 4, "sent": 4, "opened": 0, "open_rate": 0.0},
        {"group": "no_history", "members": 1, "sent": 1, "opened": 0, "open_rate": 0.0}]}
    from django.contrib.auth.models import User
    from django.test import Client
    from django.urls import reverse

    staff = User.objects.create_superuser(f"ops-{uuid.uuid4().hex[:8]}", "ops@example.com", "pw")
    admin = Client()
    admin.force_login(staff)
    page = admin.get(reverse("admin:campaigns_campaign_change", args=[cid]))
    assert page.status_code == 200
    assert ("<tr><td>optimised</td><td>3</td><td>3</td><td>3</td><td>100.0%</td></tr>"
            "<tr><td>holdout</td><td>4</td><td>4</td><td>0</td><td>0.0%</td></tr>"
            "<tr><td>no_history</td><td>1</td><td>1</td><td>0</td><td>0.0%</td></tr>") in page.content.decode()
