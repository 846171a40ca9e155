"""End to end, frequency caps (docs/POLICIES.md): the API, real Celery workers and beat, Postgres,
Redis and the emulator. The default rule (settings: marketing push, at most 3 per user per rolling
24 h) holds across senders (a campaign, events and a single send share one budget), under
concurrent sends, and after a Redis flush; a high-priority send is not capped."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from core.redis_client import get_redis
from notifications.models import FrequencyCap, Notification
from tests.e2e import SENT, TERMINAL, make_segment, make_user, send, wait_status
from tests.test_e2e_campaigns import create_campaign, wait_campaign
from tests.test_e2e_events import post_event, put_type

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PUSH = {"title": "Sale", "body": "20% off today"}
RULE = "marketing push: at most 3 per 24 h; 3 sent since "


def marketing_push(api, uid: str, **fields) -> str:
    return send(api, uid, "push", category="marketing", content=PUSH, **fields)


def outcome(nid: str) -> tuple[str, str]:
    n = wait_status(nid, TERMINAL, timeout=40)
    return ("sent" if n.status in SENT else n.status), n.reason


def test_a_campaign_two_events_and_a_single_send_share_one_budget_of_three(api, emulator):
    segment_id, (user,), _ = make_segment(api, 1, channel="push")
    cid = create_campaign(api, {"segment_id": segment_id, "channel": "push", "content": PUSH})
    wait_campaign(api, cid, "completed")
    (from_campaign,) = Notification.objects.filter(campaign_id=cid).values_list("pk", flat=True)
    kind = f"promo_{uuid.uuid4().hex[:6]}"
    put_type(api, kind, {"name": "Promo", "category": "marketing", "channels": ["push"],
                         "templates": [{"channel": "push", "locale": "en", "title": "Promo", "body": "{{ data.x }}"}]})
    from_events = []
    for i in range(2):
        r = post_event(api, {"type": kind, "user_id": user, "data": {"x": str(i)}})
        assert r.status_code == 202, r.text
        (n,) = r.json()["notifications"]
        from_events.append(n["id"])
        assert outcome(n["id"]) == ("sent", "")
    assert outcome(str(from_campaign)) == ("sent", "")
    single = marketing_push(api, user)
    assert outcome(single) == ("suppressed", "frequency_capped")
    r = post_event(api, {"type": kind, "user_id": user, "data": {"x": "late"}})
    (late,) = r.json()["notifications"]
    assert outcome(late["id"]) == ("suppressed", "frequency_capped")

    sent_ids = {str(from_campaign), *from_events}
    assert sorted(m["notification_id"] for m in emulator.messages(to=f"tok-{user}")) == sorted(sent_ids)
    shown = api.request("GET", f"/v1/notifications/{single}").json()  # what support reads
    assert (shown["status"], shown["reason"]) == ("suppressed", "frequency_capped")
    assert shown["reason_detail"].startswith(RULE) and shown["reason_detail"].endswith(" UTC (rule marketing-push)")


def test_ten_concurrent_sends_to_one_user_deliver_exactly_three(api, emulator, uid):
    user = make_user(api, uid)
    with ThreadPoolExecutor(10) as pool:
        ids = list(pool.map(lambda i: marketing_push(api, uid, key=f"{uid}-{i}"), range(10)))
    outcomes = sorted(outcome(nid) for nid in ids)
    assert outcomes == [("sent", "")] * 3 + [("suppressed", "frequency_capped")] * 7
    got = emulator.messages(to=user["tokens"][0])
    assert len(got) == 3
    assert {m["notification_id"] for m in got} == {nid for nid in ids if outcome(nid)[0] == "sent"}


def test_a_high_priority_send_is_not_capped_and_takes_no_slot(api, emulator, uid):
    """A rule of the test's own (an admin row, read by the workers per batch): ``security`` pushes
    capped at one a day (high is only for categories that bypass quiet hours)."""
    user = make_user(api, uid)
    category, name = "security", f"security-push-{uid[-8:]}"
    FrequencyCap.objects.create(name=name, category=category, channel="push", limit=1, window_seconds=86400)
    try:
        otps = [send(api, uid, "push", category=category, priority="high", content={"title": "Code", "body": "1234"})
                for _ in range(3)]
        assert [outcome(nid) for nid in otps] == [("sent", "")] * 3
        first = send(api, uid, "push", category=category, content=PUSH)
        assert outcome(first) == ("sent", "")
        second = send(api, uid, "push", category=category, content=PUSH)
        assert outcome(second) == ("suppressed", "frequency_capped")
        assert Notification.objects.get(pk=second).reason_detail.startswith(
            "security push: at most 1 per 24 h; 1 sent since ")
        assert len(emulator.messages(to=user["tokens"][0])) == 4
    finally:
        FrequencyCap.objects.filter(name=name).delete()


def test_after_a_redis_flush_the_cap_still_holds(api, emulator, uid):
    user = make_user(api, uid)
    first = [marketing_push(api, uid) for _ in range(3)]
    assert [outcome(nid) for nid in first] == [("sent", "")] * 3
    get_redis().flushdb()  # windows, sentinels, broker queues, sent markers: all gone
    later = marketing_push(api, uid)
    assert outcome(later) == ("suppressed", "frequency_capped")
    assert Notification.objects.get(pk=later).reason_detail.startswith(RULE)
    assert sorted(m["notification_id"] for m in emulator.messages(to=user["tokens"][0])) == sorted(first)
