"""The per-client rate limit (notifications/api/throttling.py): DRF's sliding log, kept in a Redis sorted
set by one script. Exact outcomes on a clock the test moves: what is refused, the Retry-After, when
the window frees a slot, and that a refused request is never counted."""

from __future__ import annotations

import pytest
from django.test import Client

from core.redis_client import get_redis
from notifications.api.throttling import ApiClientRateThrottle
from notifications.models import APIClient

pytestmark = pytest.mark.django_db

URL = "/v1/notification-types"


@pytest.fixture
def timer(monkeypatch):
    now = [1_800_000_000.0]
    monkeypatch.setattr(ApiClientRateThrottle, "timer", lambda self: now[0])
    return now


def limited(rate: str) -> tuple[APIClient, Client]:
    client, key = APIClient.objects.create_key(name="throttled", rate_limit=rate)
    return client, Client(headers={"Authorization": f"Api-Key {key}"})


def test_the_window_slides_and_retry_after_is_the_rest_of_the_oldest_requests_window(timer):
    client, http = limited("3/min")
    codes = [http.get(URL).status_code]
    for _ in range(2):
        timer[0] += 10
        codes.append(http.get(URL).status_code)
    assert codes == [200, 200, 200]  # at 0, 10 and 20 s
    timer[0] += 15  # 35 s after the first
    r = http.get(URL)
    assert (r.status_code, r.json()["error"]["code"], r.headers["Retry-After"]) == (429, "throttled", "25")
    timer[0] += 25  # the first request is exactly 60 s old: out of the window
    assert http.get(URL).status_code == 200
    assert http.get(URL).status_code == 429
    timer[0] += 10  # the second one leaves too
    assert http.get(URL).status_code == 200
    assert get_redis().zcard(f"throttle:{client.pk}") == 3


def test_refused_requests_are_not_counted(timer):
    client, http = limited("2/s")
    assert [http.get(URL).status_code for _ in range(5)] == [200, 200, 429, 429, 429]
    assert get_redis().zcard(f"throttle:{client.pk}") == 2
    timer[0] += 1.0
    assert [http.get(URL).status_code for _ in range(3)] == [200, 200, 429]


def test_without_redis_the_request_goes_through(timer, monkeypatch):
    import redis

    def down(*args, **kwargs):
        raise redis.ConnectionError("down")

    monkeypatch.setattr("notifications.api.throttling.script", lambda source: down)
    _, http = limited("1/min")
    assert [http.get(URL).status_code for _ in range(3)] == [200, 200, 200]
