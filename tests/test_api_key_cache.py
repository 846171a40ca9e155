"""A verified API key is remembered per process for ``API_KEY_CACHE_SECONDS`` (notifications/api/auth.py):
one query fewer per request, the secret still compared every time, and a revocation, expiry or scope
change made by another process honoured once the TTL has passed on the platform clock (moved here
through ``NOTIFY["CLOCK_OFFSET_FILE"]``, as the end-to-end tests move every process's clock)."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from django.utils.crypto import get_random_string

from core.api.scopes import Scope
from notifications.models import APIClient
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

URL = "/v1/notification-types"


@pytest.fixture
def moved_clock(settings, tmp_path):
    """Sets the platform clock's offset (seconds) for every reader, as Stack.set_clock_offset does."""
    path = tmp_path / "clock-offset"
    path.write_text("0")
    settings.NOTIFY = {**settings.NOTIFY, "CLOCK_OFFSET_FILE": str(path)}
    settings.API_KEY_CACHE_SECONDS = 5.0

    def move(seconds: float) -> None:
        path.write_text(str(seconds))
        stat = path.stat()
        os.utime(path, (stat.st_atime, stat.st_mtime + 1))  # a new mtime even within one tick

    return move


@pytest.fixture
def key():
    client, key = APIClient.objects.create_key(name="cached", scopes=EVERY_SCOPE)
    return client, key


def get(key: str):
    return Client(headers={"Authorization": f"Api-Key {key}"}).get(URL)


def client_queries(queries) -> int:
    return sum('FROM "notifications_apiclient"' in q["sql"] for q in queries)


def test_a_second_request_within_the_ttl_reads_no_client_row(moved_clock, key):
    assert get(key[1]).status_code == 200
    with CaptureQueriesContext(connection) as queries:
        assert get(key[1]).status_code == 200
    assert client_queries(queries.captured_queries) == 0
    moved_clock(5.1)
    with CaptureQueriesContext(connection) as queries:
        assert get(key[1]).status_code == 200
    assert client_queries(queries.captured_queries) == 1


def test_a_revocation_by_another_process_is_honoured_once_the_ttl_has_passed(moved_clock, key):
    assert get(key[1]).status_code == 200
    APIClient.objects.filter(pk=key[0].pk).update(revoked=True)  # another process: no signal here
    moved_clock(4.9)
    assert get(key[1]).status_code == 200  # the documented bound: up to API_KEY_CACHE_SECONDS
    moved_clock(5.1)
    r = get(key[1])
    assert (r.status_code, r.json()["error"]["code"]) == (401, "revoked_api_key")


def test_a_revocation_elsewhere_is_honoured_after_the_clock_moved_back(moved_clock, key):
    """An entry remembered while the clock was months ahead (a test's offset, an NTP step back) is not
    trusted for those months once the clock is back: the next request reads the row."""
    moved_clock(90 * 86400)
    assert get(key[1]).status_code == 200
    APIClient.objects.filter(pk=key[0].pk).update(revoked=True)  # another process: no signal here
    moved_clock(0)
    r = get(key[1])
    assert (r.status_code, r.json()["error"]["code"]) == (401, "revoked_api_key")


def test_a_revocation_saved_in_this_process_is_honoured_at_once(moved_clock, key):
    assert get(key[1]).status_code == 200
    key[0].revoked = True
    key[0].save()
    r = get(key[1])
    assert (r.status_code, r.json()["error"]["code"]) == (401, "revoked_api_key")


def test_an_expiry_and_a_scope_removed_elsewhere_are_honoured_after_the_ttl(moved_clock, key):
    assert get(key[1]).status_code == 200
    APIClient.objects.filter(pk=key[0].pk).update(scopes=[Scope.SEND])
    moved_clock(5.1)
    r = get(key[1])
    assert (r.status_code, r.json()["error"]["code"]) == (403, "missing_scope")
    APIClient.objects.filter(pk=key[0].pk).update(scopes=EVERY_SCOPE,
                                                  expiry_date=timezone.now() - timedelta(seconds=1))
    moved_clock(10.2)
    r = get(key[1])
    assert (r.status_code, r.json()["error"]["code"]) == (401, "expired_api_key")


def test_the_secret_is_compared_on_every_request(moved_clock, key):
    assert get(key[1]).status_code == 200
    prefix, _, secret = key[1].partition(".")
    r = get(f"{prefix}.{'x' * len(secret)}")
    assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")


def test_a_ttl_of_zero_reads_the_row_every_time(moved_clock, settings, key):
    settings.API_KEY_CACHE_SECONDS = 0
    assert get(key[1]).status_code == 200
    APIClient.objects.filter(pk=key[0].pk).update(revoked=True)
    r = get(key[1])
    assert (r.status_code, r.json()["error"]["code"]) == (401, "revoked_api_key")


def test_a_key_rotated_by_another_process_works_at_once_and_the_old_one_stops_after_the_ttl(moved_clock, key):
    client, old_key = key
    assert get(old_key).status_code == 200
    new_key = f"{client.prefix}.{get_random_string(32)}"  # as create_api_client --rotate makes it
    APIClient.objects.filter(pk=client.pk).update(hashed_key=APIClient.objects.key_generator.hash(new_key))
    assert get(new_key).status_code == 200  # the remembered hash does not match: the row is read
    moved_clock(5.1)
    r = get(old_key)
    assert (r.status_code, r.json()["error"]["code"]) == (401, "invalid_api_key")
    assert get(new_key).status_code == 200
