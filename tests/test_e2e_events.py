"""End to end, semantic events (docs/TYPES.md): the API, real Celery workers and beat, Postgres,
Redis and the provider emulator driven by the real SDKs. The platform clock is moved (every process
reads the offset file) to put the recipient inside or past their quiet hours.

The worked example of issue 14: ``order_shipped`` for a user who takes shipping news by push and
email but not SMS, at 02:00 in their zone inside their quiet hours: the push goes now as a silent
data-only message to every device in their locale, the email waits for 07:00, no SMS; a retry
replays the answer; the email is delivered later and the event tells the whole story."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from bench.stack import wait_until
from notifications.events.models import TypeTemplate
from notifications.models import Notification
from preferences.models import Recipient
from tests.e2e import SENT, TERMINAL, make_user, wait_status

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

BERLIN = ZoneInfo("Europe/Berlin")

ORDER_SHIPPED = {
    "name": "Order shipped", "category": "shipping", "channels": ["push", "email", "sms"], "routing": "all",
    "quiet_hours": "silent", "required_data": ["tracking_url"], "collapse_key": "order-{{ data.order_id }}",
    "templates": [
        {"channel": "push", "locale": "en", "title": "Your order shipped", "body": "Order {{ data.order_id }}",
         "data": {"url": "{{ data.tracking_url }}"}},
        {"channel": "push", "locale": "de", "title": "Bestellung verschickt",
         "body": "Bestellung {{ data.order_id }} ist unterwegs", "data": {"url": "{{ data.tracking_url }}"}},
        {"channel": "email", "locale": "en", "title": "Order {{ data.order_id }} shipped",
         "body": "Track it: {{ data.tracking_url }}",
         "html": "<p>Hi {{ first_name }}, <a href=\"{{ data.tracking_url }}\">track it</a></p>"},
        {"channel": "sms", "locale": "en", "body": "Order {{ data.order_id }} shipped: {{ data.tracking_url }}"}]}


def put_type(api, key: str, body: dict) -> None:
    r = api.request("PUT", f"/v1/notification-types/{key}", json=body)
    assert r.status_code in (200, 201), r.text


def simple_type(channels, **over) -> dict:
    templates = [{"channel": c, "locale": "en", "body": "Code {{ data.code }}" if c == "sms" else "Hi {{ data.code }}",
                  **({"title": "Hello"} if c != "sms" else {})} for c in channels]
    return {"name": "t", "category": over.pop("category", "account"), "channels": list(channels),
            "templates": templates, **over}


def post_event(api, body: dict, key: str | None = None):
    return api.request("POST", "/v1/events", json=body, key=key or uuid.uuid4().hex)


def by_channel(event_body: dict) -> dict[str, dict]:
    return {n["channel"]: n for n in event_body["notifications"]}


def at_local(stack, wall: datetime) -> None:
    """Move the platform clock so that it is now ``wall`` (aware)."""
    stack.set_clock_offset((wall - datetime.now(UTC)).total_seconds())


def next_local(hour: int, minute: int = 0) -> datetime:
    """The next ``hour:minute`` in Berlin, at least an hour from now (real time)."""
    day = datetime.now(BERLIN).date() + timedelta(days=1)
    return datetime(day.year, day.month, day.day, hour, minute, tzinfo=BERLIN)


def test_the_worked_example_order_shipped_at_2am_in_quiet_hours(api, emulator, uid):
    put_type(api, f"order_shipped_{uid[-6:]}", ORDER_SHIPPED)
    kind = f"order_shipped_{uid[-6:]}"
    user = make_user(api, uid, devices=2, locale="de-DE", attributes={"first_name": "Ada"})
    r = api.request("PUT", f"/v1/users/{uid}/preferences", json={
        "category_opt_outs": {"shipping": ["sms"]},
        "quiet_hours": {"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"}})
    assert r.status_code == 200, r.text
    two_am = next_local(2)
    at_local(emulator, two_am)

    body = {"type": kind, "user_id": uid, "data": {"order_id": "8812", "tracking_url": "https://t.example/8812"}}
    first = post_event(api, body, key="order-8812:shipped")
    assert first.status_code == 202, first.text
    retry = post_event(api, body, key="order-8812:shipped")
    assert (retry.json(), retry.headers["Idempotent-Replayed"]) == (first.json(), "true")
    ids = {c: n["id"] for c, n in by_channel(first.json()).items()}

    push = wait_status(ids["push"], SENT)
    sms = wait_status(ids["sms"], TERMINAL)
    assert (sms.status, sms.reason) == ("suppressed", "opted_out_category")
    email = wait_until(lambda: Notification.objects.filter(pk=ids["email"], status="scheduled",
                                                           reason="quiet_hours").first(), 20, message="email deferred")
    assert email.due_at == datetime(two_am.year, two_am.month, two_am.day, 7, 0, tzinfo=BERLIN)
    got = emulator.messages(notification_id=ids["push"])
    assert sorted(m["to"] for m in got) == sorted(user["tokens"])  # every active device, once each
    for message in got:
        raw = message["details"]["message"]
        assert "notification" not in raw  # data-only: no alert, no sound
        assert raw["data"]["title"] == "Bestellung verschickt" and raw["data"]["url"] == "https://t.example/8812"
        assert raw["android"]["collapse_key"] == "order-8812"
        assert raw["apns"]["headers"]["apns-push-type"] == "background"
    assert emulator.messages(channel="sms", to=user["phone"]) == []
    assert emulator.messages(notification_id=ids["email"]) == []
    assert "silent" in [e.kind for e in push.timeline.all()]

    at_local(emulator, two_am.replace(hour=7, second=3))  # the window ends; the scheduler releases it
    delivered = wait_status(ids["email"], ("delivered",), timeout=30)
    (mail,) = emulator.messages(notification_id=ids["email"])
    assert (mail["to"], mail["title"]) == (user["email"], "Order 8812 shipped")
    assert delivered.html == '<p>Hi Ada, <a href="https://t.example/8812">track it</a></p>'

    story = api.request("GET", f"/v1/events/{first.json()['id']}").json()
    (recipient,) = story["recipients"]
    assert recipient["outcome"] == "reached"
    assert [(n["channel"], n["status"] if n["channel"] != "push" else "sent", n["reason"])
            for n in recipient["notifications"]] == [
        ("push", "sent", ""), ("email", "delivered", ""), ("sms", "suppressed", "opted_out_category")]
    kinds = [t["kind"] for t in recipient["notifications"][1]["timeline"]]
    assert kinds[:4] == ["accepted", "released", "deferred", "released"] and "receipt:delivered" in kinds


def test_fallback_no_device_goes_by_email_and_an_invalid_email_by_sms(api, emulator, uid):
    kind = f"reach_{uid[-6:]}"
    put_type(api, kind, simple_type(["push", "email", "sms"], routing="fallback"))
    make_user(api, uid, devices=0)
    other = f"{uid}-b"
    make_user(api, other, devices=0)
    Recipient.objects.filter(pk=other).update(email_invalid_reason="bounced", email_invalid_at=datetime.now(UTC))

    one = by_channel(post_event(api, {"type": kind, "user_id": uid, "data": {"code": "1"}}).json())
    two = by_channel(post_event(api, {"type": kind, "user_id": other, "data": {"code": "2"}}).json())

    assert wait_status(one["email"]["id"], SENT).status in SENT
    assert wait_status(one["sms"]["id"], TERMINAL).reason == "fallback_not_needed"
    assert Notification.objects.get(pk=one["push"]["id"]).reason == "no_active_device"
    assert wait_status(two["sms"]["id"], SENT).status in SENT
    assert Notification.objects.get(pk=two["email"]["id"]).reason == "email_invalid"
    time.sleep(0.5)
    assert len(emulator.messages(notification_id=one["email"]["id"])) == 1
    assert emulator.messages(notification_id=one["sms"]["id"]) == []
    assert len(emulator.messages(notification_id=two["sms"]["id"])) == 1


def test_an_email_that_bounces_after_it_was_sent_reopens_the_fallback_and_the_sms_goes(api, emulator, uid):
    kind = f"bounce_{uid[-6:]}"
    put_type(api, kind, simple_type(["email", "sms"], routing="fallback"))
    user = make_user(api, uid, devices=0)
    emulator.add_receipt_rule(provider="sendgrid", to=user["email"], outcome="bounce")

    event = post_event(api, {"type": kind, "user_id": uid, "data": {"code": "7"}}).json()
    ids = by_channel(event)

    email = wait_until(lambda: Notification.objects.filter(pk=ids["email"]["id"], status="failed").first(), 30,
                       message="the email failed by its bounce receipt")
    assert email.reason == "provider_bounced"
    assert wait_status(ids["sms"]["id"], SENT).status in SENT
    time.sleep(0.5)
    assert len(emulator.messages(notification_id=ids["email"]["id"])) == 1
    assert len(emulator.messages(notification_id=ids["sms"]["id"])) == 1
    (recipient,) = api.request("GET", f"/v1/events/{event['id']}").json()["recipients"]
    assert recipient["outcome"] == "reached"
    mail, sms = recipient["notifications"]
    assert (mail["channel"], mail["status"], mail["reason"], sms["channel"]) == (
        "email", "failed", "provider_bounced", "sms")


def test_fallback_with_no_channel_eligible_says_so(api, emulator, uid):
    kind = f"nobody_{uid[-6:]}"
    put_type(api, kind, simple_type(["push", "email", "sms"], routing="fallback"))
    api.put_user(uid)  # no phone, no email, no device
    event = post_event(api, {"type": kind, "user_id": uid, "data": {"code": "1"}}).json()
    ids = by_channel(event)
    wait_status(ids["sms"]["id"], TERMINAL)
    story = api.request("GET", f"/v1/events/{event['id']}").json()
    (recipient,) = story["recipients"]
    assert recipient["outcome"] == "not_reached"
    assert [(n["channel"], n["status"], n["reason"]) for n in recipient["notifications"]] == [
        ("push", "suppressed", "no_active_device"), ("email", "suppressed", "no_email"),
        ("sms", "suppressed", "no_phone")]


def test_a_bypass_otp_type_goes_now_in_quiet_hours_and_a_required_type_ignores_an_opt_out(api, emulator, uid):
    otp = f"otp_{uid[-6:]}"
    put_type(api, otp, simple_type(["sms"], category="security", priority="high", quiet_hours="bypass",
                                   sensitive=True))
    alert = f"pw_{uid[-6:]}"
    put_type(api, alert, simple_type(["email"], category="security", required=True))
    make_user(api, uid)
    assert api.request("PUT", f"/v1/users/{uid}/preferences", json={
        "opt_outs": ["email"], "quiet_hours": {"start": "00:00", "end": "23:59", "timezone": "UTC"}}).status_code == 200
    at_local(emulator, datetime.now(UTC).replace(hour=12, minute=0) + timedelta(days=1))

    code = by_channel(post_event(api, {"type": otp, "user_id": uid, "data": {"code": "626262"}}).json())["sms"]
    mail = by_channel(post_event(api, {"type": alert, "user_id": uid, "data": {"code": "x"}}).json())["email"]

    wait_status(code["id"], SENT, timeout=10)
    (sms,) = emulator.messages(notification_id=code["id"])
    assert sms["body"] == "Code 626262"
    wait_until(lambda: Notification.objects.filter(pk=mail["id"], status="scheduled", reason="quiet_hours").first(),
               20, message="the required email deferred by quiet hours, not suppressed by the opt-out")


def test_a_template_fixed_after_acceptance_changes_what_a_deferred_notification_says(api, emulator, uid):
    kind = f"digest_{uid[-6:]}"
    put_type(api, kind, simple_type(["email"], category="news"))
    make_user(api, uid)
    assert api.request("PUT", f"/v1/users/{uid}/preferences", json={
        "quiet_hours": {"start": "22:00", "end": "07:00", "timezone": "Europe/Berlin"}}).status_code == 200
    two_am = next_local(2)
    at_local(emulator, two_am)
    nid = by_channel(post_event(api, {"type": kind, "user_id": uid, "data": {"code": "1"}}).json())["email"]["id"]
    wait_until(lambda: Notification.objects.filter(pk=nid, status="scheduled", reason="quiet_hours").exists(), 20,
               message="deferred")
    TypeTemplate.objects.filter(type_id=kind, channel="email").update(body="Fixed {{ data.code }}")
    at_local(emulator, two_am.replace(hour=7, second=3))
    wait_status(nid, SENT, timeout=30)
    (mail,) = emulator.messages(notification_id=nid)
    assert mail["body"] == "Fixed 1"


def test_one_event_for_1000_users_sends_each_exactly_once(api, emulator, uid):
    kind = f"blast_{uid[-6:]}"
    put_type(api, kind, simple_type(["email"], category="news"))
    users = [f"{uid}-{i:04d}" for i in range(1000)]
    Recipient.objects.bulk_create([Recipient(user_id=u, email=f"{u}@example.com") for u in users])
    resp = post_event(api, {"type": kind, "user_ids": users, "data": {"code": "7"}})
    assert resp.status_code == 202, resp.text
    ids = [n["id"] for n in resp.json()["notifications"]]
    assert len(ids) == len(set(ids)) == 1000
    wait_until(lambda: Notification.objects.filter(pk__in=ids, status__in=SENT).count() == 1000, 90,
               message="1,000 sent")
    time.sleep(1)
    sent_ids = [m["notification_id"] for m in emulator.messages(channel="email") if m["notification_id"] in set(ids)]
    assert sorted(sent_ids) == sorted(ids)
