"""End to end: a recurring campaign through real workers, beat, Postgres, Redis and the emulator, the
platform clock moved across two weekly occurrences that straddle Europe/Paris' spring forward."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, date, datetime, timedelta

import pytest

from bench.stack import wait_until
from notifications.ids import campaign_run_id
from notifications.models import Notification
from tests.e2e import make_segment

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]


def last_sunday_of_march(year: int) -> date:
    day = date(year, 3, 31)
    return day - timedelta(days=(day.weekday() + 1) % 7)


def test_weekly_runs_send_once_per_eligible_member_each_at_0900_paris(api, emulator, stack):
    today = datetime.now(UTC).date()
    # The next spring forward at least 8 days away: a schedule's start is at most 366 days ahead.
    year = today.year if last_sunday_of_march(today.year) - timedelta(days=8) > today else today.year + 1
    spring = last_sunday_of_march(year)
    first = spring - timedelta(days=7)
    segment_id, users, opted = make_segment(api, 6, channel="sms", opted_out_every=3)
    r = api.request("POST", "/v1/campaigns", key=uuid.uuid4().hex, json={
        "segment_id": segment_id, "channel": "sms", "content": {"body": "Weekly news"},
        "schedule": {"rrule": "FREQ=WEEKLY;BYDAY=SU;COUNT=2", "start": f"{first.isoformat()}T09:00:00",
                     "timezone": "Europe/Paris"}})
    assert r.status_code == 202, r.text
    series_id = r.json()["id"]
    winter = datetime.combine(first, datetime.min.time(), tzinfo=UTC).replace(hour=8)  # 09:00 CET
    summer = datetime.combine(spring, datetime.min.time(), tzinfo=UTC).replace(hour=7)  # 09:00 CEST
    body = api.request("GET", f"/v1/campaigns/{series_id}").json()
    assert [o["at"] for o in body["schedule"]["next_occurrences"]] == [
        winter.isoformat().replace("+00:00", "Z"), summer.isoformat().replace("+00:00", "Z")]

    def runs_done(count: int):
        items = api.request("GET", f"/v1/campaigns/{series_id}/runs").json()["items"]
        return items if len(items) == count and all(i["status"] == "completed" for i in items) else None

    stack.set_clock_offset((winter - datetime.now(UTC)).total_seconds() + 2)
    wait_until(lambda: runs_done(1), 90, interval=0.5, message="the first run completed")
    stack.set_clock_offset((summer - datetime.now(UTC)).total_seconds() + 2)
    items = wait_until(lambda: runs_done(2), 90, interval=0.5, message="the second run completed")
    assert [(i["id"], i["occurrence_at"]) for i in items] == [
        (str(campaign_run_id(series_id, summer)), summer.isoformat().replace("+00:00", "Z")),
        (str(campaign_run_id(series_id, winter)), winter.isoformat().replace("+00:00", "Z"))]
    assert [(i["outcome"]["sent"], i["outcome"]["suppressed"]) for i in items] == [(4, 2), (4, 2)]
    eligible = sorted(set(users) - opted)
    per_run = {}
    for item in items:
        rows = Notification.objects.filter(campaign_id=item["id"])
        assert sorted(rows.filter(status__in=["sent", "delivered"]).values_list("recipient_id", flat=True)) == eligible
        per_run[item["id"]] = {str(i) for i in rows.values_list("id", flat=True)}
    ids = set().union(*per_run.values())
    assert len(ids) == 12  # 6 members × 2 runs, no id shared between runs
    got = Counter(m["notification_id"] for m in emulator.messages(channel="sms") if m["notification_id"] in ids)
    assert sorted(got.values()) == [1] * 8  # each eligible member once per run
    # The series completes once its last run has finished, at beat's next tick.
    wait_until(lambda: api.request("GET", f"/v1/campaigns/{series_id}").json()["status"] == "completed", 30,
               interval=0.5, message="the series completed")
