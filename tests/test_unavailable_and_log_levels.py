"""A database that cannot be reached answers 503 with Retry-After, not 500 (issue 23 #13b: during a
Postgres restart 10 of 150 sends answered 500), in the API's error shape, for DRF views and the
others; and a 4xx is the client's problem, logged at INFO, a 5xx at ERROR (issue 23 #15).

In-process (Django test client). The connection is made to fail the way Django reports a refused
connect: ``ensure_connection`` raises ``django.db.OperationalError``.
"""

from __future__ import annotations

import json
import logging
from unittest import mock

import pytest
from django.db import InterfaceError, OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test import Client

from notifications.models import APIClient, Notification
from preferences.unsubscribe import UnsubscribeToken, make_token
from tests.conftest import EVERY_SCOPE

pytestmark = pytest.mark.django_db

REFUSED = OperationalError('connection failed: connection to server at "127.0.0.1", port 55432 failed: '
                           "Connection refused")


@pytest.fixture
def http():
    key = APIClient.objects.create_key(name="unavailable", scopes=EVERY_SCOPE)[1]
    return Client(headers={"Authorization": f"Api-Key {key}"})


def database_down(exc=REFUSED):
    return mock.patch.object(BaseDatabaseWrapper, "ensure_connection", side_effect=exc)


@pytest.mark.parametrize("exc", [REFUSED, InterfaceError("connection already closed")])
def test_a_send_while_the_database_is_down_is_503_with_retry_after(http, exc):
    body = {"user_id": "alice", "channel": "email", "content": {"subject": "Hi", "body": "Hello"}}
    with database_down(exc):
        r = http.post("/v1/notifications", json.dumps(body), content_type="application/json",
                      headers={"Idempotency-Key": "k-503"})
    assert r.status_code == 503
    assert r["Retry-After"] == "5"
    assert r.json() == {"error": {"status": 503, "code": "database_unavailable", "message":
                                  "the database cannot be reached; nothing was written: retry shortly"}}
    assert not Notification.objects.exists()


def test_a_read_while_the_database_is_down_is_503(http):
    with database_down():
        r = http.get("/v1/users/alice")
    assert (r.status_code, r["Retry-After"], r.json()["error"]["code"]) == (503, "5", "database_unavailable")


def test_a_view_outside_drf_answers_503_too():
    """The one-click unsubscribe (a plain Django view): the error shape for a client, text for a browser."""
    url = "/u/" + make_token(UnsubscribeToken(user_id="alice", category="marketing", channel="email"))
    with database_down():
        r = Client().post(url, {"List-Unsubscribe": "One-Click"})
        page = Client().post(url, {"List-Unsubscribe": "One-Click"}, headers={"Accept": "text/html,*/*;q=0.8"})
    assert (r.status_code, r["Retry-After"], r.json()["error"]["code"]) == (503, "5", "database_unavailable")
    assert (page.status_code, page["Retry-After"], page["Content-Type"]) == (503, "5", "text/plain; charset=utf-8")


def test_4xx_are_logged_at_info_and_5xx_at_error(http, caplog):
    caplog.set_level(logging.INFO, logger="django.request")
    assert http.get("/v1/users/nobody-here").status_code == 404
    assert http.post("/v1/notifications", "{", content_type="application/json",
                     headers={"Idempotency-Key": "k-400"}).status_code == 400
    with database_down():
        assert http.get("/v1/users/alice").status_code == 503
    levels = [(r.levelname, r.status_code) for r in caplog.records if r.name == "django.request"]
    assert levels == [("INFO", 404), ("INFO", 400), ("ERROR", 503)]


@pytest.mark.parametrize("logger", ["django.request", None], ids=["django.request", "LOG_LEVEL"])
def test_4xx_are_not_logged_when_the_level_is_warning(http, caplog, logger):
    caplog.set_level(logging.WARNING, logger=logger)
    assert http.get("/v1/users/nobody-here").status_code == 404
    assert [r for r in caplog.records if r.name == "django.request"] == []
