"""Send-time profiles (docs/SEND_TIME.md): the rule (smoothing, window, best hour, holdout draw), the
bulk recompute against Postgres with exact counts per local hour, and erasure reaching the table."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, time, timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from hypothesis import given
from hypothesis import strategies as st

from notifications.models import DeliveryEvent, Notification
from notifications.send_time import rule
from notifications.send_time.compute import BEST_HOUR_SQL, recompute
from notifications.send_time.models import SendTimeProfile
from preferences.api.erasure import erase_user, personal_data
from preferences.models import Recipient
from tests.history import archive

NOW = datetime(2030, 3, 20, 12, 0, tzinfo=UTC)


def histogram(**hours: int) -> list[int]:
    counts = [0] * 24
    for name, n in hours.items():
        counts[int(name[1:])] = n
    return counts


# --- The rule ---------------------------------------------------------------------------------------

def test_smoothing_adds_half_of_each_neighbour_around_midnight():
    scores = rule.smooth(histogram(h0=4, h23=2, h12=1))
    assert scores[0] == 4 + 0.5 * 2
    assert scores[23] == 2 + 0.5 * 4
    assert scores[1] == 0.5 * 4
    assert scores[22] == 0.5 * 2
    assert (scores[11], scores[12], scores[13]) == (0.5, 1, 0.5)
    assert sum(scores) == 2 * (4 + 2 + 1)


def test_a_lone_peak_loses_to_a_shoulder_of_two_busy_hours():
    # 19:00 alone has 3; 08:00 and 09:00 have 2 each: 9 scores 2 + 1 = 3, tie broken by the earlier.
    counts = histogram(h19=3, h8=2, h9=2)
    assert rule.best_hour(counts) == 8
    assert rule.best_hour(histogram(h19=4, h8=2, h9=2)) == 19


def test_the_window_keeps_the_best_hour_inside_it():
    counts = histogram(h7=10, h14=2)
    assert rule.best_hour(counts) == 7
    assert rule.best_hour(counts, rule.window_hours(time(9), time(21))) == 14
    assert rule.best_hour(histogram(), rule.window_hours(time(9), time(21))) == 9  # all equal: the first


@pytest.mark.parametrize(("start", "end", "hours"), [
    (time(9), time(21), list(range(9, 21))),
    (time(9, 30), time(21, 30), list(range(10, 22))),
    (time(21), time(2), [21, 22, 23, 0, 1]),
    (time(9, 15), time(9, 45), []),
    (time(0), time(0), list(range(24))),
])
def test_window_hours(start, end, hours):
    assert rule.window_hours(start, end) == hours


def test_the_holdout_draw_is_deterministic_and_near_its_share():
    users = [f"u{i}" for i in range(20_000)]
    drawn = [u for u in users if rule.in_holdout(42, u, 10)]
    assert drawn == [u for u in users if rule.in_holdout(42, u, 10)]
    assert 1800 < len(drawn) < 2200
    assert not any(rule.in_holdout(42, u, 0) for u in users)
    other = {u for u in users if rule.in_holdout(43, u, 10)}
    assert len(other & set(drawn)) < 400  # another campaign draws other members (about 10 % of 10 %)


hist = st.lists(st.integers(min_value=0, max_value=50), min_size=24, max_size=24)


@given(counts=hist, start=st.integers(0, 23), length=st.integers(1, 23))
def test_the_best_hour_is_in_the_window_and_no_window_hour_scores_higher(counts, start, length):
    hours = rule.window_hours(time(start), time((start + length) % 24))
    best = rule.best_hour(counts, hours)
    assert best in hours
    scores = rule.smooth(counts)
    assert all(scores[h] <= scores[best] for h in hours)
    assert all(scores[h] < scores[best] for h in hours[:hours.index(best)])  # ties: the earliest


@given(counts=hist, shift=st.integers(0, 23))
def test_the_best_hour_turns_with_the_histogram(counts, shift):
    turned = counts[-shift:] + counts[:-shift] if shift else counts
    scores = rule.smooth(counts)
    assert rule.smooth(turned)[(rule.best_hour(counts) + shift) % 24] == max(scores)


@pytest.mark.django_db
def test_the_sql_best_hour_is_the_rules_over_random_histograms():
    rnd = random.Random(7)
    cases = [[rnd.choice((0, 0, 1, 2, 3, 8)) for _ in range(24)] for _ in range(500)] + [[0] * 24, [5] * 24]
    with connection.cursor() as cur:
        cur.execute(f"""SELECT i, {BEST_HOUR_SQL} FROM (
                            SELECT i, array(SELECT jsonb_array_elements_text(x)::int) AS c
                              FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS t(x, i)) q""",
                    [json.dumps(cases)])
        got = dict(cur.fetchall())
    assert [got[i + 1] for i in range(len(cases))] == [rule.best_hour(c) for c in cases]


# --- The bulk recompute -----------------------------------------------------------------------------

def engaged(recipient: Recipient, at: datetime, channel: str = "email", kind: str = "receipt:open",
            created: datetime | None = None) -> Notification:
    n = Notification.objects.create(id=uuid.uuid4(), recipient=recipient, channel=channel, body="b",
                                    status="opened" if kind == "app_opened" else "sent",
                                    created_at=created or at - timedelta(minutes=5))
    DeliveryEvent.objects.create(notification=n, kind=kind, created_at=at)
    return n


def utc(day: int, hour: int, minute: int = 0, month: int = 3) -> datetime:
    return datetime(2030, month, day, hour, minute, tzinfo=UTC)


@pytest.mark.django_db
def test_the_recompute_counts_first_engagements_by_local_hour(frozen):
    berlin = Recipient.objects.create(user_id="berlin", timezone="Europe/Berlin")
    # 2030-03-31 is Berlin's spring change: 07:10 UTC is 08:10 before it (CET) and 09:10 after (CEST).
    engaged(berlin, utc(10, 7, 10))                          # 08 local
    n = engaged(berlin, utc(11, 7, 10))                      # 08 local, and opened again later:
    DeliveryEvent.objects.create(notification=n, kind="receipt:click", created_at=utc(11, 15))  # not counted
    engaged(berlin, utc(12, 18, 30), channel="push", kind="app_opened")   # 19 local
    engaged(berlin, utc(1, 7, 10, month=4))                  # 09 local (CEST), beyond NOW: see below
    archived = engaged(berlin, utc(13, 7, 59))               # 08 local, read from the history
    archive(archived.pk, at=utc(13, 14))
    engaged(berlin, utc(14, 7), kind="receipt:delivered")    # not an engagement
    engaged(berlin, utc(1, 7, month=1), created=utc(1, 6, month=1))  # older than 90 days
    frozen[0] = utc(2, 12, month=4)

    few = Recipient.objects.create(user_id="few", timezone="America/New_York")
    engaged(few, utc(10, 13))
    engaged(few, utc(11, 13))
    nozone = Recipient.objects.create(user_id="nozone", timezone="America")  # not a zone: the default (UTC)
    for day in (3, 4, 5):
        engaged(nozone, utc(day, 22, 45))

    run = recompute()

    assert (run.profiles, run.dropped) == (2, 0)
    p = SendTimeProfile.objects.get(recipient=berlin)
    assert p.counts == histogram(h8=3, h9=1, h19=1)
    assert (p.events, p.best_hour, p.computed_at) == (5, 8, frozen[0])
    q = SendTimeProfile.objects.get(recipient=nozone)
    assert (q.counts, q.events, q.best_hour) == (histogram(h22=3), 3, 22)
    assert not SendTimeProfile.objects.filter(recipient=few).exists()  # 2 < SEND_TIME_MIN_EVENTS

    frozen[0] = utc(1, 12, month=7)  # all of it older than 90 days now
    call_command("compute_send_times")
    assert not SendTimeProfile.objects.exists()


@pytest.mark.django_db
def test_erasure_deletes_the_profile_and_earlier_engagements_never_count_again(frozen):
    ada = Recipient.objects.create(user_id="ada", timezone="UTC")
    for day in (3, 4, 5):
        engaged(ada, utc(day, 10))
    frozen[0] = utc(6, 12)
    assert recompute().profiles == 1
    assert personal_data()["notifications.SendTimeProfile"].startswith("deleted")

    erase_user(ada, requested_by="test")
    assert not SendTimeProfile.objects.filter(recipient=ada).exists()
    assert recompute().profiles == 0
    for day in (7, 8, 9):
        engaged(ada, utc(day, 16))
    frozen[0] = utc(10, 12)
    assert recompute().profiles == 1
    assert SendTimeProfile.objects.get(recipient=ada).counts == histogram(h16=3)


@pytest.mark.django_db
def test_beat_runs_the_recompute_daily_on_the_maintenance_queue(frozen, settings):
    from notifications import tasks

    entry = settings.CELERY_BEAT_SCHEDULE["compute-send-times"]
    assert (entry["task"], entry["schedule"], entry["options"]["queue"]) == (
        "notifications.compute_send_times", 86400.0, "maintenance")
    ada = Recipient.objects.create(user_id="ada", timezone="Asia/Kolkata")  # UTC+05:30
    for day in (3, 4, 5):
        engaged(ada, utc(day, 3, 45))  # 09:15 local
    frozen[0] = utc(6, 12)
    assert tasks.compute_send_times() == {"profiles": 1, "dropped": 0}
    assert SendTimeProfile.objects.get(recipient=ada).counts == histogram(h9=3)

