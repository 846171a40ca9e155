"""The emulator's simulated engagement (providers/emulator/engagement.py): the model's rule in process,
then an emulator process that follows a moved test clock and posts ``open`` events and the app's
``opened`` to a receiver."""

from __future__ import annotations

import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest
import requests

from providers.emulator.clock import OffsetClock
from providers.emulator.engagement import Engagement, EngagementError, derived_hour, distance, draw
from tests.providers.conftest import EmulatorProcess
from tests.providers.test_emulator_webhooks import EVENTS_PATH, Receiver, settle, wait_until

pytestmark = pytest.mark.timeout(30)

MODEL = {"seed": "s1", "zone": "+09:00", "hours": [8, 10],
         "recipients": {"ada@example.com": {"hour": 9, "zone": "America/Sao_Paulo"}, "tok-1": {"hour": 20}},
         "peak": 0.9, "floor": 0.1, "spread": 3}


def at(year: int, month: int, day: int, hour: int, minute: int = 0) -> float:
    return datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp()


# --- the rule --------------------------------------------------------------------------------------

def test_preferred_hours_are_explicit_or_a_hash_of_the_address_within_the_range():
    model = Engagement.from_json(MODEL)
    hour, zone = model.preferred("ada@example.com")
    assert (hour, str(zone)) == (9, "America/Sao_Paulo")
    assert model.preferred("tok-1") == (20, timezone(timedelta(hours=9)))
    derived = {a: model.preferred(a)[0] for a in (f"u{i}@example.com" for i in range(300))}
    assert set(derived.values()) == {8, 9, 10}
    assert all(h == derived_hour(a, 8, 10) for a, h in derived.items())
    assert model.preferred("u7@example.com")[1] == timezone(timedelta(hours=9))


def test_the_open_probability_falls_linearly_from_peak_to_floor_around_the_clock():
    model = Engagement.from_json(MODEL)
    # tok-1 prefers 20:00 at +09:00 (11:00 UTC): 20, 19/21, 18/22, 17 and beyond.
    expected = {11: 0.9, 10: 0.9 - 0.8 / 3, 12: 0.9 - 0.8 / 3, 9: 0.9 - 1.6 / 3, 13: 0.9 - 1.6 / 3, 8: 0.1, 23: 0.1}
    for utc_hour, p in expected.items():
        assert model.probability("tok-1", at(2030, 6, 1, utc_hour, 30)) == pytest.approx(p)
    assert [distance(h, 1) for h in (1, 0, 23, 13, 14)] == [0, 1, 2, 12, 11]
    # Sao Paulo (UTC-3): 09:00 local is 12:00 UTC.
    assert model.probability("ada@example.com", at(2030, 6, 1, 12)) == pytest.approx(0.9)


def test_whether_a_message_is_opened_is_fixed_by_seed_and_message():
    model = Engagement.from_json(MODEL)
    keys = [str(uuid.UUID(int=i)) for i in range(2000)]
    peak_hour = at(2030, 6, 1, 11, 5)
    first = [model.opens("tok-1", k, peak_hour) is not None for k in keys]
    assert first == [draw("s1", k) < 0.9 for k in keys]
    assert 1750 <= sum(first) <= 1850  # 2000 fixed keys at 90 %: the same count on every run
    assert [Engagement.from_json(MODEL).opens("tok-1", k, peak_hour) is not None for k in keys] == first
    reseeded = Engagement.from_json({**MODEL, "seed": "s2"})
    assert [reseeded.opens("tok-1", k, peak_hour) is not None for k in keys] != first
    assert (model.opened, model.unopened) == (sum(first), 2000 - sum(first))
    assert model.opens("tok-1", keys[first.index(True)], peak_hour) == peak_hour + 0.5  # delay_ms 500


def test_peak_one_floor_zero_spread_one_opens_exactly_the_preferred_hour():
    model = Engagement.from_json({"zone": "Asia/Tokyo", "recipients": {"a@x.io": {"hour": 18}},
                                  "peak": 1, "floor": 0, "spread": 1, "delay_ms": 0})
    opened = [h for h in range(24) if model.opens("a@x.io", f"m{h}", at(2030, 6, 1, h, 59)) is not None]
    assert opened == [9]  # 18:00 JST


@pytest.mark.parametrize(("body", "message"), [
    ([], "must be a JSON object"),
    ({"colour": 1}, "unknown key(s): colour"),
    ({"zone": "Mars/Olympus"}, "zone must be an IANA zone name"),
    ({"zone": "+15:00"}, "zone must be an IANA zone name"),
    ({"hours": [10, 8]}, "hours must be [first, last]"),
    ({"hours": [0, 24]}, "hours must be [first, last]"),
    ({"recipients": {"a@x.io": {"hour": 9, "zone": "Nowhere"}}}, "recipients.a@x.io.zone must be"),
    ({"recipients": {"a@x.io": {"hour": "9"}}}, "recipients.a@x.io must be"),
    ({"peak": 1.5}, "peak must be a number between 0 and 1"),
    ({"peak": 0.2, "floor": 0.3}, "floor must not be above peak"),
    ({"spread": 0}, "spread must be at least 1"),
    ({"delay_ms": -1}, "delay_ms must be between"),
    ({"app_receipts_url": "http://127.0.0.1:1"}, "app_receipts_url and app_receipts_key go together"),
])
def test_a_bad_model_is_refused_naming_the_key(body, message):
    with pytest.raises(EngagementError) as exc:
        Engagement.from_json(body)
    assert message in str(exc.value)


def test_the_clock_follows_the_offset_file(tmp_path):
    path = tmp_path / "offset"
    clock = OffsetClock(str(path))
    assert abs(clock.now() - time.time()) < 1  # no file: no offset
    path.write_text("7200")
    assert clock.offset() == 7200.0
    path.write_text("-60")
    os.utime(path, (time.time(), time.time() + 5))  # a new mtime even within one timestamp tick
    assert clock.offset() == -60.0
    assert OffsetClock(None).offset() == 0.0


# --- through an emulator process -------------------------------------------------------------------

@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def clock_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("clock") / "offset"
    path.write_text("0")
    return path


@pytest.fixture(scope="module")
def engaged(receiver, clock_file):
    server = EmulatorProcess(env={"EMULATOR_SENDGRID_EVENTS_URL": receiver.base + EVENTS_PATH,
                                  "CLOCK_OFFSET_FILE": str(clock_file)}).start()
    yield server
    assert server.stop() == 0


@pytest.fixture(autouse=True)
def clock_back(clock_file):
    yield
    clock_file.write_text("0")
    os.utime(clock_file, (time.time(), time.time() + 7))


def move_clock(path, to: datetime) -> float:
    offset = (to - datetime.now(UTC)).total_seconds()
    path.write_text(str(offset))
    os.utime(path, (time.time(), time.time() + offset % 1 + 0.001))
    return offset


def mail(emu: EmulatorProcess, to: str, nid: str) -> None:
    r = requests.post(emu.url + "/v3/mail/send", headers={"Authorization": "Bearer SG.x"}, timeout=5, json={
        "personalizations": [{"to": [{"email": to}], "custom_args": {"notification_id": nid}}],
        "from": {"email": "n@example.com"}, "subject": "s", "content": [{"type": "text/plain", "value": "b"}]})
    assert r.status_code == 202, r.text


def test_an_email_delivered_in_the_preferred_hour_is_opened_at_the_moved_clock(engaged, receiver, clock_file):
    engaged.reset()
    model = {"zone": "Asia/Tokyo", "peak": 1, "floor": 0, "spread": 1, "delay_ms": 100,
             "recipients": {"near@example.com": {"hour": 18}, "far@example.com": {"hour": 6}}}
    assert engaged.call("POST", "/_emulator/engagement", model)["recipients"]["near@example.com"]["hour"] == 18
    moved = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(days=3)
    moved = moved.replace(hour=9) + timedelta(minutes=20)  # 18:20 JST, three days ahead
    move_clock(clock_file, moved)
    near, far = str(uuid.uuid4()), str(uuid.uuid4())
    mail(engaged, "near@example.com", near)
    mail(engaged, "far@example.com", far)
    wait_until(lambda: len(receiver.events_of(near)) == 3)
    settle(engaged)
    events = receiver.events_of(near)
    assert [e["event"] for e in events] == ["processed", "delivered", "open"]
    assert [e["event"] for e in receiver.events_of(far)] == ["processed", "delivered"]
    start = moved.timestamp()
    assert all(start - 1 <= e["timestamp"] <= start + 30 for e in events)  # the moved clock, not the host's
    opened = events[2]
    assert opened["sg_message_id"] == events[1]["sg_message_id"] and opened["email"] == "near@example.com"
    assert "smtp-id" not in opened and opened["useragent"]
    state = engaged.call("GET", "/_emulator/engagement")
    assert (state["enabled"], state["opened"], state["unopened"]) == (True, 1, 1)
    engaged.call("DELETE", "/_emulator/engagement")
    assert engaged.call("GET", "/_emulator/engagement") == {"enabled": False}


def test_a_push_opened_posts_the_apps_opened_receipt_with_the_key(engaged, receiver, clock_file):
    engaged.reset()
    moved = datetime.now(UTC).replace(minute=30, second=0, microsecond=0) + timedelta(hours=5)
    move_clock(clock_file, moved)
    engaged.call("POST", "/_emulator/engagement", {
        "zone": "+00:00", "peak": 1, "floor": 0, "spread": 1, "delay_ms": 0,
        "recipients": {"tok-a": {"hour": moved.hour}},
        "app_receipts_url": receiver.base, "app_receipts_key": "k-123"})
    nid = str(uuid.uuid4())
    r = requests.post(engaged.url + "/v1/projects/p1/messages:send", headers={"Authorization": "Bearer t"},
                      json={"message": {"token": "tok-a", "data": {"notification_id": nid}}}, timeout=5)
    assert r.status_code == 200, r.text
    path = f"/v1/notifications/{nid}/receipts"
    hits = wait_until(lambda: receiver.received(path))
    settle(engaged)
    assert len(receiver.received(path)) == 1
    assert hits[0].headers["Authorization"] == "Api-Key k-123"
    body = json.loads(hits[0].body)
    assert body["event"] == "opened"
    assert moved.timestamp() - 1 <= datetime.fromisoformat(body["at"]).timestamp() <= moved.timestamp() + 30
    assert engaged.call("GET", "/_emulator/engagement")["app_receipts_key"] == "***"


def test_the_control_api_refuses_a_bad_model_and_keeps_the_old_one(engaged):
    engaged.reset()
    engaged.call("POST", "/_emulator/engagement", {"seed": "a"})
    r = requests.post(engaged.url + "/_emulator/engagement", json={"spread": 0}, timeout=5)
    assert (r.status_code, r.json()) == (400, {"error": "spread must be at least 1"})
    assert engaged.call("GET", "/_emulator/engagement")["seed"] == "a"
